"""Data types and the decoding loop; imports nothing else of verispec but its errors.

No module here holds mutable state: the decoder is handed its drafter and verifier
(:class:`verispec.SpeculativeDecoder` supplies the defaults).
"""

from verispec.core.engine import (
    Engine,
    GenerationResult,
    StepStats,
    StreamChunk,
    VerifierPolicy,
)
from verispec.core.sampling import SamplingParams
from verispec.core.tree import DETERMINISTIC, IID, Deterministic, DraftTree, WithoutReplacement
from verispec.core.types import (
    DecodeState,
    Drafter,
    GenerationParams,
    LanguageModel,
    StepOutcome,
    Verdict,
    Verifier,
)

__all__ = [
    "DETERMINISTIC",
    "IID",
    "DecodeState",
    "Deterministic",
    "DraftTree",
    "Drafter",
    "GenerationParams",
    "GenerationResult",
    "LanguageModel",
    "SamplingParams",
    "Engine",
    "StepOutcome",
    "StepStats",
    "StreamChunk",
    "Verdict",
    "Verifier",
    "VerifierPolicy",
    "WithoutReplacement",
]

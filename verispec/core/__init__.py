"""Data types and the decoding loop; imports nothing else of verispec but its errors.

No module here holds mutable state: the decoder is handed its drafter and verifier
(:class:`verispec.SpeculativeDecoder` supplies the defaults).
"""

from verispec.core.engine import (
    GenerationResult,
    SpeculativeDecoder,
    StepStats,
    StreamChunk,
    VerifierPolicy,
)
from verispec.core.sampling import SamplingParams
from verispec.core.tree import DETERMINISTIC, IID, Deterministic, DraftTree, WithoutReplacement
from verispec.core.types import (
    DecodeState,
    Drafter,
    GenerationConfig,
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
    "GenerationConfig",
    "GenerationResult",
    "LanguageModel",
    "SamplingParams",
    "SpeculativeDecoder",
    "StepOutcome",
    "StepStats",
    "StreamChunk",
    "Verdict",
    "Verifier",
    "VerifierPolicy",
    "WithoutReplacement",
]

"""Data types and the decoding loop; imports nothing else of verispec."""

from verispec.core.engine import GenerationResult, SpeculativeDecoder, StepStats, StreamChunk
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
    "WithoutReplacement",
]

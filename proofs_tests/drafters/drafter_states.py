"""The decode state the drafter tests hand to ``propose``."""

from __future__ import annotations

import torch

from verispec.core.sampling import SamplingParams
from verispec.core.types import DecodeState


def decode_state(
    tokens: list[int], temperature: float = 0.0, seed: int = 0, **sampling: float
) -> DecodeState:
    """A state whose whole context is the prompt ``tokens``, seeded with ``seed``."""
    return DecodeState(
        tokens=list(tokens),
        prompt_length=len(tokens),
        sampling=SamplingParams(temperature=temperature, **sampling),  # type: ignore[arg-type]
        generator=torch.Generator().manual_seed(seed),
    )

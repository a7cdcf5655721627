"""The toy Markov target/draft pair shared by the end-to-end exactness audits."""

from __future__ import annotations

import torch

from verispec.models.markov import MarkovModel


def markov_pair() -> tuple[MarkovModel, MarkovModel]:
    """An order-1 target and an order-2 draft over 3 tokens (draft[a, b] ~ target[b] + noise)."""
    generator = torch.Generator().manual_seed(2024)
    target_logits = 0.7 * torch.randn(3, 3, generator=generator, dtype=torch.float64)
    noise = 1.5 * torch.randn(3, 3, 3, generator=generator, dtype=torch.float64)
    draft_logits = target_logits.expand(3, 3, 3) + noise
    return MarkovModel(target_logits), MarkovModel(draft_logits)

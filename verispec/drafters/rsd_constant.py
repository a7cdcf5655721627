"""RSD-C: Recursive Speculative Decoding with constant branching factors.

Jeon et al., "Recursive Speculative Decoding: Accelerating LLM Inference via Sampling
Without Replacement", ICML 2024 (RSD-C). With branching factors ``(b_1, ..., b_L)`` the
root gets ``b_1`` children and every node of level ``l - 1`` gets ``b_l`` children drawn
*without replacement* from the processed draft distribution at that node, by the
Gumbel-top-k trick: perturb ``log p`` with i.i.d. Gumbel(0, 1) noise and keep the ``b``
largest keys, in decreasing order. That ordered sequence has the law of ``b``
sequential draws without replacement (Vieira 2014; Kool et al. 2019); the ``b`` largest
keys are found without perturbing every token
(:func:`~verispec.drafters._draws.race_without_replacement`). The law of a
node's children is ``WithoutReplacement(p_parent)`` in stored order, verified by
recursive rejection sampling. A node whose distribution has fewer than ``b`` tokens of
positive probability gets only those. At temperature 0 the children are the draft's
``b`` top choices and the law is ``DETERMINISTIC``.

The level-wise loop (storage order, budget, temperature 0) is
:class:`~verispec.drafters._draft_model.LevelwiseDrafter`'s; this module is the draw rule.
"""

from __future__ import annotations

import torch

from verispec.core.tree import ProposalLaw, WithoutReplacement
from verispec.drafters._draft_model import LevelwiseDrafter
from verispec.drafters._draws import race_without_replacement

__all__ = ["RSDConstant", "gumbel_top_k"]


def gumbel_top_k(
    probs: torch.Tensor, k: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ordered draws without replacement from each row of ``probs`` (Gumbel-top-k).

    Args:
        probs: float, Shape: (..., V).
        k: draws per row, ``1 <= k <= V``.

    Returns:
        ``(tokens, valid)``: int64 and bool, Shape: (..., k). ``tokens[..., j]`` is the
        j-th draw; ``valid`` is False past the row's support (those tokens must be
        dropped: the row has fewer than ``k`` tokens of positive probability).
    """
    tokens, _, valid = race_without_replacement(probs, k, generator)  # first arrivals
    return tokens, valid


class RSDConstant(LevelwiseDrafter):
    """RSD-C: Gumbel-top-k draws without replacement, constant branching per level.

    Args:
        draft: the draft model (same vocabulary as the target).
        branching: children per node at each level, e.g. ``(4, 2, 2)``.
        budget: optional cap on the number of nodes; the tree is cut in level order.
    """

    def draw_children(
        self, probs: torch.Tensor, b: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Ordered draws without replacement from each row (Gumbel-top-k)."""
        return gumbel_top_k(probs, b, generator)

    def children_law(self, probs: torch.Tensor) -> ProposalLaw:
        return WithoutReplacement(probs)

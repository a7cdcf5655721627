"""RSD-C: Recursive Speculative Decoding with constant branching factors.

Jeon et al., "Recursive Speculative Decoding: Accelerating LLM Inference via Sampling
Without Replacement", ICML 2024 (RSD-C). With branching factors ``(b_1, ..., b_L)`` the
root gets ``b_1`` children and every node of level ``l - 1`` gets ``b_l`` children drawn
*without replacement* from the processed draft distribution at that node, by the
Gumbel-top-k trick: perturb ``log p`` with i.i.d. Gumbel(0, 1) noise and keep the ``b``
largest keys, in decreasing order. That ordered sequence has the law of ``b``
sequential draws without replacement (Vieira 2014; Kool et al. 2019), so the law of a
node's children is ``WithoutReplacement(p_parent)`` in stored order, verified by
recursive rejection sampling. A node whose distribution has fewer than ``b`` tokens of
positive probability gets only those. At temperature 0 the children are the draft's
``b`` top choices and the law is ``DETERMINISTIC``.

Nodes are stored level by level; within a level, children of earlier parents first,
siblings in draw order. Draft calls per step: ``L``, batching each level.
"""

from __future__ import annotations

import torch

from verispec.core.tree import DETERMINISTIC, DraftTree, ProposalLaw, WithoutReplacement
from verispec.core.types import DecodeState, LanguageModel
from verispec.drafters._draft_model import (
    DraftModelDrafter,
    branching_factors,
    draft_generator,
    positive_int,
    processed_probs,
    race_keys,
)

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
    keys = race_keys(probs, generator)  # exp(log p + Gumbel): same order
    top = torch.topk(keys, k, dim=-1)
    return top.indices, top.values > 0


class RSDConstant(DraftModelDrafter):
    """RSD-C: Gumbel-top-k draws without replacement, constant branching per level.

    Args:
        draft: the draft model (same vocabulary as the target).
        branching: children per node at each level, e.g. ``(4, 2, 2)``.
        budget: optional cap on the number of nodes; the tree is cut in level order.
    """

    def __init__(
        self,
        draft: LanguageModel,
        *,
        branching: tuple[int, ...] = (2, 2, 2),
        budget: int | None = None,
    ) -> None:
        super().__init__(draft)
        self.branching = branching_factors("branching", branching)
        full = 0
        width = 1
        for b in self.branching:
            width *= b
            full += width
        self.budget = full if budget is None else min(full, positive_int("budget", budget))

    def __repr__(self) -> str:
        return f"RSDConstant(branching={self.branching}, budget={self.budget})"

    def propose(self, state: DecodeState) -> DraftTree:
        limit = self.node_limit(state, self.budget)
        if limit == 0:
            return DraftTree.empty()
        sampling = state.sampling
        level_logits = self.score_root()[None]  # (1, V)
        generator = draft_generator(state, level_logits.device)
        level_rows = [0]
        laws: dict[int, ProposalLaw] = {}
        count = 0
        for depth, b in enumerate(self.branching):
            if depth > 0:
                level_logits = self.score_new_nodes()  # (R, V)
            b_eff = min(b, level_logits.shape[-1])
            if sampling.is_greedy:  # the draft's top choices; no distribution needed
                probs = level_logits
                draws = torch.topk(level_logits, b_eff, dim=-1).indices  # (R, b)
                valid = torch.ones_like(draws, dtype=torch.bool)
            else:
                probs = processed_probs(level_logits, sampling)  # (R, V)
                draws, valid = gumbel_top_k(probs, b_eff, generator)
            draws_list, valid_list = draws.tolist(), valid.tolist()
            next_rows: list[int] = []
            for r, row in enumerate(level_rows):
                if count >= limit:
                    break
                children = [t for t, ok in zip(draws_list[r], valid_list[r], strict=True) if ok]
                children = children[: limit - count]
                laws[row] = DETERMINISTIC if sampling.is_greedy else WithoutReplacement(probs[r])
                self.add_nodes(children, [row - 1] * len(children))
                next_rows.extend(range(count + 1, count + 1 + len(children)))
                count += len(children)
            if count >= limit or depth == len(self.branching) - 1:
                break
            level_rows = next_rows
        return self.build(laws)

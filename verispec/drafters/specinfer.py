"""SpecInfer-style draft trees of i.i.d. samples (Miao et al., ASPLOS 2024).

With branching factors ``(b_1, ..., b_L)`` the root gets ``b_1`` children and every
node of level ``l - 1`` gets ``b_l`` children, each an independent draw from the
processed draft distribution at its parent: the law of every node's children is
``IID(p_parent)``, verified by multi-round rejection sampling. Duplicate siblings are
kept (merging them would change the law). At temperature 0 a node's children are the
draft's ``b_l`` top choices, in rank order, and the law is ``DETERMINISTIC``.

Nodes are stored level by level; within a level, children of earlier parents first,
siblings in draw order. Draft calls per step: ``L`` (the root, then one per level but
the last, batching the whole level).
"""

from __future__ import annotations

import torch

from verispec.core.tree import DETERMINISTIC, IID, DraftTree, ProposalLaw
from verispec.core.types import DecodeState, LanguageModel
from verispec.drafters._draft_model import (
    DraftModelDrafter,
    branching_factors,
    draft_generator,
    positive_int,
    processed_probs,
)

__all__ = ["SpecInferTree"]


class SpecInferTree(DraftModelDrafter):
    """A tree of i.i.d. draft samples with per-level branching factors.

    Args:
        draft: the draft model (same vocabulary as the target).
        branching: children per node at each level, e.g. ``(4, 2, 2)`` (4 + 8 + 16 nodes).
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
        return f"SpecInferTree(branching={self.branching}, budget={self.budget})"

    def propose(self, state: DecodeState) -> DraftTree:
        limit = self.node_limit(state, self.budget)
        if limit == 0:
            return DraftTree.empty()
        sampling = state.sampling
        level_logits = self.score_root()[None]  # (1, V)
        generator = draft_generator(state, level_logits.device)
        level_rows = [0]  # rows (0 the root, i + 1 node i) whose children come next
        laws: dict[int, ProposalLaw] = {}
        count = 0
        for depth, b in enumerate(self.branching):
            if depth > 0:
                level_logits = self.score_new_nodes()  # (R, V), R = len(level_rows)
            if sampling.is_greedy:  # the draft's top choices; no distribution needed
                probs = level_logits
                draws = torch.topk(level_logits, min(b, probs.shape[-1]), dim=-1).indices
            else:
                probs = processed_probs(level_logits, sampling)  # (R, V)
                draws = torch.multinomial(probs, b, replacement=True, generator=generator)
            draws_list = draws.tolist()
            next_rows: list[int] = []
            for r, row in enumerate(level_rows):
                if count >= limit:
                    break
                children = draws_list[r][: limit - count]
                laws[row] = DETERMINISTIC if sampling.is_greedy else IID(probs[r])
                self.add_nodes(children, [row - 1] * len(children))
                next_rows.extend(range(count + 1, count + 1 + len(children)))
                count += len(children)
            if count >= limit or depth == len(self.branching) - 1:
                break
            level_rows = next_rows
        return self.build(laws)

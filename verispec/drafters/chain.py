"""Chain speculative decoding with a draft model (Leviathan et al. 2023; Chen et al. 2023).

The draft samples ``k`` tokens one after another, each from its processed distribution
given the tokens before it. The "tree" is a chain: every node has one child, whose law
is ``IID(p)`` with ``p`` the draft distribution at the parent — vanilla speculative
sampling is the IID rule with one child. At temperature 0 each token is the draft's
argmax and the law is ``DETERMINISTIC``.

Draft calls per step: ``k`` (the root, then one per node but the last, which is never
fed unless it is accepted). Each token is one inverse-CDF draw (or a block-wise argmax at
temperature 0), see :mod:`verispec.drafters._draws`.
"""

from __future__ import annotations

import attrs

from verispec.core.sampling import argmax_one
from verispec.core.tree import DETERMINISTIC, IID, DraftTree, ProposalLaw
from verispec.core.types import DecodeState, LanguageModel
from verispec.core.validate import integer, option
from verispec.drafters._draft_model import DraftModelDrafter, draft_generator
from verispec.drafters._draws import processed_probs, sample_one

__all__ = ["Chain", "ChainOptions"]


@attrs.frozen(kw_only=True)
class ChainOptions:
    """Chain's parameters, checked."""

    k: int = option(4, integer, 1, help="chain length (draft tokens per step)")


_DEFAULT = ChainOptions()  # the defaults of Chain's arguments


class Chain(DraftModelDrafter):
    """``k`` draft tokens sampled one after another.

    Args:
        draft: the draft model (same vocabulary as the target).
        k: the chain length (>= 1), i.e. the tree budget in nodes.
    """

    def __init__(self, draft: LanguageModel, *, k: int = _DEFAULT.k) -> None:
        super().__init__(draft)
        self.options = ChainOptions(k=k)
        self.k = k

    def __repr__(self) -> str:
        return f"Chain(k={self.k})"

    def propose(self, state: DecodeState) -> DraftTree:
        limit = self.node_limit(state, self.k)
        if limit == 0:
            return DraftTree.empty()
        sampling = state.sampling
        logits = self.score_root()
        generator = draft_generator(state, logits.device)
        laws: dict[int, ProposalLaw] = {}
        for i in range(limit):
            if i > 0:
                logits = self.score_new_nodes()[0]
            logits = self.masked(state, [i], logits[None])[0]  # row i: node i - 1
            if sampling.is_greedy:
                token = argmax_one(logits)  # the draft's top choice
                laws[i] = DETERMINISTIC
            else:
                probs = processed_probs(logits, sampling)  # (V,)
                token = sample_one(probs, generator)
                laws[i] = IID(probs)
            self.add_nodes([token], [i - 1])
        return self.build(laws)

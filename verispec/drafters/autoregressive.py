"""The autoregressive baseline as a drafter: it always sends the empty tree.

With this drafter the speculative engine decodes one token per target forward,
exactly like plain greedy or sampled decoding, through the same code path as every
other method; benchmarks use it as the ``ar`` baseline, and
:class:`verispec.SpeculativeDecoder` uses it when no drafter is given.
"""

from __future__ import annotations

from verispec.core.tree import DraftTree
from verispec.core.types import BaseDrafter, DecodeState, StepOutcome

__all__ = ["Autoregressive"]

_EMPTY_TREE = DraftTree.empty()


class Autoregressive(BaseDrafter):
    """Drafts nothing: every step commits exactly the target's own next token."""

    def begin(self, state: DecodeState) -> None:
        """Nothing to prepare."""

    def propose(self, state: DecodeState) -> DraftTree:
        """The empty tree (only the root)."""
        return _EMPTY_TREE

    def observe(self, outcome: StepOutcome) -> None:
        """Nothing to learn."""

    def reset(self) -> None:
        """Nothing to forget."""

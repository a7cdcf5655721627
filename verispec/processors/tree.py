"""Logits processing of one generation, applied to every row of a draft tree.

Row ``r`` of the target's logits is its distribution after the row's *prefix*: the
committed tokens, then the tokens on the path to the row's node. :class:`TreeProcessor`
gives each row the processors' output for that prefix, so a verifier that accepts
against the processed rows sees, at every node, the distribution ``generate`` would have
there with the same processors (docs/processors.rst). Nodes of one depth have prefixes
of one length: one processor call per depth processes them as a batch of
``input_ids`` (Shape: (B, S + d)) and scores (Shape: (B, V)), as ``generate`` would call
it on a batch. The grammar, if any, comes last and masks every row
(:class:`~verispec.processors.grammar.GrammarConstraint`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from verispec.core.tree import DraftTree
from verispec.core.types import DecodeState
from verispec.processors.grammar import GrammarConstraint
from verispec.processors.hf import Mode, classify, probe

__all__ = ["TreeProcessor"]


class TreeProcessor:
    """Processors of the prefix, then a grammar, on every tree row (a
    :class:`~verispec.core.types.TreeProcessing`).

    Args:
        processors: ``(input_ids, scores) -> scores`` callables, applied in order; each is
            classified on construction (:func:`verispec.processors.hf.classify`), which
            refuses those that are not functions of the prefix.
        constraint: the generation's grammar, or None.

    Raises:
        ConfigError: a processor cannot be applied exactly; the message names it.
    """

    def __init__(self, processors: Sequence[Any], constraint: GrammarConstraint | None) -> None:
        self._processors: list[tuple[Any, Mode]] = [(p, classify(p)) for p in processors]
        self._to_probe = [p for p, mode in self._processors if mode == "probe"]
        self.constraint = constraint

    def prune(self, tree: DraftTree, state: DecodeState) -> DraftTree:
        """``tree`` without the nodes the grammar forbids, where that keeps the laws."""
        if self.constraint is None or tree.num_nodes == 0:
            return tree
        return self.constraint.prune(tree, state)

    @property
    def allowed(self) -> Callable[[DecodeState, Sequence[Sequence[int]]], torch.Tensor] | None:
        """The grammar's allowed tokens after paths below the root, for draft-model
        drafters (``DecodeState.allowed``); ``None`` without a grammar."""
        return None if self.constraint is None else self.constraint.allowed_after

    def process(self, tree: DraftTree, logits: torch.Tensor, state: DecodeState) -> torch.Tensor:
        """The processed logits, float, Shape: (N + 1, V); ``logits`` is not modified."""
        out = logits.clone()
        if self._processors:
            committed = torch.tensor(state.tokens, dtype=torch.long)
            for rows, ids in _depth_batches(tree, committed):
                scores = out[rows]
                for processor, mode in self._processors:
                    if self._to_probe and processor in self._to_probe:
                        probe(processor, ids[:1], scores[:1])
                        self._to_probe.remove(processor)
                    if mode == "row":
                        scores = torch.cat(
                            [processor(ids[i : i + 1], scores[i : i + 1]) for i in range(len(rows))]
                        )
                    else:
                        scores = processor(ids, scores)
                out[rows] = scores.to(out.dtype)
        if self.constraint is not None:
            self.constraint.apply(tree, out, state)
        return out


def _depth_batches(
    tree: DraftTree, committed: torch.Tensor
) -> list[tuple[list[int], torch.Tensor]]:
    """``(rows, input_ids)`` per depth: the rows of that depth (row 0 the root, row ``i + 1``
    node ``i``) and their prefixes, int64, Shape: (len(rows), S + depth)."""
    paths: list[list[int]] = [[]]  # by row: the tokens from the root to the row's node
    by_depth: dict[int, list[int]] = {0: [0]}
    for node, (token, parent) in enumerate(
        zip(tree.tokens.tolist(), tree.parents.tolist(), strict=True)
    ):
        path = [*paths[parent + 1], token]
        paths.append(path)
        by_depth.setdefault(len(path), []).append(node + 1)
    batches = []
    for depth in sorted(by_depth):
        rows = by_depth[depth]
        head = committed.expand(len(rows), -1)
        if depth:
            tails = torch.tensor([paths[r] for r in rows], dtype=torch.long)
            head = torch.cat([head, tails], dim=1)
        batches.append((rows, head))
    return batches

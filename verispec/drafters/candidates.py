"""Valued candidate tries: what the value-ordered model-free drafters share.

:class:`~verispec.drafters.dynamic_token_recycling.DynamicTokenRecycling` and
:class:`~verispec.drafters.suffix.SuffixDrafter` both gather deterministic candidate
continuations from several *sources* (recycled top-k rows, n-gram matches, suffix
matches), give each node a value (an estimate of the probability that its whole path is
accepted, never larger than its parent's) and send the most valuable connected tree.
This module holds the pieces they share:

* :class:`Calibration` — online acceptance rates by (row, score bucket);
* :class:`Candidates` — a trie of valued nodes, with one calibration cell per source;
* :class:`Trie` — the same trie in Python lists, for the per-step path of a drafter;
* :func:`fuse` — the union of two tries by token path;
* :func:`subtree` — chosen nodes as a :class:`~verispec.core.tree.DraftTree`;
* :func:`tried_and_hit` — which nodes of a verified tree were tried and accepted.

A drafter sized for a CPU sends a few nodes a step and reads a few dozen candidates, where
a torch operator costs more in dispatch than in work: run between two forward passes, with
the caches cold, the ~100 small operators of a tensor pipeline made ``dtr``'s drafting a
quarter of a two-thread step (docs/benchmarks.rst). So the per-step operations run on
:class:`Trie`'s lists, and the tensor forms (:class:`Candidates`, :func:`fuse`,
:func:`subtree`, :func:`tried_and_hit`, :meth:`Calibration.update`) convert once and call
them: one implementation of each.

Shape glossary: M candidate nodes, C sources, N tree nodes.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

import attrs
import numpy as np
import torch

from verispec.core.tree import DraftTree
from verispec.core.types import Verdict
from verispec.core.validate import interval, number, option

__all__ = [
    "Calibration",
    "CalibrationOptions",
    "Candidates",
    "Trie",
    "fuse",
    "revalue",
    "subtree",
    "tried_and_hit",
    "tried_and_hit_lists",
    "update_by_agreement",
]

_MAX_RATE = 1.0 - 1e-6  # keeps a child strictly below its parent


@attrs.frozen(kw_only=True)
class CalibrationOptions:
    """The calibration's parameters, shared by the drafters that calibrate (DTR, suffix)."""

    decay: float = option(
        0.999, interval, 0, 1, closed="high", help="per-step forgetting of the calibration"
    )
    prior_strength: float = option(
        8.0, number, strict=True, help="weight of the prior acceptance rates (pseudo-tries)"
    )


class Calibration:
    """Online acceptance rates by depth and score bucket, shrunk toward the bucket's rate.

    A *try* is a node whose parent was accepted (or a child of the root) and a *hit* an
    accepted one. Two levels of pseudo-counts::

        bucket[b]  = (hits[b] + strength * prior[b]) / (tries[b] + strength)
        rate[d, b] = (hits[d, b] + depth_strength * bucket[b]) / (tries[d, b] + depth_strength)

    so sparse (depth, bucket) cells borrow from all depths of their bucket. On logged
    SmolLM2 steps (2,851 tried nodes) the score bucket explains acceptance far better
    than depth, and this shrinkage predicts as well as the bucket alone (log-loss 0.259
    against 0.256) while still following a depth effect where there is one. Counts decay
    by ``decay`` per observed step, so the table follows the text. The row need not be a
    depth: the suffix drafter indexes rows by the length of the matched context.

    Args:
        edges: bucket edges of the score, increasing in (0, 1).
        prior: float, Shape: (B,). Rate assumed before any observation, B = len(edges) + 1.
        depths: depths (rows) tracked; deeper nodes share the last row.
    """

    def __init__(
        self,
        edges: tuple[float, ...],
        prior: torch.Tensor,
        depths: int,
        strength: float,
        decay: float,
        depth_strength: float = 16.0,
    ) -> None:
        self.edges = torch.tensor(edges, dtype=torch.float32)
        self.edge_list = list(edges)
        self.prior = prior.to(torch.float64)
        self.depths = depths
        self.strength, self.decay, self.depth_strength = strength, decay, depth_strength
        self.hits = torch.zeros(depths, len(edges) + 1, dtype=torch.float64)
        self.tries = torch.zeros_like(self.hits)

    def reset(self) -> None:
        self.hits.zero_()
        self.tries.zero_()

    def fresh(self) -> Calibration:
        """A calibration with the same settings and no observation."""
        return Calibration(tuple(self.edge_list), self.prior, self.depths,
                           self.strength, self.decay, self.depth_strength)  # fmt: skip

    @property
    def num_buckets(self) -> int:
        return len(self.edges) + 1

    def cell(self, row: int, score: float) -> int:
        """Flat cell of one (0-based row, score), as :meth:`cells` computes it."""
        return min(row, self.depths - 1) * self.num_buckets + bisect_left(self.edge_list, score)

    def cells(self, depth: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
        """int64 flat cell index of each (depth, score); depth is 1-based. Same shape."""
        bucket = torch.bucketize(score.float(), self.edges)
        row = (depth - 1).clamp(0, self.depths - 1)
        return row * (len(self.edges) + 1) + bucket

    def rates(self) -> torch.Tensor:
        """float64, Shape: (depths * B,). Calibrated acceptance rate of every cell."""
        return torch.from_numpy(self._rates().reshape(-1))

    def rate_rows(self) -> list[list[float]]:
        """:meth:`rates` as Python lists, one per row: ``rate_rows()[row][bucket]``."""
        rows: list[list[float]] = self._rates().tolist()
        return rows

    def _rates(self) -> np.ndarray:
        """The rates, Shape: (depths, B), in NumPy on views of the counts (a drafter asks
        every step; a torch operator on these few numbers costs more than the numbers)."""
        hits, tries, prior = self.hits.numpy(), self.tries.numpy(), self.prior.numpy()
        bucket = (hits.sum(0) + self.strength * prior) / (tries.sum(0) + self.strength)  # (B,)
        rate = (hits + self.depth_strength * bucket) / (tries + self.depth_strength)
        return np.clip(rate, 1e-9, _MAX_RATE, out=rate)

    def update(self, cells: torch.Tensor, tried: torch.Tensor, hit: torch.Tensor) -> None:
        """Count the tried nodes (bool masks, Shape: (N,)) of cells ``cells`` (-1 = none)."""
        self.count(cells.tolist(), tried.tolist(), hit.tolist())

    def count(self, cells: Sequence[int], tried: Sequence[bool], hit: Sequence[bool]) -> None:
        """:meth:`update` on Python lists (the per-step path: no tensor operator)."""
        hits, tries = self.hits.numpy(), self.tries.numpy()  # views: counted in place
        hits *= self.decay
        tries *= self.decay
        flat_hits, flat_tries = hits.reshape(-1), tries.reshape(-1)
        for cell, was_tried, was_hit in zip(cells, tried, hit, strict=True):
            if was_tried and cell >= 0:
                flat_tries[cell] += 1.0
                if was_hit:
                    flat_hits[cell] += 1.0


@attrs.frozen(eq=False)
class Candidates:
    """A trie of candidate nodes, parents before children, each with a value.

    Attributes:
        tokens: int64, Shape: (M,).
        parents: int64, Shape: (M,). ``-1`` for children of the root.
        values: float64, Shape: (M,). Estimated probability that the node's whole path is
            accepted; below the parent's value.
        depths: int64, Shape: (M,). 1 for children of the root.
        cells: int64, Shape: (M, C). The node's calibration cell in each source's
            :class:`Calibration`; ``-1`` where the source did not propose it.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    values: torch.Tensor
    depths: torch.Tensor
    cells: torch.Tensor

    @classmethod
    def empty(cls, columns: int) -> Candidates:
        none = torch.empty(0, dtype=torch.long)
        return cls(none, none, none.double(), none, torch.empty(0, columns, dtype=torch.long))

    @classmethod
    def from_lists(
        cls,
        tokens: list[int],
        parents: list[int],
        values: list[float],
        depths: list[int],
        cells: list[list[int]],
        columns: int,
    ) -> Candidates:
        if not tokens:
            return cls.empty(columns)
        long = torch.long
        return cls(torch.tensor(tokens, dtype=long), torch.tensor(parents, dtype=long),
                   torch.tensor(values, dtype=torch.float64), torch.tensor(depths, dtype=long),
                   torch.tensor(cells, dtype=long).reshape(len(tokens), columns))  # fmt: skip

    @classmethod
    def from_trie(cls, trie: Trie) -> Candidates:
        return cls.from_lists(trie.tokens, trie.parents, trie.values, trie.depths, trie.cells,
                              trie.columns)  # fmt: skip

    def to_trie(self) -> Trie:
        return Trie(self.tokens.tolist(), self.parents.tolist(), self.values.tolist(),
                    self.depths.tolist(), self.cells.tolist(), self.num_columns)  # fmt: skip

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.numel())

    @property
    def num_columns(self) -> int:
        return int(self.cells.shape[1])

    def placed(self, columns: int, first: int) -> Candidates:
        """The same trie with its cells in columns ``first..`` of ``columns`` columns."""
        cells = torch.full((self.num_nodes, columns), -1, dtype=torch.long)
        cells[:, first : first + self.num_columns] = self.cells
        return attrs.evolve(self, cells=cells)

    def take(self, index: torch.Tensor) -> Candidates:
        """The nodes ``index`` (a connected set, parents first), parents renumbered."""
        return Candidates.from_trie(self.to_trie().take(index.tolist()))


@attrs.define(slots=True)
class Trie:
    """:class:`Candidates` in Python lists (the same attributes, one entry per node;
    ``cells`` a list of ``columns`` cells per node)."""

    tokens: list[int]
    parents: list[int]
    values: list[float]
    depths: list[int]
    cells: list[list[int]]
    columns: int

    @classmethod
    def empty(cls, columns: int) -> Trie:
        return cls([], [], [], [], [], columns)

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    def take(self, index: Sequence[int]) -> Trie:
        """The nodes ``index`` (a connected set, parents first), parents renumbered."""
        remap = {old: new for new, old in enumerate(index)}
        return Trie([self.tokens[i] for i in index],
                    [remap.get(self.parents[i], -1) for i in index],
                    [self.values[i] for i in index], [self.depths[i] for i in index],
                    [self.cells[i] for i in index], self.columns)  # fmt: skip

    def by_value(self) -> list[int]:
        """Node indices, most valuable first, the earlier node first among equal values
        (a parent before its children: a child is never worth more)."""
        values = self.values
        return sorted(range(len(values)), key=lambda i: -values[i])

    def fuse(self, extra: Trie) -> Trie:
        """:func:`fuse` on lists: this trie, grown in place by ``extra``'s nodes, returned."""
        u_tok, u_par, u_val, u_dep, u_cells = (
            self.tokens, self.parents, self.values, self.depths, self.cells,
        )  # fmt: skip
        child = {(p, t): i for i, (p, t) in enumerate(zip(u_par, u_tok, strict=True))}
        where: list[int] = []
        for t, p, v, d, c in zip(extra.tokens, extra.parents, extra.values, extra.depths,
                                 extra.cells, strict=True):  # fmt: skip
            parent = where[p] if p >= 0 else -1
            i = child.get((parent, t))
            if i is None:
                i = len(u_tok)
                child[(parent, t)] = i
                u_tok.append(t)
                u_par.append(parent)
                u_val.append(v)
                u_dep.append(d)
                u_cells.append(c)
            else:
                u_val[i] = max(u_val[i], v)
                u_cells[i] = [max(a, b) for a, b in zip(u_cells[i], c, strict=True)]
            where.append(i)
        return self

    def subtree(self, chosen: Sequence[int]) -> tuple[DraftTree, Trie]:
        """:func:`subtree` on lists."""
        if not chosen:
            return DraftTree.empty(), Trie.empty(self.columns)
        depths = self.depths
        kept = self.take(sorted(chosen, key=lambda i: depths[i]))  # stable: by depth, then value
        return DraftTree.from_parents(kept.tokens, kept.parents), kept


def fuse(base: Candidates, extra: Candidates) -> Candidates:
    """Union of two tries by token path; a shared node keeps the larger value and the
    cells of both (each column is a source; a source fills ``-1`` where it has none)."""
    if extra.num_nodes == 0:
        return base
    return Candidates.from_trie(base.to_trie().fuse(extra.to_trie()))


def revalue(
    cands: Candidates, exclusive: Sequence[Calibration], shared: Sequence[Calibration]
) -> Candidates:
    """Values re-estimated after fusion, by agreement between sources.

    A node proposed by one source takes its rate from that source's ``exclusive``
    calibration; a node proposed by several takes the largest of their ``shared``
    calibrations' rates (a path that two sources agree on is accepted more often than
    either source's nodes on average, and one only one source proposes, less). Values are
    the products of the rates down each path. Column ``j`` of the cells is read with the
    ``j``-th calibration of each list.
    """
    if cands.num_nodes == 0:
        return cands
    owned = cands.cells >= 0  # (M, C)
    is_shared = owned.sum(1) > 1

    def rates(calibrations: Sequence[Calibration]) -> torch.Tensor:
        cols = [cal.rates()[cands.cells[:, j].clamp(min=0)] for j, cal in enumerate(calibrations)]
        return torch.where(owned, torch.stack(cols, 1), 0.0).amax(1)  # (M,)

    rate = torch.where(is_shared, rates(shared), rates(exclusive))
    values = rate.clone()
    for depth in range(2, int(cands.depths.max()) + 1):  # one op per level: parents first
        at = cands.depths == depth
        values[at] = rate[at] * values[cands.parents[at]]
    return attrs.evolve(cands, values=values)


def update_by_agreement(
    cells: torch.Tensor,
    tried: torch.Tensor,
    hit: torch.Tensor,
    exclusive: Sequence[Calibration],
    shared: Sequence[Calibration],
) -> None:
    """Count a verified tree's nodes (cells: Shape: (N, C)) in the calibrations
    :func:`revalue` read them from: exclusive nodes in their source's ``exclusive`` one,
    shared nodes in each of their sources' ``shared`` one."""
    is_shared = (cells >= 0).sum(1, keepdim=True) > 1  # (N, 1)
    for j, (alone, together) in enumerate(zip(exclusive, shared, strict=True)):
        alone.update(torch.where(is_shared[:, 0], -1, cells[:, j]), tried, hit)
        together.update(torch.where(is_shared[:, 0], cells[:, j], -1), tried, hit)


def subtree(cands: Candidates, chosen: torch.Tensor) -> tuple[DraftTree, Candidates]:
    """The nodes ``chosen`` (a connected set in value order) as a tree, by depth then value.

    Returns:
        The deterministic tree and the chosen candidates in the tree's node order.
    """
    tree, kept = cands.to_trie().subtree(chosen.tolist())
    return tree, Candidates.from_trie(kept)


def tried_and_hit(tree: DraftTree, verdict: Verdict) -> tuple[torch.Tensor, torch.Tensor]:
    """bool, Shape: (N,) each: nodes whose parent was accepted (tried), and accepted nodes."""
    tried, hit = tried_and_hit_lists(tree, verdict)
    return torch.tensor(tried, dtype=torch.bool), torch.tensor(hit, dtype=torch.bool)


def tried_and_hit_lists(tree: DraftTree, verdict: Verdict) -> tuple[list[bool], list[bool]]:
    """:func:`tried_and_hit` as Python lists."""
    on_path = {-1, *verdict.accepted}
    return [p in on_path for p in tree.parents.tolist()], [
        i in on_path for i in range(tree.num_nodes)
    ]

"""Static draft-tree templates given as index paths (Token Recycling, Luo et al., ACL 2025).

A template is a set of *index paths*. The path ``(i0, i1, ..., id)`` names the node
reached from the root by taking the ``i0``-th candidate of the root, then the
``i1``-th candidate of that token, and so on: a node in slot ``j`` of a parent
whose token is ``t`` carries ``adjacency[t, j]``. A template is valid when it is
*prefix-closed* (every proper prefix of a path is itself a path), has no
duplicate paths, and every slot is below the adjacency width K.

Shipped templates:

* ``"2.2.2"`` (also named ``"80"``) — the published Token Recycling tree (repository
  ``Luowaterbi/TokenRecycling``, ``model/recycling/tree_template_.py``): 80 nodes on
  6 levels with 8 / 21 / 25 / 15 / 8 / 3 nodes per level, transcribed exactly.
* ``"8"``, ``"16"``, ``"32"`` — the first 8, 16 and 32 nodes of ``"2.2.2"`` in its
  breadth-first order, sized for CPUs where every extra tree token costs time.
  Each is prefix-closed (``proofs_tests/drafters/test_templates.py`` checks it).

:class:`TreeTemplate` stores a template in canonical breadth-first order (by depth,
then lexicographically, so siblings appear in slot order: the most probable
candidate first) with the arrays that make expansion one gather per level.

Shape glossary: N tree nodes, K candidates per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import attrs
import torch

from verispec.core.tree import DETERMINISTIC, DraftTree, ProposalLaw
from verispec.errors import ConfigError, TreeStructureError

__all__ = [
    "TEMPLATES",
    "TEMPLATE_2_2_2",
    "TemplateSpec",
    "TreeTemplate",
    "resolve_template",
]

Path: TypeAlias = tuple[int, ...]

# Published "2.2.2" template, one line per level (8, 21, 25, 15, 8, 3 nodes).
TEMPLATE_2_2_2: tuple[Path, ...] = (
    *((i,) for i in range(8)),
    *((0, i) for i in range(8)), *((1, i) for i in range(4)), *((2, i) for i in range(3)),
    (3, 0), (3, 1), (4, 0), (5, 0), (6, 0), (7, 0),
    *((0, 0, i) for i in range(8)), (0, 1, 0), (0, 1, 1), (0, 1, 2), (0, 2, 0), (0, 2, 1),
    (0, 3, 0), (0, 4, 0), (0, 5, 0), (0, 6, 0), (0, 7, 0), (1, 0, 0), (1, 0, 1), (1, 1, 0),
    (2, 0, 0), (3, 0, 0), (4, 0, 0), (5, 0, 0),
    *((0, 0, 0, i) for i in range(5)), (0, 0, 1, 0), (0, 0, 1, 1), (0, 0, 2, 0), (0, 0, 3, 0),
    (0, 0, 4, 0), (0, 1, 0, 0), (0, 2, 0, 0), (1, 0, 0, 0), (2, 0, 0, 0), (3, 0, 0, 0),
    (0, 0, 0, 0, 0), (0, 0, 0, 0, 1), (0, 0, 0, 0, 2), (0, 0, 0, 1, 0), (0, 0, 0, 2, 0),
    (0, 0, 1, 0, 0), (0, 1, 0, 0, 0), (1, 0, 0, 0, 0),
    (0, 0, 0, 0, 0, 0), (0, 0, 0, 0, 0, 1), (0, 0, 0, 1, 0, 0),
)  # fmt: skip

TEMPLATES: dict[str, tuple[Path, ...]] = {
    "2.2.2": TEMPLATE_2_2_2,
    "80": TEMPLATE_2_2_2,  # the published tree by its size
    "8": TEMPLATE_2_2_2[:8],
    "16": TEMPLATE_2_2_2[:16],
    "32": TEMPLATE_2_2_2[:32],
}

TemplateSpec: TypeAlias = "str | int | Sequence[Sequence[int]] | TreeTemplate"


def _canonical_paths(paths: Sequence[Sequence[int]], k: int | None) -> tuple[Path, ...]:
    """Validate ``paths`` and return them in canonical order (depth, then lexicographic)."""
    if isinstance(paths, str | bytes) or not isinstance(paths, Sequence):
        raise ConfigError(
            f"`template` must be a template name or a list of index paths; got {paths!r}."
        )
    seen: set[Path] = set()
    out: list[Path] = []
    for raw in paths:
        if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
            raise TreeStructureError(
                f"every template path must be a list of slot indices; got {raw!r}."
            )
        if len(raw) == 0:
            raise TreeStructureError(
                "template paths must not be empty (the root is implicit); got []."
            )
        if any(isinstance(s, bool) or not isinstance(s, int) for s in raw):
            raise TreeStructureError(
                f"template path {list(raw)} must hold integer slot indices only."
            )
        path = tuple(int(s) for s in raw)
        bad = [s for s in path if s < 0 or (k is not None and s >= k)]
        if bad:
            bound = f"[0, {k})" if k is not None else ">= 0"
            raise TreeStructureError(
                f"template path {list(path)} has slot {bad[0]}; slots must be in {bound}"
                + (
                    " (K, the adjacency width, is the number of candidates per token)."
                    if k
                    else "."
                )
            )
        if path in seen:
            raise TreeStructureError(f"template path {list(path)} appears twice.")
        seen.add(path)
        out.append(path)
    if not out:
        raise TreeStructureError("`template` must contain at least one path; got none.")
    for path in out:
        if len(path) > 1 and path[:-1] not in seen:
            raise TreeStructureError(
                f"template path {list(path)} has no parent {list(path[:-1])} in the template; "
                "a template must be prefix-closed (every prefix of a path is a path)."
            )
    return tuple(sorted(out, key=lambda p: (len(p), p)))


@attrs.frozen(eq=False)
class TreeTemplate:
    """A validated static tree template, ready for vectorised expansion.

    Attributes:
        paths: the index paths in canonical breadth-first order; node ``i`` is ``paths[i]``.
        parents: int64, Shape: (N,). Parent node index, ``-1`` for the root's children.
        slots: int64, Shape: (N,). The candidate slot of each node in its parent's row.
        level_starts: node index where each depth begins, plus N at the end;
            depth ``d`` (1-based) is nodes ``level_starts[d - 1]:level_starts[d]``.
        laws: the proposal law of each row's children (all deterministic), Shape: N + 1.
    """

    paths: tuple[Path, ...]
    parents: torch.Tensor
    slots: torch.Tensor
    level_starts: tuple[int, ...]
    laws: tuple[ProposalLaw | None, ...]

    @classmethod
    def from_paths(cls, paths: Sequence[Sequence[int]], k: int | None = None) -> TreeTemplate:
        """Validate ``paths`` (prefix-closed, no duplicates, slots in ``[0, k)``) and index them.

        Raises:
            TreeStructureError: naming the first bad path.
        """
        canon = _canonical_paths(paths, k)
        index = {p: i for i, p in enumerate(canon)}
        parents = [index[p[:-1]] if len(p) > 1 else -1 for p in canon]
        slots = [p[-1] for p in canon]
        starts = [0]
        for d in range(1, len(canon[-1]) + 1):
            starts.append(sum(1 for p in canon if len(p) <= d))
        tree = DraftTree.from_parents([0] * len(canon), parents, DETERMINISTIC)
        return cls(
            paths=canon,
            parents=torch.tensor(parents, dtype=torch.long),
            slots=torch.tensor(slots, dtype=torch.long),
            level_starts=tuple(starts),
            laws=tree.laws,
        )

    @property
    def num_nodes(self) -> int:
        return len(self.paths)

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def depth(self) -> int:
        return len(self.level_starts) - 1

    @property
    def level_sizes(self) -> tuple[int, ...]:
        """Nodes per depth, depth 1 first (``(8, 21, 25, 15, 8, 3)`` for ``"2.2.2"``)."""
        s = self.level_starts
        return tuple(s[i + 1] - s[i] for i in range(len(s) - 1))

    @property
    def max_slot(self) -> int:
        return int(self.slots.max())

    def first(self, n: int) -> TreeTemplate:
        """The first ``n`` nodes in breadth-first order (always prefix-closed)."""
        return TreeTemplate.from_paths(self.paths[:n])


def resolve_template(template: TemplateSpec, k: int) -> TreeTemplate:
    """Turn a template name, a size or a list of index paths into a :class:`TreeTemplate`.

    Args:
        template: ``"2.2.2"`` (also ``"80"``), ``"8"``, ``"16"``, ``"32"`` (or those
            sizes as ints), a list of index paths, or a :class:`TreeTemplate`.
        k: the adjacency width K; every slot must be below it.

    Raises:
        ConfigError: an unknown template name.
        TreeStructureError: a bad path (named in the message).
    """
    if isinstance(template, TreeTemplate):
        if template.max_slot >= k:
            raise TreeStructureError(
                f"the template uses slot {template.max_slot} but `k` is {k}; "
                f"raise `k` to at least {template.max_slot + 1}."
            )
        return template
    if isinstance(template, bool):
        raise ConfigError(f"`template` must be a name or a list of index paths; got {template}.")
    if isinstance(template, int):
        template = str(template)
    if isinstance(template, str):
        if template not in TEMPLATES:
            raise ConfigError(
                f"`template` must be one of {sorted(TEMPLATES)} or a list of index paths; "
                f"got {template!r}."
            )
        return TreeTemplate.from_paths(TEMPLATES[template], k)
    return TreeTemplate.from_paths(template, k)

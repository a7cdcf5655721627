"""Draft trees and the proposal laws of their children.

A :class:`DraftTree` is what a drafter sends and a verifier judges. Node ``i``
holds ``tokens[i]`` and ``parents[i]``, the index of its parent or ``-1`` for a
child of the *root* (the last committed token, which is not a node). Nodes are
stored parent-before-child, and children of one parent keep the order in which
they were drawn, because the verifiers try them in that order.

Rows of everything indexed "by row" follow the target logits returned by
``LanguageModel.forward_tree``: row 0 is the root, row ``i + 1`` is node ``i``.
``laws[row]`` is the proposal law of that row's children (``None`` for a leaf).

Shape glossary (docs/glossary): N tree nodes, V vocabulary.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import TypeAlias

import attrs
import torch

from verispec.errors import TreeStructureError

__all__ = [
    "DETERMINISTIC",
    "IID",
    "Deterministic",
    "DraftTree",
    "ProposalLaw",
    "WithoutReplacement",
    "follow_path",
]


def follow_path(
    children: Callable[[int], Sequence[int]],
    tokens: Sequence[int],
    target_token: Callable[[int, int], int],
) -> tuple[list[int], int]:
    """Walk down a tree following one target token per row: ``(accepted, extra_token)``.

    ``children(row)`` lists a row's child nodes in stored order (row 0 the root, row
    ``i + 1`` node ``i``); ``target_token(row, depth)`` is the target's token at the row
    (``depth`` 0 for the root). At each row the first child carrying that token is
    accepted and its row comes next; at the first row with no such child the walk ends
    and that token is the extra token. Only the rows on the walk are asked for, in
    order. The one walk of the greedy and coupled rules (``verispec.verifiers``) and of
    the greedy kernel's PyTorch twin (``verispec.kernels.reference``).
    """
    accepted: list[int] = []
    row = 0
    while True:
        want = target_token(row, len(accepted))
        nxt = next((c for c in children(row) if tokens[c] == want), None)
        if nxt is None:
            return accepted, want
        accepted.append(nxt)
        row = nxt + 1


def _check_probs(instance: object, attribute: attrs.Attribute, value: torch.Tensor) -> None:
    if not isinstance(value, torch.Tensor) or value.dim() != 1 or not value.is_floating_point():
        raise TreeStructureError(
            f"`{attribute.name}` must be a 1-D floating tensor of shape (V,); "
            f"got {type(value).__name__} {getattr(value, 'shape', '')}."
        )


@attrs.frozen
class Deterministic:
    """The children are fixed candidates, not samples (Token Recycling, prompt lookup, top-k).

    Verified as point-mass drafts: child ``i`` is accepted with probability
    ``r_i(c_i)`` where ``r_1`` is the target distribution and
    ``r_{i+1} = norm(r_i with c_i zeroed)``.
    """


DETERMINISTIC = Deterministic()


@attrs.frozen(eq=False)
class IID:
    """The children are independent draws from ``draft_probs`` (SpecInfer, chain drafts).

    Verified by multi-round rejection sampling. ``draft_probs``: float, Shape: (V,).
    """

    draft_probs: torch.Tensor = attrs.field(validator=_check_probs)


@attrs.frozen(eq=False)
class WithoutReplacement:
    """The children are sequential draws without replacement from ``draft_probs``.

    RSD-C, RSD-S and DySpec. Verified by recursive rejection sampling.
    ``draft_probs``: float, Shape: (V,).
    """

    draft_probs: torch.Tensor = attrs.field(validator=_check_probs)


ProposalLaw: TypeAlias = Deterministic | IID | WithoutReplacement


def _as_index_tensor(name: str, value: object) -> torch.Tensor:
    tensor = torch.as_tensor(value, dtype=torch.long)
    if tensor.dim() != 1:
        raise TreeStructureError(f"`{name}` must be 1-D; got shape {tuple(tensor.shape)}.")
    return tensor.cpu()


def _law_tuple(value: Iterable[ProposalLaw | None]) -> tuple[ProposalLaw | None, ...]:
    return tuple(value)


def _validate_tree(tokens: torch.Tensor, parents: torch.Tensor, laws: tuple) -> None:
    # Python on the lists: drafters build a tree a step, and its few nodes cost less to
    # check here than through tensor operators
    n = tokens.numel()
    if parents.numel() != n:
        raise TreeStructureError(
            f"`parents` must have one entry per token; got {parents.numel()} parents "
            f"for {n} tokens."
        )
    if n and (low := min(tokens.tolist())) < 0:
        raise TreeStructureError(f"`tokens` must be >= 0; got {low}.")
    for i, parent in enumerate(parents.tolist()):
        if not -1 <= parent < i:
            raise TreeStructureError(
                f"`parents[{i}]` must be -1 (the root) or the index of an earlier node; "
                f"got {parent}. Nodes must be stored parent-before-child."
            )
    if len(laws) != n + 1:
        raise TreeStructureError(
            f"`laws` must have N + 1 = {n + 1} entries (row 0 the root, row i + 1 node i); "
            f"got {len(laws)}."
        )
    for law in laws:
        if law is not None and not isinstance(law, Deterministic | IID | WithoutReplacement):
            raise TreeStructureError(
                f"`laws` entries must be Deterministic, IID, WithoutReplacement or None; "
                f"got {type(law).__name__}."
            )


@attrs.frozen(eq=False)
class DraftTree:
    """An immutable draft tree.

    Attributes:
        tokens: int64, Shape: (N,). Token id of each node.
        parents: int64, Shape: (N,). Parent node index, ``-1`` for the root's children;
            ``parents[i] < i`` always holds.
        laws: length N + 1. ``laws[0]`` is the law of the root's children and
            ``laws[i + 1]`` that of node ``i``'s children; ``None`` for rows with no child.

    Build one with :meth:`from_parents` or :meth:`from_paths`; both fill in the
    laws of leaves with ``None`` and of inner rows with the given default.
    """

    tokens: torch.Tensor = attrs.field(converter=lambda v: _as_index_tensor("tokens", v))
    parents: torch.Tensor = attrs.field(converter=lambda v: _as_index_tensor("parents", v))
    laws: tuple[ProposalLaw | None, ...] = attrs.field(converter=_law_tuple)

    def __attrs_post_init__(self) -> None:
        _validate_tree(self.tokens, self.parents, self.laws)

    # -- constructors -----------------------------------------------------------------

    @classmethod
    def empty(cls) -> DraftTree:
        """A tree that is only the root: the engine then decodes one token per step.

        One shared instance (the tree is immutable): a drafter that is not drafting returns
        it every step, and building it costs more than the rest of such a step's work."""
        if cls is DraftTree:
            return _EMPTY
        return cls(torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long), (None,))

    @classmethod
    def from_parents(
        cls,
        tokens: Sequence[int] | torch.Tensor,
        parents: Sequence[int] | torch.Tensor,
        laws: Sequence[ProposalLaw | None] | ProposalLaw = DETERMINISTIC,
    ) -> DraftTree:
        """Build a tree from parallel token and parent lists.

        Args:
            tokens: Shape: (N,).
            parents: Shape: (N,). ``-1`` for children of the root.
            laws: either one law for every row that has children, or a sequence
                of N + 1 entries (row 0 the root).
        """
        tokens_t = _as_index_tensor("tokens", tokens)
        parents_t = _as_index_tensor("parents", parents)
        if isinstance(laws, Deterministic | IID | WithoutReplacement):
            n = tokens_t.numel()
            has_children = [False] * (n + 1)
            if parents_t.numel() == n:
                for parent in parents_t.tolist():
                    # clamped so a bad parent reaches the validator's TreeStructureError
                    has_children[min(max(parent + 1, 0), n)] = True
            law_rows: tuple = tuple(laws if flag else None for flag in has_children)
        else:
            law_rows = tuple(laws)
        return cls(tokens_t, parents_t, law_rows)

    @classmethod
    def from_paths(
        cls,
        paths: Sequence[Sequence[int]],
        laws: ProposalLaw = DETERMINISTIC,
    ) -> DraftTree:
        """Build a trie from token paths that start below the root.

        Shared prefixes are merged; nodes are numbered breadth-first and children
        keep the order in which they first appear in ``paths``.
        """
        index: dict[tuple[int, ...], int] = {}
        order: list[tuple[int, ...]] = []
        for path in paths:
            if len(path) == 0:
                raise TreeStructureError("`paths` must not contain an empty path.")
            for depth in range(1, len(path) + 1):
                prefix = tuple(int(t) for t in path[:depth])
                if prefix not in index:
                    index[prefix] = -1
                    order.append(prefix)
        order.sort(key=len)  # stable: keeps first-appearance order within a depth
        for i, prefix in enumerate(order):
            index[prefix] = i
        tokens = [prefix[-1] for prefix in order]
        parents = [index[prefix[:-1]] if len(prefix) > 1 else -1 for prefix in order]
        return cls.from_parents(tokens, parents, laws)

    # -- derived data (cached) --------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.numel())

    def __len__(self) -> int:
        return self.num_nodes

    @functools.cached_property
    def depth(self) -> torch.Tensor:
        """int64, Shape: (N,). Depth of each node; children of the root have depth 1."""
        depth: list[int] = []
        for parent in self.parents.tolist():
            depth.append(1 if parent < 0 else depth[parent] + 1)
        return torch.tensor(depth, dtype=torch.long)

    @functools.cached_property
    def ancestor_mask(self) -> torch.Tensor:
        """bool, Shape: (N, N). ``mask[i, j]`` is True when node j is node i or its ancestor."""
        n = self.num_nodes
        mask = torch.eye(n, dtype=torch.bool)
        rows = torch.arange(n)
        ancestor = self.parents.clone()  # walk every node's ancestors one level per pass
        for _ in range(self.max_depth - 1):
            has = ancestor >= 0
            mask[rows[has], ancestor[has]] = True
            ancestor = torch.where(has, self.parents[ancestor.clamp(min=0)], ancestor)
        return mask

    @property
    def position_offsets(self) -> torch.Tensor:
        """int64, Shape: (N,). Position of each node relative to the root's position."""
        return self.depth

    @functools.cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """Child node indices by row: ``children[0]`` the root's, ``children[i + 1]`` node i's."""
        rows: list[list[int]] = [[] for _ in range(self.num_nodes + 1)]
        for i, parent in enumerate(self.parents.tolist()):
            rows[parent + 1].append(i)
        return tuple(tuple(row) for row in rows)

    @functools.cached_property
    def max_depth(self) -> int:
        return int(self.depth.max()) if self.num_nodes else 0

    @functools.cached_property
    def dfs_order(self) -> tuple[int, ...]:
        """Node indices in depth-first pre-order, children in drawn order."""
        order: list[int] = []
        stack = list(reversed(self.children[0]))
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(reversed(self.children[node + 1]))
        return tuple(order)

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node`` (inclusive)."""
        path = []
        parents = self.parents
        while node >= 0:
            path.append(node)
            node = int(parents[node])
        return path[::-1]

    def path_tokens(self, node: int) -> list[int]:
        """Token ids along the path to ``node``."""
        return [int(self.tokens[i]) for i in self.path_to(node)]

    def truncated(self, num_nodes: int) -> DraftTree:
        """The first ``num_nodes`` nodes (a valid tree, since parents come first)."""
        if num_nodes >= self.num_nodes:
            return self
        parents = self.parents[:num_nodes]
        has_children = torch.zeros(num_nodes + 1, dtype=torch.bool)
        if num_nodes:
            has_children[parents + 1] = True
        laws = tuple(
            law if flag else None
            for law, flag in zip(self.laws[: num_nodes + 1], has_children.tolist(), strict=True)
        )
        return DraftTree(self.tokens[:num_nodes], parents, laws)


_EMPTY = DraftTree(torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long), (None,))

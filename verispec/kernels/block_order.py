"""Node orders for block-sparse tree attention (DySpec, Xiong et al., appendix C).

A tree attention kernel walks the ancestor mask in tiles of ``block_m`` queries by
``block_n`` keys and skips every tile the mask leaves empty, so its work is the
number of *non-empty blocks*. That number depends on the order of the nodes.
DySpec (appendix C) renumbers the nodes in depth-first order: a subtree is then a
contiguous range and each node's ancestors are packed before it, which usually
leaves fewer non-empty blocks than breadth-first order.

Usually, not always: ``proofs_tests/kernels/test_block_order.py`` finds trees where
depth-first order has *more* non-empty blocks than the stored order (the smallest
has 8 nodes). :func:`block_friendly_order` therefore returns the depth-first order
only when it does not increase the count, and the stored order otherwise.

Any order used to score a tree must keep parents before children (both orders here
do), so :func:`permute_tree` gives a valid :class:`~verispec.core.tree.DraftTree`.

Shape glossary: N tree nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from verispec.core.tree import DraftTree
from verispec.core.validate import integer
from verispec.errors import TreeStructureError

__all__ = [
    "block_friendly_order",
    "block_states",
    "count_nonempty_blocks",
    "dfs_order",
    "permute_tree",
]


def dfs_order(tree: DraftTree) -> torch.Tensor:
    """int64, Shape: (N,). Depth-first pre-order, children in stored (drawn) order.

    ``order[k]`` is the node placed at position ``k``.
    """
    return torch.tensor(tree.dfs_order, dtype=torch.long)


def block_states(mask: torch.Tensor, block_m: int, block_n: int) -> torch.Tensor:
    """Classify the tiles of ``mask``: 0 empty, 1 full, 2 partial.

    Args:
        mask: bool, Shape: (..., M, K). True where a query sees a key.
        block_m, block_n: tile height (queries) and width (keys).

    Returns:
        int8, Shape: (..., ceil(M / block_m), ceil(K / block_n)). Positions past the
        edges are ignored (they make a tile neither non-empty nor partial). Computed on
        ``mask``'s device without a host sync.
    """
    integer("block_m", block_m, 1)
    integer("block_n", block_n, 1)
    *lead, rows, cols = mask.shape
    mb, nb = -(-rows // block_m), -(-cols // block_n)
    padded = torch.zeros((*lead, mb * block_m, nb * block_n), dtype=torch.int32, device=mask.device)
    padded[..., :rows, :cols] = mask
    seen = padded.reshape(*lead, mb, block_m, nb, block_n).sum(dim=(-1, -3))  # (..., mb, nb)
    tile_rows = (rows - torch.arange(mb, device=mask.device) * block_m).clamp(max=block_m)
    tile_cols = (cols - torch.arange(nb, device=mask.device) * block_n).clamp(max=block_n)
    in_range = tile_rows[:, None] * tile_cols[None, :]  # (mb, nb) entries inside the mask
    return torch.where(seen == 0, 0, torch.where(seen == in_range, 1, 2)).to(torch.int8)


def count_nonempty_blocks(
    mask: torch.Tensor,
    block_m: int,
    block_n: int | None = None,
    order: torch.Tensor | Sequence[int] | None = None,
) -> int:
    """Non-empty ``block_m x block_n`` tiles of ``mask`` with nodes renumbered by ``order``.

    Args:
        mask: bool, Shape: (N, N). An ancestor mask (``DraftTree.ancestor_mask``).
        block_m: tile height; ``block_n`` (tile width) defaults to it.
        order: node placed at each position, Shape: (N,); ``None`` keeps the stored order.

    Returns:
        The number of tiles that hold at least one True entry (a host sync).
    """
    block_n = block_m if block_n is None else block_n
    if order is not None:
        index = torch.as_tensor(order, dtype=torch.long, device=mask.device)
        mask = mask.index_select(0, index).index_select(1, index)
    return int((block_states(mask, block_m, block_n) != 0).sum())


def block_friendly_order(tree: DraftTree, block_m: int, block_n: int | None = None) -> torch.Tensor:
    """The depth-first order if it has no more non-empty blocks than the stored order.

    Returns:
        int64, Shape: (N,). ``dfs_order(tree)`` or ``arange(N)`` (ties keep the stored
        order, which needs no permutation).
    """
    stored = torch.arange(tree.num_nodes)
    if tree.num_nodes == 0:
        return stored
    dfs = dfs_order(tree)
    mask = tree.ancestor_mask
    if count_nonempty_blocks(mask, block_m, block_n, dfs) < count_nonempty_blocks(
        mask, block_m, block_n
    ):
        return dfs
    return stored


def permute_tree(tree: DraftTree, order: torch.Tensor | Sequence[int]) -> DraftTree:
    """Renumber the nodes of ``tree``: new node ``k`` is old node ``order[k]``.

    Tokens, parents and laws move with their nodes; siblings keep their relative
    order when ``order`` does (depth-first order does), so verification is unchanged.
    Map node indices back with ``order[new_index]``.

    Raises:
        TreeStructureError: ``order`` is not a permutation, or puts a child before its
            parent.
    """
    index = torch.as_tensor(order, dtype=torch.long).cpu()
    n = tree.num_nodes
    if index.shape != (n,) or not torch.equal(torch.sort(index).values, torch.arange(n)):
        raise TreeStructureError(
            f"`order` must be a permutation of the {n} node indices; got {index.tolist()}."
        )
    new_of_old = torch.empty(n, dtype=torch.long)
    new_of_old[index] = torch.arange(n)
    old_parents = tree.parents[index]
    parents = torch.where(old_parents >= 0, new_of_old[old_parents.clamp(min=0)], -1)
    if bool((parents >= torch.arange(n)).any()):
        raise TreeStructureError(
            "`order` must keep every parent before its children (a topological order)."
        )
    laws = (tree.laws[0], *(tree.laws[i + 1] for i in index.tolist()))
    return DraftTree(tree.tokens[index], parents, laws)

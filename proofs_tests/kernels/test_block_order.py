"""Block counting and DySpec's depth-first node order (appendix C)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from verispec.core.sampling import SamplingParams
from verispec.core.tree import DraftTree
from verispec.core.types import DecodeState
from verispec.drafters.dyspec import DySpec
from verispec.drafters.templates import resolve_template
from verispec.errors import TreeStructureError
from verispec.kernels.block_order import (
    block_friendly_order,
    block_states,
    count_nonempty_blocks,
    dfs_order,
    permute_tree,
)
from verispec.models.markov import MarkovModel
from verispec.verifiers import Greedy

GPU_BLOCKS = (16, 32, 64)


def _tree(parents: list[int]) -> DraftTree:
    return DraftTree.from_parents(list(range(len(parents))), parents)


def _bfs_numbered(parents: list[int]) -> DraftTree:
    """The same tree with nodes renumbered breadth-first (how templates are stored)."""
    tree = _tree(parents)
    depth = tree.depth.tolist()
    return permute_tree(tree, sorted(range(len(parents)), key=lambda i: depth[i]))


def _random_parents(n: int, g: torch.Generator) -> list[int]:
    return [-1] + [int(torch.randint(-1, i, (), generator=g)) for i in range(1, n)]


@given(
    rows=st.integers(1, 20),
    cols=st.integers(1, 20),
    block_m=st.integers(1, 7),
    block_n=st.integers(1, 7),
    seed=st.integers(0, 2**16),
)
def test_block_states_match_brute_force(rows, cols, block_m, block_n, seed) -> None:  # type: ignore[no-untyped-def]
    """Every tile is classified empty (0), full (1) or partial (2) exactly as a loop over its
    in-range entries says, for any mask and tile sizes that do not divide it."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(rows, cols, generator=g) < float(torch.rand((), generator=g))
    states = block_states(mask, block_m, block_n)
    for i in range(states.shape[0]):
        for j in range(states.shape[1]):
            tile = mask[i * block_m : (i + 1) * block_m, j * block_n : (j + 1) * block_n]
            expected = 0 if not tile.any() else 1 if tile.all() else 2
            assert int(states[i, j]) == expected
    assert count_nonempty_blocks(mask, block_m, block_n) == int((states != 0).sum())


def test_dfs_lowers_the_count_on_token_recycling_2_2_2() -> None:
    """On Token Recycling's 80-node "2.2.2" template (stored breadth-first), depth-first order
    lowers the non-empty 16x16 tiles from 15 to 11 and the 32x32 tiles from 6 to 5, and
    never raises the count at any tile size from 4 to 64."""
    template = resolve_template("2.2.2", 8)
    tree = _tree(template.parents.tolist())
    mask, order = tree.ancestor_mask, dfs_order(tree)
    for block in (4, 8, 16, 32, 64):
        assert count_nonempty_blocks(mask, block, order=order) <= count_nonempty_blocks(mask, block)
    assert (count_nonempty_blocks(mask, 16), count_nonempty_blocks(mask, 16, order=order)) == (
        15,
        11,
    )
    assert (count_nonempty_blocks(mask, 32), count_nonempty_blocks(mask, 32, order=order)) == (6, 5)


@pytest.mark.parametrize("budget", [64, 128, 256])
def test_dfs_never_raises_the_count_on_dyspec_trees(budget: int) -> None:
    """On DySpec trees (Algorithm 1, a random Markov draft over 200 tokens, stored in pop
    order), depth-first order never raises the non-empty tile count at 16, 32 and 64, and
    lowers it at 16 for trees of 128 nodes and more."""
    g = torch.Generator().manual_seed(budget)
    drafter = DySpec(MarkovModel.random(200, g, scale=2.0), budget=budget)
    state = DecodeState([1, 2, 3], 3, SamplingParams(temperature=1.0), g)
    drafter.begin(state)
    tree = drafter.propose(state)
    mask, order = tree.ancestor_mask, dfs_order(tree)
    counts = [
        (count_nonempty_blocks(mask, b), count_nonempty_blocks(mask, b, order=order))
        for b in GPU_BLOCKS
    ]
    assert all(dfs <= stored for stored, dfs in counts), counts
    if budget >= 128:
        assert counts[0][1] < counts[0][0], counts


def test_dfs_on_random_trees_lowers_the_total_and_never_raises_at_gpu_tiles() -> None:
    """Over 60 random recursive trees of 8-256 nodes numbered breadth-first, depth-first
    order never raises the count at tile sizes 16, 32 and 64, and lowers the total at 16 by
    more than a third."""
    g = torch.Generator().manual_seed(0)
    totals = {b: [0, 0] for b in GPU_BLOCKS}
    for _ in range(60):
        tree = _bfs_numbered(_random_parents(int(torch.randint(8, 257, (), generator=g)), g))
        mask, order = tree.ancestor_mask, dfs_order(tree)
        for b in GPU_BLOCKS:
            stored = count_nonempty_blocks(mask, b)
            dfs = count_nonempty_blocks(mask, b, order=order)
            assert dfs <= stored
            totals[b][0] += stored
            totals[b][1] += dfs
    assert totals[16][1] < 0.66 * totals[16][0], totals


def test_dfs_can_raise_the_count_so_the_guarded_order_keeps_the_stored_one() -> None:
    """Depth-first order is not always better: on this 8-node tree with 2x2 tiles it has 10
    non-empty tiles against 8 for breadth-first order, and ``block_friendly_order`` then
    keeps the stored order."""
    tree = _tree([-1, -1, -1, 1, 1, 4, 4, 6])
    mask = tree.ancestor_mask
    assert count_nonempty_blocks(mask, 2) == 8
    assert count_nonempty_blocks(mask, 2, order=dfs_order(tree)) == 10
    assert torch.equal(block_friendly_order(tree, 2), torch.arange(8))


@given(seed=st.integers(0, 2**16), n=st.integers(0, 40), block=st.sampled_from([2, 4, 8, 16]))
def test_block_friendly_order_never_raises_the_count(seed: int, n: int, block: int) -> None:
    """``block_friendly_order`` never has more non-empty tiles than the stored order."""
    g = torch.Generator().manual_seed(seed)
    tree = _tree(_random_parents(n, g)) if n else DraftTree.empty()
    order = block_friendly_order(tree, block)
    if n:
        mask = tree.ancestor_mask
        assert count_nonempty_blocks(mask, block, order=order) <= count_nonempty_blocks(mask, block)


@given(seed=st.integers(0, 2**16), n=st.integers(1, 30))
def test_permuted_tree_has_the_permuted_mask_and_the_same_greedy_verdict(seed: int, n: int) -> None:
    """Renumbering a tree depth-first permutes its ancestor mask accordingly, and greedy
    verification of the renumbered tree keeps the same tokens (its nodes map back through
    the order)."""
    g = torch.Generator().manual_seed(seed)
    parents = _random_parents(n, g)
    tokens = torch.randint(0, 5, (n,), generator=g)
    tree = DraftTree.from_parents(tokens, parents)
    order = dfs_order(tree)
    permuted = permute_tree(tree, order)
    assert torch.equal(permuted.ancestor_mask, tree.ancestor_mask[order][:, order])
    logits = torch.randn(n + 1, 5, generator=g, dtype=torch.float64)
    row_of_new = torch.cat([torch.zeros(1, dtype=torch.long), order + 1])
    original = Greedy().verify(tree, logits)
    renumbered = Greedy().verify(permuted, logits[row_of_new])
    assert original.committed_tokens(tree) == renumbered.committed_tokens(permuted)
    assert [int(order[i]) for i in renumbered.accepted] == list(original.accepted)


def test_permute_tree_refuses_bad_orders() -> None:
    """A non-permutation or an order that puts a child first raises TreeStructureError."""
    tree = _tree([-1, 0, 1])
    with pytest.raises(TreeStructureError, match="permutation"):
        permute_tree(tree, [0, 0, 1])
    with pytest.raises(TreeStructureError, match="parent"):
        permute_tree(tree, [1, 0, 2])

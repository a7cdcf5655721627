"""Tests of verispec/core/tree.py: DraftTree validation, constructors and derived data."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from strategies import parent_lists

from verispec.core.tree import DETERMINISTIC, IID, DraftTree, WithoutReplacement
from verispec.errors import TreeStructureError

# -- validation ----------------------------------------------------------------------


def test_parents_must_match_tokens_in_length() -> None:
    """One parent per token."""
    with pytest.raises(TreeStructureError, match="one entry per token"):
        DraftTree([1, 2], [-1], (None, None, None))


def test_tokens_must_be_non_negative() -> None:
    """Token ids are >= 0."""
    with pytest.raises(TreeStructureError, match="`tokens` must be >= 0"):
        DraftTree.from_parents([1, -3], [-1, 0])


@pytest.mark.parametrize("parents", [[-1, 1], [-1, 5], [0, -1], [-2, -1]])
def test_parent_must_be_root_or_an_earlier_node(parents: list[int]) -> None:
    """A parent index is -1 or smaller than the child's own index (parent before child)."""
    with pytest.raises(TreeStructureError, match="parent-before-child"):
        DraftTree.from_parents([4, 5], parents)


def test_laws_need_one_entry_per_row() -> None:
    """``laws`` has N + 1 entries: the root's row and one per node."""
    with pytest.raises(TreeStructureError, match="N \\+ 1 = 3 entries"):
        DraftTree([1, 2], [-1, 0], (DETERMINISTIC, None))


def test_laws_must_be_proposal_laws() -> None:
    """Anything but Deterministic, IID, WithoutReplacement or None is rejected."""
    with pytest.raises(TreeStructureError, match="got str"):
        DraftTree([1], [-1], ("iid", None))


def test_index_arrays_must_be_one_dimensional() -> None:
    """tokens and parents are 1-D."""
    with pytest.raises(TreeStructureError, match="`tokens` must be 1-D"):
        DraftTree([[1, 2]], [-1, 0], (None, None, None))


@pytest.mark.parametrize("law", [IID, WithoutReplacement])
def test_draft_probs_must_be_a_float_vector(law) -> None:
    """A law's draft distribution is a 1-D floating tensor."""
    with pytest.raises(TreeStructureError, match="1-D floating tensor"):
        law(torch.tensor([1, 2]))
    with pytest.raises(TreeStructureError, match="1-D floating tensor"):
        law(torch.ones(2, 3))


# -- constructors --------------------------------------------------------------------


def test_empty_tree_is_only_the_root() -> None:
    """N = 0: no nodes, one row (the root) without children or law."""
    tree = DraftTree.empty()
    assert tree.num_nodes == len(tree) == 0
    assert tree.laws == (None,)
    assert tree.children == ((),)
    assert tree.dfs_order == ()
    assert tree.max_depth == 0
    assert tree.depth.shape == (0,) and tree.ancestor_mask.shape == (0, 0)
    assert tree.truncated(0) is tree


def test_chain_of_one() -> None:
    """N = 1: the root's single child, at depth 1, its own ancestor."""
    law = IID(torch.tensor([0.5, 0.5]))
    tree = DraftTree.from_parents([1], [-1], law)
    assert tree.laws == (law, None)
    assert tree.children == ((0,), ())
    assert tree.depth.tolist() == [1] and tree.max_depth == 1
    assert tree.ancestor_mask.tolist() == [[True]]
    assert tree.path_to(0) == [0] and tree.path_tokens(0) == [1]
    assert tree.truncated(0).laws == (None,)


def test_from_parents_gives_inner_rows_the_law_and_leaves_none() -> None:
    """One law for every row with children; leaves get None."""
    tree = DraftTree.from_parents([5, 6, 7, 8], [-1, -1, 0, 2], DETERMINISTIC)
    assert tree.laws == (DETERMINISTIC, DETERMINISTIC, None, DETERMINISTIC, None)


def test_from_parents_takes_a_law_per_row() -> None:
    """A sequence of N + 1 laws is kept row by row."""
    law = WithoutReplacement(torch.tensor([0.2, 0.8]))
    tree = DraftTree.from_parents([0, 1], [-1, 0], [law, DETERMINISTIC, None])
    assert tree.laws == (law, DETERMINISTIC, None)


def test_from_paths_merges_prefixes_breadth_first_in_first_appearance_order() -> None:
    """Shared prefixes become one node; nodes are numbered by depth, then first appearance."""
    tree = DraftTree.from_paths([[4, 2, 9], [4, 3], [7], [4, 2, 1]])
    # depth 1: 4, 7; depth 2: 4-2, 4-3; depth 3: 4-2-9, 4-2-1
    assert tree.tokens.tolist() == [4, 7, 2, 3, 9, 1]
    assert tree.parents.tolist() == [-1, -1, 0, 0, 2, 2]
    assert tree.path_tokens(5) == [4, 2, 1]


def test_from_paths_rejects_an_empty_path() -> None:
    """Every path starts below the root, so it has at least one token."""
    with pytest.raises(TreeStructureError, match="empty path"):
        DraftTree.from_paths([[1], []])


# -- derived data, against brute force ----------------------------------------------


@settings(max_examples=150)
@given(parents=parent_lists(max_nodes=14))
def test_derived_data_matches_brute_force(parents: list[int]) -> None:
    """depth, ancestor mask, children, DFS order and paths agree with direct recomputation."""
    tokens = [(7 * i) % 11 for i in range(len(parents))]
    tree = DraftTree.from_parents(tokens, parents)
    n = len(parents)

    def ancestors(i: int) -> list[int]:
        chain = []
        while i >= 0:
            chain.append(i)
            i = parents[i]
        return chain

    assert tree.depth.tolist() == [len(ancestors(i)) for i in range(n)]
    assert tree.position_offsets.tolist() == tree.depth.tolist()
    assert tree.max_depth == max((len(ancestors(i)) for i in range(n)), default=0)
    mask = [[j in ancestors(i) for j in range(n)] for i in range(n)]
    assert tree.ancestor_mask.tolist() == mask
    for row in range(n + 1):
        assert list(tree.children[row]) == [i for i in range(n) if parents[i] == row - 1]
    for i in range(n):
        assert tree.path_to(i) == ancestors(i)[::-1]
        assert tree.path_tokens(i) == [tokens[j] for j in ancestors(i)[::-1]]
    # DFS pre-order: a permutation where every node follows its parent and its subtree is
    # contiguous, with siblings in drawn order
    order = list(tree.dfs_order)
    assert sorted(order) == list(range(n))
    position = {node: k for k, node in enumerate(order)}
    for i in range(n):
        subtree = [j for j in range(n) if i in ancestors(j)]
        span = sorted(position[j] for j in subtree)
        assert span == list(range(position[i], position[i] + len(subtree)))
    for row in range(n + 1):
        kids = tree.children[row]
        assert [position[k] for k in kids] == sorted(position[k] for k in kids)


@settings(max_examples=100)
@given(parents=parent_lists(max_nodes=14))
def test_truncated_is_the_valid_prefix_tree(parents: list[int]) -> None:
    """truncated(m) keeps the first m nodes, and laws only on rows that still have children."""
    tree = DraftTree.from_parents(list(range(len(parents))), parents, DETERMINISTIC)
    for m in range(len(parents) + 2):
        cut = tree.truncated(m)
        kept = min(m, len(parents))
        assert cut.tokens.tolist() == tree.tokens.tolist()[:kept]
        assert cut.parents.tolist() == parents[:kept]
        for row in range(kept + 1):
            has_children = any(p == row - 1 for p in parents[:kept])
            assert (cut.laws[row] is not None) == has_children
    assert tree.truncated(len(parents)) is tree

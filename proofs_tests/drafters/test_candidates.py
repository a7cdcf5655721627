"""Tests of verispec/drafters/candidates.py: calibration cells, union of tries, values by
agreement, subtrees and tried/hit masks."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from verispec.core import DraftTree, Verdict
from verispec.drafters.candidates import (
    Calibration,
    Candidates,
    fuse,
    revalue,
    subtree,
    tried_and_hit,
    update_by_agreement,
)


def _calibration(rows: int = 3) -> Calibration:
    return Calibration((0.25, 0.5, 0.75), torch.tensor([0.1, 0.3, 0.6, 0.9]), rows, 8.0, 1.0)


@given(st.integers(0, 5), st.floats(0.0, 1.0))
def test_cell_matches_cells(row: int, score: float) -> None:
    """The scalar cell() is the cell that the tensor cells() computes (row = depth - 1)."""
    calibration = _calibration()
    want = calibration.cells(torch.tensor(row + 1), torch.tensor(score, dtype=torch.float64))
    assert calibration.cell(row, score) == int(want)


def _trie(paths: list[tuple[int, ...]], values: list[float], cells: list[list[int]]) -> Candidates:
    index = {path: i for i, path in enumerate(paths)}
    parents = [index[p[:-1]] if len(p) > 1 else -1 for p in paths]
    return Candidates.from_lists([p[-1] for p in paths], parents, values,
                                 [len(p) for p in paths], cells, len(cells[0]))  # fmt: skip


def _by_path(cands: Candidates) -> dict[tuple[int, ...], int]:
    paths: list[tuple[int, ...]] = []
    for i in range(cands.num_nodes):
        parent = int(cands.parents[i])
        paths.append((*(paths[parent] if parent >= 0 else ()), int(cands.tokens[i])))
    return {path: i for i, path in enumerate(paths)}


def test_fuse_is_the_union_by_token_path() -> None:
    """Paths in both tries appear once with the larger value and both sources' cells;
    paths in one keep their value and cells; parents stay before children."""
    a = _trie([(1,), (1, 2), (3,)], [0.5, 0.2, 0.4], [[4, -1], [5, -1], [6, -1]])
    b = _trie([(1,), (1, 7), (1, 2)], [0.6, 0.3, 0.1], [[-1, 8], [-1, 9], [-1, 10]])
    union = fuse(a, b)
    at = _by_path(union)
    assert set(at) == {(1,), (1, 2), (3,), (1, 7)}
    assert float(union.values[at[(1,)]]) == 0.6 and float(union.values[at[(1, 2)]]) == 0.2
    assert union.cells[at[(1,)]].tolist() == [4, 8] and union.cells[at[(1, 7)]].tolist() == [-1, 9]
    assert all(int(p) < i for i, p in enumerate(union.parents))


def test_revalue_uses_exclusive_rates_alone_and_shared_rates_together() -> None:
    """A node one source proposed takes that source's exclusive rate, a node both proposed
    the larger shared rate, and values multiply down each path."""
    exclusive = [_calibration(), _calibration()]
    shared = [_calibration(), _calibration()]
    shared[0].prior = torch.tensor([0.2, 0.4, 0.7, 0.95])
    cands = _trie([(1,), (1, 2), (3,)], [0.0, 0.0, 0.0], [[2, 3], [1, -1], [-1, 0]])
    out = revalue(cands, exclusive, shared)
    shared_rate = max(float(shared[0].rates()[2]), float(shared[1].rates()[3]))
    assert float(out.values[0]) == pytest.approx(shared_rate, rel=1e-12)
    assert float(out.values[1]) == pytest.approx(shared_rate * float(exclusive[0].rates()[1]))
    assert float(out.values[2]) == pytest.approx(float(exclusive[1].rates()[0]), rel=1e-12)


def test_update_by_agreement_counts_each_node_in_the_calibration_it_is_read_from() -> None:
    """Exclusive nodes count in their source's exclusive calibration, shared nodes in every
    owning source's shared calibration; untried nodes nowhere."""
    exclusive, shared = [_calibration(), _calibration()], [_calibration(), _calibration()]
    cells = torch.tensor([[2, 3], [1, -1], [-1, 0], [5, -1]])
    tried = torch.tensor([True, True, True, False])
    hit = torch.tensor([True, False, True, False])
    update_by_agreement(cells, tried, hit, exclusive, shared)
    assert exclusive[0].tries.view(-1).nonzero().flatten().tolist() == [1]
    assert exclusive[1].tries.view(-1).nonzero().flatten().tolist() == [0]
    assert shared[0].tries.view(-1).nonzero().flatten().tolist() == [2]
    assert shared[1].tries.view(-1).nonzero().flatten().tolist() == [3]
    assert float(shared[1].hits.sum()) == 1 and float(exclusive[0].hits.sum()) == 0


def test_subtree_orders_by_depth_then_value() -> None:
    """subtree() sends the chosen nodes by depth, in the given (value) order within a depth,
    with parents renumbered, and returns their candidates in the tree's order."""
    cands = _trie([(1,), (1, 2), (3,), (1, 4)], [0.9, 0.5, 0.6, 0.4], [[0], [1], [2], [3]])
    tree, kept = subtree(cands, torch.tensor([0, 2, 1]))
    assert [tree.path_tokens(i) for i in range(tree.num_nodes)] == [[1], [3], [1, 2]]
    assert kept.cells.flatten().tolist() == [0, 2, 1]


def test_tried_and_hit() -> None:
    """Tried: nodes whose parent is the root or accepted; hit: accepted nodes."""
    tree = DraftTree.from_parents([1, 2, 3, 4], [-1, -1, 0, 2])
    tried, hit = tried_and_hit(tree, Verdict((0,), 9))
    assert tried.tolist() == [True, True, True, False]
    assert hit.tolist() == [True, False, False, False]

"""SpecInferTree: i.i.d. draft samples with per-level branching factors."""

from __future__ import annotations

import pytest
import torch
from drafter_states import decode_state

from verispec.core import DETERMINISTIC, IID
from verispec.drafters.specinfer import SpecInferTree
from verispec.errors import ConfigError
from verispec.models.markov import MarkovModel


@pytest.fixture
def draft() -> MarkovModel:
    return MarkovModel.random(6, torch.Generator().manual_seed(4), order=2, scale=1.5)


def test_level_sizes_parents_and_iid_laws(draft: MarkovModel) -> None:
    """Branching (3, 2, 2) gives 3 + 6 + 12 nodes stored level by level, each node with
    its level's number of children, and every inner row's law is IID of the processed
    draft distribution at that row's context."""
    state = decode_state([5, 0], temperature=0.7, seed=3)
    drafter = SpecInferTree(draft, branching=(3, 2, 2))
    drafter.begin(state)
    tree = drafter.propose(state)
    assert tree.num_nodes == 21
    assert tree.depth.tolist() == [1] * 3 + [2] * 6 + [3] * 12
    assert [len(c) for c in tree.children[: 1 + 9]] == [3] + [2] * 9
    for row in range(1 + 9):
        law = tree.laws[row]
        assert isinstance(law, IID)
        path = [] if row == 0 else tree.path_tokens(row - 1)
        expected = state.sampling.probs(draft.next_logits([5, 0, *path]), torch.float64)
        assert torch.allclose(law.draft_probs, expected, atol=0, rtol=1e-12)
    assert all(law is None for law in tree.laws[10:])


def test_one_draft_call_per_level(draft: MarkovModel) -> None:
    """The draft is called once per level but the last, each call feeding the whole level."""
    state = decode_state([1], temperature=1.0)
    drafter = SpecInferTree(draft, branching=(3, 2, 2))
    drafter.begin(state)
    before = len(draft.call_log)
    drafter.propose(state)
    assert draft.call_log[before:] == [(0, 0), (0, 3), (3, 6)]


def test_greedy_children_are_the_top_choices(draft: MarkovModel) -> None:
    """At temperature 0 a node's children are its b most likely draft tokens, in rank order,
    distinct, with the DETERMINISTIC law."""
    state = decode_state([2, 3], temperature=0.0)
    drafter = SpecInferTree(draft, branching=(4, 3))
    drafter.begin(state)
    tree = drafter.propose(state)
    for row in range(1 + 4):
        path = [] if row == 0 else tree.path_tokens(row - 1)
        ranked = torch.argsort(draft.next_logits([2, 3, *path]), descending=True).tolist()
        kids = [int(tree.tokens[c]) for c in tree.children[row]]
        assert kids == ranked[: len(kids)]
        assert tree.laws[row] is DETERMINISTIC


def test_budget_cuts_the_tree_in_level_order(draft: MarkovModel) -> None:
    """A budget of 5 keeps the 3 root children and the first two grandchildren."""
    state = decode_state([1], temperature=1.0)
    drafter = SpecInferTree(draft, branching=(3, 2), budget=5)
    drafter.begin(state)
    tree = drafter.propose(state)
    assert tree.parents.tolist() == [-1, -1, -1, 0, 0]


def test_siblings_are_independent_draws() -> None:
    """Siblings may repeat (independent draws): with a peaked draft, duplicates appear."""
    probs = torch.tensor([[0.9, 0.1], [0.5, 0.5]], dtype=torch.float64)
    draft = MarkovModel.from_probs(probs)
    state = decode_state([0], temperature=1.0, seed=1)
    drafter = SpecInferTree(draft, branching=(4,))
    drafter.begin(state)
    tree = drafter.propose(state)
    assert len(set(tree.tokens.tolist())) < 4


@pytest.mark.parametrize(
    "kwargs",
    [{"branching": ()}, {"branching": (2, 0)}, {"branching": (2, -1)}, {"budget": 0}],
)
def test_bad_parameters(draft: MarkovModel, kwargs: dict) -> None:
    """Branching factors and budget must be integers >= 1."""
    with pytest.raises(ConfigError):
        SpecInferTree(draft, **kwargs)

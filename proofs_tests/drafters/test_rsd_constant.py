"""RSD-C: Gumbel-top-k draws without replacement with constant branching factors."""

from __future__ import annotations

import itertools

import pytest
import torch
from drafter_states import decode_state
from scipy.stats import chisquare

from verispec.core import DETERMINISTIC, WithoutReplacement
from verispec.drafters.rsd_constant import RSDConstant, gumbel_top_k
from verispec.errors import ConfigError
from verispec.models.markov import MarkovModel

ALPHA = 1e-3


def wor_law(probs: list[float], k: int) -> dict[tuple[int, ...], float]:
    """Exact law of k ordered sequential draws without replacement from ``probs``."""
    law = {}
    for seq in itertools.permutations(range(len(probs)), k):
        prob, left = 1.0, 1.0
        for token in seq:
            prob *= probs[token] / left if left > 0 else 0.0
            left -= probs[token]
        if prob > 0:
            law[seq] = prob
    return law


def chisquare_pvalue(counts: dict, law: dict, n: int) -> float:
    """Chi-square p-value of observed ``counts`` against ``law``; cells with an expected
    count below 5 are pooled into one; an observation outside the law's support fails."""
    assert set(counts) <= set(law), f"draws outside the support: {set(counts) - set(law)}"
    big = [cell for cell in law if law[cell] * n >= 5]
    small = [cell for cell in law if law[cell] * n < 5]
    observed = [counts.get(cell, 0) for cell in big]
    expected = [law[cell] * n for cell in big]
    if small:
        observed.append(sum(counts.get(cell, 0) for cell in small))
        expected.append(sum(law[cell] for cell in small) * n)
    return float(chisquare(observed, expected).pvalue)


@pytest.mark.parametrize(
    ("probs", "k"),
    [
        ([0.5, 0.3, 0.2], 3),
        ([0.05, 0.6, 0.1, 0.2, 0.05], 3),
        ([0.7, 0.0, 0.2, 0.1], 2),
        ([0.25, 0.25, 0.25, 0.25], 4),
    ],
)
def test_gumbel_top_k_orders_follow_sequential_without_replacement(
    probs: list[float], k: int
) -> None:
    """The ordered Gumbel-top-k draws have the exact law of k sequential draws without
    replacement, prod_i p(c_i) / (1 - sum_{j<i} p(c_j)) (chi-square over every ordered
    k-tuple, 100,000 draws, alpha = 1e-3)."""
    n = 100_000
    generator = torch.Generator().manual_seed(11)
    p = torch.tensor(probs, dtype=torch.float64)
    tokens, valid = gumbel_top_k(p.expand(n, -1), k, generator)
    assert bool(valid.all())
    counts: dict[tuple[int, ...], int] = {}
    for row in tokens.tolist():
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    assert chisquare_pvalue(counts, wor_law(probs, k), n) > ALPHA


def test_gumbel_top_k_flags_draws_past_the_support() -> None:
    """With fewer positive-probability tokens than k, the extra draws are flagged invalid
    and the valid ones are exactly the support."""
    p = torch.tensor([0.0, 0.6, 0.0, 0.4], dtype=torch.float64)
    tokens, valid = gumbel_top_k(p.expand(50, -1), 3, torch.Generator().manual_seed(0))
    assert valid[:, :2].all() and not valid[:, 2].any()
    assert {frozenset(row[:2]) for row in tokens.tolist()} == {frozenset({1, 3})}


@pytest.fixture
def draft() -> MarkovModel:
    return MarkovModel.random(6, torch.Generator().manual_seed(5), order=2, scale=1.5)


def test_levels_distinct_siblings_and_without_replacement_laws(draft: MarkovModel) -> None:
    """Branching (3, 2): 3 + 6 nodes, siblings distinct, each inner row's law
    WithoutReplacement of the processed draft distribution at its context; one draft call
    per level."""
    state = decode_state([4, 1], temperature=0.8, seed=2)
    drafter = RSDConstant(draft, branching=(3, 2))
    drafter.begin(state)
    before = len(draft.call_log)
    tree = drafter.propose(state)
    assert draft.call_log[before:] == [(0, 0), (0, 3)]
    assert tree.depth.tolist() == [1] * 3 + [2] * 6
    for row in range(1 + 3):
        kids = [int(tree.tokens[c]) for c in tree.children[row]]
        assert len(kids) == len(set(kids)) == (3 if row == 0 else 2)
        law = tree.laws[row]
        assert isinstance(law, WithoutReplacement)
        path = [] if row == 0 else tree.path_tokens(row - 1)
        expected = state.sampling.probs(draft.next_logits([4, 1, *path]), torch.float64)
        assert torch.allclose(law.draft_probs, expected, atol=0, rtol=1e-12)


def test_small_support_gives_fewer_children(draft: MarkovModel) -> None:
    """With top_k = 2 processing, a node cannot get more than 2 children."""
    state = decode_state([0], temperature=1.0, top_k=2)
    drafter = RSDConstant(draft, branching=(4, 3))
    drafter.begin(state)
    tree = drafter.propose(state)
    assert [len(c) for c in tree.children[:3]] == [2, 2, 2]
    assert tree.num_nodes == 6


def test_greedy_children_are_the_top_choices(draft: MarkovModel) -> None:
    """At temperature 0 a node's children are its b most likely draft tokens in rank order."""
    state = decode_state([3], temperature=0.0)
    drafter = RSDConstant(draft, branching=(3, 2))
    drafter.begin(state)
    tree = drafter.propose(state)
    for row in range(1 + 3):
        path = [] if row == 0 else tree.path_tokens(row - 1)
        ranked = torch.argsort(draft.next_logits([3, *path]), descending=True).tolist()
        assert [int(tree.tokens[c]) for c in tree.children[row]] == ranked[: 3 if row == 0 else 2]
        assert tree.laws[row] is DETERMINISTIC


@pytest.mark.parametrize(
    "kwargs", [{"branching": ()}, {"branching": (0,)}, {"branching": (2, 1.5)}, {"budget": -3}]
)
def test_bad_parameters(draft: MarkovModel, kwargs: dict) -> None:
    """Branching factors and budget must be integers >= 1."""
    with pytest.raises(ConfigError):
        RSDConstant(draft, **kwargs)

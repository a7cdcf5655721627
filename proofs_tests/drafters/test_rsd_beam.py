"""RSD-S: Stochastic Beam Search draft trees and their without-replacement sibling laws."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from drafter_states import decode_state
from scipy.stats import chi2, chisquare

from verispec.core import DETERMINISTIC, WithoutReplacement
from verispec.drafters.rsd_beam import (
    RSDStochasticBeam,
    log1mexp,
    shifted_gumbels,
    stochastic_beam_level,
)
from verispec.errors import ConfigError
from verispec.models.markov import MarkovModel

ALPHA = 1e-3


# -- the truncated Gumbel transform ---------------------------------------------------


def test_log1mexp_is_accurate_on_both_branches() -> None:
    """log1mexp(x) = log(1 - exp(x)) to 1e-15 relative, near 0 and far below it."""
    x = torch.tensor([-1e-12, -1e-3, -0.5, -0.7, -2.0, -40.0], dtype=torch.float64)
    exact = [math.log(-math.expm1(v)) for v in x.tolist()]
    assert torch.allclose(log1mexp(x), torch.tensor(exact, dtype=torch.float64), rtol=1e-15)


def test_shifted_gumbels_have_the_parent_maximum_and_keep_order() -> None:
    """Each row's maximum becomes the parent's score, order within a row is kept, -inf
    stays -inf, and the result equals the textbook -log(e^-T - e^-Z + e^-G) where that is
    well conditioned."""
    generator = torch.Generator().manual_seed(0)
    gumbels = torch.randn(50, 7, generator=generator, dtype=torch.float64) * 3
    gumbels[:, 6] = -math.inf
    parent = torch.randn(50, generator=generator, dtype=torch.float64) - 2
    shifted = shifted_gumbels(gumbels, parent)
    assert torch.allclose(shifted.max(-1).values, parent, atol=1e-12)
    assert torch.equal(shifted[:, :6].argsort(-1), gumbels[:, :6].argsort(-1))
    assert bool((shifted[:, 6] == -math.inf).all())
    top = gumbels.max(-1, keepdim=True).values
    textbook = -torch.log(torch.exp(-parent[:, None]) - torch.exp(-top) + torch.exp(-gumbels))
    assert torch.allclose(shifted[:, :6], textbook[:, :6], rtol=1e-9, atol=1e-9)


def test_shifted_gumbels_are_finite_at_extreme_scores() -> None:
    """The stable form gives finite values where the textbook form overflows (scores of
    +-800, far below the parent: exp(800) is inf in float64)."""
    gumbels = torch.tensor([[-800.0, 0.0, 800.0], [1e-3, 0.0, -1e-3]], dtype=torch.float64)
    parent = torch.tensor([-900.0, -1e-9], dtype=torch.float64)
    shifted = shifted_gumbels(gumbels, parent)
    assert bool(torch.isfinite(shifted).all())
    assert torch.allclose(shifted.max(-1).values, parent)
    assert shifted[0].argsort().tolist() == [0, 1, 2]


# -- the sampling laws, by simulation -------------------------------------------------

ROOT = [0.45, 0.3, 0.15, 0.1]
NEXT = [
    [0.6, 0.2, 0.15, 0.05],
    [0.1, 0.1, 0.4, 0.4],
    [0.25, 0.25, 0.25, 0.25],
    [0.05, 0.05, 0.1, 0.8],
]


SPREAD = [3, 130, 131, 299]  # where the 4 tokens sit in a vocabulary of 3 blocks


def _two_levels(n: int, width: int, seed: int, spread: bool = False) -> tuple[torch.Tensor, ...]:
    """n independent two-level Stochastic Beam Searches over the chain ROOT, NEXT; with
    ``spread``, tokens 0..3 are SPREAD over a vocabulary of 300 (3 blocks of the draws)."""
    generator = torch.Generator().manual_seed(seed)
    root, table = torch.tensor(ROOT, dtype=torch.float64), torch.tensor(NEXT, dtype=torch.float64)
    if spread:
        root = torch.zeros(300, dtype=torch.float64).index_copy_(0, torch.tensor(SPREAD), root)
        table = torch.zeros(300, 300, dtype=torch.float64)
        table[torch.tensor(SPREAD)[:, None], torch.tensor(SPREAD)] = torch.tensor(NEXT).double()
    zeros = torch.zeros(n, 1, dtype=torch.float64)
    root = root.expand(n, 1, -1)
    _, tok1, s1, phi1, valid1 = stochastic_beam_level(zeros, zeros, root, width, generator)
    assert bool(valid1.all())
    probs2 = table[tok1]  # (n, W, V)
    beam2, tok2, _, _, valid2 = stochastic_beam_level(s1, phi1, probs2, width, generator)
    if spread:  # back to 0..3
        index = torch.full((300,), -1, dtype=torch.long).index_copy_(
            0, torch.tensor(SPREAD), torch.arange(4)
        )
        tok1, tok2 = index[tok1], index[tok2]
    return tok1, beam2, tok2, valid2


def _wor_law(probs: list[float], k: int) -> dict[tuple[int, ...], float]:
    law = {}
    for seq in itertools.permutations(range(len(probs)), k):
        prob, left = 1.0, 1.0
        for token in seq:
            prob *= probs[token] / left
            left -= probs[token]
        if prob > 0:
            law[seq] = prob
    return law


def _pvalue(counts: dict, law: dict, n: int) -> float:
    assert set(counts) <= set(law)
    cells = sorted(law, key=lambda c: law[c])
    observed = [counts.get(c, 0) for c in cells if law[c] * n >= 5]
    expected = [law[c] * n for c in cells if law[c] * n >= 5]
    rest = [c for c in cells if law[c] * n < 5]
    if rest:
        observed.append(sum(counts.get(c, 0) for c in rest))
        expected.append(sum(law[c] for c in rest) * n)
    return float(chisquare(observed, expected).pvalue)


@pytest.mark.parametrize("spread", [False, True])
def test_whole_levels_are_sequences_drawn_without_replacement(spread: bool) -> None:
    """Kool et al.'s theorem, which the stable shift must preserve: the ordered W prefixes
    of level 2 are W draws without replacement from the law of two-token sequences
    (exact law of every ordered pair of sequences enumerated; chi-square, 100,000 runs),
    also with the tokens spread over several blocks of the block-wise race."""
    n, width = 100_000 if not spread else 40_000, 2
    tok1, beam2, tok2, valid2 = _two_levels(n, width, seed=1, spread=spread)
    assert bool(valid2.all())
    sequences = tok1.gather(1, beam2) * 4 + tok2  # (n, W): the 2-token prefix as an index
    joint = [ROOT[a] * NEXT[a][b] for a in range(4) for b in range(4)]
    counts: dict[tuple[int, ...], int] = {}
    for row in sequences.tolist():
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    assert _pvalue(counts, _wor_law(joint, width), n) > ALPHA


def test_same_parent_subsequences_follow_sequential_without_replacement() -> None:
    """Theorem 3.2 of RSD, in the form recursive rejection needs: in an RSD-S level, the
    i-th child of a parent, given the earlier children and that there is an i-th one, is
    drawn from the parent's draft distribution with the earlier children removed
    (one pooled chi-square over every (parent token, earlier children) history with enough
    data; 60,000 runs of width 3, so a parent gets 0 to 3 children)."""
    n, width = 60_000, 3
    tok1, beam2, tok2, valid2 = _two_levels(n, width, seed=2)
    groups: dict[tuple, dict[int, int]] = {}
    sizes = set()
    for parents, beams, tokens, valid in zip(
        tok1.tolist(), beam2.tolist(), tok2.tolist(), valid2.tolist(), strict=True
    ):
        for b, parent_token in enumerate(parents):
            kids = [t for t, bb, ok in zip(tokens, beams, valid, strict=True) if bb == b and ok]
            sizes.add(len(kids))
            for i, kid in enumerate(kids):
                cell = groups.setdefault((parent_token, tuple(kids[:i])), {})
                cell[kid] = cell.get(kid, 0) + 1
    assert sizes == {0, 1, 2, 3}  # the number of children really varies
    stat, dof = 0.0, 0
    for (parent_token, history), cell in groups.items():
        total = sum(cell.values())
        left = 1.0 - sum(NEXT[parent_token][h] for h in history)
        expected = {t: NEXT[parent_token][t] / left * total for t in range(4) if t not in history}
        assert set(cell) <= set(expected)
        if min(expected.values()) < 5:
            continue
        stat += sum((cell.get(t, 0) - e) ** 2 / e for t, e in expected.items())
        dof += len(expected) - 1
    assert dof > 30
    assert chi2.sf(stat, dof) > ALPHA


# -- the drafter ----------------------------------------------------------------------


@pytest.fixture
def draft() -> MarkovModel:
    return MarkovModel.random(6, torch.Generator().manual_seed(6), order=2, scale=1.5)


def test_tree_has_width_nodes_per_level_and_without_replacement_laws(draft: MarkovModel) -> None:
    """W = 3, L = 4: 3 nodes per level, stored level by level, siblings distinct, each
    inner row's law WithoutReplacement of the processed draft at its context; one draft
    call per level."""
    state = decode_state([2, 5], temperature=0.9, seed=4)
    drafter = RSDStochasticBeam(draft, width=3, depth=4)
    drafter.begin(state)
    before = len(draft.call_log)
    tree = drafter.propose(state)
    assert draft.call_log[before:] == [(0, 0), (0, 3), (3, 3), (6, 3)]
    assert tree.depth.tolist() == [1] * 3 + [2] * 3 + [3] * 3 + [4] * 3
    for row, kids in enumerate(tree.children):
        tokens = [int(tree.tokens[c]) for c in kids]
        assert len(tokens) == len(set(tokens))
        law = tree.laws[row]
        if not kids:
            assert law is None
            continue
        assert isinstance(law, WithoutReplacement)
        path = [] if row == 0 else tree.path_tokens(row - 1)
        expected = state.sampling.probs(draft.next_logits([2, 5, *path]), torch.float64)
        assert torch.allclose(law.draft_probs, expected, atol=0, rtol=1e-12)


def test_greedy_is_beam_search_on_draft_log_probabilities(draft: MarkovModel) -> None:
    """At temperature 0 each level holds the W best extensions, by path log-probability,
    of the previous level's beams, best first, with the DETERMINISTIC law."""
    state = decode_state([1], temperature=0.0)
    drafter = RSDStochasticBeam(draft, width=3, depth=3)
    drafter.begin(state)
    tree = drafter.propose(state)

    def log_prob(path: list[int]) -> float:
        total, context = 0.0, [1]
        for token in path:
            total += float(torch.log_softmax(draft.next_logits(context), -1)[token])
            context.append(token)
        return total

    beams: list[list[int]] = [[]]
    for level in range(3):
        candidates = [[*b, t] for b in beams for t in range(6)]
        candidates.sort(key=log_prob, reverse=True)
        beams = candidates[:3]
        nodes = [i for i in range(tree.num_nodes) if int(tree.depth[i]) == level + 1]
        assert [tree.path_tokens(i) for i in nodes] == beams
    assert all(law is None or law is DETERMINISTIC for law in tree.laws)


def test_budget_caps_the_tree(draft: MarkovModel) -> None:
    """A budget of 5 with W = 2, L = 4 keeps two full levels and the best node of the third."""
    state = decode_state([0], temperature=1.0)
    drafter = RSDStochasticBeam(draft, width=2, depth=4, budget=5)
    drafter.begin(state)
    assert drafter.propose(state).depth.tolist() == [1, 1, 2, 2, 3]


@pytest.mark.parametrize(
    "kwargs", [{"width": 0}, {"depth": 0}, {"width": -2}, {"depth": 1.5}, {"budget": 0}]
)
def test_bad_parameters(draft: MarkovModel, kwargs: dict) -> None:
    """Width, depth and budget must be integers >= 1."""
    with pytest.raises(ConfigError):
        RSDStochasticBeam(draft, **kwargs)

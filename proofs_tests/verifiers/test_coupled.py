"""Tests of verispec/verifiers/coupled.py: the coupled rule and its per-position noise.

The rule's exactness rests on three facts, each tested here:

1. ``seeded_sample`` is the exponential race by blocks (block ``argmin F_b / Q_b``,
   then token ``argmin E_v / q_v`` in it) — checked against Gumbel-max by blocks
   computed independently on the same noise;
2. the noise behaves as i.i.d. Exp(1) over indices, streams, positions and seeds — a
   Kolmogorov-Smirnov test of the values, and chi-square tests of the draws over seeds
   and over positions (one block and four), and of pairs of positions (independence),
   all at ALPHA = 1e-3 with fixed seeds; so each draw has law ``q`` (the race's
   theorem, applied to the blocks and then within the block);
3. the walk over the tree, given independent draws ``x_t ~ q_t`` per position, emits
   the verdict law of the recursive rule for fixed candidates: enumerating every draw
   through the library's own walk (``follow_target``), in float64, gives
   ``verdict_distribution``'s law to 1e-12 — so child ``c_i`` is accepted with
   probability ``q(c_i)``, exactly as under the recursive rule, and the committed
   tokens follow the target.

The end-to-end audits through the engine (and the audit's power against a coupling
keyed by tree node) are in ``proofs_tests/end_to_end/test_coupled_exactness.py``.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare, kstest
from strategies import distributions, draft_trees, logit_rows, sampling_params, vocab_sizes

from verispec.core.sampling import SamplingParams
from verispec.core.tree import DETERMINISTIC, IID, DraftTree, WithoutReplacement
from verispec.errors import ConfigError, TreeStructureError
from verispec.verifiers import (
    BLOCK,
    Coupled,
    Greedy,
    RecursiveRejection,
    default_verifier,
    position_noise,
    recursive_verifier,
    seeded_sample,
    verdict_distribution,
)
from verispec.verifiers._rules import follow_target

ALPHA = 1e-3
TOL = 1e-12
DRAWS = 20_000
TARGET = torch.tensor([0.3, 0.0, 0.05, 0.25, 0.1, 0.0, 0.3], dtype=torch.float64)  # V = 7


def chi_square_p_value(counts: Counter, probs: dict, draws: int) -> float:
    """Chi-square p-value of ``counts`` against ``probs``; impossible outcomes asserted absent."""
    assert all(probs.get(key, 0.0) > 0 for key in counts), "a token of probability 0 was drawn"
    keys = [key for key, p in probs.items() if p > 0]
    observed = [counts.get(key, 0) for key in keys]
    expected = [probs[key] * draws for key in keys]
    scale = sum(observed) / sum(expected)
    return float(chisquare(observed, [e * scale for e in expected]).pvalue)


# -- 1. the draw is the two-level exponential race on the noise ----------------------


def reference_draw(target: torch.Tensor, seed: int, position: int) -> int:
    """Gumbel-max by blocks, written independently: the block of largest log Q_b + G_b,
    then the token of largest log q_v + G_v in it, with G = -log E of the noise."""
    size = target.shape[0]
    starts = list(range(0, size, BLOCK))
    block = 0
    if len(starts) > 1:
        masses = torch.tensor([math.fsum(target[a : a + BLOCK].tolist()) for a in starts])
        gumbel = -position_noise(seed, position, 0, len(starts)).log()
        block = int((masses.log() + gumbel).argmax())
    inside = target[starts[block] : starts[block] + BLOCK].double()
    gumbel = -position_noise(seed, position, block + 1, inside.shape[0]).log()
    return starts[block] + int((inside.log() + gumbel).argmax())  # log 0 = -inf: never


@settings(max_examples=60)
@given(
    size=st.one_of(st.integers(2, 40), st.integers(BLOCK - 1, 3 * BLOCK + 7)),
    weights_seed=st.integers(0, 2**31),
    sparsity=st.sampled_from([0.0, 0.5, 0.97]),
    seed=st.integers(0, 2**64 - 1),
    position=st.integers(0, 2**40),
)
def test_seeded_sample_is_the_two_level_race_on_its_noise(
    size: int, weights_seed: int, sparsity: float, seed: int, position: int
) -> None:
    """seeded_sample equals Gumbel-max by blocks (then within the block) on its noise, for
    one block and for several (a short last block included), float64 and float32 weights."""
    generator = torch.Generator().manual_seed(weights_seed)
    target = torch.rand(size, generator=generator, dtype=torch.float64) ** 3
    target[torch.rand(size, generator=generator) < sparsity] = 0.0
    target[int(torch.randint(size, (1,), generator=generator))] += 0.01  # some mass
    expected = reference_draw(target, seed, position)
    assert target[expected] > 0
    assert seeded_sample(target, seed, position) == expected
    assert seeded_sample(target.float(), seed, position) == reference_draw(
        target.float(), seed, position
    )


def test_with_two_blocks_both_are_drawn_from() -> None:
    """With exactly two blocks (V = 300: a full block and a short one), seeded_sample
    equals the reference draw at each of 64 positions, and draws come from both blocks."""
    target = torch.full((300,), 1 / 300, dtype=torch.float64)
    draws = [seeded_sample(target, 7, position) for position in range(64)]
    assert draws == [reference_draw(target, 7, position) for position in range(64)]
    assert min(draws) < BLOCK <= max(draws)


def test_block_masses_are_summed_exactly_enough_to_keep_a_near_tie() -> None:
    """Block masses are summed in float64: for float32 weights built so that the two
    blocks' race is a near-tie that a float32 sum of the first block would decide the
    other way, seeded_sample still equals the reference draw (masses by math.fsum)."""
    seed, position = 5, 11
    noise = position_noise(seed, position, 0, 2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        scale = torch.pow(10.0, -torch.randint(0, 9, (BLOCK,), generator=generator).float())
        first = torch.rand(BLOCK, generator=generator) * scale  # float32, wide range
        exact = math.fsum(first.double().tolist())
        rounded = float(first.reshape(1, -1).sum(1)[0])  # float32 accumulation
        middle = float(noise[1]) * (exact + rounded) / 2 / float(noise[0])
        tail = float(torch.tensor(middle, dtype=torch.float32))  # the second block's mass
        masses = torch.tensor([[exact, tail], [rounded, tail]], dtype=torch.float64)
        winners = (noise / masses).argmin(1).tolist()  # the race on each pair of masses
        if winners[0] != winners[1]:
            break
    else:
        pytest.fail("no near-tie found")
    target = torch.cat([first, torch.tensor([tail])])  # float32, V = BLOCK + 1
    assert seeded_sample(target, seed, position) == reference_draw(target, seed, position)
    assert (seeded_sample(target, seed, position) < BLOCK) == (winners[0] == 0)


def test_point_mass_is_always_drawn() -> None:
    """A one-hot target (temperature 0) is drawn at every seed and position."""
    target = torch.zeros(49152)
    target[31337] = 1.0
    assert {seeded_sample(target, seed, 7 * seed) for seed in range(20)} == {31337}


# -- 2. the noise: a pure function of (seed, position, stream, index), i.i.d. Exp(1) --


def test_noise_is_a_pure_function_of_its_key() -> None:
    """Same key, same noise; another seed, position or stream, other noise; value i does
    not depend on how many values are asked for."""
    a = position_noise(5, 100, 3, 1000)
    assert torch.equal(a, position_noise(5, 100, 3, 1000))
    assert torch.equal(a[:7], position_noise(5, 100, 3, 7))
    for other in [(5, 101, 3), (6, 100, 3), (5, 100, 4)]:
        assert not torch.equal(a[:7], position_noise(*other, 7))
    assert a.dtype == torch.float64 and bool((a > 0).all()) and bool(a.isfinite().all())


def test_noise_values_are_exponential() -> None:
    """Noise values over 100 positions x 2 streams x 500 indices pass a KS test
    against Exp(1)."""
    values = torch.cat([position_noise(2024, t, b, 500) for t in range(100) for b in (0, 7)])
    assert kstest(values.numpy(), "expon").pvalue > ALPHA


WIDE = torch.zeros(1000, dtype=torch.float64)  # 4 blocks, the last one short (232 tokens)
WIDE[[3, 200, 255, 256, 300, 511, 700, 999]] = torch.tensor(
    [0.1, 0.05, 0.2, 0.15, 0.05, 0.1, 0.25, 0.1], dtype=torch.float64
)


@pytest.mark.parametrize("over", ["seeds", "positions"])
@pytest.mark.parametrize("target", [TARGET, WIDE], ids=["V=7", "V=1000"])
def test_draws_over_seeds_or_positions_follow_the_target(over: str, target: torch.Tensor) -> None:
    """20,000 draws at one position over seeds, or at one seed over positions, pass
    chi-square against q (zeros included; V = 1000 spans four blocks)."""
    keys = [(s, 41) if over == "seeds" else (9, s) for s in range(DRAWS)]
    counts = Counter(seeded_sample(target, seed, position) for seed, position in keys)
    probs = dict(enumerate(target.tolist()))
    assert chi_square_p_value(counts, probs, DRAWS) > ALPHA


def test_draws_at_neighbouring_positions_are_independent() -> None:
    """Pairs (draw at t, draw at t + 1) over 20,000 seeds pass chi-square against q x q."""
    counts = Counter(
        (seeded_sample(TARGET, seed, 3), seeded_sample(TARGET, seed, 4)) for seed in range(DRAWS)
    )
    q = TARGET.tolist()
    probs = {(a, b): q[a] * q[b] for a in range(len(q)) for b in range(len(q))}
    assert chi_square_p_value(counts, probs, DRAWS) > ALPHA


# -- 3. the walk: exact law by enumeration through the library's own walk -------------


class _NeedDraw(Exception):
    def __init__(self, row: int) -> None:
        self.row = row


def coupled_verdict_law(
    tree: DraftTree, target_probs: torch.Tensor
) -> dict[tuple[tuple[int, ...], int], float]:
    """The exact verdict law of ``follow_target`` when each visited row's draw is an
    independent x ~ q_row: every draw sequence enumerated, probabilities multiplied."""
    law: dict[tuple[tuple[int, ...], int], float] = {}

    def explore(script: list[int], weight: float) -> None:
        def draw(row: int, depth: int) -> int:
            if depth < len(script):
                return script[depth]
            raise _NeedDraw(row)

        try:
            verdict = follow_target(tree, draw)
        except _NeedDraw as need:
            for token, prob in enumerate(target_probs[need.row].tolist()):
                if prob > 0:
                    explore([*script, token], weight * prob)
            return
        key = (verdict.accepted, verdict.extra_token)
        law[key] = law.get(key, 0.0) + weight

    explore([], 1.0)
    return law


def target_law_of_verdicts(
    tree: DraftTree, target_probs: torch.Tensor, law: dict
) -> dict[tuple[tuple[int, ...], int], float]:
    """For each verdict, the target's probability of its committed tokens (q along the path)."""
    tokens = tree.tokens.tolist()
    out = {}
    for accepted, extra in law:
        rows = [0, *(node + 1 for node in accepted)]
        committed = [tokens[node] for node in accepted] + [extra]
        out[(accepted, extra)] = math.prod(
            float(target_probs[row, token]) for row, token in zip(rows, committed, strict=True)
        )
    return out


@settings(max_examples=80)
@given(data=st.data())
def test_enumerated_law_equals_the_recursive_rule_and_the_target(data: st.DataObject) -> None:
    """Over every draw, the coupled walk's verdict law equals the recursive rule's for fixed
    candidates, and each verdict's probability is the target's probability of its tokens
    (float64, 1e-12): child c_i is accepted with probability q(c_i)."""
    size = data.draw(vocab_sizes(2, 5))
    tree = data.draw(draft_trees(size, max_nodes=8, distinct_siblings=data.draw(st.booleans())))
    rows = [data.draw(distributions(size)) for _ in range(tree.num_nodes + 1)]
    target_probs = torch.stack(rows)  # (N + 1, V)
    law = coupled_verdict_law(tree, target_probs)
    assert abs(math.fsum(law.values()) - 1.0) < TOL
    target = target_law_of_verdicts(tree, target_probs, law)
    for key, prob in law.items():
        assert abs(prob - target[key]) < TOL, key
    recursive = verdict_distribution(tree, target_probs)
    for key in set(law) | set(recursive):
        assert abs(law.get(key, 0.0) - recursive.get(key, 0.0)) < TOL, key


def test_sampled_verdicts_of_a_two_level_tree_follow_the_enumerated_law() -> None:
    """20,000 verdicts of the real verify (seeds 0..19,999) on a two-level tree with a
    repeated sibling pass chi-square against the enumerated law."""
    tree = DraftTree.from_parents([3, 0, 3, 6, 4, 2], [-1, -1, -1, 0, 0, 1], DETERMINISTIC)
    gen = torch.Generator().manual_seed(3)
    logits = 1.5 * torch.randn(tree.num_nodes + 1, 7, generator=gen, dtype=torch.float64)
    sampling = SamplingParams(temperature=0.9, top_k=6)
    law = coupled_verdict_law(tree, sampling.probs(logits, torch.float64))
    verifier = Coupled(dtype=torch.float64)
    counts: Counter = Counter()
    for seed in range(DRAWS):
        generator = torch.Generator().manual_seed(seed)
        verdict = verifier.verify(tree, logits, sampling, generator, position=12)
        counts[(verdict.accepted, verdict.extra_token)] += 1
    assert all(key[0] != (2,) for key in counts)  # the repeated sibling 3 is never reached
    assert chi_square_p_value(counts, law, DRAWS) > ALPHA


# -- the verifier ---------------------------------------------------------------------


@settings(max_examples=60)
@given(data=st.data())
def test_committed_tokens_are_the_per_position_draws(data: st.DataObject) -> None:
    """Whatever the tree, the token committed at depth d is the seeded draw of its row at
    position + d: the text does not depend on the tree (seeded identity)."""
    size = data.draw(vocab_sizes(2, 6))
    tree = data.draw(draft_trees(size, max_nodes=10))
    logits = data.draw(logit_rows(tree.num_nodes + 1, size))
    sampling = data.draw(sampling_params(allow_greedy=False))
    seed = data.draw(st.integers(0, 2**64 - 1))
    position = data.draw(st.integers(0, 10**6))
    generator = torch.Generator().manual_seed(seed)
    verdict = Coupled().verify(tree, logits, sampling, generator, position=position)
    tokens = tree.tokens.tolist()
    rows = [0, *(node + 1 for node in verdict.accepted)]
    for depth, (row, token) in enumerate(
        zip(rows, [tokens[n] for n in verdict.accepted] + [verdict.extra_token], strict=True)
    ):
        assert token == seeded_sample(sampling.probs(logits[row]), seed, position + depth)
    for node in verdict.accepted:  # the path is connected, from the root down
        parent = int(tree.parents[node])
        assert parent == -1 or parent in verdict.accepted


def test_temperature_zero_agrees_with_greedy() -> None:
    """At temperature 0 the draws are the argmax: the verdict is Greedy's."""
    tree = DraftTree.from_parents([1, 2, 0, 3], [-1, -1, 0, 1])
    logits = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    logits[0, 2] = logits[3, 3] = 9.0
    generator = torch.Generator().manual_seed(0)
    verdict = Coupled().verify(tree, logits, SamplingParams(), generator, position=4)
    assert verdict == Greedy().verify(tree, logits)
    assert verdict.accepted == (1,)


def _sampled_tree(law) -> DraftTree:
    return DraftTree.from_parents([1, 2, 0], [-1, -1, 0], [law, law, None, None])


@pytest.mark.parametrize(
    "tree",
    [
        _sampled_tree(IID(torch.full((4,), 0.25))),
        _sampled_tree(WithoutReplacement(torch.full((4,), 0.25))),
        DraftTree.from_parents(
            [1, 2, 0], [-1, -1, 0], [DETERMINISTIC, IID(torch.full((4,), 0.25)), None, None]
        ),
    ],
    ids=["iid", "without-replacement", "mixed"],
)
def test_sampled_or_mixed_laws_go_to_recursive_rejection(tree: DraftTree) -> None:
    """A tree with a sampled proposal law is verified by the fallback: the same verdicts
    as RecursiveRejection with the same generator, over 50 seeds."""
    logits = torch.randn(4, 4, generator=torch.Generator().manual_seed(2))
    sampling = SamplingParams(temperature=1.0)
    for seed in range(50):
        coupled = Coupled().verify(
            tree, logits, sampling, torch.Generator().manual_seed(seed), position=9
        )
        recursive = RecursiveRejection().verify(
            tree, logits, sampling, torch.Generator().manual_seed(seed)
        )
        assert coupled == recursive


def test_without_a_position_the_fallback_verifies() -> None:
    """Called with the protocol's four arguments, the tree goes to the fallback."""
    tree = DraftTree.from_parents([1, 2], [-1, -1])
    logits = torch.randn(3, 4, generator=torch.Generator().manual_seed(5))
    sampling = SamplingParams(temperature=1.0)
    for seed in range(30):
        got = Coupled().verify(tree, logits, sampling, torch.Generator().manual_seed(seed))
        generator = torch.Generator().manual_seed(seed)
        want = RecursiveRejection().verify(tree, logits, sampling, generator)
        assert got == want


def test_nothing_is_drawn_from_the_generator() -> None:
    """A deterministic tree's verdict leaves the generator's state untouched."""
    generator = torch.Generator().manual_seed(11)
    before = generator.get_state()
    tree = DraftTree.from_parents([1, 2, 0], [-1, -1, 0])
    logits = torch.randn(4, 4, generator=torch.Generator().manual_seed(6))
    Coupled().verify(tree, logits, SamplingParams(temperature=0.8), generator, position=3)
    assert torch.equal(generator.get_state(), before)


@pytest.mark.parametrize("bad", [-1, 2**64, 1.5, "3", True])
def test_position_must_be_an_integer_in_range(bad: object) -> None:
    """A position outside [0, 2**64) or not an integer is a ConfigError naming it."""
    tree = DraftTree.empty()
    with pytest.raises(ConfigError, match="`position`"):
        Coupled().verify(
            tree, torch.zeros(1, 4), SamplingParams(temperature=1.0), torch.Generator(),
            position=bad,  # type: ignore[arg-type]
        )  # fmt: skip


def test_logits_shape_must_match_the_tree() -> None:
    """Logits with the wrong number of rows are a TreeStructureError."""
    with pytest.raises(TreeStructureError, match="target_logits"):
        Coupled().verify(
            DraftTree.from_parents([1], [-1]),
            torch.zeros(3, 4),
            SamplingParams(temperature=1.0),
            torch.Generator(),
            position=0,
        )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dtype": torch.float16}, "`dtype`"),
        ({"fallback": "recursive"}, "`fallback`"),
        ({"fallback": RecursiveRejection}, "`fallback`"),
    ],
)
def test_bad_constructor_arguments(kwargs: dict, match: str) -> None:
    """A bad dtype or fallback is a ConfigError naming it."""
    with pytest.raises(ConfigError, match=match):
        Coupled(**kwargs)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((-1, 0, 0, 4), "`seed`"),
        ((0, 2**64, 0, 4), "`position`"),
        ((0, 0, -1, 4), "`stream`"),
        ((0, 0, 0, 0), "`count`"),
    ],
)
def test_noise_arguments_are_checked(args: tuple, match: str) -> None:
    """position_noise names the argument out of range."""
    with pytest.raises(ConfigError, match=match):
        position_noise(*args)


def test_policies() -> None:
    """default_verifier: Greedy at T = 0, Coupled above; recursive_verifier: Greedy at T = 0,
    RecursiveRejection above."""
    assert isinstance(default_verifier(SamplingParams()), Greedy)
    assert isinstance(default_verifier(SamplingParams(temperature=0.5)), Coupled)
    assert isinstance(recursive_verifier(SamplingParams()), Greedy)
    assert isinstance(recursive_verifier(SamplingParams(temperature=0.5)), RecursiveRejection)

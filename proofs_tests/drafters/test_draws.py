"""Block-wise draws: the processed draft distribution, i.i.d. draws, draws without
replacement (exponential race) and top choices, on vocabularies of several blocks."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
import torch
from scipy.stats import chisquare, kstest

from verispec.core.sampling import SamplingParams, argmax_one
from verispec.drafters import _draws
from verispec.drafters._draws import (
    processed_probs,
    race_without_replacement,
    sample_iid,
    sample_one,
    top_indices,
)
from verispec.errors import NonFiniteLogitsError

ALPHA = 1e-3
V = 1000  # 8 blocks of 128, the last one padded
SUPPORT = [0, 5, 127, 128, 131, 600, 999]  # block edges, two tokens sharing a block
WEIGHTS = [0.3, 0.05, 0.1, 0.2, 0.15, 0.12, 0.08]


def _probs(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A distribution over V = 1000 tokens whose support spans four blocks; the rest 0."""
    probs = torch.zeros(V, dtype=dtype)
    probs[SUPPORT] = torch.tensor(WEIGHTS, dtype=dtype)
    return probs


def _pvalue(counts: dict, law: dict, n: int) -> float:
    """Chi-square p-value of ``counts`` against ``law`` (cells under 5 expected pooled);
    an observation outside the law's support fails."""
    assert set(counts) <= set(law), f"draws outside the support: {set(counts) - set(law)}"
    big = [cell for cell in law if law[cell] * n >= 5]
    small = [cell for cell in law if law[cell] * n < 5]
    observed = [counts.get(cell, 0) for cell in big]
    expected = [law[cell] * n for cell in big]
    if small:
        observed.append(sum(counts.get(cell, 0) for cell in small))
        expected.append(sum(law[cell] for cell in small) * n)
    return float(chisquare(observed, expected).pvalue)


CHUNK = 500  # rows per call in the large samples below


def _in_chunks(
    draw: Callable[[torch.Tensor], tuple[torch.Tensor, ...]], probs: torch.Tensor, n: int
) -> tuple[torch.Tensor, ...]:
    """``draw`` over ``n`` rows of ``probs`` (Shape: (V,)), ``CHUNK`` rows per call,
    concatenated: the rows are independent draws either way (one generator runs on from
    call to call), and the rejection loops of the loose bounds run about 3x faster on
    small calls than on one call of every row."""
    parts = [draw(probs.expand(min(CHUNK, n - start), -1)) for start in range(0, n, CHUNK)]
    return tuple(torch.cat(columns) for columns in zip(*parts, strict=True))


def _count(rows: list[list[int]]) -> dict[tuple[int, ...], int]:
    counts: dict[tuple[int, ...], int] = {}
    for row in rows:
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    return counts


def _wor_law(k: int) -> dict[tuple[int, ...], float]:
    """Exact law of k ordered sequential draws without replacement from ``_probs()``."""
    weight = dict(zip(SUPPORT, WEIGHTS, strict=True))
    law = {}
    for seq in itertools.permutations(SUPPORT, k):
        prob, left = 1.0, 1.0
        for token in seq:
            prob *= weight[token] / left
            left -= weight[token]
        law[seq] = prob
    return law


@pytest.fixture(params=["tight", "loose"])
def slack(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The real mass bounds, or bounds two to six times the mass, a different factor per
    block, so that most attempts are rejected and the rejection steps are tested too
    (drawing blocks by their bounds without rejection would then be far off)."""
    if request.param == "loose":
        monkeypatch.setattr(_draws, "_SLACK", {torch.float32: 2.0, torch.float64: 2.0})
        tight = _draws._mass_bounds

        def loose(blocks: torch.Tensor) -> torch.Tensor:
            factor = 1 + torch.arange(blocks.shape[-2], dtype=torch.float64) % 3
            return tight(blocks) * factor

        monkeypatch.setattr(_draws, "_mass_bounds", loose)
    return request.param


# -- the processed distribution ----------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("temperature", [0.6, 1.0])
def test_processed_probs_are_bitwise_the_targets_processing(
    dtype: torch.dtype, temperature: float
) -> None:
    """With temperature only, the draft distribution is bit for bit sampling.probs (the
    target's processing; here computed in place), for rows and single rows, V = 49,152."""
    logits = 3 * torch.randn(3, 49152, generator=torch.Generator().manual_seed(0), dtype=dtype)
    sampling = SamplingParams(temperature=temperature)
    assert torch.equal(processed_probs(logits, sampling), sampling.probs(logits, dtype))
    assert torch.equal(processed_probs(logits[1], sampling), sampling.probs(logits[1], dtype))


def test_processed_probs_with_truncation_and_bad_logits() -> None:
    """top-k processing goes through sampling.probs; NaN or all -inf rows are refused."""
    logits = torch.randn(2, 300, generator=torch.Generator().manual_seed(1))
    sampling = SamplingParams(temperature=0.7, top_k=5)
    assert torch.equal(processed_probs(logits, sampling), sampling.probs(logits))
    for bad in (math.nan, math.inf):
        broken = logits.clone()
        broken[1, 7] = bad
        with pytest.raises(NonFiniteLogitsError):
            processed_probs(broken, SamplingParams(temperature=0.7))
    with pytest.raises(NonFiniteLogitsError):
        processed_probs(torch.full((1, 300), -math.inf), SamplingParams(temperature=0.7))


# -- top choices -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("vocab_size", [7, 1000, 49152])
def test_argmax_one_is_torch_argmax_with_ties(vocab_size: int, dtype: torch.dtype) -> None:
    """argmax_one is the first maximum, as torch.argmax, in every float dtype (NumPy's scan
    or torch's): with ties, with -inf, +inf and NaN entries (a NaN counts as the maximum),
    and on a strided row."""
    generator = torch.Generator().manual_seed(2)
    for _ in range(20):
        scores = (-1 - torch.rand(vocab_size, generator=generator)).to(dtype)
        assert argmax_one(scores) == int(scores.argmax())
        ties = torch.randint(vocab_size, (3,), generator=generator)
        scores[ties] = 0.0
        assert argmax_one(scores) == int(scores.argmax()) == int(ties.min())
        scores[ties[:1]] = -0.0  # a negative zero ties with zero
        assert argmax_one(scores) == int(scores.argmax()) == int(ties.min())
        scores[ties[1:2]] = math.inf
        assert argmax_one(scores) == int(scores.argmax()) == int(ties[1])
        scores[ties[2:]] = math.nan
        assert argmax_one(scores) == int(scores.argmax()) == int(ties[2])
    rows = torch.randn(vocab_size, 3, generator=generator).to(dtype)
    assert argmax_one(rows[:, 1]) == int(rows[:, 1].argmax())


@pytest.mark.parametrize("vocab_size", [7, 1000, 49152])
@pytest.mark.parametrize("k", [1, 4, 8])
def test_top_indices_are_the_k_largest_in_order(vocab_size: int, k: int) -> None:
    """top_indices gives the k largest entries of each row, largest first (the values of
    torch.topk), with the largest entries crowded into one block or spread out."""
    generator = torch.Generator().manual_seed(3)
    scores = torch.randn(6, vocab_size, generator=generator, dtype=torch.float64)
    scores[0, :k] += 10  # all in the first block
    k = min(k, vocab_size)
    indices = top_indices(scores, k)
    assert indices.shape == (6, k)
    assert torch.equal(scores.gather(1, indices), torch.topk(scores, k).values)


# -- i.i.d. draws ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sample_iid_pairs_follow_the_product_law(dtype: torch.dtype, slack: str) -> None:
    """Two i.i.d. draws per row have the law p(a) p(b) over every ordered pair, on a
    vocabulary of 8 blocks, with tight or loose mass bounds (chi-square, 30,000 rows)."""
    n, generator = 30_000, torch.Generator().manual_seed(4)
    (draws,) = _in_chunks(lambda rows: (sample_iid(rows, 2, generator),), _probs(dtype), n)
    weight = dict(zip(SUPPORT, WEIGHTS, strict=True))
    law = {(a, b): weight[a] * weight[b] for a in SUPPORT for b in SUPPORT}
    assert _pvalue(_count(draws.tolist()), law, n) > ALPHA


def test_sample_one_follows_the_distribution(slack: str) -> None:
    """sample_one draws token t with probability p(t) (chi-square, 6,000 draws) and never
    a token of zero probability."""
    probs, generator = _probs(), torch.Generator().manual_seed(5)
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(6000):
        token = sample_one(probs, generator)
        counts[(token,)] = counts.get((token,), 0) + 1
    law = {(t,): w for t, w in zip(SUPPORT, WEIGHTS, strict=True)}
    assert _pvalue(counts, law, 6000) > ALPHA


def test_sample_iid_takes_a_vocabulary_of_one_block() -> None:
    """Small vocabularies (one block) are drawn from too, with rows of different laws."""
    probs = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5]])
    draws = sample_iid(probs, 50, torch.Generator().manual_seed(6))
    assert set(draws[0].tolist()) == {1}
    assert set(draws[1].tolist()) == {0, 2}


# -- draws without replacement -----------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_race_orders_follow_sequential_without_replacement(dtype: torch.dtype, slack: str) -> None:
    """The three first arrivals have the law of three sequential draws without replacement
    over every ordered triple, on a vocabulary of 8 blocks, two support tokens sharing a
    block, with tight or loose mass bounds (chi-square, 40,000 rows)."""
    n, generator = 40_000, torch.Generator().manual_seed(7)
    tokens, _, valid = _in_chunks(
        lambda rows: race_without_replacement(rows, 3, generator), _probs(dtype), n
    )
    assert bool(valid.all())
    assert _pvalue(_count(tokens.tolist()), _wor_law(3), n) > ALPHA


def test_race_arrival_times_are_the_exponential_race(slack: str) -> None:
    """Arrival times are those of the race with rates p: the first is Exp(sum p) and, given
    the first token y, the gap to the second is Exp(sum p - p(y)) (Kolmogorov-Smirnov,
    20,000 rows); these times are what RSD-S turns into Gumbel scores."""
    n, generator, probs = 20_000, torch.Generator().manual_seed(8), _probs(torch.float64)
    tokens, times, _ = _in_chunks(
        lambda rows: race_without_replacement(rows, 2, generator), probs, n
    )
    assert kstest(times[:, 0].numpy(), "expon").pvalue > ALPHA
    scaled_gaps = (times[:, 1] - times[:, 0]) * (1 - probs[tokens[:, 0]])  # Exp(1) each
    assert kstest(scaled_gaps.numpy(), "expon").pvalue > ALPHA


def test_race_flags_draws_past_the_support() -> None:
    """With fewer positive-probability tokens than draws, the extra draws are invalid
    (infinite times), the valid ones are exactly the support, and tokens stay < V."""
    tokens, times, valid = race_without_replacement(
        _probs().expand(20, -1), 9, torch.Generator().manual_seed(9)
    )
    assert bool(valid[:, :7].all()) and not bool(valid[:, 7:].any())
    assert bool(torch.isinf(times[:, 7:]).all())
    assert {frozenset(row[:7]) for row in tokens.tolist()} == {frozenset(SUPPORT)}
    assert int(tokens.max()) < V

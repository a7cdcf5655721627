"""The coupled rule's C draw (verispec.kernels.cpu.draw) against the torch path.

1. Its noise is ``position_noise``'s: the same Philox4x64-10 words, the logarithm within a
   unit in the last place.
2. Its token is the torch path's (``seeded_sample(sampling.probs(row))``) on rows of every
   shape the race has (one block, a full block, a short last block, SmolLM2's 49,152
   tokens) and every processing (temperature, top-k, top-p, min-p and their mixes), with ties
   and ``-inf`` entries; at temperature 0 it is the first maximum.
3. Its draws follow the processed distribution (chi-square); through the engine, see
   ``end_to_end/test_coupled_exactness.py`` (float32 rows).
4. Rows it does not take (float64, strided, NaN, +inf, all ``-inf``, a temperature float32
   rounds to 0) return ``None``, and the verifier then raises the torch path's error.
"""

from __future__ import annotations

import math
import threading
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from verispec.core import SamplingParams
from verispec.core.tree import DraftTree
from verispec.errors import NonFiniteLogitsError
from verispec.kernels.cpu import draw as cpu_draw
from verispec.verifiers import BLOCK, Coupled, position_noise, seeded_sample

pytestmark = pytest.mark.skipif(
    cpu_draw.library() is None, reason="the C kernel cannot be built on this machine"
)

ALPHA = 1e-3

SAMPLINGS = {
    "T=1": SamplingParams(temperature=1.0),
    "T=0.8,top-p=0.95": SamplingParams(temperature=0.8, top_p=0.95),
    "T=0.3,top-k=5": SamplingParams(temperature=0.3, top_k=5),
    "T=1.7,top-p=0.5,min-p=0.05": SamplingParams(temperature=1.7, top_p=0.5, min_p=0.05),
    "T=0.7,top-k=50,top-p=0.9": SamplingParams(temperature=0.7, top_k=50, top_p=0.9),
    "T=1.2,min-p=0.1": SamplingParams(temperature=1.2, min_p=0.1),
    "top-p=0.2": SamplingParams(temperature=1.0, top_p=0.2),
}


def _torch_draw(row: torch.Tensor, sampling: SamplingParams, seed: int, position: int) -> int:
    return seeded_sample(sampling.probs(row), seed, position)


@pytest.mark.parametrize(
    ("seed", "position", "stream", "count"),
    [(0, 0, 0, 1), (7, 100, 3, 1000), (2**64 - 1, 2**64 - 1, 2**64 - 1, 5), (12345, 5, 0, 192)],
)
def test_noise_is_position_noise_to_an_ulp(
    seed: int, position: int, stream: int, count: int
) -> None:
    """The kernel's noise is position_noise's within one unit in the last place: the same
    Philox words (a wrong word would be off by far more), a different logarithm."""
    expected = position_noise(seed, position, stream, count)
    found = cpu_draw.position_noise(seed, position, stream, count)
    assert found is not None and found.dtype == torch.float64
    assert torch.all((found - expected).abs() <= expected * 2.0**-52)


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize("vocab", [1, 7, 256, 257, 1000, 49152])
def test_the_draw_is_the_torch_paths(vocab: int, sampling: str) -> None:
    """On Gaussian rows of three scales, rows rounded to integers (ties) and rows with
    ``-inf`` entries, at 8 positions each, the C token equals the torch path's."""
    params = SAMPLINGS[sampling]
    generator = torch.Generator().manual_seed(vocab)
    rows = [scale * torch.randn(vocab, generator=generator) for scale in (1.0, 3.0, 10.0)]
    rows.append(rows[1].round())
    masked = rows[2].clone()
    masked[1::3] = -math.inf
    rows.append(masked)
    for r, row in enumerate(rows):
        for position in range(8):
            key = (11 + r, 1000 + 37 * position)
            assert cpu_draw.coupled_draw(row, params, *key, BLOCK) == _torch_draw(row, params, *key)


def test_a_temperature_below_float32s_range_draws_among_the_maxima() -> None:
    """Temperature 1e-50 (0 in float32): a point mass on the two tied maxima, as the torch
    path's, never a NaN race."""
    row = torch.tensor([0.5, 3.0, -1.0, 3.0, 2.0])
    params = SamplingParams(temperature=1e-50)
    draws = [cpu_draw.coupled_draw(row, params, 4, t, BLOCK) for t in range(200)]
    assert set(draws) == {1, 3}
    assert draws == [_torch_draw(row, params, 4, t) for t in range(200)]


def test_at_temperature_zero_the_draw_is_the_first_maximum() -> None:
    """Temperature 0: the first index of the row's maximum, whatever the key."""
    row = torch.tensor([0.5, 3.0, -1.0, 3.0, 2.0])
    draws = {cpu_draw.coupled_draw(row, SamplingParams(), seed, 9, BLOCK) for seed in range(20)}
    assert draws == {1}


@pytest.mark.parametrize("top_k", [1000, 2**64 + 5])
def test_a_top_k_of_the_vocabulary_or_more_cuts_nothing(top_k: int) -> None:
    """top-k >= V keeps every token, also past 64 bits (where a C integer would wrap to 5)."""
    row = torch.linspace(0.0, 2.0, 1000)
    params = SamplingParams(temperature=1.0, top_k=top_k)
    draws = [cpu_draw.coupled_draw(row, params, 2, t, BLOCK) for t in range(300)]
    assert draws == [_torch_draw(row, params, 2, t) for t in range(300)]
    assert min(d for d in draws if d is not None) < 990  # beyond the 5 largest


def test_top_k_keeps_ties_with_the_kth_and_nothing_just_below() -> None:
    """top-k 3 on a row whose four largest logits tie and 390 more sit 1e-4 below them: 2,000
    draws take all four tied tokens and nothing else."""
    row = torch.zeros(1000)
    row[11:401] = 2.0 - 1e-4
    row[[10, 500, 600, 900]] = 2.0
    params = SamplingParams(temperature=1.0, top_k=3)
    draws = {cpu_draw.coupled_draw(row, params, 8, t, BLOCK) for t in range(2000)}
    assert draws == {10, 500, 600, 900}


@pytest.mark.parametrize("sampling", ["T=1", "T=0.8,top-p=0.95", "T=1.2,min-p=0.1"])
def test_draws_over_positions_follow_the_processed_distribution(sampling: str) -> None:
    """20,000 draws at one seed over positions, on a row of 600 logits (three blocks, the
    last one short), pass chi-square against the processed distribution."""
    params = SAMPLINGS[sampling]
    row = torch.full((600,), -6.0)
    row[[3, 40, 255, 256, 300, 511, 599]] = torch.tensor([1.0, 0.2, 0.8, -0.5, 0.0, 1.4, -1.0])
    draws = 20_000
    counts = Counter(cpu_draw.coupled_draw(row, params, 3, t, BLOCK) for t in range(draws))
    q = params.probs(row.double(), torch.float64)
    assert all(q[token] > 0 for token in counts), "a token of probability 0 was drawn"
    cells = [int(t) for t in torch.nonzero(q * draws >= 5).flatten()]  # the rest pooled
    observed = [counts.get(t, 0) for t in cells]
    expected = [float(q[t]) * draws for t in cells]
    rest = draws - sum(expected)
    if rest > 1e-9:
        observed.append(draws - sum(observed))
        expected.append(rest)
    assert chisquare(observed, expected).pvalue > ALPHA


def test_threads_draw_the_same_tokens_as_one_thread() -> None:
    """Two threads drawing at once (each with its own buffers, rows of two sizes) draw what
    one thread draws."""
    params = SAMPLINGS["T=0.8,top-p=0.95"]
    generator = torch.Generator().manual_seed(5)
    rows = {v: 3 * torch.randn(v, generator=generator) for v in (49152, 1000)}

    def draws(vocab: int) -> list[int | None]:
        return [cpu_draw.coupled_draw(rows[vocab], params, 1, t, BLOCK) for t in range(200)]

    expected = {vocab: draws(vocab) for vocab in rows}
    found: dict[int, list[int | None]] = {}

    def run(vocab: int) -> None:
        found[vocab] = draws(vocab)

    threads = [threading.Thread(target=run, args=(v,)) for v in rows]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert found == expected


NOT_TAKEN = {
    "float64": (torch.zeros(10, dtype=torch.float64), SAMPLINGS["T=1"]),
    "strided": (torch.zeros(20)[::2], SAMPLINGS["T=1"]),
    "NaN": (torch.tensor([0.0, math.nan, 1.0]), SAMPLINGS["T=1"]),
    "+inf": (torch.tensor([0.0, math.inf, 1.0]), SAMPLINGS["T=1"]),
    "all -inf": (torch.full((4,), -math.inf), SAMPLINGS["T=1"]),
    "two rows": (torch.zeros(2, 5), SAMPLINGS["T=1"]),
}


@pytest.mark.parametrize("case", list(NOT_TAKEN))
def test_rows_it_does_not_take_return_none(case: str) -> None:
    """float64, strided or 2-d rows, and a NaN, +inf or all -inf row: None (the caller takes
    the torch path)."""
    row, params = NOT_TAKEN[case]
    assert cpu_draw.coupled_draw(row, params, 0, 0, BLOCK) is None


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_the_verifier_still_names_a_bad_row(bad: float) -> None:
    """A row the kernel refuses reaches the torch path, which raises NonFiniteLogitsError."""
    logits = torch.zeros(1, 6)
    logits[0, 2] = bad
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(NonFiniteLogitsError, match="NaN or \\+inf"):
        Coupled().verify(DraftTree.empty(), logits, SAMPLINGS["T=1"], generator, position=4)

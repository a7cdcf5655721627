"""Tests of verispec/core/sampling.py: validated parameters and the processed distribution."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import logit_rows, sampling_params

from verispec.core.sampling import SamplingParams, _top_p_drop, _top_p_drop_sorted
from verispec.errors import ConfigError, NonFiniteLogitsError


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.5),
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("temperature", "1"),
        ("temperature", True),
        ("top_k", -1),
        ("top_k", 1.5),
        ("top_k", True),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_p", -0.1),
        ("top_p", math.nan),
        ("min_p", 1.0),
        ("min_p", -0.1),
        ("min_p", math.nan),
    ],
)
def test_invalid_fields_raise_config_error_naming_the_field(field: str, value: object) -> None:
    """Each out-of-range field raises ConfigError whose message names it and the value."""
    with pytest.raises(ConfigError, match=f"`{field}` must be .*; got {value!r}"):
        SamplingParams(**{field: value})


def test_defaults_are_greedy_and_unfiltered() -> None:
    """The default parameters are greedy decoding with no filtering."""
    params = SamplingParams()
    assert params.is_greedy
    assert (params.top_k, params.top_p, params.min_p) == (0, 1.0, 0.0)


@settings(max_examples=100)
@given(data=st.data(), params=sampling_params())
def test_probs_is_a_distribution_on_the_finite_logits(data: st.DataObject, params) -> None:
    """Every row is non-negative, sums to 1, vanishes on -inf logits and keeps a maximum.

    (Which of several tied maxima top-p keeps is unspecified, so the property is that
    the tied maxima together keep positive mass.)
    """
    logits = data.draw(logit_rows(3, data.draw(st.integers(1, 9))))
    for dtype in (torch.float32, torch.float64):
        probs = params.probs(logits, dtype)
        assert probs.dtype == dtype and probs.shape == logits.shape
        assert bool((probs >= 0).all())
        assert torch.allclose(probs.sum(-1), torch.ones(3, dtype=dtype), atol=1e-6)
        assert bool((probs[logits == -math.inf] == 0).all())
        cast = logits.to(dtype)
        maxima = cast == cast.amax(-1, keepdim=True)
        assert bool(((probs * maxima).sum(-1) > 0).all())


def test_temperature_zero_is_the_argmax_one_hot_in_the_logits_precision() -> None:
    """Greedy rows are one-hot on the first maximum, decided before any cast."""
    logits = torch.tensor([[0.0, 2.2e-313, -1.0], [1.0, 3.0, 3.0]], dtype=torch.float64)
    probs = SamplingParams().probs(logits, torch.float32)  # 2.2e-313 is 0 in float32
    assert probs.tolist() == [[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]]


def test_temperature_scales_logits_before_softmax() -> None:
    """At temperature T the distribution is softmax(logits / T)."""
    logits = torch.tensor([0.3, -1.2, 2.0, 0.0], dtype=torch.float64)
    for temperature in (0.25, 1.0, 3.0):
        probs = SamplingParams(temperature=temperature).probs(logits, torch.float64)
        assert torch.allclose(probs, torch.softmax(logits / temperature, -1), atol=1e-15)


def test_tiny_temperature_does_not_overflow() -> None:
    """A tiny temperature gives a point mass, not NaN (logits are shifted by the max first)."""
    logits = torch.tensor([1000.0, 999.0, -5.0])
    probs = SamplingParams(temperature=1e-30).probs(logits)
    assert probs.tolist() == [1.0, 0.0, 0.0]


def test_a_temperature_below_the_dtypes_range_is_a_point_mass_on_the_maxima() -> None:
    """Temperature 1e-50 rounds to 0 in float32: the result is still the point mass on the
    maxima (ties shared), not NaN, in float32 and in float64."""
    logits = torch.tensor([1.0, 3.0, -5.0, 3.0])
    for dtype in (torch.float32, torch.float64):
        probs = SamplingParams(temperature=1e-50).probs(logits, dtype)
        assert probs.tolist() == [0.0, 0.5, 0.0, 0.5]


def test_top_k_keeps_the_k_largest_and_their_ties() -> None:
    """top_k zeroes all but the k largest logits; a tie with the k-th is kept."""
    logits = torch.tensor([1.0, 4.0, 2.0, 2.0, 0.0], dtype=torch.float64)
    probs = SamplingParams(temperature=1.0, top_k=2).probs(logits, torch.float64)
    assert (probs > 0).tolist() == [False, True, True, True, False]
    probs = SamplingParams(temperature=1.0, top_k=9).probs(logits, torch.float64)
    assert bool((probs > 0).all())


def test_top_p_keeps_the_smallest_prefix_reaching_the_mass() -> None:
    """top_p keeps the most likely tokens until their mass reaches top_p, then stops."""
    base = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    logits = base.log()
    for top_p, kept in [(0.49, 1), (0.55, 2), (0.79, 2), (0.85, 3), (0.96, 4), (1.0, 4)]:
        probs = SamplingParams(temperature=1.0, top_p=top_p).probs(logits, torch.float64)
        assert int((probs > 0).sum()) == kept, top_p
        assert torch.allclose(probs[:kept], base[:kept] / base[:kept].sum(), atol=1e-15)


@pytest.mark.parametrize("scale", [4.0, 0.5, 0.02])
def test_top_p_matches_a_full_sort_at_large_vocabularies(scale: float) -> None:
    """The top-k search for the top-p cut (256, 4096, then V tokens) equals a full sort."""
    gen = torch.Generator().manual_seed(0)
    logits = scale * torch.randn(2, 5000, generator=gen, dtype=torch.float64)
    params = SamplingParams(temperature=1.0, top_p=0.9)
    probs = torch.softmax(logits, -1)
    sorted_probs, order = probs.sort(-1, descending=True)
    keep_sorted = (sorted_probs.cumsum(-1) - sorted_probs) < 0.9
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    expected = torch.where(keep, probs, 0.0)
    expected = expected / expected.sum(-1, keepdim=True)
    assert torch.allclose(params.probs(logits, torch.float64), expected, atol=1e-15)


@pytest.mark.parametrize("scale", [8.0, 3.0, 1.0, 0.02])
@pytest.mark.parametrize("top_p", [0.5, 0.95, 0.999])
def test_the_cpu_top_p_ranking_equals_the_full_sort_a_gpu_runs(scale: float, top_p: float) -> None:
    """The CPU's top-p cut (a top set of candidates ranked in NumPy) drops exactly the tokens
    the full stable sort drops (what a GPU runs), from peaked to flat rows, ties included."""
    gen = torch.Generator().manual_seed(int(scale * 10))
    scores = scale * torch.randn(3, 49152, generator=gen)
    scores[2, 100:400] = scores[2, 7]  # ties with a likely token
    got = _top_p_drop(scores, top_p)
    assert torch.equal(got, _top_p_drop_sorted(scores.softmax(-1), top_p))
    assert bool((~got).any(-1).all())  # every row keeps a token


def test_top_p_is_applied_after_temperature() -> None:
    """The top_p mass is measured on the tempered distribution."""
    logits = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64).log()
    cold = SamplingParams(temperature=0.5, top_p=0.6).probs(logits, torch.float64)
    # tempered: (0.5^2, 0.3^2, 0.2^2) / 0.38 = (0.658, 0.237, 0.105): the first reaches 0.6
    assert (cold > 0).tolist() == [True, False, False]


def test_min_p_drops_tokens_below_a_fraction_of_the_best() -> None:
    """min_p removes tokens whose probability is below min_p times the largest one."""
    base = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    probs = SamplingParams(temperature=1.0, min_p=0.31).probs(base.log(), torch.float64)
    assert (probs > 0).tolist() == [True, True, False, False]
    assert torch.allclose(probs[:2], torch.tensor([0.625, 0.375], dtype=torch.float64))


@settings(max_examples=60)
@given(
    logits=st.lists(st.integers(-600, 600), min_size=6, max_size=6, unique=True),
    params=sampling_params(allow_greedy=False),
)
def test_matches_transformers_logits_warpers(logits: list[int], params) -> None:
    """Same distribution as Hugging Face's temperature, top-k, top-p, min-p warpers in order.

    Logits are distinct multiples of 0.01, so no two tokens tie.
    """
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    scores = torch.tensor([logits], dtype=torch.float64) / 100
    warpers = [TemperatureLogitsWarper(params.temperature)]
    if params.top_k:
        warpers.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1:
        warpers.append(TopPLogitsWarper(params.top_p))
    if params.min_p > 0:
        warpers.append(MinPLogitsWarper(params.min_p))
    hf = scores
    for warper in warpers:
        hf = warper(torch.zeros(1, 1, dtype=torch.long), hf)
    expected = torch.softmax(hf, -1)
    ours = params.probs(scores, torch.float64)
    assert ((ours > 0) == (expected > 0)).all() or _boundary_tie(scores, params)
    if ((ours > 0) == (expected > 0)).all():
        assert torch.allclose(ours, expected, atol=1e-12)


def _boundary_tie(scores: torch.Tensor, params: SamplingParams) -> bool:
    """True when a top-p cut falls within rounding of a cumulative mass (either side is right)."""
    if params.top_p == 1:
        return False
    probs = torch.softmax(scores / params.temperature, -1).sort(descending=True).values
    return bool(((probs.cumsum(-1) - params.top_p).abs() < 1e-9).any())


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_nan_or_positive_infinity_raises(bad: float, temperature: float) -> None:
    """NaN or +inf logits raise NonFiniteLogitsError, greedy or not."""
    logits = torch.tensor([[0.0, 1.0], [bad, 0.0]])
    with pytest.raises(NonFiniteLogitsError, match="NaN or \\+inf"):
        SamplingParams(temperature=temperature).probs(logits)


def test_a_row_of_negative_infinity_raises() -> None:
    """A row with no finite logit has no distribution."""
    logits = torch.tensor([[0.0, 1.0], [-math.inf, -math.inf]])
    with pytest.raises(NonFiniteLogitsError, match="all -inf"):
        SamplingParams(temperature=1.0).probs(logits)


def test_dtype_must_be_floating() -> None:
    """Asking for an integer distribution is a configuration error."""
    with pytest.raises(ConfigError, match="`dtype`"):
        SamplingParams(temperature=1.0).probs(torch.zeros(3), torch.int64)

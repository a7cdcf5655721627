"""Hypothesis strategies shared by the test suite: distributions, draft trees, sampling.

Distributions are float64 tensors of shape (V,) that sum to 1, drawn from shapes
chosen to break acceptance rules: zeros, near-ties, point masses, uniform; pairs of
(target, draft) add draft = target, disjoint supports and tiny perturbations.
Other modules may append strategies here.
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from verispec.core.sampling import SamplingParams
from verispec.core.tree import DETERMINISTIC, DraftTree

__all__ = [
    "distribution_pairs",
    "distributions",
    "draft_trees",
    "logit_rows",
    "parent_lists",
    "sampling_params",
    "vocab_sizes",
]

DISTRIBUTION_KINDS = ("random", "sparse", "near_tie", "point_mass", "uniform", "skewed")
PAIR_KINDS = ("independent", "equal", "disjoint", "perturbed", "draft_point_mass", "shared_zeros")


def vocab_sizes(min_value: int = 2, max_value: int = 8) -> st.SearchStrategy[int]:
    """Vocabulary sizes V small enough to enumerate."""
    return st.integers(min_value, max_value)


def _normalised(weights: list[float]) -> torch.Tensor:
    tensor = torch.tensor(weights, dtype=torch.float64)
    return tensor / tensor.sum()


@st.composite
def distributions(
    draw: st.DrawFn, vocab_size: int, kinds: tuple[str, ...] = DISTRIBUTION_KINDS
) -> torch.Tensor:
    """A probability vector, float64, Shape: (V,), summing to 1 (to rounding).

    Kinds: ``random`` (any weights), ``sparse`` (about half the entries exactly 0),
    ``near_tie`` (entries equal up to 1e-9), ``point_mass``, ``uniform``, ``skewed``
    (weights spanning ten orders of magnitude).
    """
    kind = draw(st.sampled_from(kinds))
    size = vocab_size
    if kind == "point_mass":
        token = draw(st.integers(0, size - 1))
        return _normalised([1.0 if i == token else 0.0 for i in range(size)])
    if kind == "uniform":
        return _normalised([1.0] * size)
    if kind == "near_tie":
        jitter = draw(st.lists(st.integers(-3, 3), min_size=size, max_size=size))
        return _normalised([1.0 + 1e-9 * j for j in jitter])
    if kind == "skewed":
        exponents = draw(st.lists(st.integers(-10, 0), min_size=size, max_size=size))
        return _normalised([10.0**e for e in exponents])
    weights = draw(
        st.lists(st.floats(0.0, 1.0, allow_subnormal=False), min_size=size, max_size=size)
    )
    if kind == "sparse":
        keep = draw(st.lists(st.booleans(), min_size=size, max_size=size))
        weights = [w if k else 0.0 for w, k in zip(weights, keep, strict=True)]
    if math.fsum(weights) <= 1e-6:  # no usable mass: put it on one token
        weights[draw(st.integers(0, size - 1))] = 1.0
    return _normalised(weights)


@st.composite
def distribution_pairs(
    draw: st.DrawFn, vocab_size: int, kinds: tuple[str, ...] = PAIR_KINDS
) -> tuple[torch.Tensor, torch.Tensor]:
    """(target, draft), each float64 of Shape: (V,), related in a chosen way.

    Kinds: ``independent``, ``equal`` (draft = target, bit for bit), ``disjoint``
    (supports do not meet), ``perturbed`` (draft = target up to relative 1e-12),
    ``draft_point_mass``, ``shared_zeros`` (both vanish on the same tokens).
    """
    kind = draw(st.sampled_from(kinds))
    target = draw(distributions(vocab_size))
    if kind == "equal":
        return target, target.clone()
    if kind == "perturbed":
        signs = torch.tensor(
            draw(st.lists(st.sampled_from([-1.0, 1.0]), min_size=vocab_size, max_size=vocab_size)),
            dtype=torch.float64,
        )
        draft = target * (1 + 1e-12 * signs)
        return target, draft / draft.sum()
    if kind == "disjoint":
        split = draw(st.integers(1, vocab_size - 1))
        left = draw(distributions(split))
        right = draw(distributions(vocab_size - split))
        zeros_l = torch.zeros(split, dtype=torch.float64)
        zeros_r = torch.zeros(vocab_size - split, dtype=torch.float64)
        pair = (torch.cat([left, zeros_r]), torch.cat([zeros_l, right]))
        return pair if draw(st.booleans()) else (pair[1], pair[0])
    if kind == "draft_point_mass":
        token = draw(st.integers(0, vocab_size - 1))
        return target, _normalised([1.0 if i == token else 0.0 for i in range(vocab_size)])
    draft = draw(distributions(vocab_size))
    if kind == "shared_zeros":
        support = (target > 0) & (draft > 0)
        if bool(support.any()):
            target = target * support / (target * support).sum()
            draft = draft * support / (draft * support).sum()
    return target, draft


@st.composite
def parent_lists(draw: st.DrawFn, max_nodes: int = 12, min_nodes: int = 0) -> list[int]:
    """A valid ``parents`` list: node i's parent is -1 (the root) or an earlier node."""
    n = draw(st.integers(min_nodes, max_nodes))
    return [draw(st.integers(-1, i - 1)) for i in range(n)]


@st.composite
def draft_trees(
    draw: st.DrawFn, vocab_size: int, max_nodes: int = 12, distinct_siblings: bool = True
) -> DraftTree:
    """A Deterministic-law tree over vocabulary V (siblings distinct unless told)."""
    parents = draw(parent_lists(max_nodes))
    used: dict[int, set[int]] = {}
    tokens: list[int] = []
    for parent in parents:
        taken = used.setdefault(parent, set())
        free = [t for t in range(vocab_size) if t not in taken] if distinct_siblings else []
        if distinct_siblings and not free:
            break  # this parent already has one child per token
        token = (
            draw(st.sampled_from(free))
            if distinct_siblings
            else draw(st.integers(0, vocab_size - 1))
        )
        taken.add(token)
        tokens.append(token)
    parents = parents[: len(tokens)]
    return DraftTree.from_parents(tokens, parents, DETERMINISTIC)


@st.composite
def logit_rows(draw: st.DrawFn, rows: int, vocab_size: int) -> torch.Tensor:
    """float64 logits of Shape: (rows, V), ties and -inf included, one finite entry a row."""
    values = st.one_of(
        st.floats(-8.0, 8.0, allow_nan=False), st.sampled_from([0.0, 1.0, -math.inf])
    )
    flat = draw(st.lists(values, min_size=rows * vocab_size, max_size=rows * vocab_size))
    logits = torch.tensor(flat, dtype=torch.float64).reshape(rows, vocab_size)
    logits[:, 0] = logits[:, 0].clamp(min=-8.0)  # every row keeps one finite entry
    return logits


def sampling_params(allow_greedy: bool = True) -> st.SearchStrategy[SamplingParams]:
    """Valid :class:`SamplingParams` covering every processing step."""
    temperature = st.floats(0.05, 3.0)
    if allow_greedy:
        temperature = st.one_of(st.just(0.0), temperature)
    return st.builds(
        SamplingParams,
        temperature=temperature,
        top_k=st.integers(0, 6),
        top_p=st.one_of(st.just(1.0), st.floats(0.05, 1.0, exclude_min=True)),
        min_p=st.one_of(st.just(0.0), st.floats(0.0, 0.9)),
    )

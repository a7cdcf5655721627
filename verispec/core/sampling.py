"""Sampling parameters: how logits become the distribution that decoding samples from.

The same processing is applied to target *and* draft logits before any
acceptance rule runs; verispec's exactness guarantee is with respect to the
processed target distribution. Order of operations, as in Hugging Face
transformers' default logits processors: temperature, then top-k, then top-p,
then min-p. Temperature 0 is greedy decoding: the distribution is the one-hot
of the argmax.

Shape glossary (docs/glossary): V vocabulary.
"""

from __future__ import annotations

import math

import attrs
import numpy as np
import torch

from verispec.core.validate import attrs_check, integer, interval, number
from verispec.errors import ConfigError, NonFiniteLogitsError

__all__ = ["SamplingParams", "argmax_one"]

_NUMPY_DTYPES = (torch.float32, torch.float64, torch.float16)


def argmax_one(scores: torch.Tensor) -> int:
    """``int(scores.argmax())`` of one row: the first maximum (a NaN counts as the maximum).

    A float32, float64 or float16 row on the CPU is scanned by NumPy's vectorised argmax,
    the same index as ``torch.argmax`` at a fraction of its cost at V = 49,152
    (verification's one argmax per plain step); other rows by torch.

    Args:
        scores: float, Shape: (V,).
    """
    if scores.device.type == "cpu" and scores.dtype in _NUMPY_DTYPES:
        return int(scores.detach().numpy().argmax())
    return int(scores.argmax())


def _non_finite_error(logits: torch.Tensor) -> NonFiniteLogitsError:
    """Say what is wrong with logits whose row maximum is not finite (off the hot path)."""
    if bool(torch.isnan(logits).any()) or bool((logits == math.inf).any()):
        return NonFiniteLogitsError(
            "`logits` contain NaN or +inf; refusing to sample from them. "
            "Check the model's dtype (float16 overflows) and its inputs."
        )
    return NonFiniteLogitsError(
        "`logits` have a row whose entries are all -inf, so no distribution can be formed."
    )


def _top_p_candidates(row: np.ndarray, top_p: float) -> np.ndarray:
    """Indices (ascending) of a top set of ``row``'s probabilities of mass >= ``top_p``: those
    at least ``p_max / 2**10``, else ``/ 2**14``, else ``/ 2**20``, else ``(1 - top_p) /
    (2 V)``, the first threshold whose set reaches the mass (the last always does: the
    tokens below it hold less than ``1 - top_p`` together), else every index."""
    vocab_size = row.shape[0]
    most = float(row.max())
    for floor in (most / 2**10, most / 2**14, most / 2**20, (1.0 - top_p) / (2 * vocab_size)):
        index = np.flatnonzero(row >= floor)
        if row[index].sum(dtype=np.float64) >= top_p:
            return index
    return np.arange(vocab_size)


def _top_p_drop_sorted(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """:func:`_top_p_drop` of probabilities by a full stable sort of each row, on their
    device."""
    top, order = probs.sort(dim=-1, descending=True, stable=True)
    drop_sorted = (top.cumsum(-1, dtype=torch.float64) - top) >= top_p
    return torch.empty_like(drop_sorted).scatter_(-1, order, drop_sorted)


def _top_p_drop(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """bool, Shape: (..., V): tokens outside the smallest most-likely set of mass >= top_p.

    A token is dropped when the mass of the tokens ranked before it (ties in index order;
    masses summed in float64) already reaches ``top_p``. Instead of sorting all V
    probabilities (slow at V = 49,152 on a small CPU), each row sorts only a top set of them
    that holds the mass (:func:`_top_p_candidates`): every other token ranks after all of
    the set, so they are all dropped exactly when the set's mass reaches ``top_p`` (checked
    on the cumulative sum; a row where it does not is sorted whole). Same result as a full
    sort (:func:`_top_p_drop_sorted`, which a GPU runs instead: no host sync there).
    """
    probs = scores.softmax(-1)
    if probs.device.type != "cpu":
        return _top_p_drop_sorted(probs, top_p)
    vocab_size = scores.shape[-1]
    flat = probs.detach().reshape(-1, vocab_size)
    rows = (flat.float() if flat.dtype == torch.bfloat16 else flat).numpy()  # NumPy has no bf16
    drop = np.ones(rows.shape, dtype=bool)
    for r, row in enumerate(rows):
        index = _top_p_candidates(row, top_p)
        order = index[np.argsort(-row[index], kind="stable")]
        top = row[order]
        cumulative = top.cumsum(dtype=np.float64)
        if cumulative[-1] < top_p and len(index) < vocab_size:
            order = np.argsort(-row, kind="stable")
            top = row[order]
            cumulative = top.cumsum(dtype=np.float64)
        drop[r, order] = (cumulative - top) >= top_p
    return torch.from_numpy(drop).reshape(probs.shape)


@attrs.frozen
class SamplingParams:
    """How logits are turned into the distribution decoding samples from.

    Attributes:
        temperature: ``0`` means greedy (argmax); otherwise logits are divided by it (by
            the dtype's smallest normal number where it is smaller: a point mass on the
            maxima either way).
        top_k: keep the ``top_k`` most likely tokens (ties with the k-th are kept);
            ``0`` keeps all.
        top_p: keep the smallest set of most likely tokens whose mass reaches ``top_p``;
            ``1`` keeps all.
        min_p: drop tokens whose probability is below ``min_p`` times the largest one;
            ``0`` keeps all.
    """

    temperature: float = attrs.field(
        default=0.0, validator=attrs_check(number, note=" (0 means greedy)")
    )
    top_k: int = attrs.field(default=0, validator=attrs_check(integer, 0, note=" (0 disables it)"))
    top_p: float = attrs.field(
        default=1.0, validator=attrs_check(interval, 0, 1, closed="high", note=" (1 disables it)")
    )
    min_p: float = attrs.field(
        default=0.0, validator=attrs_check(interval, 0, 1, closed="low", note=" (0 disables it)")
    )

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The processed distribution of each row of ``logits``.

        One host sync (the finiteness check of the row maxima).

        Args:
            logits: float, Shape: (..., V).
            dtype: float32 or float64, the precision of the result.

        Returns:
            ``dtype``, Shape: (..., V); each row sums to 1. At temperature 0 each
            row is the one-hot of its argmax (ties go to the lowest index).

        Raises:
            NonFiniteLogitsError: a row contains NaN or +inf, or has no finite entry.
        """
        if not dtype.is_floating_point:
            raise ConfigError(f"`dtype` must be a floating dtype; got {dtype}.")
        # NaN and +inf propagate to the row maximum, and a row of -inf has maximum -inf:
        # one reduction checks all three.
        row_max = logits.amax(-1, keepdim=True)  # (..., 1)
        if not bool(torch.isfinite(row_max).all()):
            raise _non_finite_error(logits)
        if self.is_greedy:
            # argmax in the logits' own precision: casting first could merge near-ties
            out = torch.zeros(logits.shape, dtype=dtype, device=logits.device)
            out.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
            return out
        logits = logits.to(dtype)
        row_max = row_max.to(dtype)
        # Shifting by the maximum first keeps every score <= 0, so dividing by a tiny
        # temperature can underflow to -inf but never overflow to +inf (no NaN).
        scores = logits - row_max
        if self.temperature != 1:
            # a temperature the dtype rounds to 0 divides as its smallest normal number:
            # still a point mass on the maxima, where 0 would make 0 / 0 = NaN
            scores = scores / max(self.temperature, torch.finfo(dtype).tiny)
        if self.top_k and self.top_k < scores.shape[-1]:
            kth = torch.topk(scores, self.top_k, dim=-1).values[..., -1:]
            scores = torch.where(scores < kth, -math.inf, scores)  # masked_fill's values, faster
        if self.top_p < 1.0:
            scores = torch.where(_top_p_drop(scores, self.top_p), -math.inf, scores)
        probs = scores.softmax(-1)
        if self.min_p > 0:
            floor = self.min_p * probs.amax(-1, keepdim=True)
            probs = probs.masked_fill(probs < floor, 0.0)
            probs = probs / probs.sum(-1, keepdim=True)
        return probs

"""Draws from draft distributions, batched over rows, without a full-vocabulary random pass.

Every draft-model drafter draws its tokens here, from the processed draft distribution
it declares in its proposal law. The laws of the draws are the textbook ones; what is
not textbook is how little of the vocabulary each draw touches. On a CPU at
V = 49,152, one uniform per token or a ``torch.topk`` costs tens of times what a
reduction (``sum``, ``amax``) does. So each row is viewed
as ``V / B`` blocks of ``B`` tokens; one reduction gives the block masses (or maxima),
and only the few blocks that a draw can reach are opened:

* :func:`sample_iid` — i.i.d. draws by a two-level inverse CDF in float64: pick a block
  by the cumulative block masses, then a token by the cumulative masses inside it.
* :func:`race_without_replacement` — ordered draws without replacement as the first
  arrivals of an exponential race (token ``y`` arrives at ``E_y / p(y)``, ``E_y ~
  Exp(1)``; arrival order is Gumbel-top-k order: Vieira 2014; Kool et al. 2019), with
  the race run per block: see its docstring for why that is the same law.
* :func:`top_indices` — the ``k`` largest entries of each row via block maxima.

Also here: the processed draft distribution (:func:`processed_probs`) and
:func:`race_keys`, the full-row exponential-race keys DySpec uses.

Notation: R rows, V vocabulary, B tokens per block, K draws per row.
"""

from __future__ import annotations

import bisect
import itertools
import math

import torch
import torch.nn.functional as F

from verispec.core.sampling import SamplingParams

__all__ = [
    "processed_probs",
    "race_keys",
    "race_without_replacement",
    "sample_iid",
    "sample_one",
    "top_indices",
]

_BLOCK = 128  # tokens per block (B)
_SLACK = {dtype: 1 + _BLOCK * torch.finfo(dtype).eps for dtype in (torch.float32, torch.float64)}


def processed_probs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """The draft distribution the drafter draws from and declares in its proposal law.

    At temperature > 0 this is ``sampling.probs(logits)``, the same processing as the
    target's; with temperature only, the same operations in one buffer (each fresh
    R x V temporary costs page faults on a CPU). At temperature 0 the draws are the
    draft's top choices, and this returns the plain softmax of the logits, used only to
    rank tokens and to value tree slots.

    Args:
        logits: float, Shape: (..., V).

    Returns:
        float64 when ``logits`` are float64, else float32; Shape: (..., V).
    """
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    if sampling.is_greedy:
        return torch.softmax(logits.to(dtype), -1)
    if sampling.top_k or sampling.top_p < 1 or sampling.min_p > 0:
        return sampling.probs(logits, dtype)
    row_max = logits.amax(-1, keepdim=True)  # (..., 1)
    if not math.isfinite(float(row_max.sum())):  # NaN, +inf or a row of -inf
        return sampling.probs(logits, dtype)  # raises NonFiniteLogitsError
    probs = torch.sub(logits.to(dtype), row_max.to(dtype))  # sampling.probs' scores
    if sampling.temperature != 1:
        probs.div_(sampling.temperature)
    return torch.softmax(probs, -1, out=probs)  # in place: row by row, read before written


def race_keys(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Exponential-race keys ``p / E``, E ~ Exp(1) i.i.d.: larger keys come first.

    ``log(p / E) = log p + G`` with ``G = -log E`` a standard Gumbel, so sorting a row's
    keys in decreasing order is Gumbel-top-k: a sequence of draws without replacement
    from that row (Vieira 2014; Kool et al. 2019). Zero-probability tokens get key 0.
    ``E = -log U`` with ``U`` uniform: about six times cheaper on a CPU than
    ``Tensor.exponential_``.

    Args:
        probs: float, Shape: (..., V).

    Returns:
        same dtype, Shape: (..., V); ``log`` of it gives the Gumbel-perturbed log-probs.
    """
    uniform = torch.rand(probs.shape, generator=generator, dtype=probs.dtype, device=probs.device)
    exponential = -uniform.clamp_min_(torch.finfo(probs.dtype).tiny).log_()  # (0, 745]
    return probs / exponential


def _exponential(
    shape: tuple[int, ...], like: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """float64 Exp(1) draws, ``-log U``, Shape: ``shape``, on ``like``'s device."""
    uniform = torch.rand(shape, generator=generator, dtype=torch.float64, device=like.device)
    return uniform.clamp_min_(torch.finfo(torch.float64).tiny).log_().neg_()  # (0, 745]


def _blocks(rows: torch.Tensor, fill: float) -> torch.Tensor:
    """``rows`` (Shape: (..., V)) as blocks, Shape: (..., V / B, B), padded with ``fill``."""
    pad = -rows.shape[-1] % _BLOCK
    if pad:
        rows = F.pad(rows, (0, pad), value=fill)
    return rows.reshape(*rows.shape[:-1], -1, _BLOCK)


def _open(blocks: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The blocks ``index`` (int64, Shape: (R, K)) of each row: Shape: (R, K, B)."""
    return blocks.gather(1, index.unsqueeze(-1).expand(-1, -1, blocks.shape[-1]))


def top_indices(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest entries of each row, largest first.

    The ``k`` largest entries lie in the ``k`` blocks with the largest maxima (a block
    outside them has ``k`` block maxima at least as large as any of its entries), so
    only those ``k * B`` entries are ranked. Ties may be broken in another order than
    ``torch.topk``'s (which documents none).

    Args:
        scores: float, Shape: (..., V).
        k: ``1 <= k <= V``.

    Returns:
        int64, Shape: (..., k).
    """
    if scores.shape[-1] <= 4 * _BLOCK:
        return torch.topk(scores, k, dim=-1).indices
    lead = scores.shape[:-1]
    blocks = _blocks(scores.reshape(-1, scores.shape[-1]), -math.inf)  # (R, V / B, B)
    chosen = torch.topk(blocks.amax(-1), min(k, blocks.shape[1]), dim=-1).indices  # (R, K)
    best = torch.topk(_open(blocks, chosen).flatten(1), k, dim=-1).indices  # (R, k)
    block = chosen.gather(1, torch.div(best, _BLOCK, rounding_mode="floor"))
    return (block * _BLOCK + best % _BLOCK).reshape(*lead, k)


def _mass_bounds(blocks: torch.Tensor) -> torch.Tensor:
    """float64 upper bounds of the blocks' masses, Shape: (R, V / B).

    One reduction in the probabilities' own precision (a float64 sum of float32 blocks
    costs three times more on a CPU), inflated by ``B * eps``, more than the worst-case
    relative error of any order of summation of ``B`` non-negative terms, ``(B - 1) u``.
    An empty block keeps the bound 0. The draws use these bounds with rejection, so
    their law does not depend on the rounding.
    """
    slack = _SLACK.get(blocks.dtype) or 1 + _BLOCK * torch.finfo(blocks.dtype).eps
    return blocks.sum(-1).to(torch.float64).mul_(slack)


def _inverse_cdf(
    blocks: torch.Tensor, cdf: torch.Tensor, n: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """One attempt of :func:`sample_iid`: ``(tokens, accepted)``, Shape: (R, n)."""
    total = cdf[:, -1:]  # (R, 1)
    x = torch.rand(
        (blocks.shape[0], n), generator=generator, dtype=torch.float64, device=blocks.device
    )
    x = torch.minimum(x.mul_(total), total.nextafter(torch.zeros_like(total)))  # x < total
    block = torch.searchsorted(cdf, x, right=True)  # (R, n): cdf[block - 1] <= x < cdf[block]
    before = torch.where(block > 0, cdf.gather(1, (block - 1).clamp_min_(0)), 0.0)
    icdf = _open(blocks, block).to(torch.float64).cumsum_(-1)  # (R, n, B)
    offset = (x - before).unsqueeze(-1)  # uniform in [0, bound of the block's mass)
    token = torch.searchsorted(icdf, offset, right=True).squeeze(-1)  # B: past the mass
    accepted = offset.squeeze(-1) < icdf[..., -1]
    return block * _BLOCK + token.clamp_max_(_BLOCK - 1), accepted


def sample_iid(probs: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` independent draws from each row of ``probs``, by inverse CDF in float64.

    Two levels: a uniform ``x`` in ``[0, sum of the bounds)`` picks the block whose
    interval of cumulative mass bounds (:func:`_mass_bounds`) holds it; inside that
    block, ``y = x - (bounds before it)`` is uniform in ``[0, bound)``: if ``y`` is below
    the block's float64 cumulative mass it picks the token whose interval holds it,
    otherwise (probability about ``B * eps``) the attempt is rejected and drawn again.
    Each attempt picks token ``t`` with probability ``p(t) / (sum of the bounds)``, so
    an accepted draw has probability ``p(t) / sum(p)``. Tokens of zero probability have
    empty intervals and are never drawn.

    Args:
        probs: float, Shape: (R, V); rows with positive, finite mass.
        n: draws per row.

    Returns:
        int64, Shape: (R, n).
    """
    blocks = _blocks(probs, 0.0)  # (R, V / B, B)
    cdf = _mass_bounds(blocks).cumsum_(-1)  # (R, V / B)
    tokens, accepted = _inverse_cdf(blocks, cdf, n, generator)
    while not bool(accepted.all()):  # one host sync; another round about once in 1e4 calls
        again, ok = _inverse_cdf(blocks, cdf, n, generator)
        tokens = torch.where(accepted, tokens, again)
        accepted |= ok
    return tokens


def sample_one(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One draw from ``probs`` (float, Shape: (V,)): :func:`sample_iid` of one row, with
    the two searches and the cumulative sum inside the block done on the host (the
    batched version costs twice as much for one draw)."""
    blocks = _blocks(probs, 0.0)  # (V / B, B)
    cdf = blocks.sum(-1).to(torch.float64).cumsum_(-1).tolist()  # of the rounded masses
    slack = _SLACK.get(blocks.dtype) or 1 + _BLOCK * torch.finfo(blocks.dtype).eps
    while True:  # another round about once in 1e4 calls
        uniform = torch.rand((), generator=generator, dtype=torch.float64, device=probs.device)
        x = min(float(uniform) * cdf[-1], math.nextafter(cdf[-1], 0.0))  # x < total
        block = bisect.bisect_right(cdf, x)  # cdf[block - 1] <= x < cdf[block]
        offset = (x - (cdf[block - 1] if block else 0.0)) * slack  # uniform in [0, bound)
        icdf = list(itertools.accumulate(blocks[block].tolist()))  # float64, in order
        if offset < icdf[-1]:
            return block * _BLOCK + bisect.bisect_right(icdf, offset)


def race_without_replacement(
    probs: torch.Tensor, n: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``n`` first arrivals of each row's exponential race: ordered draws without
    replacement, with their arrival times.

    In the race token ``y`` arrives at ``E_y / p(y)``, ``E_y ~ Exp(1)``; arrival order
    is Gumbel-top-k order (``log p(y) - log E_y`` decreasing), i.e. sequential draws
    without replacement from ``p``, and ``-log`` of an arrival time is the token's
    Gumbel-perturbed log-probability. Run per block (not in Vieira 2014 or Kool et al.
    2019; same law):

    1. a block's first arrival comes at rate ``mass``: it is found by thinning a
       process of rate ``bound >= mass`` (:func:`_mass_bounds`): candidates ``E / bound``
       apart, each kept with probability ``mass / bound`` (rejected about once in 1e4);
    2. only the ``n`` blocks whose first arrivals come first can hold one of the ``n``
       first arrivals of the row (any other block's arrivals follow ``n`` of theirs), so
       only those blocks' candidates are tested, until the ``n`` earliest are all kept;
    3. inside each of those blocks a race of its own is run; its first arrival time is
       independent of which tokens arrive and of the gaps between arrivals, so it is
       replaced by the block's time from step 1 and the gaps are kept;
    4. the ``n`` earliest of the ``n`` blocks' first ``n`` arrivals are the row's.

    Args:
        probs: float, Shape: (..., V); zero-probability tokens never arrive.
        n: draws per row, ``1 <= n <= V``.

    Returns:
        ``(tokens, times, valid)``, Shape: (..., n), in arrival order: int64 tokens,
        float64 arrival times (``inf`` past the support) and bool ``valid``, False past
        the row's support (fewer than ``n`` tokens of positive probability).
    """
    lead, vocab_size = probs.shape[:-1], probs.shape[-1]
    blocks = _blocks(probs.reshape(-1, vocab_size), 0.0)  # (R, V / B, B)
    rows, num_blocks, size = blocks.shape
    bound = _mass_bounds(blocks)  # (R, V / B)
    first = _exponential((rows, num_blocks), bound, generator).div_(bound)  # inf: empty
    opened = min(n, num_blocks)
    tested = torch.zeros_like(first, dtype=torch.bool)  # candidate found to be the first
    while True:
        block_time, block = torch.topk(first, opened, dim=-1, largest=False)  # (R, K)
        inside = _open(blocks, block).to(torch.float64)  # (R, K, B)
        block_bound = bound.gather(1, block)
        mark = torch.rand(
            block.shape, generator=generator, dtype=torch.float64, device=block.device
        )
        rejected = mark * block_bound >= inside.sum(-1)  # kept with probability mass / bound
        rejected &= ~tested.gather(1, block) & (block_bound > 0)
        if not bool(rejected.any()):  # one host sync
            break
        tested.scatter_(1, block, ~rejected)  # a rejected block's next candidate is untested
        later = block_time + _exponential(block.shape, bound, generator).div_(block_bound)
        first.scatter_(1, block, torch.where(rejected, later, block_time))
    arrival = _exponential((rows, opened, size), inside, generator).div_(inside)  # inf: p = 0
    per_block = min(n, size)
    times, slot = torch.topk(arrival, per_block, dim=-1, largest=False)  # (R, K, n')
    gaps = (times - times[..., :1]).nan_to_num_(math.inf, math.inf)  # inf - inf: empty block
    merged = (block_time.unsqueeze(-1) + gaps).flatten(1)  # (R, K * n')
    times, pick = torch.topk(merged, n, dim=-1, largest=False)  # (R, n)
    chosen = block.gather(1, torch.div(pick, per_block, rounding_mode="floor"))
    tokens = chosen * size + slot.flatten(1).gather(1, pick)  # padding only where invalid
    tokens = tokens.clamp_max_(vocab_size - 1).reshape(*lead, n)
    times = times.reshape(*lead, n)
    return tokens, times, torch.isfinite(times)

"""Triton recursive rejection verification of one draft tree, uniform draws given.

One program walks the tree from the root exactly as
``verispec.kernels.reference.rejection_verify`` does (the rules of the three
proposal laws, docs/exactness; RSD, Jeon et al. 2024, Algorithm 4; SpecInfer's
multi-round rule, Miao et al. 2024): at each row the target row is quantised into
a scratch residual, the children are tried in stored order against their coins,
and each rejection updates the residual (and, without replacement, the proposal).

Arithmetic is fixed point (``reference.FIXED_ONE`` = 2**52): weights are int64,
their sums are exact whatever the order of reduction, and every remaining step is
a single float64 multiply, divide or compare, so the kernel matches the reference
draw for draw. Scratch: two int64 vectors of V entries (residual, proposal).

Ordering. The scratch vectors are global memory that every thread of the program
reads and writes, and Triton orders global accesses across threads only at a
barrier. So the walk reads what it needs of the scratch into registers, then crosses
``tl.debug_barrier()`` before anything overwrites it: before each row's quantisation
(the previous row's scalar reads), before a rejection's updates (this child's scalar
reads), and after them (the next child's reads). The block loops of
``_quantize_into`` and ``_residual_step`` read and write each element from the same
thread (the same layout), so they need no barrier inside.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["rejection_verify_kernel"]

_ONE = tl.constexpr(4503599627370496.0)  # 2**52


@triton.jit
def _quantize_into(src_ptr, stride_v, dst_ptr, vocab_size, BLOCK_V: tl.constexpr):
    """``dst = floor(src * 2**52)`` as int64; returns the exact sum."""
    offs = tl.arange(0, BLOCK_V)
    total = tl.zeros((), dtype=tl.int64)
    for start in range(0, vocab_size, BLOCK_V):
        idx = start + offs
        valid = idx < vocab_size
        probs = tl.load(src_ptr + idx * stride_v, mask=valid, other=0.0).to(tl.float64)
        weights = (probs * _ONE).to(tl.int64)
        tl.store(dst_ptr + idx, weights, mask=valid)
        total += tl.sum(weights, axis=0)
    return total


@triton.jit
def _residual_step(residual_ptr, proposal_ptr, mass, draft_mass, vocab_size,
                   BLOCK_V: tl.constexpr):  # fmt: skip
    """``residual = max(norm(residual) - norm(proposal), 0)`` in fixed point; returns its sum."""
    offs = tl.arange(0, BLOCK_V)
    r_scale = _ONE / mass.to(tl.float64)
    p_scale = tl.where(draft_mass > 0, _ONE / tl.maximum(draft_mass, 1).to(tl.float64), 0.0)
    total = tl.zeros((), dtype=tl.int64)
    for start in range(0, vocab_size, BLOCK_V):
        idx = start + offs
        valid = idx < vocab_size
        r = tl.load(residual_ptr + idx, mask=valid, other=0)
        p = tl.load(proposal_ptr + idx, mask=valid, other=0)
        new = (r.to(tl.float64) * r_scale).to(tl.int64) - (p.to(tl.float64) * p_scale).to(tl.int64)
        new = tl.maximum(new, 0)
        tl.store(residual_ptr + idx, new, mask=valid)
        total += tl.sum(new, axis=0)
    return total


@triton.jit
def _sample(residual_ptr, mass, uniform, vocab_size, BLOCK_V: tl.constexpr):
    """Inverse CDF: the number of indices whose cumulative weight is <= floor(u * mass)."""
    offs = tl.arange(0, BLOCK_V)
    threshold = tl.minimum((uniform * mass.to(tl.float64)).to(tl.int64), mass - 1)
    running = tl.zeros((), dtype=tl.int64)
    count = tl.zeros((), dtype=tl.int64)
    for start in range(0, vocab_size, BLOCK_V):
        idx = start + offs
        valid = idx < vocab_size
        w = tl.load(residual_ptr + idx, mask=valid, other=0)
        cdf = tl.cumsum(w, axis=0) + running
        count += tl.sum(((cdf <= threshold) & valid).to(tl.int64), axis=0)
        running += tl.sum(w, axis=0)
    return count


@triton.jit(do_not_specialize=["num_nodes"])
def rejection_verify_kernel(
    target_ptr, draft_ptr, draft_row_ptr, law_ptr, tokens_ptr, child_ptr_ptr, child_idx_ptr,
    uniforms_ptr, residual_ptr, proposal_ptr, out_ptr,
    num_nodes, vocab_size, stride_tr, stride_tv, stride_dr, stride_dv,
    BLOCK_V: tl.constexpr,
):  # fmt: skip
    """Grid: (1,). Writes ``[num_accepted, extra_token, path...]``; ``out`` arrives as -1s.

    Law codes: 0 leaf, 1 Deterministic, 2 IID, 3 WithoutReplacement.
    """
    row = tl.zeros((), dtype=tl.int64)
    count = 0
    walking = 1
    while walking != 0:
        tl.debug_barrier()  # every thread is done reading the previous row's scratch
        target_row = target_ptr + row * stride_tr
        mass = _quantize_into(target_row, stride_tv, residual_ptr, vocab_size, BLOCK_V)
        law = tl.load(law_ptr + row)
        lo = tl.load(child_ptr_ptr + row)
        hi = tl.load(child_ptr_ptr + row + 1)
        draft_mass = tl.zeros((), dtype=tl.int64)
        if law >= 2:
            draft_row = draft_ptr + tl.load(draft_row_ptr + row) * stride_dr
            draft_mass = _quantize_into(draft_row, stride_dv, proposal_ptr, vocab_size, BLOCK_V)
        tl.debug_barrier()
        chosen = tl.full((), -1, dtype=tl.int64)
        i = lo
        while (i < hi) & (chosen < 0):
            child = tl.load(child_idx_ptr + i)
            x = tl.load(tokens_ptr + child)
            u = tl.load(uniforms_ptr + child)
            residual_x = tl.load(residual_ptr + x)  # this child's scratch, read once
            proposal_x = tl.zeros((), dtype=tl.int64)
            if law >= 2:
                proposal_x = tl.load(proposal_ptr + x)
            r_x = residual_x.to(tl.float64) / mass.to(tl.float64)
            p_x = tl.full((), 1.0, dtype=tl.float64)
            if law >= 2:
                denominator = tl.maximum(draft_mass, 1).to(tl.float64)
                p_x = tl.where(draft_mass > 0, proposal_x.to(tl.float64) / denominator, 0.0)
            if u * p_x < r_x:
                chosen = child
            else:
                tl.debug_barrier()  # every thread has read residual[x] and proposal[x]
                if law == 1:
                    mass -= residual_x
                    tl.store(residual_ptr + x, 0)
                else:
                    mass = _residual_step(residual_ptr, proposal_ptr, mass, draft_mass,
                                          vocab_size, BLOCK_V)  # fmt: skip
                    if law == 3:
                        draft_mass -= proposal_x
                        tl.store(proposal_ptr + x, 0)
                tl.debug_barrier()  # the updates are visible to the next child's reads
                if mass <= 0:  # no residual mass left: restart from the target row
                    mass = _quantize_into(target_row, stride_tv, residual_ptr, vocab_size,
                                          BLOCK_V)  # fmt: skip
                    tl.debug_barrier()
            i += 1
        if chosen < 0:
            uniform = tl.load(uniforms_ptr + num_nodes)
            tl.store(out_ptr + 1, _sample(residual_ptr, mass, uniform, vocab_size, BLOCK_V))
            walking = 0
        else:
            tl.store(out_ptr + 2 + count, chosen)
            count += 1
            row = chosen + 1
    tl.store(out_ptr, count)

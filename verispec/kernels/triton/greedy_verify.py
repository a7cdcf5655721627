"""Triton greedy tree verification: row argmax, then the walk down the tree.

Two launches, no host sync between them. ``row_argmax_kernel`` finds the argmax of
every row of the target logits (one program per row, ties to the lowest id, like
``torch.argmax``). ``greedy_verify_kernel`` (one program) walks from the root:
at each row the first child, in stored order, whose token is the row's argmax is
accepted; the walk stops at a row with no such child, whose argmax is the extra
token. This is ``verispec.verifiers.Greedy``'s rule.

Host wrapper: ``verispec.kernels.ops.greedy_verify``; reference:
``verispec.kernels.reference.greedy_verify``.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["greedy_verify_kernel", "row_argmax_kernel"]


@triton.jit
def row_argmax_kernel(
    logits_ptr, best_ptr, vocab_size, stride_lr, stride_lv,
    BLOCK_V: tl.constexpr, ACC_DTYPE: tl.constexpr,
):  # fmt: skip
    """Grid: (N + 1,). ``best[r] = argmax(logits[r])``, the lowest id among ties.

    Compares in ``ACC_DTYPE`` (float64 for float64 logits, else float32: exact).
    """
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_V)
    best_val = tl.load(logits_ptr + row * stride_lr).to(ACC_DTYPE)
    best_idx = tl.zeros((), dtype=tl.int64)
    for start in range(0, vocab_size, BLOCK_V):
        idx = start + offs
        vals = tl.load(logits_ptr + row * stride_lr + idx * stride_lv, mask=idx < vocab_size,
                       other=float("-inf")).to(ACC_DTYPE)  # fmt: skip
        blk_max = tl.max(vals, axis=0)
        blk_arg = tl.min(tl.where(vals == blk_max, idx, vocab_size), axis=0).to(tl.int64)
        better = blk_max > best_val  # strict: an earlier block keeps its ties
        best_idx = tl.where(better, blk_arg, best_idx)
        best_val = tl.where(better, blk_max, best_val)
    tl.store(best_ptr + row, best_idx)


@triton.jit
def greedy_verify_kernel(
    best_ptr, tokens_ptr, child_ptr_ptr, child_idx_ptr, out_ptr, BLOCK_C: tl.constexpr
):  # fmt: skip
    """Grid: (1,). Writes ``[num_accepted, extra_token, path...]`` to ``out``.

    ``out`` arrives filled with -1; ``BLOCK_C`` is at least the largest child count.
    """
    offs = tl.arange(0, BLOCK_C)
    row = tl.zeros((), dtype=tl.int64)
    count = 0
    walking = 1
    while walking != 0:
        want = tl.load(best_ptr + row)
        lo = tl.load(child_ptr_ptr + row)
        hi = tl.load(child_ptr_ptr + row + 1)
        valid = lo + offs < hi
        kids = tl.load(child_idx_ptr + lo + offs, mask=valid, other=0)
        toks = tl.load(tokens_ptr + kids, mask=valid, other=-1)
        first = tl.min(tl.where(valid & (toks == want), offs, BLOCK_C), axis=0)
        if first < BLOCK_C:
            node = tl.load(child_idx_ptr + lo + first)
            tl.store(out_ptr + 2 + count, node)
            count += 1
            row = node + 1
        else:
            tl.store(out_ptr + 1, want)
            walking = 0
    tl.store(out_ptr, count)

"""Triton products and norms whose rows do not depend on how many rows run together.

cuBLAS picks a kernel (tiling, split of the inner dimension, reduction order) by the
problem's shape, so on CUDA the same row multiplied alone or among 80 others can round
differently, and a tree pass's rows are not bit-identical to sequential decoding's.
These kernels fix everything a row's sums depend on:

* ``batch_invariant_kernel`` — ``x @ w.T (+ bias)``: one tile shape per dtype, never
  chosen from the row count (:data:`verispec.kernels.graph_ops.PRODUCT_TILES`), the inner
  dimension walked in ``BLOCK_K`` steps from the first, accumulated in float32 with no
  split; every output element is the same sequence of ``tl.dot`` steps whatever ``M`` is
  and wherever its row sits in the tile. The row count is not specialised on, so one
  compiled kernel serves every ``M``.
* ``rms_norm_rows_kernel`` — one program a row: its sum of squares is one ``tl.sum`` over
  a block of fixed width, in float32.

Host side and operators: :mod:`verispec.kernels.graph_ops`.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["batch_invariant_kernel", "rms_norm_rows_kernel"]


@triton.jit(do_not_specialize=("M",))
def batch_invariant_kernel(
    x_ptr, w_ptr, b_ptr, o_ptr,
    M, N, K,
    stride_xm, stride_wn, stride_om,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """Grid: (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)). x: (M, K), w: (N, K), o: (M, N), each
    with unit last stride; bias: (N,) when ``HAS_BIAS``. Accumulates in float32, rounds
    once to the output's dtype."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    row_valid = offs_m < M
    col_valid = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for first in range(0, K, BLOCK_K):
        k_valid = (first + offs_k) < K
        a = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + (first + offs_k)[None, :],
            mask=row_valid[:, None] & k_valid[None, :],
            other=0.0,
        )
        b = tl.load(
            w_ptr + offs_n[None, :] * stride_wn + (first + offs_k)[:, None],
            mask=col_valid[None, :] & k_valid[:, None],
            other=0.0,
        )
        if UPCAST:  # the interpreter's bfloat16 dot is wrong: multiply in float32 there
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    if HAS_BIAS:
        acc = acc + tl.load(b_ptr + offs_n, mask=col_valid, other=0.0).to(tl.float32)[None, :]
    tl.store(
        o_ptr + offs_m[:, None] * stride_om + offs_n[None, :],
        acc.to(o_ptr.dtype.element_ty),
        mask=row_valid[:, None] & col_valid[None, :],
    )


@triton.jit
def rms_norm_rows_kernel(
    x_ptr, w_ptr, o_ptr, stride_xm, stride_om, E, eps, BLOCK_E: tl.constexpr,
):  # fmt: skip
    """Grid: (M,). ``o = x * rsqrt(mean(x ** 2) + eps) * w`` a row, in float32, rounded once
    to the output's dtype."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_E)
    valid = offs < E
    x = tl.load(x_ptr + row * stride_xm + offs, mask=valid, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    scale = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / E + eps)
    tl.store(o_ptr + row * stride_om + offs, (x * scale * w).to(o_ptr.dtype.element_ty), mask=valid)

"""Triton KV compaction: gather the accepted positions into place, every layer at once.

After verification only the accepted path's KV entries stay. Entry ``start + j``
becomes a copy of entry ``source[j]`` in every cache tensor (keys and values of
every layer) in one launch. The tensors are reached from one base pointer plus a
per-tensor element offset, so they must share dtype, shape and strides. Each program
loads all its source rows, waits at a barrier, then stores, so overlapping source
and destination ranges are safe.

Host wrapper: ``verispec.kernels.ops.compact_kv``; reference:
``verispec.kernels.reference.compact_kv``.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["kv_compaction_kernel"]


@triton.jit(do_not_specialize=["start", "num_moved"])
def kv_compaction_kernel(
    base_ptr, delta_ptr, source_ptr, start, num_moved, head_dim,
    stride_x, stride_l, stride_d,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Grid: (tensors, X, cdiv(D, BLOCK_D)); each tensor viewed as (X, L, D)."""
    tensor = tl.program_id(0)
    x = tl.program_id(1)
    d_block = tl.program_id(2)
    base = base_ptr + tl.load(delta_ptr + tensor) + x * stride_x
    rows = tl.arange(0, BLOCK_N)
    cols = d_block * BLOCK_D + tl.arange(0, BLOCK_D)
    tile = (rows[:, None] < num_moved) & (cols[None, :] < head_dim)
    src = tl.load(source_ptr + rows, mask=rows < num_moved, other=0)
    vals = tl.load(base + src[:, None] * stride_l + cols[None, :] * stride_d, mask=tile)
    tl.debug_barrier()  # every read before any write: the ranges may overlap
    dst = start + rows
    tl.store(base + dst[:, None] * stride_l + cols[None, :] * stride_d, vals, mask=tile)

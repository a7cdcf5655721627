"""Triton kernels of Token Recycling's drafter state (Luo et al., ACL 2025, Sec. 3.2-3.3).

* ``token_recycling_kernel`` expands a static template breadth-first from the root
  over the adjacency matrix (V, K): level by level, the node in slot ``j`` below a
  node with token ``t`` gets ``adjacency[t, j]`` (``-1``, unknown, propagates).
* ``adjacency_update_kernel`` overwrites the row of every scored token with the
  target's top-K ids at that position; a token scored at several rows keeps its
  last row's (the rows before are skipped), so writes never collide.

Host wrappers: ``verispec.kernels.ops.expand_template`` / ``update_adjacency``;
references: ``verispec.kernels.reference``.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["adjacency_update_kernel", "token_recycling_kernel"]


@triton.jit(do_not_specialize=["root"])
def token_recycling_kernel(
    adj_ptr, parents_ptr, slots_ptr, level_ptr, out_ptr,
    root, num_levels, vocab_size, stride_av, stride_ak,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """Grid: (1,). ``out`` (N + 1,): row 0 the root, row i + 1 node i's token or -1."""
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr, root)
    tl.debug_barrier()
    for level in range(0, num_levels):
        lo = tl.load(level_ptr + level)
        hi = tl.load(level_ptr + level + 1)
        for start in range(lo, hi, BLOCK):
            node = start + offs
            valid = node < hi
            parent_row = tl.load(parents_ptr + node, mask=valid, other=-1) + 1
            slot = tl.load(slots_ptr + node, mask=valid, other=0)
            parent_tok = tl.load(out_ptr + parent_row, mask=valid, other=-1)
            known = valid & (parent_tok >= 0)
            safe_tok = tl.minimum(tl.maximum(parent_tok, 0), vocab_size - 1)
            cand = tl.load(adj_ptr + safe_tok * stride_av + slot * stride_ak, mask=known, other=-1)
            tl.store(out_ptr + node + 1, tl.where(known, cand.to(tl.int64), -1), mask=valid)
        tl.debug_barrier()  # the next level reads this level's tokens


@triton.jit(do_not_specialize=["num_rows"])
def adjacency_update_kernel(
    adj_ptr, rows_ptr, topk_ptr, num_rows, num_cols,
    stride_av, stride_ak, stride_tr, stride_tk,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Grid: (cdiv(M, BLOCK_R),). ``adj[rows[i]] = topk[i]`` unless rows[j] == rows[i], j > i."""
    pid = tl.program_id(0)
    mine = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    mine_valid = mine < num_rows
    tok = tl.load(rows_ptr + mine, mask=mine_valid, other=-1)
    later_dup = tl.zeros((BLOCK_R,), dtype=tl.int32)
    for start in range(0, num_rows, BLOCK_R):
        other = start + tl.arange(0, BLOCK_R)
        other_tok = tl.load(rows_ptr + other, mask=other < num_rows, other=-2)
        hit = (tok[:, None] == other_tok[None, :]) & (other[None, :] > mine[:, None])
        later_dup += tl.sum(hit.to(tl.int32), axis=1)
    keep = mine_valid & (later_dup == 0)
    cols = tl.arange(0, BLOCK_K)
    tile = keep[:, None] & (cols[None, :] < num_cols)
    ids = tl.load(topk_ptr + mine[:, None] * stride_tr + cols[None, :] * stride_tk, mask=tile)
    safe = tl.maximum(tok, 0)
    tl.store(adj_ptr + safe[:, None] * stride_av + cols[None, :] * stride_ak,
             ids.to(adj_ptr.dtype.element_ty), mask=tile)  # fmt: skip

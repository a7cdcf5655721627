"""Triton attention for the runtime's static (CUDA-graph) passes: the used slots only, in a
fixed order.

The graphed forward attends from ``Q`` new tokens to a cache whose size never changes
(a graph holds its addresses) and whose used length lives on the device (``where``, the
first new slot). :func:`~verispec.models.attention.attend_static` therefore attends to the
whole cache, masked: at a 4,096-slot float32 cache of a 7B shape that is 4 GB read a step
for a context of a few hundred tokens. This kernel reads ``where`` on the device and loops
over the key tiles ``[0, where + Q)`` only, so a replayed graph reads what the step uses.

One program computes ``BLOCK_M`` query rows of one query head (FlashAttention-2's online
softmax, Dao 2023): every key tile from the first in order, each key visible when it is
committed (slot < ``where``) or allowed by the ``(Q, Q)`` local mask. A row's result
depends on its own query, the cache and its mask row only, summed over the same tiles in
the same order whatever ``Q`` is and wherever the row sits in its tile: a fully masked
tile leaves the running maximum, sum and accumulator exactly as they were (``exp(0) = 1``,
``p = 0``). So tree rows equal sequential rows bit for bit: the attention half of
``batch_invariant=True`` (:mod:`verispec.kernels.triton.batch_invariant` has the products).

The softmax scale is folded into the queries by the model (``from_hf``). GQA: query head
``h`` reads key/value head ``h // num_groups``. Host wrapper:
:func:`verispec.kernels.graph_ops.static_attention`.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["static_attention_kernel", "static_attention_rows_kernel"]


@triton.jit
def static_attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, mask_ptr, where_ptr,
    stride_qm, stride_qh,
    stride_kh, stride_ks,
    stride_vh, stride_vs,
    stride_om, stride_oh,
    stride_mm,
    q_len, num_groups,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Grid: (cdiv(Q, BLOCK_M), H). q: (Q, H, D); k, v: (H_kv, S, >= D), unit last stride;
    o: (Q, H, D); mask: (Q, Q) uint8 (1 = visible); where: one int64 (the first new slot)."""
    pid_m = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // num_groups
    start = tl.load(where_ptr)
    end = start + q_len

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_valid = offs_m < q_len
    d_valid = offs_d < HEAD_DIM
    q = tl.load(
        q_ptr + offs_m[:, None] * stride_qm + head * stride_qh + offs_d[None, :],
        mask=row_valid[:, None] & d_valid[None, :],
        other=0.0,
    ).to(tl.float32)

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    for first in range(0, end, BLOCK_N):
        keys = first + offs_n
        key_valid = keys < end
        kv_mask = key_valid[:, None] & d_valid[None, :]
        k = tl.load(
            k_ptr + kv_head * stride_kh + keys[:, None] * stride_ks + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        ).to(tl.float32)
        v = tl.load(
            v_ptr + kv_head * stride_vh + keys[:, None] * stride_vs + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        ).to(tl.float32)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)
        local = keys - start  # >= 0: a new slot, read from the local mask
        in_local = (local >= 0) & key_valid
        allowed = tl.load(
            mask_ptr + offs_m[:, None] * stride_mm + tl.where(in_local, local, 0)[None, :],
            mask=row_valid[:, None] & in_local[None, :],
            other=0,
        )
        visible = ((local < 0)[None, :] | (allowed != 0)) & key_valid[None, :]
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that saw nothing yet
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(scores - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(
        o_ptr + offs_m[:, None] * stride_om + head * stride_oh + offs_d[None, :],
        out,
        mask=row_valid[:, None] & d_valid[None, :],
    )


@triton.jit
def static_attention_rows_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, mask_ptr, where_ptr,
    stride_qm, stride_qh,
    stride_kh, stride_ks,
    stride_vh, stride_vs,
    stride_om, stride_oh,
    stride_mm,
    q_len, num_groups,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_Q: tl.constexpr,
):  # fmt: skip
    """Grid: (Q, H). One query row of one head, its keys taken in **sequence order**: the
    committed slots ``[0, where)``, then the new keys its mask row allows, in column order
    (a tree's ancestors, root first), at positions ``where, where + 1, ...``. Tiles of
    ``BLOCK_N`` positions, each score a sum over D of one row's products: a tree node's
    row then has exactly the bits of the same token decoded alone after its ancestors
    were committed and compacted (same keys at the same positions, same tiles, same order),
    whatever slots the ancestors took in the tree pass. Shapes as
    :func:`static_attention_kernel`'s; ``BLOCK_Q`` >= Q."""
    row = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // num_groups
    start = tl.load(where_ptr)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_c = tl.arange(0, BLOCK_Q)
    d_valid = offs_d < HEAD_DIM
    q = tl.load(q_ptr + row * stride_qm + head * stride_qh + offs_d, mask=d_valid, other=0.0)
    q = q.to(tl.float32)
    visible = tl.load(mask_ptr + row * stride_mm + offs_c, mask=offs_c < q_len, other=0) != 0
    rank = tl.cumsum(visible.to(tl.int32), axis=0) - 1  # a visible column's place in order
    count = tl.sum(visible.to(tl.int32), axis=0)
    end = start + count

    m_i = tl.full((), float("-inf"), tl.float32)
    l_i = tl.zeros((), tl.float32)
    acc = tl.zeros((BLOCK_D,), tl.float32)
    for first in range(0, end, BLOCK_N):
        position = first + offs_n
        valid = position < end
        # a new key's column: the visible column whose rank is its place after `start`
        match = visible[None, :] & (rank[None, :] == (position - start)[:, None])
        column = tl.sum(tl.where(match, offs_c[None, :], 0), axis=1)
        slot = tl.where(position < start, position, start + column)
        kv_mask = valid[:, None] & d_valid[None, :]
        k = tl.load(
            k_ptr + kv_head * stride_kh + slot[:, None] * stride_ks + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        ).to(tl.float32)
        v = tl.load(
            v_ptr + kv_head * stride_vh + slot[:, None] * stride_vs + offs_d[None, :],
            mask=kv_mask,
            other=0.0,
        ).to(tl.float32)
        scores = tl.sum(q[None, :] * k, axis=1)  # (BLOCK_N,)
        scores = tl.where(valid, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(scores - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new
    tl.store(
        o_ptr + row * stride_om + head * stride_oh + offs_d,
        acc / tl.where(l_i == 0.0, 1.0, l_i),
        mask=d_valid,
    )

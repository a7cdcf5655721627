"""Triton tree attention: block-sparse flash attention over a prefix plus a draft tree.

One program computes ``BLOCK_M`` queries of one head (FlashAttention-2's online
softmax, Dao 2023): first over the prefix keys, then over the tree's own keys under
the ancestor mask (SpecInfer §4.2). A per-tile state table, built by the host
(``block_order.block_states``), says which tiles are empty (skipped: DySpec
appendix C), full (no mask load) or partial (mask loaded). GQA: query head ``h``
reads key/value head ``h // num_groups``.

Host wrapper: ``verispec.kernels.ops.tree_attention``; reference:
``verispec.kernels.reference.tree_attention``.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["tree_attention_kernel"]


@triton.jit
def _attend_tile(
    q, acc, m_i, l_i, k_ptrs, v_ptrs, key_valid, d_valid, visible, scale,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """One online-softmax step over a tile of keys; returns the updated (acc, m, l)."""
    k = tl.load(k_ptrs, mask=key_valid[:, None] & d_valid[None, :], other=0.0)
    v = tl.load(v_ptrs, mask=key_valid[:, None] & d_valid[None, :], other=0.0)
    if UPCAST:  # the interpreter's bfloat16 dot is wrong: multiply in float32 there
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # (BLOCK_M, BLOCK_N)
    scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that saw nothing yet
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(scores - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def tree_attention_kernel(
    q_ptr, kp_ptr, vp_ptr, kt_ptr, vt_ptr, o_ptr,
    tmask_ptr, pmask_ptr, tstate_ptr, pstate_ptr,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kpb, stride_kph, stride_kps, stride_kpd,
    stride_vpb, stride_vph, stride_vps, stride_vpd,
    stride_ktb, stride_kth, stride_ktn, stride_ktd,
    stride_vtb, stride_vth, stride_vtn, stride_vtd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_tmb, stride_tmn, stride_tmk,
    stride_pmb, stride_pmn, stride_pms,
    stride_tsb, stride_tsm, stride_tsn,
    stride_psb, stride_psm, stride_psn,
    num_nodes, prefix_len, num_groups, scale,
    HEAD_DIM: tl.constexpr, HAS_PREFIX_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr, ACC_DTYPE: tl.constexpr,
):  # fmt: skip
    """Grid: (cdiv(N, BLOCK_M), H, B). Masks are uint8 (1 = visible); states int8.

    Accumulates in ``ACC_DTYPE`` (float64 for float64 inputs, float32 otherwise).
    """
    pid_m = tl.program_id(0)
    head = tl.program_id(1)
    batch = tl.program_id(2)
    kv_head = head // num_groups

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_valid = offs_m < num_nodes
    d_valid = offs_d < HEAD_DIM

    q_ptrs = (q_ptr + batch * stride_qb + head * stride_qh
              + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd)  # fmt: skip
    q = tl.load(q_ptrs, mask=row_valid[:, None] & d_valid[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=ACC_DTYPE)
    l_i = tl.zeros((BLOCK_M,), dtype=ACC_DTYPE)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=ACC_DTYPE)

    # 1. the prefix: every tile visible unless a prefix mask says otherwise
    kp_base = kp_ptr + batch * stride_kpb + kv_head * stride_kph
    vp_base = vp_ptr + batch * stride_vpb + kv_head * stride_vph
    for start in range(0, prefix_len, BLOCK_N):
        keys = start + offs_n
        key_valid = keys < prefix_len
        visible = row_valid[:, None] & key_valid[None, :]
        state = 1
        if HAS_PREFIX_MASK:
            state = tl.load(pstate_ptr + batch * stride_psb + pid_m * stride_psm
                            + (start // BLOCK_N) * stride_psn)  # fmt: skip
            if state == 2:
                pm = tl.load(pmask_ptr + batch * stride_pmb + offs_m[:, None] * stride_pmn
                             + keys[None, :] * stride_pms, mask=visible, other=0)  # fmt: skip
                visible = visible & (pm != 0)
        if state != 0:
            k_ptrs = kp_base + keys[:, None] * stride_kps + offs_d[None, :] * stride_kpd
            v_ptrs = vp_base + keys[:, None] * stride_vps + offs_d[None, :] * stride_vpd
            acc, m_i, l_i = _attend_tile(
                q, acc, m_i, l_i, k_ptrs, v_ptrs, key_valid, d_valid, visible, scale,
                UPCAST, PRECISION,
            )  # fmt: skip

    # 2. the tree: skip the tiles the ancestor mask leaves empty
    kt_base = kt_ptr + batch * stride_ktb + kv_head * stride_kth
    vt_base = vt_ptr + batch * stride_vtb + kv_head * stride_vth
    for start in range(0, num_nodes, BLOCK_N):
        state = tl.load(tstate_ptr + batch * stride_tsb + pid_m * stride_tsm
                        + (start // BLOCK_N) * stride_tsn)  # fmt: skip
        if state != 0:
            keys = start + offs_n
            key_valid = keys < num_nodes
            visible = row_valid[:, None] & key_valid[None, :]
            if state == 2:
                tm = tl.load(tmask_ptr + batch * stride_tmb + offs_m[:, None] * stride_tmn
                             + keys[None, :] * stride_tmk, mask=visible, other=0)  # fmt: skip
                visible = visible & (tm != 0)
            k_ptrs = kt_base + keys[:, None] * stride_ktn + offs_d[None, :] * stride_ktd
            v_ptrs = vt_base + keys[:, None] * stride_vtn + offs_d[None, :] * stride_vtd
            acc, m_i, l_i = _attend_tile(
                q, acc, m_i, l_i, k_ptrs, v_ptrs, key_valid, d_valid, visible, scale,
                UPCAST, PRECISION,
            )  # fmt: skip

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # a query that saw nothing: zeros
    o_ptrs = (o_ptr + batch * stride_ob + head * stride_oh
              + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od)  # fmt: skip
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=row_valid[:, None] & d_valid[None, :])

"""Triton tree attention: block-sparse flash attention over a prefix plus a draft tree.

One program computes ``BLOCK_M`` queries of one head (FlashAttention-2's online
softmax, Dao 2023): first over the prefix keys, then over the tree's own keys under
the ancestor mask (SpecInfer §4.2). A per-tile state table, built by the host
(``block_order.block_states``), says which tiles are empty (skipped: DySpec
appendix C), full (no mask load) or partial (mask loaded). ``IS_CAUSAL`` replaces the
tree mask by ``key <= query`` (a prefill), so no (N, N) mask is ever built. GQA: query
head ``h`` reads key/value head ``h // num_groups``.

Split over the prefix (flash-decoding, Dao et al. 2023): with ``SPLIT`` the grid's
third axis runs ``num_splits`` programs per batch row, each over ``split_len`` prefix
keys (the last one also over the tree); each writes its unnormalised accumulator and
its running max and sum, and ``tree_attention_combine_kernel`` merges them. A small
tree over a long prefix then fills the GPU instead of running ``H`` programs.

Lengths and offsets are not specialised (``do_not_specialize``), so a growing
sequence never triggers a recompile; the scale is a float64 argument, so the float64
kernel does not see it rounded to float32.

Host wrapper: ``verispec.kernels.ops.tree_attention``; reference:
``verispec.kernels.reference.tree_attention``.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["tree_attention_combine_kernel", "tree_attention_kernel"]


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


# Lengths, offsets and the strides of the masks and tile tables change as the sequence
# grows; specialising on them (value 1, multiple of 16) would recompile mid-generation.
_VARYING = (
    "num_nodes", "prefix_len", "num_splits", "split_len",
    "stride_tmb", "stride_tmn", "stride_pmb", "stride_pmn",
    "stride_tsb", "stride_tsm", "stride_psb", "stride_psm",
)  # fmt: skip


# The masks are slices of the model's (Q, S + Q) mask: their start moves with S.
_MOVING = ("tmask_ptr", "pmask_ptr", "tstate_ptr", "pstate_ptr")


@triton.jit(do_not_specialize=_VARYING, do_not_specialize_on_alignment=_MOVING)
def tree_attention_kernel(
    q_ptr, kp_ptr, vp_ptr, kt_ptr, vt_ptr, o_ptr, acc_part_ptr, ml_part_ptr,
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
    num_nodes, prefix_len, num_groups, scale: tl.float64, num_splits, split_len,
    HEAD_DIM: tl.constexpr, HAS_PREFIX_MASK: tl.constexpr, IS_CAUSAL: tl.constexpr,
    SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr, ACC_DTYPE: tl.constexpr,
):  # fmt: skip
    """Grid: (cdiv(N, BLOCK_M), H, B * num_splits). Masks are uint8 (1 = visible); states int8.

    Accumulates in ``ACC_DTYPE`` (float64 for float64 inputs, float32 otherwise).
    ``split_len`` is a multiple of ``BLOCK_N`` (the prefix state table's tile width).
    With ``SPLIT`` the partial results go to ``acc_part`` (B, H, num_splits, N, BLOCK_D)
    and ``ml_part`` (B, H, num_splits, 2, N), both contiguous; without, to ``o``.
    """
    pid_m = tl.program_id(0)
    head = tl.program_id(1)
    batch = tl.program_id(2) // num_splits
    split = tl.program_id(2) % num_splits
    kv_head = head // num_groups
    # the float64 scale in the accumulator's precision (adding it to a zero of that dtype
    # first makes this one expression valid in the compiler and in the interpreter alike)
    scale_acc = (tl.zeros((), dtype=ACC_DTYPE) + scale).to(ACC_DTYPE)

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

    # 1. this split's share of the prefix: every tile visible unless a prefix mask says not
    kp_base = kp_ptr + batch * stride_kpb + kv_head * stride_kph
    vp_base = vp_ptr + batch * stride_vpb + kv_head * stride_vph
    prefix_lo = split * split_len
    prefix_hi = tl.minimum(prefix_len, prefix_lo + split_len)
    for start in range(prefix_lo, prefix_hi, BLOCK_N):
        keys = start + offs_n
        key_valid = keys < prefix_hi
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
                q, acc, m_i, l_i, k_ptrs, v_ptrs, key_valid, d_valid, visible, scale_acc,
                UPCAST, PRECISION,
            )  # fmt: skip

    # 2. the tree (by the last split only): skip the tiles the ancestor mask leaves empty
    kt_base = kt_ptr + batch * stride_ktb + kv_head * stride_kth
    vt_base = vt_ptr + batch * stride_vtb + kv_head * stride_vth
    tree_hi = tl.where(split == num_splits - 1, num_nodes, 0)
    if IS_CAUSAL:  # keys past this tile's last query are never visible
        tree_hi = tl.minimum(tree_hi, (pid_m + 1) * BLOCK_M)
    for start in range(0, tree_hi, BLOCK_N):
        keys = start + offs_n
        key_valid = keys < num_nodes
        k_ptrs = kt_base + keys[:, None] * stride_ktn + offs_d[None, :] * stride_ktd
        v_ptrs = vt_base + keys[:, None] * stride_vtn + offs_d[None, :] * stride_vtd
        if IS_CAUSAL:
            visible = row_valid[:, None] & (keys[None, :] <= offs_m[:, None])
            acc, m_i, l_i = _attend_tile(
                q, acc, m_i, l_i, k_ptrs, v_ptrs, key_valid, d_valid, visible, scale_acc,
                UPCAST, PRECISION,
            )  # fmt: skip
        else:
            state = tl.load(tstate_ptr + batch * stride_tsb + pid_m * stride_tsm
                            + (start // BLOCK_N) * stride_tsn)  # fmt: skip
            if state != 0:
                visible = row_valid[:, None] & key_valid[None, :]
                if state == 2:
                    tm = tl.load(tmask_ptr + batch * stride_tmb + offs_m[:, None] * stride_tmn
                                 + keys[None, :] * stride_tmk, mask=visible, other=0)  # fmt: skip
                    visible = visible & (tm != 0)
                acc, m_i, l_i = _attend_tile(
                    q, acc, m_i, l_i, k_ptrs, v_ptrs, key_valid, d_valid, visible, scale_acc,
                    UPCAST, PRECISION,
                )  # fmt: skip

    if SPLIT:  # partial results: unnormalised accumulator, running max and sum
        part = (batch * tl.num_programs(1) + head) * num_splits + split
        a_ptrs = (acc_part_ptr + (part * num_nodes + offs_m[:, None]) * BLOCK_D
                  + offs_d[None, :])  # fmt: skip
        tl.store(a_ptrs, acc, mask=row_valid[:, None])
        tl.store(ml_part_ptr + (2 * part) * num_nodes + offs_m, m_i, mask=row_valid)
        tl.store(ml_part_ptr + (2 * part + 1) * num_nodes + offs_m, l_i, mask=row_valid)
    else:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # a query that saw nothing: zeros
        o_ptrs = (o_ptr + batch * stride_ob + head * stride_oh
                  + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od)  # fmt: skip
        tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty),
                 mask=row_valid[:, None] & d_valid[None, :])  # fmt: skip


@triton.jit(do_not_specialize=["num_nodes", "num_splits"])
def tree_attention_combine_kernel(
    acc_part_ptr, ml_part_ptr, o_ptr,
    stride_ob, stride_oh, stride_on, stride_od,
    num_nodes, num_splits,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
    ACC_DTYPE: tl.constexpr,
):  # fmt: skip
    """Grid: (cdiv(N, BLOCK_M), H, B). Merge the splits' partial softmaxes into ``o``.

    ``out = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s`` with ``M = max_s m_s``,
    merged online over the splits; a query no split saw gets zeros.
    """
    pid_m = tl.program_id(0)
    head = tl.program_id(1)
    batch = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_valid = offs_m < num_nodes
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=ACC_DTYPE)
    l_i = tl.zeros((BLOCK_M,), dtype=ACC_DTYPE)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=ACC_DTYPE)
    for split in range(0, num_splits):
        part = (batch * tl.num_programs(1) + head) * num_splits + split
        m_s = tl.load(ml_part_ptr + (2 * part) * num_nodes + offs_m, mask=row_valid,
                      other=float("-inf"))  # fmt: skip
        l_s = tl.load(ml_part_ptr + (2 * part + 1) * num_nodes + offs_m, mask=row_valid, other=0.0)
        a_s = tl.load(acc_part_ptr + (part * num_nodes + offs_m[:, None]) * BLOCK_D
                      + offs_d[None, :], mask=row_valid[:, None], other=0.0)  # fmt: skip
        m_new = tl.maximum(m_i, m_s)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        beta = tl.exp(m_s - m_safe)
        l_i = l_i * alpha + l_s * beta
        acc = acc * alpha[:, None] + a_s * beta[:, None]
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_ptrs = (o_ptr + batch * stride_ob + head * stride_oh
              + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od)  # fmt: skip
    d_valid = offs_d < HEAD_DIM
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=row_valid[:, None] & d_valid[None, :])

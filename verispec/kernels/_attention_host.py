"""Host side of the tree attention kernel: validate, pick tile sizes, build the grid.

Part of :mod:`verispec.kernels.ops` (which re-exports :func:`tree_attention`); the
``@triton.jit`` code is in :mod:`verispec.kernels.triton.tree_attention`, the reference in
:func:`verispec.kernels.reference.tree_attention`.

Shape glossary: B batch, N tree nodes, S prefix, H heads, D head dim.
"""

from __future__ import annotations

import functools

import torch

from verispec.core.validate import integer
from verispec.errors import TreeStructureError
from verispec.kernels import reference
from verispec.kernels.backend import backend_for, interpreting, kernel_module, launch_device
from verispec.kernels.block_order import block_states
from verispec.kernels.dtypes import FLOAT_DTYPES

__all__ = [
    "attention_blocks",
    "attention_warps",
    "launch_tree_attention",
    "prefix_splits",
    "tree_attention",
    "triton_cdiv",
]

_MIN_SPLIT_KEYS = 256  # fewer prefix keys per program than this is not worth a second launch


def _pow2(n: int, floor: int = 1) -> int:
    return max(floor, 1 << max(0, n - 1).bit_length())


def _fail(message: str) -> TreeStructureError:
    return TreeStructureError(message)


def _as_4d(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.dim() == 3:
        return t[None]
    if t.dim() != 4:
        raise _fail(f"`{name}` must have shape (H, L, D) or (B, H, L, D); got {tuple(t.shape)}.")
    return t


def _mask_3d(mask: torch.Tensor, name: str, rows: int, cols: int) -> torch.Tensor:
    mask = mask[None] if mask.dim() == 2 else mask
    if mask.dim() != 3 or tuple(mask.shape[1:]) != (rows, cols) or mask.dtype != torch.bool:
        raise _fail(
            f"`{name}` must be a bool tensor of shape ({rows}, {cols}) or (B, {rows}, {cols}); "
            f"got {mask.dtype} {tuple(mask.shape)}."
        )
    return mask


def attention_blocks(
    num_nodes: int, head_dim: int, dtype: torch.dtype = torch.float16
) -> tuple[int, int]:
    """Default (BLOCK_M, BLOCK_N) of tree attention for N queries of head dim D.

    Chosen so that ``ptxas`` reports no register spills for sm_80 and sm_90
    (``benchmarks/compile_check.py`` measures them): float32 and float64 dots at
    IEEE precision hold much more per thread than 16-bit ones, so they get 16-query tiles.
    """
    if interpreting():
        return 32, 32  # the interpreter pays per launch and per op, hardly per element
    block_n = 64 if head_dim <= 64 else 32
    if dtype in (torch.float32, torch.float64):
        return 16, block_n
    return (16 if num_nodes <= 16 else 32 if num_nodes <= 64 else 64), block_n


def attention_warps(block_m: int, dtype: torch.dtype) -> int:
    """Warps per program: 8 except for 16-query tiles of 16-bit inputs (no spills, as above)."""
    return 4 if block_m <= 16 and dtype in (torch.float16, torch.bfloat16) else 8


def _sm_count(device: torch.device) -> int:
    return _sm_count_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _sm_count_of(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def prefix_splits(programs: int, prefix_len: int, block_n: int, device: torch.device) -> int:
    """How many programs share the prefix of each (query tile, head, batch) by default.

    1 unless the grid (``programs`` = query tiles x heads x batch) leaves most of the
    GPU's multiprocessors idle and the prefix is long: then enough splits to give each
    multiprocessor about two programs, each over at least 256 prefix keys.
    """
    if device.type != "cuda" or interpreting() or prefix_len < 2 * _MIN_SPLIT_KEYS:
        return 1
    wanted = -(-2 * _sm_count(device) // max(programs, 1))
    by_length = prefix_len // max(_MIN_SPLIT_KEYS, block_n)
    return max(1, min(wanted, by_length))


def tree_attention(
    query: torch.Tensor,
    prefix_key: torch.Tensor,
    prefix_value: torch.Tensor,
    tree_key: torch.Tensor,
    tree_value: torch.Tensor,
    tree_mask: torch.Tensor | None,
    *,
    prefix_mask: torch.Tensor | None = None,
    scale: float | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_splits: int | None = None,
    kernels: str = "auto",
) -> torch.Tensor:
    """Attention of N tree queries over a prefix plus the tree (ancestor mask), GQA.

    Args:
        query: float16/bfloat16/float32/float64, Shape: (H, N, D) or (B, H, N, D).
        prefix_key, prefix_value: Shape: (H_kv, S, D) or (B, H_kv, S, D); S may be 0.
            H must be a multiple of H_kv.
        tree_key, tree_value: Shape: (H_kv, N, D) or (B, H_kv, N, D).
        tree_mask: bool, Shape: (N, N) or (B, N, N); True where query i sees tree key j
            (``DraftTree.ancestor_mask``). Tiles it leaves empty are skipped. ``None``:
            causal (query i sees keys 0..i), computed in the kernel without a mask.
        prefix_mask: bool, Shape: (N, S) or (B, N, S); ``None`` means all visible.
        scale: score scale, ``D ** -0.5`` by default.
        block_m, block_n: tile sizes of the Triton kernel (powers of two >= 16).
        num_splits: programs sharing the prefix (split-K); ``None`` picks
            (:func:`prefix_splits`: 1 except for few programs over a long prefix on a GPU).
        kernels: ``"auto"``, ``"triton"`` or ``"torch"`` (:mod:`verispec.kernels.backend`).

    Returns:
        ``query``'s dtype and shape. A query that sees no key gets zeros.
    """
    squeeze = query.dim() == 3
    q = _as_4d(query, "query")
    kp, vp = _as_4d(prefix_key, "prefix_key"), _as_4d(prefix_value, "prefix_value")
    kt, vt = _as_4d(tree_key, "tree_key"), _as_4d(tree_value, "tree_value")
    _batch, heads, n, d = q.shape
    kv_heads, s = kp.shape[1], kp.shape[2]
    if q.dtype not in FLOAT_DTYPES or any(t.dtype != q.dtype for t in (kp, vp, kt, vt)):
        raise _fail(f"tensors must share one dtype among {FLOAT_DTYPES}; query is {q.dtype}.")
    if kv_heads == 0 or heads % kv_heads or tuple(kt.shape[1:]) != (kv_heads, n, d):
        raise _fail(
            f"`tree_key` must have shape (B, H_kv, N, D) = (B, H_kv, {n}, {d}) with H = {heads} "
            f"a multiple of H_kv; got {tuple(kt.shape)}."
        )
    if (
        tuple(vt.shape) != tuple(kt.shape)
        or tuple(vp.shape) != tuple(kp.shape)
        or kp.shape[-1] != d
    ):
        raise _fail("keys and values must have matching shapes (B, H_kv, L, D).")
    if num_splits is not None:
        integer("num_splits", num_splits, 1, note=" or None")
    tmask = None if tree_mask is None else _mask_3d(tree_mask.to(q.device), "tree_mask", n, n)
    pmask = None if prefix_mask is None else _mask_3d(prefix_mask.to(q.device), "prefix_mask", n, s)
    if backend_for("tree attention", q.device, kernels) == "torch":
        if tmask is None:
            tmask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()[None]
        out = reference.tree_attention(q, kp, vp, kt, vt, tmask, pmask, scale)
    else:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        if n:
            launch_tree_attention(
                q, kp, vp, kt, vt, tmask, pmask, out, scale,
                block_m=block_m, block_n=block_n, num_splits=num_splits,
            )  # fmt: skip
    return out[0] if squeeze else out


def launch_tree_attention(
    q: torch.Tensor,
    kp: torch.Tensor,
    vp: torch.Tensor,
    kt: torch.Tensor,
    vt: torch.Tensor,
    tmask: torch.Tensor | None,
    pmask: torch.Tensor | None,
    out: torch.Tensor,
    scale: float | None,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    states: tuple[torch.Tensor | None, torch.Tensor | None] | None = None,
    num_splits: int | None = None,
) -> None:
    """Run the Triton kernel on validated 4-D tensors; writes ``out`` (B, H, N, D) (any strides).

    ``tmask=None`` is causal. ``states``: precomputed ``(tree_states, prefix_states)``
    tile tables for these block sizes (the HF integration caches them across layers).
    """
    import triton.language as tl

    module = kernel_module("tree_attention")
    batch, heads, n, d = q.shape
    prefix_len = kp.shape[2]
    default_m, default_n = attention_blocks(n, d, q.dtype)
    bm, bn = block_m or default_m, block_n or default_n
    if states is None:
        states = (
            None if tmask is None else block_states(tmask, bm, bn),
            None if pmask is None else block_states(pmask, bm, bn),
        )
    tstates, pstates = states
    causal = tmask is None
    if tmask is None:  # causal; never read: small stand-ins for the mask and its tile table
        tmask_u8 = torch.zeros(1, 1, 1, dtype=torch.uint8, device=q.device)
        tstates = torch.zeros(1, 1, 1, dtype=torch.int8, device=q.device)
    else:
        assert tstates is not None
        tmask_u8 = tmask.view(torch.uint8)
    pmask_u8 = tmask_u8 if pmask is None else pmask.view(torch.uint8)
    pstates_t = tstates if pstates is None else pstates

    def bstride(t: torch.Tensor) -> int:  # broadcast a batch of one
        return 0 if t.shape[0] == 1 else t.stride(0)

    fp64 = q.dtype == torch.float64
    m_tiles = triton_cdiv(n, bm)
    splits = num_splits or prefix_splits(m_tiles * heads * batch, prefix_len, bn, q.device)
    # each split covers a whole number of BLOCK_N tiles (the prefix state table's width)
    split_len = triton_cdiv(triton_cdiv(max(prefix_len, 1), splits), bn) * bn
    splits = max(1, min(splits, triton_cdiv(prefix_len, split_len)))
    acc_dtype = torch.float64 if fp64 else torch.float32
    block_d = _pow2(d, 16)
    if splits > 1:
        acc_part = torch.empty(batch, heads, splits, n, block_d, dtype=acc_dtype, device=q.device)
        ml_part = torch.empty(batch, heads, splits, 2, n, dtype=acc_dtype, device=q.device)
    else:
        acc_part = ml_part = out  # never written
    acc_tl = tl.float64 if fp64 else tl.float32
    with launch_device(q.device):
        module.tree_attention_kernel[(m_tiles, heads, batch * splits)](
            q, kp, vp, kt, vt, out, acc_part, ml_part, tmask_u8, pmask_u8, tstates, pstates_t,
            *q.stride(), *kp.stride(), *vp.stride(), *kt.stride(), *vt.stride(), *out.stride(),
            bstride(tmask_u8), tmask_u8.stride(1), tmask_u8.stride(2),
            bstride(pmask_u8), pmask_u8.stride(1), pmask_u8.stride(2),
            bstride(tstates), tstates.stride(1), tstates.stride(2),
            bstride(pstates_t), pstates_t.stride(1), pstates_t.stride(2),
            n, prefix_len, heads // kp.shape[1], d**-0.5 if scale is None else float(scale),
            splits, split_len,
            HEAD_DIM=d, HAS_PREFIX_MASK=pmask is not None, IS_CAUSAL=causal, SPLIT=splits > 1,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d,
            UPCAST=interpreting() and q.dtype == torch.bfloat16,
            PRECISION="ieee" if q.dtype in (torch.float32, torch.float64) else "tf32",
            ACC_DTYPE=acc_tl, num_warps=attention_warps(bm, q.dtype),
        )  # fmt: skip
        if splits > 1:
            module.tree_attention_combine_kernel[(m_tiles, heads, batch)](
                acc_part, ml_part, out, *out.stride(), n, splits,
                HEAD_DIM=d, BLOCK_M=bm, BLOCK_D=block_d, ACC_DTYPE=acc_tl,
            )  # fmt: skip


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)

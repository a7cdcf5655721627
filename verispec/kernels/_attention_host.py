"""Host side of the tree attention kernel: validate, pick tile sizes, build the grid.

Part of :mod:`verispec.kernels.ops` (which re-exports :func:`tree_attention`); the
``@triton.jit`` code is in :mod:`verispec.kernels.tree_attention`, the reference in
:func:`verispec.kernels.reference.tree_attention`.

Shape glossary: B batch, N tree nodes, S prefix, H heads, D head dim.
"""

from __future__ import annotations

import torch

from verispec.errors import TreeStructureError
from verispec.kernels import reference
from verispec.kernels.backend import choose, interpreting, kernel_module
from verispec.kernels.block_order import block_states

__all__ = ["attention_blocks", "launch_tree_attention", "tree_attention", "triton_cdiv"]

_ATTENTION_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


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


def attention_blocks(num_nodes: int, head_dim: int) -> tuple[int, int]:
    """Default (BLOCK_M, BLOCK_N) of tree attention for N queries of head dim D."""
    if interpreting():
        return 32, 32  # the interpreter pays per launch and per op, hardly per element
    block_m = 16 if num_nodes <= 16 else 32 if num_nodes <= 64 else 64
    return block_m, 64 if head_dim <= 64 else 32


def tree_attention(
    query: torch.Tensor,
    prefix_key: torch.Tensor,
    prefix_value: torch.Tensor,
    tree_key: torch.Tensor,
    tree_value: torch.Tensor,
    tree_mask: torch.Tensor,
    *,
    prefix_mask: torch.Tensor | None = None,
    scale: float | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Attention of N tree queries over a prefix plus the tree (ancestor mask), GQA.

    Args:
        query: float16/bfloat16/float32/float64, Shape: (H, N, D) or (B, H, N, D).
        prefix_key, prefix_value: Shape: (H_kv, S, D) or (B, H_kv, S, D); S may be 0.
            H must be a multiple of H_kv.
        tree_key, tree_value: Shape: (H_kv, N, D) or (B, H_kv, N, D).
        tree_mask: bool, Shape: (N, N) or (B, N, N); True where query i sees tree key j
            (``DraftTree.ancestor_mask``). Tiles it leaves empty are skipped.
        prefix_mask: bool, Shape: (N, S) or (B, N, S); ``None`` means all visible.
        scale: score scale, ``D ** -0.5`` by default.
        block_m, block_n: tile sizes of the Triton kernel (powers of two >= 16).

    Returns:
        ``query``'s dtype and shape. A query that sees no key gets zeros.
    """
    squeeze = query.dim() == 3
    q = _as_4d(query, "query")
    kp, vp = _as_4d(prefix_key, "prefix_key"), _as_4d(prefix_value, "prefix_value")
    kt, vt = _as_4d(tree_key, "tree_key"), _as_4d(tree_value, "tree_value")
    _batch, heads, n, d = q.shape
    kv_heads, s = kp.shape[1], kp.shape[2]
    if q.dtype not in _ATTENTION_DTYPES or any(t.dtype != q.dtype for t in (kp, vp, kt, vt)):
        raise _fail(f"tensors must share one dtype among {_ATTENTION_DTYPES}; query is {q.dtype}.")
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
    tmask = _mask_3d(tree_mask.to(q.device), "tree_mask", n, n)
    pmask = None if prefix_mask is None else _mask_3d(prefix_mask.to(q.device), "prefix_mask", n, s)
    if choose(q.device, "tree attention") == "reference":
        out = reference.tree_attention(q, kp, vp, kt, vt, tmask, pmask, scale)
    else:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        if n:
            launch_tree_attention(
                q, kp, vp, kt, vt, tmask, pmask, out, scale, block_m=block_m, block_n=block_n
            )
    return out[0] if squeeze else out


def launch_tree_attention(
    q: torch.Tensor,
    kp: torch.Tensor,
    vp: torch.Tensor,
    kt: torch.Tensor,
    vt: torch.Tensor,
    tmask: torch.Tensor,
    pmask: torch.Tensor | None,
    out: torch.Tensor,
    scale: float | None,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    states: tuple[torch.Tensor, torch.Tensor | None] | None = None,
) -> None:
    """Run the Triton kernel on validated 4-D tensors; writes ``out`` (B, H, N, D) (any strides).

    ``states``: precomputed ``(tree_states, prefix_states)`` tile tables for these
    block sizes (the HF integration caches them across layers).
    """
    import triton.language as tl

    module = kernel_module("tree_attention")
    batch, heads, n, d = q.shape
    default_m, default_n = attention_blocks(n, d)
    bm, bn = block_m or default_m, block_n or default_n
    if states is None:
        states = (
            block_states(tmask, bm, bn),
            None if pmask is None else block_states(pmask, bm, bn),
        )
    tstates, pstates = states
    tmask_u8 = tmask.view(torch.uint8)
    pmask_u8 = tmask_u8 if pmask is None else pmask.view(torch.uint8)
    pstates_t = tstates if pstates is None else pstates

    def bstride(t: torch.Tensor) -> int:  # broadcast a batch of one
        return 0 if t.shape[0] == 1 else t.stride(0)

    fp64 = q.dtype == torch.float64
    grid = (triton_cdiv(n, bm), heads, batch)
    module.tree_attention_kernel[grid](
        q, kp, vp, kt, vt, out, tmask_u8, pmask_u8, tstates, pstates_t,
        *q.stride(), *kp.stride(), *vp.stride(), *kt.stride(), *vt.stride(), *out.stride(),
        bstride(tmask_u8), tmask_u8.stride(1), tmask_u8.stride(2),
        bstride(pmask_u8), pmask_u8.stride(1), pmask_u8.stride(2),
        bstride(tstates), tstates.stride(1), tstates.stride(2),
        bstride(pstates_t), pstates_t.stride(1), pstates_t.stride(2),
        n, kp.shape[2], heads // kp.shape[1], d**-0.5 if scale is None else scale,
        HEAD_DIM=d, HAS_PREFIX_MASK=pmask is not None,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=_pow2(d, 16),
        UPCAST=interpreting() and q.dtype == torch.bfloat16,
        PRECISION="ieee" if q.dtype in (torch.float32, torch.float64) else "tf32",
        ACC_DTYPE=tl.float64 if fp64 else tl.float32,
    )  # fmt: skip


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)

"""The Triton kernels of the graphed CUDA runtime as PyTorch operators.

The fast runtime's static passes (:mod:`verispec.models.accelerators.graphs`) are captured in CUDA
graphs and, with ``compile=True``, compiled by inductor first. A Triton launch inside a
compiled function must be an operator that inductor treats as opaque, with a shape rule
for tracing, so each kernel is registered once here with ``torch.library.custom_op``:

* ``verispec::static_attention`` — attention of ``Q`` new rows over the used slots of a
  fixed-size cache (:mod:`verispec.kernels.triton.static_attention`); the cache write stays in
  PyTorch (:func:`static_attention`), so the operator only reads;
* ``verispec::invariant_linear`` and ``verispec::invariant_rms_norm`` — the products and
  norms of :mod:`verispec.kernels.triton.batch_invariant`, whose rows do not depend on the row
  count (``FastModel(batch_invariant=True)`` swaps them in with :class:`InvariantLinear`
  and :class:`InvariantRMSNorm`).

:func:`static_attention` computes :func:`~verispec.models.attention.attend_static`'s result
from the cache's buffers and the pass's tensors; the runtime's accelerator
(:class:`~verispec.models.accelerators.invariant.TritonAttention`) sets it as each layer's
static-pass core from outside: the model file imports no kernel.
"""

from __future__ import annotations

import torch
import triton
from torch import Tensor, nn

from verispec.kernels.backend import backend_for, interpreting, kernel_module, launch_device
from verispec.kernels.dtypes import FLOAT_DTYPES

__all__ = [
    "ATTENTION_TILES",
    "PRODUCT_TILES",
    "InvariantLinear",
    "InvariantRMSNorm",
    "invariant_linear",
    "invariant_rms_norm",
    "static_attention",
]

ATTENTION_TILES = (16, 32)
"""``(BLOCK_M, BLOCK_N)`` of the static attention: query rows and key slots a tile. Fixed,
never chosen from the row count, so a row's sums run over the same key tiles in the same
order in a pass of any size; 32 slots a tile leave no register spills on sm_80 and sm_90
at head dims 64 and 128 (64 spilled on sm_90 at D = 64 and on sm_80 at D = 128)."""


PRODUCT_TILES: dict[torch.dtype, tuple[int, int, int]] = {
    torch.float16: (16, 64, 64),
    torch.bfloat16: (16, 64, 64),
    torch.float32: (16, 64, 32),
}
"""``(BLOCK_M, BLOCK_N, BLOCK_K)`` of the batch-invariant product, per dtype: one tile shape,
never chosen from the row count. Sixteen rows a tile (``tl.dot``'s least) waste little on
the one to a few hundred rows a decoding step has; a sixty-four-column tile keeps the
smaller projections' grids near the multiprocessor count."""


def _check_device(t: torch.Tensor, rule: str) -> None:
    """Raise :class:`~verispec.errors.KernelUnavailableError` where the Triton kernel of
    ``rule`` cannot run on ``t``'s device (the CPU without the interpreter, say)."""
    backend_for(rule, t.device, "triton")


@torch.library.custom_op("verispec::static_attention", mutates_args=())
def _static_attention_op(
    q: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    where: torch.Tensor,
    local_mask: torch.Tensor,
    by_position: bool,
) -> torch.Tensor:
    q_len, heads, head_dim = q.shape
    out = torch.empty(q_len, heads, head_dim, dtype=torch.float32, device=q.device)
    mask = local_mask.view(torch.uint8) if local_mask.dtype == torch.bool else local_mask
    block_m, block_n = ATTENTION_TILES
    module = kernel_module("static_attention")
    strides = (
        q.stride(0), q.stride(1), cache_k.stride(0), cache_k.stride(1),
        cache_v.stride(0), cache_v.stride(1), out.stride(0), out.stride(1), mask.stride(0),
    )  # fmt: skip
    with launch_device(q.device):
        if by_position:
            module.static_attention_rows_kernel[(q_len, heads)](
                q, cache_k, cache_v, out, mask, where.reshape(1), *strides,
                q_len, heads // cache_k.shape[0],
                HEAD_DIM=head_dim, BLOCK_N=block_n, BLOCK_D=triton.next_power_of_2(head_dim),
                BLOCK_Q=triton.next_power_of_2(q_len),
            )  # fmt: skip
        else:
            module.static_attention_kernel[(triton.cdiv(q_len, block_m), heads)](
                q, cache_k, cache_v, out, mask, where.reshape(1), *strides,
                q_len, heads // cache_k.shape[0],
                HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
                BLOCK_D=triton.next_power_of_2(head_dim), PRECISION="ieee",
            )  # fmt: skip
    return out.to(q.dtype)


@_static_attention_op.register_fake
def _(q: Tensor, *rest: object) -> Tensor:
    return q.new_empty(q.shape)


def static_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    where: torch.Tensor,
    local_mask: torch.Tensor,
    *,
    by_position: bool = False,
) -> torch.Tensor:
    """:func:`~verispec.models.attention.attend_static` on the Triton kernel: the new keys and
    values written at slots ``where + i`` (a 0-d int64 tensor on the device), then each query
    attends to the committed slots and, among the new ones, to what ``local_mask`` (Shape:
    (Q, Q)) allows, reading only slots ``[0, where + Q)``.

    ``by_position``: each row sums its keys in sequence order (committed slots, then its
    visible new keys in column order, a tree's ancestors root first), one row a program
    (``static_attention_rows_kernel``), so that a branching tree's node has exactly the
    bits of the same token decoded after its ancestors were committed
    (``batch_invariant=True``). Without it rows of 16 share key tiles by slot: the same
    bits for a chain only.

    q: (Q, H, D); k, v: (Q, H_kv, D); cache_k: (H_kv, S, D); cache_v: (H_kv, S, D or more),
    float32 or float64 (the runtime's activations); returns (Q, H * D). A row's result does
    not depend on ``Q`` (module docstring of :mod:`verispec.kernels.triton.static_attention`).

    Raises:
        KernelUnavailableError: Triton cannot run on the tensors' device.
        ValueError: a dtype other than float32, or heads that do not group.
    """
    q_len, heads, head_dim = q.shape
    if not torch.compiler.is_compiling():  # checked eagerly (the capture's warm-up runs)
        _check_device(q, "static attention")
    if q.dtype != torch.float32 or cache_k.dtype != torch.float32:
        allowed = "float32"
        raise ValueError(
            f"`q` and the caches must be {allowed} (the runtime's activations); got "
            f"{q.dtype} and {cache_k.dtype} (of {sorted(str(d) for d in FLOAT_DTYPES)})."
        )
    if heads % cache_k.shape[0]:
        raise ValueError(
            f"`q` has {heads} heads, not a multiple of the cache's {cache_k.shape[0]} key heads."
        )
    slots = where + torch.arange(q_len, device=q.device)
    cache_k.index_copy_(1, slots, k.transpose(0, 1))
    cache_v[..., :head_dim].index_copy_(1, slots, v.transpose(0, 1))
    q = q if q.stride(-1) == 1 else q.contiguous()
    out = _static_attention_op(q, cache_k, cache_v, where, local_mask, by_position)
    return out.reshape(q_len, heads * head_dim)


@torch.library.custom_op("verispec::invariant_linear", mutates_args=())
def _invariant_linear_op(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    rows, inner = x.shape
    out = torch.empty(rows, weight.shape[0], dtype=x.dtype, device=x.device)
    block_m, block_n, block_k = PRODUCT_TILES[x.dtype]
    upcast = interpreting() and x.dtype == torch.bfloat16
    kernel = kernel_module("batch_invariant").batch_invariant_kernel
    with launch_device(x.device):
        kernel[(triton.cdiv(rows, block_m), triton.cdiv(weight.shape[0], block_n))](
            x, weight, bias if bias is not None else weight, out,
            rows, weight.shape[0], inner, x.stride(0), weight.stride(0), out.stride(0),
            HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
            PRECISION="ieee" if x.dtype == torch.float32 or upcast else "tf32",
            UPCAST=upcast, num_warps=4, num_stages=3,
        )  # fmt: skip
    return out


@_invariant_linear_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


def invariant_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ weight.T (+ bias)`` with each row's sums independent of the row count.

    x: (M, K); weight: (N, K) (``nn.Linear``'s layout); bias: (N,) or ``None``; float16,
    bfloat16 or float32, all one dtype. Accumulates in float32 and rounds once to x's
    dtype. Tiles: :data:`PRODUCT_TILES`.

    Raises:
        KernelUnavailableError: Triton cannot run on the tensors' device.
        ValueError: mixed or unsupported dtypes, or shapes that do not multiply.
    """
    if not torch.compiler.is_compiling():
        _check_device(x, "batch-invariant product")
    if x.dtype not in PRODUCT_TILES or weight.dtype != x.dtype:
        raise ValueError(
            f"`x` and `weight` must share one dtype of "
            f"{sorted(str(d) for d in PRODUCT_TILES)}; got {x.dtype} and {weight.dtype}."
        )
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(
            f"`x` must be (M, K) and `weight` (N, K); got {tuple(x.shape)} and "
            f"{tuple(weight.shape)}."
        )
    x = x if x.stride(-1) == 1 else x.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    return _invariant_linear_op(x, weight, bias)


@torch.library.custom_op("verispec::invariant_rms_norm", mutates_args=())
def _invariant_rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    out = torch.empty_like(x)
    kernel = kernel_module("batch_invariant").rms_norm_rows_kernel
    with launch_device(x.device):
        kernel[(x.shape[0],)](
            x, weight, out, x.stride(0), out.stride(0), x.shape[1], eps,
            BLOCK_E=triton.next_power_of_2(x.shape[1]),
        )  # fmt: skip
    return out


@_invariant_rms_norm_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x)


def invariant_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x ** 2, -1) + eps) * weight`` a row at a time (x: (M, E), weight:
    (E,)), in float32, rounded once to x's dtype: a row's result does not depend on M.

    Raises:
        KernelUnavailableError: Triton cannot run on the tensors' device.
        ValueError: mismatched widths.
    """
    if not torch.compiler.is_compiling():
        _check_device(x, "batch-invariant norm")
    if x.dim() != 2 or weight.shape != (x.shape[1],):
        raise ValueError(
            f"`x` must be (M, E) and `weight` (E,); got {tuple(x.shape)} and {tuple(weight.shape)}."
        )
    x = x if x.stride(-1) == 1 else x.contiguous()
    return _invariant_rms_norm_op(x, weight, float(eps))


class InvariantLinear(nn.Module):
    """``nn.Linear`` on :func:`invariant_linear`, sharing the source module's parameters."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight = weight
        self.bias = bias
        self.out_features, self.in_features = weight.shape

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> InvariantLinear:
        return cls(linear.weight, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return invariant_linear(x, self.weight, self.bias)


class InvariantRMSNorm(nn.Module):
    """An RMS norm (``weight``, ``eps``) on :func:`invariant_rms_norm`, sharing the source
    module's weight."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = weight
        self.eps = eps

    @classmethod
    def from_norm(cls, norm: nn.Module) -> InvariantRMSNorm:
        weight, eps = norm.weight, norm.eps
        assert isinstance(weight, torch.Tensor) and isinstance(eps, float)
        return cls(weight, eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return invariant_rms_norm(x, self.weight, self.eps)

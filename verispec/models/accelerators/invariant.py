"""The Triton kernels of CUDA graphs as accelerators: batch-invariant products and norms, and
the static attention that reads only the cache's used slots.

Both are :mod:`verispec.kernels.graph_ops`' operators (CUDA, or Triton's interpreter on the
CPU for tests), installed from outside as the block products are: the plain model imports no
kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from torch import Tensor, nn

from verispec.models.accelerators.base import Accelerator, Plan
from verispec.models.llama import KVCache, PassInputs, PassKind, RMSNorm

if TYPE_CHECKING:
    from verispec.models.llama import Transformer

__all__ = [
    "InvariantKernels",
    "TritonAttention",
    "triton_static_attention",
    "use_invariant_kernels",
]


def use_invariant_kernels(model: nn.Module) -> None:
    """Swap every product and norm under ``model`` for the batch-invariant Triton kernels
    of :mod:`verispec.kernels.triton.batch_invariant` (the same weights, shared, not copied)."""
    from verispec.kernels.graph_ops import InvariantLinear, InvariantRMSNorm

    for name, child in model.named_children():
        if type(child) is nn.Linear:
            setattr(model, name, InvariantLinear.from_linear(child))
        elif type(child) is RMSNorm:
            setattr(model, name, InvariantRMSNorm.from_norm(child))
        else:
            use_invariant_kernels(child)


class TritonAttention(Accelerator):
    """The accelerator that sets every layer's static-pass (CUDA graph) attention core to
    :func:`verispec.kernels.graph_ops.static_attention`, which reads only the cache's used
    slots in a fixed order (position by position with ``batch_invariant``): with
    ``attention="triton"``."""

    label = "+Triton attention"

    @classmethod
    def attach(
        cls, model: Transformer, plan: Plan, attached: Sequence[Accelerator]
    ) -> TritonAttention | None:
        if plan.attention != "triton":
            return None
        core = functools.partial(triton_static_attention, by_position=plan.batch_invariant)
        for block in model.blocks:
            block.attention.cores[PassKind.STATIC] = core
        return cls()


def triton_static_attention(
    q: Tensor, k: Tensor, v: Tensor, cache: KVCache, inputs: PassInputs, *, by_position: bool
) -> Tensor:
    """:func:`verispec.kernels.graph_ops.static_attention` as a static passes' attention core
    (the arguments of :func:`~verispec.models.attention.attend_static`)."""
    from verispec.kernels.graph_ops import static_attention

    args = (q, k, v, cache.k, cache.v, inputs.where, inputs.local_mask)
    return static_attention(*args, by_position=by_position)


class InvariantKernels(Accelerator):
    """The accelerator of ``batch_invariant=True``: every product (the projections, the LM
    head) and every norm a Triton kernel with one fixed tiling and summation order
    (:func:`use_invariant_kernels`), so a row's result does not depend on how many rows run
    with it."""

    label = "+batch-invariant"

    @classmethod
    def attach(
        cls, model: Transformer, plan: Plan, attached: Sequence[Accelerator]
    ) -> InvariantKernels | None:
        if not plan.batch_invariant:
            return None
        use_invariant_kernels(model)
        return cls()

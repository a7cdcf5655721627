"""Weights prepacked for oneDNN: the runtime's dense products on the CPU.

Every ``nn.Linear`` the block kernel (:mod:`verispec.models.accelerators.blocks`) does not cover
is replaced by :class:`PackedLinear` (:func:`prepack_linears`), whose weight is reordered
once into oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``) and
multiplied by ``_linear_pointwise``. On the CPUs measured, oneDNN's product is faster
than the default MKL one for 2 or more rows (docs/benchmarks.rst), and its result for a row does not
depend on how many rows are computed with it from two rows up (checked by
:func:`~verispec.models.accelerators.probe.row_invariant_kernels`; a single row is padded to two,
:func:`~verispec.models.invariance.min_product_rows`). Float32, or bfloat16 where oneDNN
multiplies it, natively or emulated (:func:`~verispec.kernels.cpu.features.bf16_supported`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from verispec.errors import ConfigError
from verispec.kernels.cpu.features import bf16_supported
from verispec.models.accelerators.base import Accelerator, Plan
from verispec.models.accelerators.linear_op import PACKED_LINEAR
from verispec.models.invariance import DENSE_MIN_ROWS

if TYPE_CHECKING:
    from verispec.models.llama import Transformer

__all__ = ["PackedLinear", "Prepacked", "can_prepack", "prepack_linears"]


class PackedLinear(nn.Module):
    """``nn.Linear`` with its weight reordered once for oneDNN (CPU, float32 or bfloat16).

    Attributes:
        packed: the weight in oneDNN's blocked layout (an opaque mkldnn tensor).
        bias: the original bias, or ``None``.
        weight_dtype: the dtype inputs must have.
        min_rows: a single float32 row takes another path than two or more
            (:data:`~verispec.models.invariance.DENSE_MIN_ROWS`).
    """

    min_rows: ClassVar[int] = DENSE_MIN_ROWS

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight_dtype = linear.weight.dtype
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = linear.bias
        self.key: int | None = None  # set when a compiled forward calls it by key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: Shape: (R, in_features), in ``weight_dtype``."""
        if torch.compiler.is_compiling():  # an opaque operator inside compiled graphs
            return PACKED_LINEAR(x, self.key)
        return self.eager(x)

    def eager(self, x: torch.Tensor) -> torch.Tensor:
        """The oneDNN product itself."""
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, dtype={self.weight_dtype}, oneDNN"


def prepack_linears(module: nn.Module) -> int:
    """Replace every ``nn.Linear`` under ``module`` by a :class:`PackedLinear`; return how many.

    Tied weights (the embedding and the LM head) stay tied: the embedding keeps the
    plain tensor, the head gets a packed copy.
    """
    count = 0
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, PackedLinear(child))
            count += 1
        else:
            count += prepack_linears(child)
    return count


def can_prepack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether oneDNN runs products of ``dtype`` weights on ``device`` (a CPU with oneDNN;
    float32, or bfloat16 where the CPU multiplies it natively)."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and bf16_supported())


class Prepacked(Accelerator):
    """The accelerator that prepacks every remaining ``nn.Linear`` for oneDNN
    (:func:`prepack_linears`): with ``prepack="auto"`` where :func:`can_prepack`, with
    ``True`` or an error."""

    label = "+oneDNN"

    @classmethod
    def attach(
        cls, model: Transformer, plan: Plan, attached: Sequence[Accelerator]
    ) -> Prepacked | None:
        dtype = model.weight_dtype
        if plan.prepack is True and not can_prepack(plan.device, dtype):
            raise ConfigError(
                f"`prepack=True` needs a CPU with oneDNN and float32 or native bfloat16 "
                f"weights; got {dtype} on {plan.device}."
            )
        if not (plan.prepack and can_prepack(plan.device, dtype)):
            return None
        return cls() if prepack_linears(model) > 0 else None

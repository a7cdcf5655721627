"""``verispec::packed_linear``: a weight product as one opaque operator in compiled graphs.

Inside ``torch.compile`` (:mod:`verispec.models.accelerators.compiled`) the runtime's weight
products stay what they are eagerly: oneDNN's product with a prepacked weight
(:class:`~verispec.models.accelerators.onednn.PackedLinear`; inductor's own prepacking would
pick MKL for float32, slower here and with rows that depend on the row count) or the block
kernel (:class:`~verispec.models.accelerators.blocks.BlockLinear`). Each such module is registered
under an integer key (:func:`register_linear`) and the graph calls :data:`PACKED_LINEAR`
with that key, which runs the module's ``eager`` product. The operator is registered when
this module is imported, by the modules that call it.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

__all__ = ["PACKED_LINEAR", "OpaqueProduct", "register_linear", "register_products"]

_LINEARS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_KEYS = itertools.count()


def register_linear(linear: Any) -> int:
    """A key under which ``verispec::packed_linear`` finds ``linear`` (held weakly): a module
    with ``eager(x)`` and ``out_features``."""
    key = next(_KEYS)
    _LINEARS[key] = linear
    return key


@runtime_checkable
class OpaqueProduct(Protocol):
    """A weight product that runs as :data:`PACKED_LINEAR` inside compiled graphs: its
    ``eager`` product, found by its ``key`` (:func:`register_products` sets it)."""

    key: int | None
    out_features: int

    def eager(self, x: torch.Tensor) -> torch.Tensor: ...


def register_products(model: nn.Module) -> int:
    """Register every :class:`OpaqueProduct` under ``model`` and set its ``key``; return how
    many (what a compiled forward does before its first compile)."""
    products = [m for m in model.modules() if isinstance(m, OpaqueProduct)]
    for product in products:
        product.key = register_linear(product)
    return len(products)


@torch.library.custom_op("verispec::packed_linear", mutates_args=())
def _packed_linear(x: torch.Tensor, key: int) -> torch.Tensor:
    return _LINEARS[key].eager(x)


@_packed_linear.register_fake
def _(x: torch.Tensor, key: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], _LINEARS[key].out_features))


PACKED_LINEAR = torch.ops.verispec.packed_linear
"""The operator: ``PACKED_LINEAR(x, key)``, x Shape: (R, in_features)."""

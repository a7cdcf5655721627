"""``verispec::packed_linear``: a weight product as one opaque operator in compiled graphs.

Inside ``torch.compile`` (:mod:`verispec.models._compiled`) the runtime's weight products
stay what they are eagerly: oneDNN's product with a prepacked weight
(:class:`~verispec.models.onednn.PackedLinear`; inductor's own prepacking would pick MKL
for float32, slower here and with rows that depend on the row count) or the block
kernel (:class:`~verispec.models.cpu_linear.BlockLinear`). Each such module is registered
under an integer key (:func:`register_linear`) and the graph calls :data:`PACKED_LINEAR`
with that key, which runs the module's ``eager`` product. The operator is registered when
this module is imported, by the modules that call it.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import torch

__all__ = ["PACKED_LINEAR", "register_linear"]

_LINEARS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_KEYS = itertools.count()


def register_linear(linear: Any) -> int:
    """A key under which ``verispec::packed_linear`` finds ``linear`` (held weakly): a module
    with ``eager(x)`` and ``out_features``."""
    key = next(_KEYS)
    _LINEARS[key] = linear
    return key


@torch.library.custom_op("verispec::packed_linear", mutates_args=())
def _packed_linear(x: torch.Tensor, key: int) -> torch.Tensor:
    return _LINEARS[key].eager(x)


@_packed_linear.register_fake
def _(x: torch.Tensor, key: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], _LINEARS[key].out_features))


PACKED_LINEAR = torch.ops.verispec.packed_linear
"""The operator: ``PACKED_LINEAR(x, key)``, x Shape: (R, in_features)."""

"""Row invariance: how many rows each product runs on, and the probe of this machine's kernels.

A tree node's logits equal those of decoding its path one token at a time, bit for bit,
only if no product gives a row other bits because other rows run with it (see
docs/runtime.rst, "Tree rows and sequential decoding"). The kernels have that property
from some row count up, so a pass runs on at least that many rows, the rest padded and
thrown away. The rule is written here, once:

* a weight product: what it declares (:class:`RowProduct`: one row for the block kernel,
  :class:`~verispec.models.accelerators.blocks.BlockLinear`, row-invariant by construction),
  else two, as for oneDNN and the dense products (a single float32 row takes another
  path) — :func:`min_product_rows`;
* the attention's batched products: :data:`MIN_PRODUCT_ROWS` rows, in whole tokens of
  ``G`` query heads per key/value head, and two tokens at least — :func:`min_tokens`;
* a pass: one token where every weight product is the block kernel (the attention pads
  its own products), else :func:`min_tokens` — :func:`min_pass_tokens`;
* the attention's value product runs per block of :data:`VALUE_BLOCK` slots, whose sum
  runs over the slots in order.

:func:`~verispec.models.accelerators.probe.row_invariant_kernels` checks on random data
that this machine's kernels have those properties at a model's shapes; where they do not,
tree rows equal sequential rows to rounding only. This module is the rule alone: the plain
model (:mod:`verispec.models.attention`) reads it, and it imports no kernel.
"""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable

from torch import nn

__all__ = [
    "DENSE_MIN_ROWS",
    "MIN_PRODUCT_ROWS",
    "VALUE_BLOCK",
    "RowProduct",
    "min_pass_tokens",
    "min_product_rows",
    "min_tokens",
]

VALUE_BLOCK = 128
"""Keys per block of the attention's value product (see
:func:`verispec.models.attention.attend`)."""
MIN_PRODUCT_ROWS = 4
"""The fewest rows the attention's batched products run on: from there on, a row's result
does not depend on the row count (checked by
:func:`~verispec.models.accelerators.probe.row_invariant_kernels`)."""
DENSE_MIN_ROWS = 2
"""The fewest rows of a dense weight product (oneDNN's float32 product takes another path
for a single row)."""


@runtime_checkable
class RowProduct(Protocol):
    """A weight product that declares the fewest rows it runs on with row-invariant results
    (the block kernel: one); a product that declares nothing needs :data:`DENSE_MIN_ROWS`."""

    min_rows: ClassVar[int]


def min_product_rows(product: nn.Module) -> int:
    """The fewest rows the weight product ``product`` runs on: what it declares
    (:class:`RowProduct`), else :data:`DENSE_MIN_ROWS`."""
    return product.min_rows if isinstance(product, RowProduct) else DENSE_MIN_ROWS


def min_tokens(groups: int) -> int:
    """The fewest tokens a pass's products run on (the rest padded): two, and at least
    :data:`MIN_PRODUCT_ROWS` rows of the attention's products for ``groups`` query heads per
    key/value head. oneDNN's projections need two rows; the attention pads itself."""
    return max(DENSE_MIN_ROWS, -(-MIN_PRODUCT_ROWS // groups))


def min_pass_tokens(module: nn.Module, groups: int) -> int:
    """The fewest tokens a forward of ``module`` (a decoder) runs on: one where every weight
    product under it is the block kernel (the attention pads its own products), else
    :func:`min_tokens` of ``groups`` query heads per key/value head."""
    products = (m for m in module.modules() if isinstance(m, nn.Linear | RowProduct))
    return 1 if all(min_product_rows(p) == 1 for p in products) else min_tokens(groups)

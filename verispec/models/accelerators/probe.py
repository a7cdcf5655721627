"""Whether this machine's matrix kernels give a row the same bits whatever else is computed.

The rule of how many rows each product runs on is :mod:`verispec.models.invariance`; this
is its check on the machine at hand, for the products the runtime may run (oneDNN's
prepacked ones, torch's batched products in the attention).
"""

from __future__ import annotations

import torch
from torch import nn

from verispec.models.accelerators.onednn import PackedLinear, can_prepack
from verispec.models.invariance import VALUE_BLOCK, min_tokens

__all__ = ["row_invariant_kernels"]

_INVARIANT: dict[tuple, bool] = {}


def row_invariant_kernels(
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    *,
    head_dim: int = 64,
    widths: tuple[int, ...] = (576, 1536),
    groups: int = 3,
) -> bool:
    """Whether this machine's matrix kernels give a row the same bits whatever else is computed.

    The runtime's tree rows equal sequential decoding bit for bit when, at the model's
    shapes, (1) oneDNN's product with a prepacked weight gives a row the same result for
    any row count from 2 up (inner widths ``widths``); (2) a batched product's row is the
    same for any row count the attention uses (``groups`` times the padded token count)
    and any column count (inner width ``head_dim``); (3) the product of softmax weights
    with the values over one block of :data:`VALUE_BLOCK` slots (``head_dim + 1`` columns)
    accumulates over the slots in order, so that only the order of the nonzero terms
    matters, not their slots nor zeros between them, for any of those row counts. (The
    blocks' sums are added by the attention's own code, in an order fixed by position: see
    :func:`~verispec.models.attention.attend`.) This checks the three on random data (tens of
    milliseconds, once per process and shape) and says whether they hold; see
    docs/runtime.rst. Defaults: SmolLM2-135M's shapes.
    """
    key = (dtype, str(device), head_dim, tuple(widths), groups)
    if key not in _INVARIANT:
        _INVARIANT[key] = _probe_invariance(dtype, torch.device(device), head_dim, widths, groups)
    return _INVARIANT[key]


def _probe_invariance(
    dtype: torch.dtype, device: torch.device, head_dim: int, widths: tuple[int, ...], groups: int
) -> bool:
    generator = torch.Generator().manual_seed(0)

    def rand(*shape: int, uniform: bool = False) -> torch.Tensor:
        draw = torch.rand if uniform else torch.randn
        return draw(*shape, generator=generator).to(device, compute)

    compute = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
    checks = []
    with torch.no_grad():
        if can_prepack(device, dtype):  # (1) prepacked projections, 2..40 rows
            for inner in widths:
                packed = PackedLinear(nn.Linear(inner, 96, bias=False).to(device, dtype))
                x = rand(40, inner).to(dtype)
                first = packed(x[:2])[:2]
                checks += [torch.equal(packed(x[:m])[:2], first) for m in range(3, 41)]
        rows = [groups * q for q in range(min_tokens(groups), 41)]
        keys, queries = rand(2, 640, head_dim), rand(2, rows[-1], head_dim)
        scores = torch.bmm(queries[:, : rows[0]], keys[:, :384].transpose(1, 2))  # (2)
        for m in rows:
            for n in (384, 640):
                got = torch.bmm(queries[:, :m], keys[:, :n].transpose(1, 2))
                checks.append(torch.equal(got[:, : rows[0], :384], scores))
        block = VALUE_BLOCK  # (3): 100 terms, in order, in one block of the value product
        values, weights = rand(2, block, head_dim + 1), rand(2, rows[-1], block, uniform=True)
        weights[..., 100:] = 0
        reference = torch.bmm(weights[:, : rows[0]], values)
        spread = torch.randperm(block, generator=generator)[:100].sort().values.to(device)
        moved_w, moved_v = torch.zeros_like(weights), rand(2, block, head_dim + 1)
        moved_w[..., spread], moved_v[:, spread] = weights[..., :100], values[:, :100]
        for m in rows:
            checks.append(torch.equal(torch.bmm(weights[:, :m], values)[:, : rows[0]], reference))
            checks.append(torch.equal(torch.bmm(moved_w[:, :m], moved_v)[:, : rows[0]], reference))
    return all(checks)

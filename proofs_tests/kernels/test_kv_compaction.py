"""KV compaction: the kernel moves exactly what ``index_select`` then copy moves."""

from __future__ import annotations

import pytest
import torch

from verispec.errors import TreeStructureError
from verispec.kernels import ops, reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "source", [[12, 14, 13, 20], [12], [13, 12], [15, 16, 17, 18, 19, 20, 21, 22, 23]]
)
def test_every_layer_equals_the_reference(triton_backend, device, dtype, source) -> None:  # type: ignore[no-untyped-def]
    """Keys and values of 3 layers (B=1, H_kv=3, L=30, D=64) after moving ``source`` to 12..:
    identical to the reference, overlapping and out-of-order sources included; entries
    outside the destination range are untouched."""
    g = torch.Generator().manual_seed(len(source))
    caches = [torch.randn(1, 3, 30, 64, generator=g).to(dtype) for _ in range(6)]
    expected = [c.clone() for c in caches]
    src = torch.tensor(source)
    reference.compact_kv(expected, 12, src)
    moved = [c.to(device) for c in caches]
    ops.compact_kv(moved, 12, src.to(device))
    for got, want, before in zip(moved, expected, caches, strict=True):
        assert torch.equal(got.cpu(), want)
        end = 12 + len(source)
        assert torch.equal(got.cpu()[..., :12, :], before[..., :12, :])
        assert torch.equal(got.cpu()[..., end:, :], before[..., end:, :])


def test_stacked_tensor_views_and_mixed_shapes(triton_backend, device) -> None:
    """A stacked (layers, 2, B, H, L, D) tensor, buffer views with spare capacity (as in
    ``TreeKVCache``) and tensors of two head dims in one call all equal the reference."""
    g = torch.Generator().manual_seed(0)
    stacked = torch.randn(2, 2, 1, 2, 24, 16, generator=g)
    buffers = [torch.randn(1, 2, 40, 32, generator=g)[:, :, :24] for _ in range(2)]
    small = torch.randn(1, 4, 24, 8, generator=g)
    src = torch.tensor([9, 7, 11])
    expected = [t.clone() for t in (stacked, *buffers, small)]
    reference.compact_kv(expected, 6, src)
    got = [t.to(device) for t in (stacked, *buffers, small)]
    ops.compact_kv(got[0], 6, src.to(device))
    ops.compact_kv(got[1:], 6, src.to(device))
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a.cpu(), b)


def test_out_of_range_destination_is_refused() -> None:
    """Moving more entries than fit after ``start`` raises TreeStructureError."""
    with pytest.raises(TreeStructureError, match="L >= start"):
        ops.compact_kv([torch.zeros(1, 1, 5, 4)], 4, torch.tensor([0, 1]))


def test_caches_on_several_devices_are_compacted_where_they_live() -> None:
    """Caches split over devices (a model under ``device_map``: here the CPU and the meta
    device) are each compacted on their own device with the source copied there, instead
    of being refused; the CPU caches equal the reference."""
    g = torch.Generator().manual_seed(3)
    on_cpu = [torch.randn(1, 2, 20, 8, generator=g) for _ in range(2)]
    on_meta = [torch.empty(1, 2, 20, 8, device="meta") for _ in range(2)]
    expected = [c.clone() for c in on_cpu]
    source = torch.tensor([9, 11, 10])
    reference.compact_kv(expected, 5, source)
    ops.compact_kv([on_cpu[0], on_meta[0], on_cpu[1], on_meta[1]], 5, source)
    for got, want in zip(on_cpu, expected, strict=True):
        assert torch.equal(got, want)

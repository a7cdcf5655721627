"""Token Recycling kernels: template expansion and adjacency update equal the drafter's own
PyTorch code (``verispec.drafters.token_recycling``) and the kernel references, exactly."""

from __future__ import annotations

import pytest
import torch

from verispec.drafters import token_recycling as tr
from verispec.drafters.templates import resolve_template
from verispec.kernels import ops, reference


def _adjacency(vocab: int, k: int, g: torch.Generator, unknown: float, dtype: torch.dtype):  # type: ignore[no-untyped-def]
    adj = torch.randint(0, vocab, (vocab, k), generator=g)
    adj[torch.rand(vocab, k, generator=g) < unknown] = -1
    return adj.to(dtype)


@pytest.mark.parametrize("template_name", ["2.2.2", "8"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_expansion_equals_the_drafters(triton_backend, device, template_name, dtype) -> None:  # type: ignore[no-untyped-def]
    """Expanding the "2.2.2" (80 nodes, 6 levels) and "8" templates from 4 roots, one of them
    unknown to the matrix, over a matrix with 30% unknown slots gives the drafter's rows."""
    g = torch.Generator().manual_seed(len(template_name))
    template = resolve_template(template_name, 8)
    adjacency = _adjacency(60, 8, g, 0.3, dtype)
    adjacency[7] = -1  # a root never seen: its whole tree is unknown
    for root in (0, 7, 31, 59):
        expected = tr.expand_template(adjacency, root, template)
        args = (template.parents, template.slots, template.level_starts)
        assert torch.equal(reference.expand_template(adjacency, root, *args), expected)
        got = ops.expand_template(adjacency.to(device), root, *args)
        assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("k", [8, 3])
def test_update_equals_the_drafters_last_writer_wins(triton_backend, device, k) -> None:  # type: ignore[no-untyped-def]
    """Scattering 81 rows of top-K ids whose tokens repeat (20 distinct) leaves the same matrix
    as the drafter's last-occurrence scatter: a repeated token keeps its last row."""
    g = torch.Generator().manual_seed(k)
    adjacency = _adjacency(50, k, g, 0.5, torch.int32)
    rows = torch.randint(0, 20, (81,), generator=g)
    topk = torch.randint(0, 50, (81, k), generator=g)
    expected = adjacency.clone()
    keep = tr.last_occurrence_mask(rows)
    expected[rows[keep]] = topk[keep].to(torch.int32)
    mine = adjacency.clone()
    reference.update_adjacency(mine, rows, topk)
    assert torch.equal(mine, expected)
    on_device = adjacency.to(device)
    ops.update_adjacency(on_device, rows, topk)
    assert torch.equal(on_device.cpu(), expected)
    last = int((rows == rows[0]).nonzero()[-1])
    assert torch.equal(on_device[rows[0]].cpu(), topk[last].to(torch.int32))

"""The C top-k of CPU logit rows (verispec.kernels.cpu.topk) against torch."""

from __future__ import annotations

import math

import pytest
import torch

from verispec.kernels.cpu import topk as cpu_topk

pytestmark = pytest.mark.skipif(
    cpu_topk.library() is None, reason="the C kernel cannot be built on this machine"
)


def _reference(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest of each row, the lower id first among equal values."""
    order = torch.sort(logits, dim=-1, descending=True, stable=True)
    return order.values[:, :k], order.indices[:, :k]


@pytest.mark.parametrize("rows", [1, 2, 5, 81])
@pytest.mark.parametrize(("vocab", "k", "block"), [(49152, 8, 64), (4096, 16, 64), (96, 1, 8)])
def test_topk_and_block_logsumexp_match_torch(rows: int, vocab: int, k: int, block: int) -> None:
    """Values and ids are those of a stable descending sort (ties: lower id first), and the
    log-sum-exp is that of the row's block maxima."""
    generator = torch.Generator().manual_seed(rows * vocab + k)
    logits = 3 * torch.randn(rows, vocab, generator=generator)
    logits[0, 7 : 7 + 3 * k] = 9.0  # ties at the top, across blocks
    if rows > 1:
        logits[1] = torch.randint(0, 3, (vocab,), generator=generator).float()  # many ties
    found = cpu_topk.topk_rows(logits, k, block, lse=True)
    assert found is not None
    values, ids, lse = found
    ref_values, ref_ids = _reference(logits, k)
    assert torch.equal(values, ref_values)
    assert torch.equal(ids, ref_ids)
    block_max = logits.reshape(rows, -1, block).amax(-1)
    assert lse is not None
    torch.testing.assert_close(lse, torch.logsumexp(block_max, -1, keepdim=True))
    plain = cpu_topk.topk_rows(logits, k, block)  # without the log-sum-exp: the same top-k
    assert plain is not None and plain[2] is None
    assert torch.equal(plain[0], values) and torch.equal(plain[1], ids)


def test_a_strided_batch_of_rows() -> None:
    """Rows with a row stride larger than V (a slice of wider logits) are read in place."""
    wide = torch.randn(3, 2 * 4096, generator=torch.Generator().manual_seed(1))
    logits = wide[:, :4096]
    found = cpu_topk.topk_rows(logits, 8, 64)
    assert found is not None
    assert torch.equal(found[1], _reference(logits, 8)[1])


def test_infinite_rows() -> None:
    """A row of -inf gives -inf values (lowest ids) and a -inf log-sum-exp; a +inf entry
    comes first."""
    logits = torch.full((2, 512), -math.inf)
    logits[1, 300] = math.inf
    found = cpu_topk.topk_rows(logits, 4, 64, lse=True)
    assert found is not None
    values, ids, lse = found
    assert ids[0].tolist() == [0, 1, 2, 3] and (values[0] == -math.inf).all()
    assert lse is not None and lse[0].item() == -math.inf
    assert ids[1, 0].item() == 300 and values[1, 0].item() == math.inf


def test_declines_what_it_does_not_take() -> None:
    """None (the caller uses torch.topk) for a NaN, another dtype, a block that does not
    divide V or is not a multiple of 8, a non-unit column stride, or k outside [1, V]."""
    logits = torch.randn(2, 512)
    nan = logits.clone()
    nan[1, 100] = math.nan
    assert cpu_topk.topk_rows(nan, 4, 64) is None
    assert cpu_topk.topk_rows(nan, 4, 64, lse=True) is None
    assert cpu_topk.topk_rows(logits.double(), 4, 64) is None
    assert cpu_topk.topk_rows(logits[:, :500], 4, 64) is None
    assert cpu_topk.topk_rows(logits, 4, 12) is None
    assert cpu_topk.topk_rows(torch.randn(512, 2).t(), 4, 64) is None
    assert cpu_topk.topk_rows(logits, 0, 64) is None
    assert cpu_topk.topk_rows(logits, 513, 64) is None

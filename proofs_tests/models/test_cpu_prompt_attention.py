"""Tests of the C attention of a prompt's causal pass (``kernels/cpu/prompt_attention.c``).

The properties: it writes the cache as the torch prompt attention does and gives its outputs
to rounding, with committed slots before the pass or none, for head widths that fill its
32-lane value tiles and for those that do not; a row's bits depend on its own query and the
slots it sees only (not on the rows after it, on how the prompt is split into passes, or on
the thread count), and the AVX-512 build gives the AVX2 build's bits; bad arguments are
refused before anything is written.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from verispec.kernels.cpu.features import cpu_flags
from verispec.models.accelerators import blocks as cpu_linear
from verispec.models.accelerators.blocks import kernel_status
from verispec.models.accelerators.c_attention import attend_prompt_cpu
from verispec.models.attention import attend_prompt, on_buffers

available, why = kernel_status()
pytestmark = pytest.mark.skipif(not available, reason=f"block kernel unavailable: {why}")


def _pass(queries: int, capacity: int, heads: int, kv_heads: int, dim: int, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    cache_k = torch.randn(kv_heads, capacity, dim, generator=g)
    ones = torch.ones(kv_heads, capacity, 1)
    cache_v = torch.cat([torch.randn(kv_heads, capacity, dim, generator=g), ones], -1)
    q = torch.randn(queries, heads, dim, generator=g) * 0.3
    k = torch.randn(queries, kv_heads, dim, generator=g)
    v = torch.randn(queries, kv_heads, dim, generator=g)
    return q, k, v, cache_k, cache_v


def _causal(queries: int) -> torch.Tensor:
    return torch.ones(queries, queries, dtype=torch.bool).tril()


@pytest.mark.parametrize(
    ("queries", "start", "heads", "kv_heads", "dim"),
    [
        (1, 0, 9, 3, 64),
        (7, 0, 9, 3, 64),
        (33, 0, 9, 3, 64),
        (100, 0, 9, 3, 64),
        (40, 300, 9, 3, 64),
        (129, 31, 9, 3, 64),
        (50, 17, 4, 2, 40),  # value lanes past the last 32-lane tile
        (20, 5, 8, 8, 128),  # no grouping
    ],
)
def test_c_prompt_attention_equals_torch_prompt_attention(
    queries: int, start: int, heads: int, kv_heads: int, dim: int
) -> None:
    """attend_prompt_cpu writes the cache entries attend_prompt writes (the column of ones
    untouched) and gives its outputs to rounding: each token over every committed slot and
    the pass's slots up to its own."""
    q, k, v, cache_k, cache_v = _pass(queries, 512, heads, kv_heads, dim, queries + start)
    where = torch.tensor([start, start + queries])
    ours_k, ours_v = cache_k.clone(), cache_v.clone()
    expected = on_buffers(attend_prompt, q, k, v, cache_k, cache_v, where, _causal(queries))
    got = on_buffers(attend_prompt_cpu, q, k, v, ours_k, ours_v, where, _causal(queries))
    assert torch.equal(ours_k, cache_k) and torch.equal(ours_v, cache_v)
    assert (got - expected).abs().max().item() < 1e-5


def test_c_prompt_attention_row_depends_only_on_its_slots() -> None:
    """Each row has the same bits whether the prompt runs as one pass of 100 tokens or as
    passes of 37, 30 and 33 (each after the ones before it), on one, two or three threads."""
    q, k, v, cache_k, cache_v = _pass(100, 256, 9, 3, 64, 7)
    threads_before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        whole = on_buffers(
            attend_prompt_cpu, q, k, v, cache_k.clone(), cache_v.clone(),
            torch.tensor([0, 100]), _causal(100),
        )  # fmt: skip
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            ck, cv, parts = cache_k.clone(), cache_v.clone(), []
            for first, last in ((0, 37), (37, 67), (67, 100)):
                rows = slice(first, last)
                where, mask = torch.tensor([first, last]), _causal(last - first)
                parts.append(
                    on_buffers(attend_prompt_cpu, q[rows], k[rows], v[rows], ck, cv, where, mask)
                )
            assert torch.equal(torch.cat(parts), whole), threads
    finally:
        torch.set_num_threads(threads_before)


def test_c_prompt_attention_refuses_bad_arguments_and_writes_nothing() -> None:
    """A pass past the cache's capacity, or a head width that is not a multiple of 8, is
    refused (-1) with the cache as it was; through attend_prompt_cpu, a named error."""
    lib = cpu_linear.library()
    assert lib is not None
    for queries, capacity, dim in ((10, 40, 64), (4, 64, 12)):
        q, k, v, cache_k, cache_v = _pass(queries, capacity, 9, 3, dim, 1)
        ck, cv, out = cache_k.clone(), cache_v.clone(), torch.empty(queries, 9 * dim)
        status = lib.vs_attend_prompt(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), ck.data_ptr(), cv.data_ptr(), capacity,
            queries, 9, 3, dim, 35, out.data_ptr(), 1,
        )  # fmt: skip
        assert status == -1
        assert torch.equal(ck, cache_k) and torch.equal(cv, cache_v)
    q, k, v, cache_k, cache_v = _pass(10, 40, 9, 3, 64, 1)
    with pytest.raises(RuntimeError, match="prompt attention refused"):
        on_buffers(
            attend_prompt_cpu, q, k, v, cache_k, cache_v, torch.tensor([35, 45]), _causal(10)
        )


@pytest.mark.skipif("avx512f" not in cpu_flags(), reason="this CPU has no AVX-512")
def test_avx512_prompt_attention_equals_the_avx2_prompt_attention_bit_for_bit() -> None:
    """The native AVX-512 build (register tiles of four rows) gives every bit the AVX2 build
    gives (tiles of two): each row's sums run over the same slots and lanes in the same
    order, whatever tile it is in."""
    narrow = cpu_linear._build(("-mno-avx512f",))
    native = cpu_linear.library()
    assert native is not None
    q, k, v, cache_k, cache_v = _pass(70, 256, 9, 3, 64, 3)

    def attention(lib: ctypes.CDLL, threads: int) -> torch.Tensor:
        ck, cv, out = cache_k.clone(), cache_v.clone(), torch.empty(70, 9 * 64)
        status = lib.vs_attend_prompt(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), ck.data_ptr(), cv.data_ptr(), 256, 70,
            9, 3, 64, 21, out.data_ptr(), threads,
        )  # fmt: skip
        assert status == 0
        return out

    expected = attention(narrow, 1)
    for threads in (1, 2):
        assert torch.equal(attention(native, threads), expected), threads

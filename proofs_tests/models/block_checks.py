"""Checks shared by the block-product tests: a row's bits do not depend on how many rows run
with it, on the thread count, nor on the instruction set the kernel was built for."""

from __future__ import annotations

import ctypes

import torch

from verispec.models.accelerators import blocks
from verispec.models.accelerators.blocks import BlockLinear


def assert_rows_invariant(block: BlockLinear, x: torch.Tensor) -> None:
    """``block``'s rows of ``x`` are the same bits for the first 1 to ``len(x)`` rows on one
    thread, and for all of them on two."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        full = block(x)
        for rows in range(1, len(x) + 1):
            assert torch.equal(block(x[:rows]), full[:rows]), rows
        torch.set_num_threads(2)
        assert torch.equal(block(x), full)
    finally:
        torch.set_num_threads(threads)


def assert_avx512_equals_avx2(block: BlockLinear, x: torch.Tensor) -> None:
    """On an AVX-512 CPU, the native build's product (16-lane registers) equals the build
    without AVX-512 (eight lanes) bit for bit, for 1 to ``len(x)`` rows, on one or two
    threads."""
    narrow = blocks._build(("-mno-avx512f",))
    native = blocks.library()
    assert native is not None and block.bias is not None
    n, k = block.out_features, block.in_features

    def product(lib: ctypes.CDLL, rows: int, threads: int) -> torch.Tensor:
        y = torch.empty(rows, n)
        status = lib.vs_linear(
            block.kind, x.data_ptr(), rows, k, block.blocks.data_ptr(), n,
            block.bias.data_ptr(), y.data_ptr(), threads,
        )  # fmt: skip
        assert status == 0
        return y

    for rows in range(1, len(x) + 1):
        for threads in (1, 2):
            assert torch.equal(product(native, rows, threads), product(narrow, rows, 1)), rows

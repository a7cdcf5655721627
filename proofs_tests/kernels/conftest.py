"""Kernel tests: run the Triton kernels under Triton's CPU interpreter when there is no GPU.

Triton reads ``TRITON_INTERPRET`` when a ``@triton.jit`` function is defined, so it is
set here, before any test module imports a kernel (``verispec.kernels.backend`` also
re-imports a kernel module whose mode is stale). On a machine with CUDA the kernels
are compiled and run on the GPU instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from verispec.kernels.backend import interpreting, triton_available, use_backend

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def device() -> torch.device:
    """Where kernel tests put their tensors: CUDA when present, else the CPU (interpreter)."""
    return DEVICE


@pytest.fixture
def triton_backend() -> Iterator[None]:
    """Force the Triton kernels for the test (skip when Triton cannot run here)."""
    if not triton_available():
        pytest.skip("the optional `triton` package is not installed")
    if DEVICE.type == "cpu" and not interpreting():
        pytest.skip("no CUDA device and TRITON_INTERPRET is not 1")
    with use_backend("triton"):
        yield


def random_parents(num_nodes: int, generator: torch.Generator, chain_bias: float = 0.0) -> list:
    """A random valid parents list; with ``chain_bias`` a node extends the previous one."""
    parents = []
    for i in range(num_nodes):
        if i and float(torch.rand((), generator=generator)) < chain_bias:
            parents.append(i - 1)
        else:
            parents.append(int(torch.randint(-1, i, (), generator=generator)) if i else -1)
    return parents


@pytest.fixture
def make_parents():  # type: ignore[no-untyped-def]
    """The :func:`random_parents` factory."""
    return random_parents

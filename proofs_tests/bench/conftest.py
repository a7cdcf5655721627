"""Fixtures for the benchmark tests: the smoke model (tiny random Llama + byte tokenizer)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from verispec.bench.runner import make_context
from verispec.models.tiny import load_smoke_model


@pytest.fixture(scope="session")
def smoke_context() -> Any:
    """A benchmark context over the smoke model in float64 (exact greedy comparisons)."""
    model, tokenizer = load_smoke_model(dtype=torch.float64)
    return make_context(model, tokenizer)


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Any:
    """Run the tiny models on one thread, restored after each module.

    On a shared 2-core machine, two spinning intra-op threads make a 64-wide model
    about 15x slower than one thread; the figures of these tests mean nothing anyway.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

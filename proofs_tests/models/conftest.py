"""Fixtures of the model-adapter tests."""

from __future__ import annotations

import pytest
import torch

from verispec.models import HFModel, tiny_llama


@pytest.fixture(autouse=True)
def _one_thread():  # type: ignore[no-untyped-def]
    """Run these tests on one intra-op thread, then restore the setting.

    The tiny models' ops take microseconds; on a shared, loaded CPU, torch's thread pool
    makes each one wait milliseconds for its workers (measured: sdpa 0.06 ms on one thread,
    20 ms on two).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def llama64() -> HFModel:
    """Tiny float64 Llama, V = 64, 2 layers."""
    return tiny_llama(vocab_size=64, seed=0)

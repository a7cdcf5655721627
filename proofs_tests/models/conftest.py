"""Fixtures of the model-adapter tests."""

from __future__ import annotations

import pytest

from verispec.models import HFModel, tiny_llama


@pytest.fixture(autouse=True)
def _one_thread(one_thread: None) -> None:
    """Run these tests on one intra-op thread, then restore the setting.

    The tiny models' ops take microseconds; on a shared, loaded CPU, torch's thread pool
    makes each one wait milliseconds for its workers (measured: sdpa 0.06 ms on one thread,
    20 ms on two).
    """


@pytest.fixture(scope="session")
def llama64() -> HFModel:
    """Tiny float64 Llama, V = 64, 2 layers."""
    return tiny_llama(vocab_size=64, seed=0)

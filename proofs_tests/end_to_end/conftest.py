"""Fixtures for the end-to-end audits: the toy models are tiny, so one CPU thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Tiny tensors: intra-op threads only add contention (10x slower on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

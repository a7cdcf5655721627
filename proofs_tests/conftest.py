"""Test-suite wide settings: GPU tests skip without CUDA; hypothesis profiles; the tiny
Llama and the one-thread setting the ``generate`` tests share."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "verispec",
    deadline=None,
    derandomize=True,  # the audits are deterministic: same examples every run
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("VERISPEC_HYPOTHESIS_PROFILE", "verispec"))

# Under pytest-xdist (the test command runs one worker per core), each worker's torch takes
# its share of the cores, so the workers do not oversubscribe them; a test that sets its
# own thread count still does.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _workers))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread on a shared CPU; the setting is restored."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def hf_model() -> Any:
    """A tiny float64 Llama (V = 64, 4 layers, eos 1): exact greedy comparisons. Shared:
    no test may change its weights (build your own model for that)."""
    from verispec.models.tiny import tiny_llama

    return tiny_llama(vocab_size=64, hidden_size=32, num_layers=4, max_length=512).hf_model


@pytest.fixture(scope="session")
def default_model() -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct as ``verispec.load_default_model()`` returns it (the model and
    its tokenizer), loaded once for the whole run: a load takes 20-50 s on 2 cores. Shared:
    no test may change its weights or settings (load your own for that)."""
    from verispec.errors import DefaultModelUnavailableError
    from verispec.models import load_default_model

    try:
        return load_default_model()
    except DefaultModelUnavailableError as error:  # pragma: no cover - packaging issue
        pytest.skip(str(error))

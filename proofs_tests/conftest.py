"""Test-suite wide settings: GPU tests skip without CUDA; hypothesis profiles."""

from __future__ import annotations

import os

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)

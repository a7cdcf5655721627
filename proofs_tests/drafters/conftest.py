"""Fixtures shared by the drafter tests: the tiny Llama and plain greedy references."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module")
def single_thread() -> Iterator[None]:
    """Run small-op workloads on one thread: on a busy 2-core machine, two OpenMP threads
    spin against each other and a tiny-model generation slows down ten-fold."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(single_thread: None):
    """The tiny random Llama (V = 64, float64) of verispec.models.tiny."""
    from verispec.models.tiny import tiny_llama

    return tiny_llama(vocab_size=64, seed=0)


class GreedyReference:
    """Plain greedy continuations computed by full forwards of the Hugging Face model (cached)."""

    def __init__(self, hf_model: torch.nn.Module) -> None:
        self.hf_model = hf_model
        self._cache: dict[tuple[int, ...], list[int]] = {}

    def __call__(self, prompt: list[int], n: int) -> list[int]:
        key = tuple(prompt)
        out = self._cache.get(key, [])
        if len(out) < n:
            ids = torch.tensor([prompt + out])
            with torch.inference_mode():
                while len(out) < n:
                    nxt = int(self.hf_model(ids).logits[0, -1].argmax())
                    out = [*out, nxt]
                    ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
            self._cache[key] = out
        return out[:n]


@pytest.fixture(scope="module")
def greedy_reference(tiny) -> GreedyReference:
    return GreedyReference(tiny.hf_model)

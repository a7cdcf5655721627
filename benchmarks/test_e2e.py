"""End-to-end gates on the embedded model: each method's tokens/s over ``ar``'s, same run.

Every gate runs the method and the ``ar`` baseline alternately (``ar`` untimed by
pytest-benchmark in the setup of each round, timed here; the method timed by
pytest-benchmark), so both see the same machine state, and asserts a *ratio* of
tokens per second, never an absolute time. Greedy decoding, float32, a few
shipped prompts where drafting has something to find (code, summary, retrieval).

Run::

    .venv/bin/python -m pytest benchmarks/test_e2e.py          # CPU gates (slow)
    .venv/bin/python -m pytest benchmarks -m gpu               # GPU gates (need CUDA)

The thresholds are what the methods must keep on a 2-core CPU / an NVIDIA GPU with
SmolLM2-135M; a failure means a regression (or a machine too busy to measure).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from verispec.bench.methods import METHODS
from verispec.bench.prompts import build_prompt_ids, shipped_questions
from verispec.bench.runner import make_context
from verispec.core.types import GenerationParams
from verispec.specs import parse_method

PROMPT_IDS = (7, 14, 27)  # coding (rewrite a function), summarisation, retrieval
MAX_NEW_TOKENS = 48
ROUNDS = 3

# spec -> (lowest, highest) allowed tokens/s ratio over `ar`; None = unbounded.
CPU_GATES: dict[str, tuple[float | None, float | None]] = {
    "hf": (None, 1.15),  # verispec's loop costs at most ~15% over transformers' generate
    "tr:template=16": (1.15, None),
    "tr:template=32": (1.10, None),
    "pld": (1.00, None),
    "dtr": (1.15, None),
    "hf-pld": (None, None),  # the peer, recorded for comparison
}
GPU_GATES: dict[str, tuple[float | None, float | None]] = {
    "hf": (None, 1.20),
    "tr": (1.30, None),
    "tr:template=32": (1.20, None),
    "pld": (1.00, None),
    "dtr": (1.30, None),
    "hf-pld": (None, None),
}


class _Workload:
    """The embedded model on one device, the prompts templated, and the `ar` baseline."""

    def __init__(self, device: str) -> None:
        from verispec.models.default import load_default_model

        model, tokenizer = load_default_model(device=device)
        self.context = make_context(model, tokenizer)
        wanted = [q for q in shipped_questions() if q.question_id in PROMPT_IDS]
        self.prompts = [
            build_prompt_ids(tokenizer, [{"role": "user", "content": q.turns[0]}]) for q in wanted
        ]
        self.config = GenerationParams(
            max_new_tokens=MAX_NEW_TOKENS, eos_token_ids=self.context.eos_token_ids
        )
        self.ar = self.runner("ar")
        self.run_all(self.ar)  # warm-up

    def runner(self, spec_text: str) -> Any:
        spec = parse_method(spec_text, METHODS)
        reason = METHODS[spec.name].availability()
        if reason is not None:
            pytest.skip(reason)
        return METHODS[spec.name].build(self.context, spec.params)

    def run_all(self, runner: Any) -> list[Any]:
        """One answer per prompt (:class:`~verispec.bench.runner.TurnResult`)."""
        return [runner.run(ids, self.config) for ids in self.prompts]


def _gate(benchmark: Any, workload: _Workload, spec_text: str, bounds: tuple) -> None:
    runner = workload.runner(spec_text)
    ar_seconds: list[float] = []
    ar_results: list[Any] = []
    method_seconds: list[float] = []

    def timed_method() -> list[Any]:
        start = time.perf_counter()
        out = workload.run_all(runner)
        _sync(workload)
        method_seconds.append(time.perf_counter() - start)
        return out

    def baseline_then_reset() -> None:
        start = time.perf_counter()
        ar_results[:] = workload.run_all(workload.ar)
        _sync(workload)
        ar_seconds.append(time.perf_counter() - start)
        runner.reset()  # every round starts cold, as the benchmark runner does

    runner.reset()
    workload.run_all(runner)  # warm-up, untimed
    outputs = benchmark.pedantic(timed_method, setup=baseline_then_reset, rounds=ROUNDS)
    method_s = statistics.median(method_seconds)
    ar_s = statistics.median(ar_seconds)
    method_rate = sum(len(r.tokens) for r in outputs) / method_s
    ar_rate = sum(len(r.tokens) for r in ar_results) / ar_s
    ratio = method_rate / ar_rate
    mat = sum(r.committed for r in outputs) / sum(r.steps for r in outputs)
    benchmark.extra_info.update(
        tokens_per_s=method_rate,
        ar_tokens_per_s=ar_rate,
        ratio_vs_ar=ratio,
        mean_accepted=mat,
        identical_to_ar=[r.tokens for r in outputs] == [r.tokens for r in ar_results],
    )
    where = (
        f"{spec_text}: {ratio:.2f}x ar ({method_rate:.1f} vs {ar_rate:.1f} tok/s, MAT {mat:.2f})"
    )
    low, high = bounds
    if low is not None:
        assert ratio >= low, f"{where}; gate >= {low}x"
    if high is not None:
        assert ratio <= high, f"{where}; gate <= {high}x"


def _sync(workload: _Workload) -> None:
    if workload.context.device.type == "cuda":
        torch.cuda.synchronize(workload.context.device)


@pytest.fixture(scope="module")
def cpu_workload() -> Iterator[_Workload]:
    yield _Workload("cpu")


@pytest.fixture(scope="module")
def gpu_workload() -> Iterator[_Workload]:
    yield _Workload("cuda")


@pytest.mark.slow
@pytest.mark.parametrize("spec_text", list(CPU_GATES))
def test_cpu_gate(benchmark: Any, cpu_workload: _Workload, spec_text: str) -> None:
    """On the CPU, the method's tokens/s over ar's (same run) stays within its gate."""
    _gate(benchmark, cpu_workload, spec_text, CPU_GATES[spec_text])


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.parametrize("spec_text", list(GPU_GATES))
def test_gpu_gate(benchmark: Any, gpu_workload: _Workload, spec_text: str) -> None:
    """On an NVIDIA GPU, the method's tokens/s over ar's (same run) stays within its gate."""
    _gate(benchmark, gpu_workload, spec_text, GPU_GATES[spec_text])

"""The in-process stages of ``benchmarks/gpu_check.py``: kernel timings, T(n), bench.

Each ``stage_*`` takes the run's ``Check`` (settings: ``dry``, ``device``, ``out``,
``sizes``, ``limit``, ``max_new_tokens``, ``real_model``) and returns ``(status, data)``.
Without the real model the targets are random Llamas of the real shapes: only their
speed means anything.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2_SHAPE = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
    rope_theta=100000.0, max_position_embeddings=8192,
)  # fmt: skip
LLAMA_7B_SHAPE = dict(
    vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=32, tie_word_embeddings=False,
    max_position_embeddings=4096,
)  # fmt: skip
TINY_SHAPE = dict(
    vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
    max_position_embeddings=4096,
)  # fmt: skip
GPU_METHODS = "hf,hf-pld,ar,pld,tr:template=8,tr,dtr,chain,specinfer,dyspec,rsdc,rsds"
DRY_METHODS = "hf,ar,tr:template=8,dtr,chain"
MAT_REPORT = ROOT / "proofs_tests" / "bench" / "data" / "bench_specbench_shard_a.json"


def _median_seconds(fn: Callable[[], Any], device: Any, repeats: int) -> float:
    import statistics

    import torch

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()  # warm-up (compiles)
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def stage_kernels(check: Any) -> tuple[str, dict[str, Any]]:
    """Each kernel against its PyTorch path: outputs compared, median milliseconds."""
    import torch

    from verispec.core.tree import DraftTree, WithoutReplacement
    from verispec.drafters.templates import resolve_template
    from verispec.kernels import ops

    device, dry = check.device, check.dry
    g = torch.Generator().manual_seed(0)
    vocab = 300 if dry else 49152
    rows: list[dict[str, Any]] = []

    def case(name: str, run: Callable[[str], Any], compare: Callable[[Any, Any], float]) -> None:
        triton_out, torch_out = run("triton"), run("torch")
        rows.append(
            {
                "case": name,
                "max_abs_difference": compare(triton_out, torch_out),
                "triton_ms": 1e3 * _median_seconds(lambda: run("triton"), device, 1 if dry else 20),
                "torch_ms": 1e3 * _median_seconds(lambda: run("torch"), device, 1 if dry else 20),
            }
        )

    def diff(a: Any, b: Any) -> float:
        return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0

    shapes = [(9, 3, 4, 16, 64)] if dry else [
        (9, 3, 16, 512, 64), (9, 3, 80, 512, 64), (9, 3, 16, 4096, 64), (9, 3, 128, 4096, 64),
        (32, 32, 64, 2048, 128),
    ]  # fmt: skip
    for heads, kv_heads, n, s, d in shapes:
        dtype = torch.float32 if dry else torch.float16
        q = torch.randn(1, heads, n, d, generator=g).to(device, dtype)
        kp, vp = (torch.randn(1, kv_heads, s, d, generator=g).to(device, dtype) for _ in "kv")
        kt, vt = (torch.randn(1, kv_heads, n, d, generator=g).to(device, dtype) for _ in "kv")
        parents = [-1] + [int(torch.randint(-1, i, (), generator=g)) for i in range(1, n)]
        mask = DraftTree.from_parents([0] * n, parents).ancestor_mask.to(device)
        case(
            f"tree attention H={heads}/{kv_heads} N={n} S={s} D={d} {str(dtype)[6:]}",
            lambda k, a=(q, kp, vp, kt, vt, mask): ops.tree_attention(*a, kernels=k),
            diff,
        )
    template = resolve_template("8" if dry else "2.2.2", 8)
    nodes = template.num_nodes
    tree = DraftTree.from_parents(torch.arange(nodes), template.parents)
    logits = torch.randn(nodes + 1, vocab, generator=g).to(device)
    case("greedy verification", lambda k: ops.greedy_verify(tree, logits, kernels=k),
         lambda a, b: float(a != b))  # fmt: skip
    draft = torch.softmax(torch.randn(vocab, generator=g, dtype=torch.float64), 0)
    wr_tree = DraftTree.from_parents(
        torch.arange(nodes), template.parents, WithoutReplacement(draft)
    )
    probs = torch.softmax(torch.randn(nodes + 1, vocab, generator=g, dtype=torch.float64), -1)
    probs, coins = probs.to(device), torch.rand(nodes + 1, generator=g, dtype=torch.float64)
    case("rejection verification", lambda k: ops.rejection_verify(wr_tree, probs, coins, kernels=k),
         lambda a, b: float(a != b))  # fmt: skip
    adjacency = torch.randint(0, vocab, (vocab, 8), generator=g, dtype=torch.int32).to(device)
    topk = torch.randint(0, vocab, (nodes + 1, 8), generator=g).to(device)
    args = (template.parents, template.slots, template.level_starts)

    def token_recycling(k: str) -> Any:
        rows_ = ops.expand_template(adjacency, 11, *args, kernels=k)
        ops.update_adjacency(adjacency.clone(), rows_.clamp(min=0), topk, kernels=k)
        return rows_

    case("Token Recycling expand + update", token_recycling, diff)
    length, layers = (32, 2) if dry else (4096, 60)
    caches = [torch.randn(1, 3, length, 64, generator=g).half().to(device) for _ in range(layers)]
    source = torch.tensor([length - 10, length - 13, length - 4]).to(device)

    def compaction(k: str) -> Any:
        moved = [c.clone() for c in caches]
        ops.compact_kv(moved, length - 14, source, kernels=k)
        return torch.stack(moved)

    case("KV compaction", compaction, diff)
    for row in rows:
        row["speedup"] = row["torch_ms"] / row["triton_ms"] if row["triton_ms"] else None
    bad = [r["case"] for r in rows if "attention" not in r["case"] and r["max_abs_difference"]]
    bad += [r["case"] for r in rows if "attention" in r["case"] and r["max_abs_difference"] > 4e-3]
    return ("ok" if not bad else "failed"), {"rows": rows, "mismatches": bad}


def build_llama(shape: dict[str, Any], dtype: Any, device: Any, seed: int = 0) -> Any:
    """A randomly initialised Llama of ``shape``, built on ``device`` in ``dtype``, in HFModel."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from verispec.models.hf import HFModel

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(LlamaConfig(**shape, attn_implementation="sdpa"))
    finally:
        torch.set_default_dtype(previous)
    generator = torch.Generator(device=device).manual_seed(seed)  # on the device: fast at 7B
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02, generator=generator)
    model.generation_config.eos_token_id = None
    return HFModel(model.eval())


def _target(check: Any, dtype: Any) -> tuple[Any, Any, str]:
    """(model, tokenizer, what): the real SmolLM2 if installed and loadable, else random."""
    from verispec.models.tiny import ByteTokenizer

    if check.dry:
        return build_llama(TINY_SHAPE, dtype, check.device), ByteTokenizer(), "tiny random Llama"
    if check.real_model:
        try:
            from verispec.models.default import load_default_model

            model, tokenizer = load_default_model(dtype=dtype, device=check.device)
            return model, tokenizer, "SmolLM2-135M-Instruct (real weights)"
        except Exception as exc:  # a missing converter dependency: fall back, say so
            print(f"[gpu_check] real model not loadable ({exc}); random weights", file=sys.stderr)
    model = build_llama(SMOLLM2_SHAPE, dtype, check.device)
    return model, ByteTokenizer(), "SmolLM2-shaped random Llama (speed only)"


def _latency(check: Any, model: Any) -> dict[str, Any]:
    """T(n) of the HF adapter (sdpa and the Triton tree attention) and of the fast runtime
    (CUDA graphs on a GPU), all over the same transformers model."""
    from verispec.drafters.budget import measure_latency
    from verispec.kernels.hf_attention import tree_attention_where_supported
    from verispec.models import FastModel, HFModel

    repeats, warmup = (1, 0) if check.dry else (5, 2)
    context = min(512, model.max_length // 4)
    adapter = HFModel(model.hf_model)
    tables = {}
    for attention in ("sdpa", "triton"):
        if attention == "triton" and check.dry:
            continue  # the interpreter's timings mean nothing
        kernels = "torch" if attention == "sdpa" else "triton"
        with tree_attention_where_supported(adapter.hf_model, kernels=kernels):
            table = measure_latency(
                adapter, check.sizes, context=context, repeats=repeats, warmup=warmup
            )
        tables[f"adapter-{attention}"] = [1e3 * s for s in table.seconds]
    runtime = FastModel(model.hf_model, max_length=min(model.max_length, 4096))
    setup_s = runtime.warm_up()  # captures the CUDA graphs (eager on CPU)
    table = measure_latency(runtime, check.sizes, context=context, repeats=repeats, warmup=warmup)
    tables[f"runtime-{runtime.runtime}"] = [1e3 * s for s in table.seconds]
    return {"n": check.sizes, "ms": tables, "runtime_setup_s": round(setup_s, 1)}


def stage_latency(check: Any) -> tuple[str, dict[str, Any]]:
    import torch

    dtype = torch.float32 if check.dry else torch.float16
    model, _, what = _target(check, dtype)
    return "ok", {"model": what, "dtype": str(dtype)[6:], **_latency(check, model)}


def stage_latency_7b(check: Any) -> tuple[str, dict[str, Any]]:
    import torch

    shape = TINY_SHAPE if check.dry else LLAMA_7B_SHAPE
    model = build_llama(shape, torch.bfloat16, check.device)
    try:
        return "ok", {"model": "Llama-2-7B-shaped random", "dtype": "bfloat16",
                      **_latency(check, model)}  # fmt: skip
    finally:
        del model
        if check.device.type == "cuda":
            torch.cuda.empty_cache()


def _mat_from_cpu() -> dict[str, float]:
    if not MAT_REPORT.exists():
        return {}
    methods = json.loads(MAT_REPORT.read_text())["methods"]
    return {label: float(m["mean_accepted"]) for label, m in methods.items()}


def _bench_run(
    check: Any, model: Any, tokenizer: Any, methods: str, kernels: str, chat: bool
) -> Any:
    from verispec.bench.loop import run_bench
    from verispec.bench.methods import METHODS
    from verispec.bench.prompts import select_questions, shipped_questions
    from verispec.bench.report import summarise
    from verispec.bench.runner import BenchConfig, make_context
    from verispec.kernels.backend import use_backend
    from verispec.specs import parse_methods

    questions = select_questions(shipped_questions(), limit=check.limit, max_turns=1)
    config = BenchConfig(max_new_tokens=check.max_new_tokens, warmup=1, chat=chat)
    with use_backend(kernels):
        run = run_bench(make_context(model, tokenizer), parse_methods(methods, METHODS),
                        questions, config, progress=False)  # fmt: skip
    return summarise(run), run.records


def _answers(records: Any) -> dict[str, dict[tuple[str, int], list[int]]]:
    """Each method's answers by (question id, turn)."""
    answers: dict[str, dict[tuple[str, int], list[int]]] = {}
    for r in records:
        answers.setdefault(r.method, {})[(str(r.question_id), r.turn)] = list(r.result.tokens)
    return answers


def _against(mine: dict[Any, list[int]], reference: dict[Any, list[int]]) -> dict[str, Any]:
    """How many of ``mine`` equal the reference's answer to the same question, and where
    the others first differ (token index)."""
    same, differ = 0, []
    for key, tokens in mine.items():
        expected = reference.get(key)
        if expected is None:
            continue
        if tokens == expected:
            same += 1
            continue
        pairs = enumerate(zip(tokens, expected, strict=False))
        first = next((i for i, (a, b) in pairs if a != b), min(len(tokens), len(expected)))
        differ.append({"question_id": key[0], "turn": key[1], "first_diff": first})
    return {"identical": same, "compared": same + len(differ), "differ": differ}


def stage_bench(check: Any) -> tuple[str, dict[str, Any]]:
    import torch

    from verispec.bench.records import machine_info, write_json, write_text
    from verispec.bench.report import render_markdown, to_json

    cpu_mat = _mat_from_cpu()
    data: dict[str, Any] = {"mat_source": str(MAT_REPORT.relative_to(ROOT)), "runs": {}}
    dtypes = (torch.float32,) if check.dry else (torch.float16, torch.bfloat16)
    for dtype in dtypes:
        name = str(dtype)[6:]
        model, tokenizer, what = _target(check, dtype)
        chat = "real" in what  # the byte tokenizer of the random models has no chat template
        runs = {
            "kernels on": _bench_run(check, model, tokenizer, check.methods, "auto", chat),
            "kernels off": _bench_run(check, model, tokenizer, "ar,tr:template=8", "torch", chat),
        }
        # every answer against ar's in the same run, and ar against itself across the switch
        answers = {label: _answers(records) for label, (_, records) in runs.items()}
        ar_on = answers["kernels on"].get("ar", {})
        for label, (report, _) in runs.items():
            stem = f"bench_{name}_{label.replace(' ', '_')}"
            machine = machine_info(check.device, name)
            command = f"gpu_check bench {name} {label} ({what})"
            write_json(check.out / f"{stem}.json", to_json(report, machine, command))
            write_text(check.out / f"{stem}.md", render_markdown(report, machine, command))
            methods = {}
            for method, fig in report.methods.items():
                row = {
                    "tokens_per_s": fig.tokens_per_s,
                    "mean_accepted": fig.mean_accepted,
                    "speedup_vs_hf": fig.speedup_vs_hf,
                    "speedup_vs_ar": fig.speedup_vs_ar,
                    "identical": fig.identical,
                    "steps_per_s": fig.steps / fig.seconds if fig.seconds else None,
                    "nodes_per_step": fig.mean_tree_size,
                    "vs_ar": _against(answers[label][method], answers[label].get("ar", {})),
                }
                if label != "kernels on":
                    row["vs_ar_kernels_on"] = _against(answers[label][method], ar_on)
                if "random" in what and method in cpu_mat and row["steps_per_s"]:
                    row["estimated_tokens_per_s"] = cpu_mat[method] * row["steps_per_s"]
                methods[method] = row
            data["runs"][f"{name} {label}"] = {"model": what, "methods": methods}
        data.setdefault("latency_tables", {})[name] = _keep_latency_table(check, model, name)
        del model
    return "ok", data


def _keep_latency_table(check: Any, model: Any, name: str) -> str | None:
    """Copy the latency table the device-sized methods used with ``model`` (the budget
    rule's T(n), cached by :func:`~verispec.drafters.budget.latency_for`) into OUTDIR as
    ``latency_<dtype>.json``, so that how they sized their trees can be read after the
    machine is gone; ``None`` if none was measured."""
    import shutil

    from verispec.drafters.budget import latency_path

    table = latency_path(model)
    if not table.is_file():
        return None
    shutil.copyfile(table, check.out / f"latency_{name}.json")
    return f"latency_{name}.json"


# -- the step: T(n) per runtime configuration, row invariance, a profile --------------

STEP_SIZES = (0, 1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 127, 128, 160, 200, 255)
STEP_CONFIGS: dict[str, dict[str, Any]] = {
    "graphs": {"attention": "torch"},
    "graphs+triton-attention": {"attention": "triton"},
    "compiled+graphs+triton-attention": {"compile": True, "attention": "triton"},
    "invariant": {"batch_invariant": True},
    "compiled+invariant": {"compile": True, "batch_invariant": True},
}
STEP_SMOLLM2 = ("graphs", "graphs+triton-attention", "compiled+graphs+triton-attention",
                "invariant")  # fmt: skip
"""The runtime configurations the ``step`` and ``e2e`` stages compare (FastModel options):
CUDA graphs of the eager forward with the torch attention over the whole cache (the
default until 2026-11-28), the Triton
static attention (the used slots only), the forward compiled by inductor before capture,
and the batch-invariant products, norms and attention, without and with compiling."""
STEP_7B = ("graphs", "graphs+triton-attention", "invariant")  # compiling 7B costs too long


def _root_rows_equal(model: Any, sizes: list[int], context: int) -> dict[str, Any]:
    """Whether the root row of a pass over ``n`` tree nodes has the bits of the root row of a
    pass over the root alone, for every ``n`` in ``sizes`` (the same committed context):
    what tree rows equal to sequential rows needs. Returns the sizes where it fails and the
    largest difference."""
    import torch

    from verispec.core.tree import DraftTree

    generator = torch.Generator().manual_seed(1)
    model.prefill(torch.randint(model.vocab_size, (context,), generator=generator))
    try:
        alone = model.forward_tree(DraftTree.empty())[0].clone()
        differ, largest = [], 0.0
        for n in sizes:
            if n == 0:
                continue
            tokens = torch.randint(model.vocab_size, (n,), generator=generator)
            parents = [i - 1 if i % 4 else -1 for i in range(n)]  # chains of four off the root
            row = model.forward_tree(DraftTree.from_parents(tokens, parents))[0]
            if not torch.equal(row, alone):
                differ.append(n)
                largest = max(largest, float((row.double() - alone.double()).abs().max()))
    finally:
        model.reset()
    return {"sizes_differing": differ, "checked": len([n for n in sizes if n]),
            "max_abs_difference": largest}  # fmt: skip


def _profile_step(model: Any, nodes: int, out: Path, label: str) -> dict[str, Any]:
    """torch.profiler over 10 steps of ``nodes`` tree nodes after a 256-token context: CUDA
    kernels and their time per step, the host's wall time per step; the table of the
    costliest kernels goes to ``profile_<label>_<nodes>.txt``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from verispec.core.tree import DraftTree

    generator = torch.Generator().manual_seed(2)
    model.prefill(torch.randint(model.vocab_size, (256,), generator=generator))
    tokens = torch.randint(model.vocab_size, (nodes,), generator=generator)
    tree = DraftTree.from_parents(tokens, [i - 1 if i % 4 else -1 for i in range(nodes)])
    steps = 10
    try:
        for _ in range(3):
            model.forward_tree(tree)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            for _ in range(steps):
                model.forward_tree(tree)
            torch.cuda.synchronize()
            wall = (time.perf_counter() - start) / steps
    finally:
        model.reset()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    (out / f"profile_{label}_{nodes}.txt").write_text(table)
    gpu_us = sum(e.device_time for e in kernels)  # self time on the device, microseconds
    return {
        "nodes": nodes,
        "wall_ms_per_step": 1e3 * wall,
        "kernels_per_step": len(kernels) / steps,
        "gpu_busy_ms_per_step": gpu_us / 1e3 / steps,
    }


def _step_model(check: Any, dtype: Any, shape: dict[str, Any] | None) -> tuple[Any, str]:
    """(transformers model, what): the real SmolLM2 (``shape`` None) where installed, else a
    random Llama of ``shape`` (SmolLM2's when ``shape`` is None)."""
    if shape is None:
        model, _, what = _target(check, dtype)
        return model.hf_model, what
    return build_llama(TINY_SHAPE if check.dry else shape, dtype, check.device).hf_model, (
        "Llama-2-7B-shaped random"
    )


def _step_case(check: Any, hf: Any, what: str, dtype: Any, configs: list[str],
               profile_label: str | None) -> dict[str, Any]:  # fmt: skip
    import torch

    from verispec.drafters.budget import measure_latency
    from verispec.models import FastModel

    sizes = [n for n in STEP_SIZES if n <= (8 if check.dry else 255)]
    repeats, warmup = (1, 0) if check.dry else (7, 2)
    result: dict[str, Any] = {"model": what, "dtype": str(dtype)[6:], "n": sizes, "configs": {}}
    for name in configs:
        options = dict(STEP_CONFIGS[name])
        if check.dry:
            options["compile"] = False  # inductor's CPU compile is the test suite's business
        row: dict[str, Any] = {}
        try:
            start = time.perf_counter()
            model = FastModel(hf, max_length=2048, keep_source=True, **options)
            row["setup_s"] = round(model.warm_up() + time.perf_counter() - start, 1)
            row["runtime"] = model.runtime
            table = measure_latency(model, sizes, context=512, repeats=repeats, warmup=warmup)
            row["ms"] = [round(1e3 * s, 3) for s in table.seconds]
            row["root_rows"] = _root_rows_equal(model, sizes, 300)
            if profile_label and check.device.type == "cuda":
                row["profile"] = [
                    _profile_step(model, n, check.out, f"{profile_label}_{name}") for n in (0, 80)
                ]
            del model
        except Exception as exc:  # one configuration failing must not stop the others
            row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        result["configs"][name] = row
        if check.device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"[gpu_check] step {what} {name}: {row.get('ms', row.get('error'))}",
              file=sys.stderr, flush=True)  # fmt: skip
    return result


def stage_step(check: Any) -> tuple[str, dict[str, Any]]:
    """T(n) for n up to 255 of each runtime configuration (:data:`STEP_CONFIGS`), whether a
    tree pass's root row has the bits of a one-token pass's, and a profile of one step
    before and after: SmolLM2 in float16, and a random 7B-shaped Llama in bfloat16 (graphs
    and invariant only: compiling it costs more than the device time)."""
    import torch

    cases = []
    half = torch.float32 if check.dry else torch.float16
    hf, what = _step_model(check, half, None)
    # The dry run times the default only: the Triton configurations run in the interpreter
    # there, minutes a table; proofs_tests/kernels/test_graph_ops.py checks them on the CPU.
    smollm2 = ["graphs"] if check.dry else list(STEP_SMOLLM2)
    cases.append(_step_case(check, hf, what, half, smollm2, "smollm2"))
    del hf
    wide = half if check.dry else torch.bfloat16
    hf, what = _step_model(check, wide, LLAMA_7B_SHAPE)
    cases.append(
        _step_case(check, hf, what, wide, ["graphs"] if check.dry else list(STEP_7B), None)
    )
    del hf
    if check.device.type == "cuda":
        torch.cuda.empty_cache()
    failed = [c["configs"][n] for c in cases for n in c["configs"] if "error" in c["configs"][n]]
    return ("ok" if len(failed) < sum(len(c["configs"]) for c in cases) else "failed"), {
        "cases": cases
    }


E2E_METHODS = "ar,pld,tr,tr:template=80,dtr"
E2E_RUNS = (
    ("float16", "graphs", True),
    ("float16", "compiled+graphs+triton-attention", True),
    ("bfloat16", "invariant", True),
    ("float16", "compiled+graphs+triton-attention", False),
)
"""(dtype, configuration, whether the engine synchronises at every phase boundary)."""


def _phases(records: Any) -> dict[str, float]:
    """Mean milliseconds a step spends drafting, in the target (forwards, KV commits and the
    prefill) and verifying, by the engine's own clocks (:class:`~verispec.bench.runner.TurnResult`),
    and the whole answer's time a step, over these answers."""
    records = list(records)
    steps = sum(r.result.steps for r in records)
    if not steps:
        return {}
    parts = {
        part: 1e3 * sum(getattr(r.result, f"{part}_s") or 0.0 for r in records) / steps
        for part in ("draft", "target", "verify", "prefill")
    }
    parts["whole"] = 1e3 * sum(r.result.seconds for r in records) / steps
    return {k: round(v, 3) for k, v in parts.items()}


def stage_e2e(check: Any) -> tuple[str, dict[str, Any]]:
    """``ar``, ``pld``, ``tr`` (default and the 80-node template) and ``dtr`` end to end in
    each runtime configuration of :data:`E2E_RUNS`: tokens/s, MAT, nodes a step and every
    answer against ``ar``'s in the same run (in bfloat16 with the batch-invariant kernels
    every answer must equal ``ar``'s); each configuration's latency table is kept."""
    import torch

    from verispec.core.engine import PHASE_SYNC_ENV
    from verispec.models import FastModel

    data: dict[str, Any] = {"runs": {}}
    methods = "ar,tr:template=8,dtr" if check.dry else (check.e2e_methods or E2E_METHODS)
    runs = [("float32", "graphs", True), ("float32", "graphs", False)] if check.dry else (
        E2E_RUNS
    )  # fmt: skip
    loaded: dict[str, tuple[Any, Any, str]] = {}
    for dtype_name, config, phase_sync in runs:
        dtype = getattr(torch, dtype_name)
        if dtype_name not in loaded:
            loaded.clear()
            loaded[dtype_name] = _target(check, dtype)
        source, tokenizer, what = loaded[dtype_name]
        chat = "real" in what
        label = f"{dtype_name} {config}" + ("" if phase_sync else " no-phase-sync")
        os.environ[PHASE_SYNC_ENV] = "1" if phase_sync else "0"  # read when a decoder is built
        try:
            options = dict(STEP_CONFIGS[config])
            if check.dry:
                options["compile"] = False
            start = time.perf_counter()
            model = FastModel(source.hf_model, keep_source=True, **options)
            setup = model.warm_up() + time.perf_counter() - start
            report, records = _bench_run(check, model, tokenizer, methods, "auto", chat)
            answers = _answers(records)
            rows = {}
            for method, fig in report.methods.items():
                rows[method] = {
                    "tokens_per_s": fig.tokens_per_s,
                    "mean_accepted": fig.mean_accepted,
                    "speedup_vs_ar": fig.speedup_vs_ar,
                    "nodes_per_step": fig.mean_tree_size,
                    "vs_ar": _against(answers[method], answers.get("ar", {})),
                    "ms_per_step": _phases(r for r in records if r.method == method),
                }
            table = _keep_latency_table(check, model, label.replace(" ", "_"))
            data["runs"][label] = {"model": what, "runtime": model.runtime,
                                   "setup_s": round(setup, 1), "methods": rows,
                                   "latency_table": table}  # fmt: skip
            del model
        except Exception as exc:
            data["runs"][label] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        finally:
            os.environ.pop(PHASE_SYNC_ENV, None)
        if check.device.type == "cuda":
            torch.cuda.empty_cache()
        row = data["runs"][label]
        brief = row.get("error") or {
            m: round(r["tokens_per_s"], 1) for m, r in row["methods"].items()
        }
        print(f"[gpu_check] e2e {label}: {brief}", file=sys.stderr, flush=True)
    bad = [k for k, r in data["runs"].items() if "error" in r]
    return ("ok" if not bad else "failed"), data

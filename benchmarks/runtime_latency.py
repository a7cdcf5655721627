"""Where the target's time goes: T(n) of the fast runtime against the HF adapter, on this CPU.

Run from the repository root (after ``bash scripts/bench.sh --help`` or the test command has
set up ``.venv``)::

    .venv/bin/python benchmarks/runtime_latency.py --out results/runtime
    .venv/bin/python benchmarks/runtime_latency.py --out results/runtime --quick   # minutes

It writes ``latency.json`` and ``latency.md`` (and ``steps.png``) into ``--out``:

* **T(n)**: the median latency of one target step over ``n`` new tokens (the root and
  ``n - 1`` tree nodes; ``n = 1`` is a plain decoding step) after a ``--context``-token
  prompt, for the HF adapter and the runtime, float32 and bfloat16 (where the CPU
  multiplies it natively), at each thread count of ``--threads``; measured by
  :func:`verispec.drafters.budget.measure_latency`, so every step builds a fresh tree.
* **memory bound**: a forward over one token streams every weight once; the bytes it must
  read (weights, plus the KV cache of the context) over the measured read bandwidth of
  this machine (a sum over a 1 GiB tensor at the same thread count) is the least T(1)
  can be; the table gives T(1)'s share of that bound.
* **per-step time over a long generation**: ``--steps`` plain decoding steps after a
  short prompt, on the runtime and the adapter, each step timed: the runtime's step time
  should stay flat apart from attention's growth with the context (no cache copy).
* with ``--compile``, the same for the runtime compiled per bucket (every bucket
  compiled before the measurement; the compile time is reported beside the table).
* **peak memory**: the peak resident set (``VmHWM``) of a fresh process while it loads
  the model, then while it decodes ``--steps`` tokens (the peak reset after loading), for
  each target, and for the runtime with ``keep_source=False`` (``fast-lean``).

The CPU's instruction-set flags and torch's version go into the report with every figure.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from verispec.bench.commands.flags import add_threads_option
from verispec.bench.records import machine_info, write_json, write_text
from verispec.core.tree import DraftTree
from verispec.drafters.budget import measure_latency
from verispec.kernels.cpu.features import bf16_supported
from verispec.models.default import load_default_model
from verispec.models.hf import HFModel

SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)  # new tokens per forward
QUICK_SIZES = (1, 2, 8, 16, 32)


def read_bandwidth(threads: int) -> float:
    """GB/s of a sum over a 1 GiB float32 tensor on ``threads`` threads (median of 5)."""
    torch.set_num_threads(threads)
    data = torch.ones(1 << 28)
    data.sum()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - start)
    return data.numel() * 4 / statistics.median(times) / 1e9


def streamed_bytes(model: Any, context: int) -> int:
    """Bytes one single-token forward must read: the weights it multiplies by and the cache."""
    config = model.config
    itemsize = torch.finfo(model.dtype).bits // 8
    hidden, inner, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    per_layer = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
    per_layer += 3 * hidden * inner
    weights = (layers * per_layer + config.vocab_size * hidden) * itemsize
    cache_itemsize = 4 if model.dtype in (torch.bfloat16, torch.float16) else itemsize
    if isinstance(model, HFModel):
        cache_itemsize = itemsize
    cache = 2 * layers * kv_heads * head_dim * context * cache_itemsize
    return weights + cache


def latency_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    dtypes = [torch.float32, *([torch.bfloat16] if bf16_supported() else [])]
    sizes = QUICK_SIZES if args.quick else SIZES
    for threads in args.threads:
        bandwidth = read_bandwidth(threads)
        for dtype in dtypes:
            for runtime in ("hf", "fast", *(["compiled"] if args.compile else [])):
                torch.set_num_threads(threads)
                compiled = runtime == "compiled"
                model, _ = load_default_model(
                    dtype=dtype, runtime="fast" if compiled else runtime, compile=compiled
                )
                compile_s = model.warm_up() if compiled else None  # every bucket, untimed
                table = measure_latency(
                    model,
                    [n - 1 for n in sizes],
                    context=args.context,
                    repeats=args.repeats,
                    warmup=2,
                )
                tokens = [size + 1 for size in table.sizes]
                ms = {n: 1e3 * t for n, t in zip(tokens, table.seconds, strict=True)}
                bound_ms = 1e3 * streamed_bytes(model, args.context) / (bandwidth * 1e9)
                rows.append(
                    {
                        "target": "HF adapter (sdpa)"
                        if runtime == "hf"
                        else "runtime (" + model.runtime + ")",
                        "runtime": runtime,
                        "dtype": str(dtype).replace("torch.", ""),
                        "threads": threads,
                        "bandwidth_gb_s": round(bandwidth, 1),
                        "bound_ms": round(bound_ms, 2),
                        "ms": {str(n): round(ms[n], 2) for n in sizes},
                        **({"compile_s": round(compile_s, 1)} if compiled else {}),
                    }
                )
                print(json.dumps(rows[-1]), file=sys.stderr)
                del model
    return rows


def step_times(
    runtime: str,
    dtype: torch.dtype,
    steps: int,
    threads: int,
    *,
    keep_source: bool = True,
    after_load: Any = None,
) -> list[float]:
    """Milliseconds of each of ``steps`` plain decoding steps after an 8-token prompt;
    ``after_load()`` is called once the model is loaded."""
    torch.set_num_threads(threads)
    model, _ = load_default_model(
        dtype=dtype, runtime=runtime, max_length=steps + 64, keep_source=keep_source
    )
    gc.collect()
    if after_load is not None:
        after_load()
    generator = torch.Generator().manual_seed(0)
    model.prefill(torch.randint(model.vocab_size, (8,), generator=generator))
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        logits = model.forward_tree(DraftTree.empty())
        model.commit([], int(logits[0].argmax()))
        times.append(1e3 * (time.perf_counter() - start))
    return times


def _peak_mib(reset: bool = False) -> float:
    """This process's peak resident set (``VmHWM``, MiB); ``reset``: then restart it."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM"))
    if reset:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    return int(line.split()[1]) / 1024


def peak_memory_mib(target: str, dtype: str, steps: int) -> tuple[float, float]:
    """Peak resident set (MiB) of a fresh process that loads the model (``target``: ``hf``,
    ``fast``, or ``fast-lean``, the runtime with ``keep_source=False``), and its peak while
    it then decodes ``steps`` tokens."""
    runtime, keep = target.removesuffix("-lean"), not target.endswith("-lean")
    code = (
        "import torch, sys; sys.path.insert(0, 'benchmarks');"
        "from runtime_latency import step_times, _peak_mib;"
        f"step_times({runtime!r}, torch.{dtype}, {steps}, 1, keep_source={keep},"
        " after_load=lambda: print(_peak_mib(reset=True)));"
        "print(_peak_mib())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    return float(out[-2]), float(out[-1])


def render(report: dict[str, Any]) -> str:
    lines = ["# Fast runtime: T(n) on this CPU", ""]
    machine = report["machine"]
    lines += [
        f"CPU: {machine['cpu']} ({machine['cpu_flags']}); torch {machine['torch']}; "
        f"context {report['context']} tokens; T(n) = median ms of one step over n new tokens.",
        "",
    ]
    sizes = list(report["latency"][0]["ms"])
    head = "| target | dtype | threads | " + " | ".join(f"T({n})" for n in sizes)
    head += f" | T({sizes[-2]})/T(1) | bound ms | T(1) share of bound |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for row in report["latency"]:
        ms = row["ms"]
        ratio = ms[sizes[-2]] / ms["1"]
        share = row["bound_ms"] / ms["1"]
        lines.append(
            f"| {row['target']} | {row['dtype']} | {row['threads']} | "
            + " | ".join(f"{ms[n]:.1f}" for n in sizes)
            + f" | {ratio:.2f} | {row['bound_ms']:.1f} | {100 * share:.0f} % |"
        )
    compiles = [r for r in report["latency"] if "compile_s" in r]
    if compiles:
        lines += [""] + [
            f"Compiling every bucket took {r['compile_s']:.0f} s ({r['dtype']}, "
            f"{r['threads']} thread(s)); not part of any T(n)."
            for r in compiles
        ]
    lines += ["", "Read bandwidth (sum over 1 GiB): "]
    seen = {}
    for row in report["latency"]:
        seen[row["threads"]] = row["bandwidth_gb_s"]
    lines[-1] += ", ".join(f"{b} GB/s at {t} thread(s)" for t, b in seen.items())
    if "steps" in report:
        lines += ["", f"## Per-step time over {report['steps_count']} decoding steps (ms)", ""]
        lines += [
            "| target | dtype | steps 1-64 | steps 449-512 | last 64 | max |",
            "|---|---|---|---|---|---|",
        ]
        for key, times in report["steps"].items():
            runtime, dtype = key.split("/")
            mid = times[448:512] if len(times) >= 512 else times[len(times) // 2 :][:64]
            lines.append(
                f"| {runtime} | {dtype} | {statistics.median(times[:64]):.1f} | "
                f"{statistics.median(mid):.1f} | {statistics.median(times[-64:]):.1f} | "
                f"{max(times):.1f} |"
            )
    if "peak_mib" in report:
        lines += ["", "## Peak resident memory (MiB): loading, then decoding", ""]
        lines += ["| target | dtype | load | decode |", "|---|---|---|---|"]
        for key, (load, decode) in report["peak_mib"].items():
            runtime, dtype = key.split("/")
            lines.append(f"| {runtime} | {dtype} | {load:.0f} | {decode:.0f} |")
    return "\n".join(lines) + "\n"


def save_step_plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for key, times in report["steps"].items():
        ax.plot(range(1, len(times) + 1), times, label=key, linewidth=0.8)
    ax.set_xlabel("decoding step (context = 8 + step tokens)")
    ax.set_ylabel("ms per step")
    ax.set_title(f"Per-step time over {report['steps_count']} tokens, 1 thread")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/runtime"))
    add_threads_option(parser, counts=True)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=1024)
    parser.add_argument("--quick", action="store_true", help="fewer sizes, 256 steps, no memory")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="add the compiled runtime's T(n) (every bucket compiled first, time reported)",
    )
    args = parser.parse_args()
    if args.quick:
        args.steps, args.repeats = min(args.steps, 256), 3
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "machine": machine_info("cpu"),
        "context": args.context,
        "command": " ".join(sys.argv),
        "latency": latency_rows(args),
        "steps_count": args.steps,
        "steps": {},
    }
    dtypes = ["float32", *(["bfloat16"] if bf16_supported() else [])]
    for runtime in ("hf", "fast"):
        for dtype in dtypes:
            report["steps"][f"{runtime}/{dtype}"] = step_times(
                runtime, getattr(torch, dtype), args.steps, 1
            )
    if not args.quick:
        report["peak_mib"] = {
            f"{target}/{dtype}": peak_memory_mib(target, dtype, args.steps)
            for target in ("hf", "fast", "fast-lean")
            for dtype in dtypes
        }
    write_json(args.out / "latency.json", report)
    write_text(args.out / "latency.md", render(report))
    save_step_plot(report, args.out / "steps.png")
    print(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

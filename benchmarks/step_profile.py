"""Where one target step's time goes on this CPU: products, LM head, attention, small ops, Python.

Run from the repository root::

    .venv/bin/python benchmarks/step_profile.py --threads 1,2 --sizes 1,16 --weights auto,dense

For each thread count, weight layout (:class:`~verispec.models.FastModel`'s ``weights``) and
step size n (the root plus n - 1 tree nodes, after a ``--context``-token prompt), it times
``--repeats`` steps and splits each into

* **C layers**: where the decoder layers run as one C call
  (:meth:`verispec.models.accelerators.c_layers.LayerKernel.forward`), that call, timed around it:
  the embedding and rotary rows, the layers' products, attention and small operators and
  the final norm together, and in a one-token step (n = 1) the LM head too (the columns
  below then hold the rest of the step only);
* **products**: the decoder layers' weight products (timed around each call);
* **LM head**: the output product over the rows verification reads;
* **attention**: :func:`verispec.models.attention.attend` or, where it runs, the C attention
  :func:`verispec.models.accelerators.c_attention.attend_cpu` (cache write, scores, mask, softmax,
  value product), timed around each call;
* **small ops**: every other torch operator (norms, rotary, residuals, SwiGLU, casts,
  embedding), the self time torch's profiler gives them;
* **Python and dispatch**: the rest of the step's wall time.

Each class is also given as a share of its roofline: the bytes it must read (weights in
their layout) over the read bandwidth measured here, and for products its floating-point
operations over the core's fused multiply-add peak (``--peak-gflops``; default: 32 float32
flops a cycle, AVX2's two FMA units, times the clock ``/proc/cpuinfo`` reports, per thread).
Prints a Markdown table, with the CPU's flags.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections import defaultdict
from typing import Any

import torch
from runtime_latency import read_bandwidth  # beside this script

from verispec.bench.commands.flags import add_threads_option
from verispec.bench.records import machine_info
from verispec.drafters.budget import _chain_like_tree
from verispec.kernels.cpu.features import cpu_features
from verispec.models.accelerators.blocks import BlockLinear
from verispec.models.accelerators.onednn import PackedLinear
from verispec.models.default import load_default_model
from verispec.models.llama import PassKind
from verispec.models.runtime import FastModel


def _clock_ghz() -> float:
    try:
        with open("/proc/cpuinfo") as info:
            return (
                max(float(line.split(":")[1]) for line in info if line.startswith("cpu MHz")) / 1e3
            )
    except (OSError, ValueError):
        return 3.0


def _weight_bytes(module: Any) -> int:
    if isinstance(module, BlockLinear):
        return module.blocks.numel() * module.blocks.element_size()
    if isinstance(module, PackedLinear):
        return module.in_features * module.out_features * torch.finfo(module.weight_dtype).bits // 8
    return module.weight.numel() * module.weight.element_size()


def profile_step(model: FastModel, n: int, context: int, repeats: int) -> dict[str, float]:
    """Mean milliseconds per class over ``repeats`` steps of ``n`` new tokens; the small
    ops' self time comes from a second, profiled pass."""
    spent: dict[str, float] = defaultdict(float)
    head = model.transformer.output
    linears = [m for m in model.transformer.modules() if isinstance(m, BlockLinear | PackedLinear)]
    # the product itself: a block product's ``eager`` (its ``forward`` calls it, and the
    # LM head of a tree pass is called there directly), a packed one's ``forward``
    entry = {id(m): "eager" if isinstance(m, BlockLinear) else "forward" for m in linears}
    originals = {id(m): getattr(m, entry[id(m)]) for m in linears}

    def timed(module: Any, label: str) -> Any:
        forward = getattr(module, entry[id(module)])

        def run(x: torch.Tensor) -> torch.Tensor:
            start = time.perf_counter()
            out = forward(x)
            spent[label] += time.perf_counter() - start
            return out

        return run

    for module in linears:
        setattr(
            module, entry[id(module)], timed(module, "LM head" if module is head else "products")
        )
    cores = [block.attention.cores for block in model.transformer.blocks]
    tree_cores = [c[PassKind.TREE] for c in cores]  # the torch operators or the C call

    def timed_attention(function: Any) -> Any:
        def run(*args: torch.Tensor) -> torch.Tensor:
            start = time.perf_counter()
            with torch.profiler.record_function("verispec::attention"):
                out = function(*args)
            spent["attention"] += time.perf_counter() - start
            return out

        return run

    for core, function in zip(cores, tree_cores, strict=True):
        core[PassKind.TREE] = timed_attention(function)
    layers = model._shared.layers  # every layer in one C call, where it runs

    def timed_layers(function: Any) -> Any:  # its one C call a pass or step timed
        def run(*args: Any, **kwargs: Any) -> torch.Tensor:
            start = time.perf_counter()
            out = function(*args, **kwargs)
            spent["C layers"] += time.perf_counter() - start
            return out

        return run

    if layers is not None:
        layers.forward = timed_layers(layers.tree_pass)
        layers.decode_step = timed_layers(layers.decode_step)  # type: ignore[method-assign]
    generator = torch.Generator().manual_seed(0)
    try:
        model.prefill(torch.randint(model.vocab_size, (context,), generator=generator))
        for _ in range(2):
            model.forward_tree(_chain_like_tree(n - 1, generator, model.vocab_size))
        spent.clear()
        start = time.perf_counter()
        for _ in range(repeats):
            model.forward_tree(_chain_like_tree(n - 1, generator, model.vocab_size))
        wall = time.perf_counter() - start
        timed_classes = dict(spent)
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:  # a separate pass: its
            for _ in range(repeats):  # overhead would inflate the wall time above
                model.forward_tree(_chain_like_tree(n - 1, generator, model.vocab_size))
        # Every operator's own time but the products' and the attention's (timed apart).
        events = {e.key: e for e in prof.key_averages()}
        small = sum(
            e.self_cpu_time_total
            for key, e in events.items()
            if key not in ("verispec::attention", "mkldnn::_linear_pointwise")
        )
        if "verispec::attention" in events:
            inside = events["verispec::attention"]
            small -= inside.cpu_time_total - inside.self_cpu_time_total
        small /= 1e6
        spent.clear()
        spent.update(timed_classes)
    finally:
        if layers is not None:
            layers.forward = layers.tree_pass
            del layers.decode_step
        for core, function in zip(cores, tree_cores, strict=True):
            core[PassKind.TREE] = function
        for module in linears:
            setattr(module, entry[id(module)], originals[id(module)])
        model.reset()
    ms = {k: v / repeats * 1e3 for k, v in spent.items()}
    ms["small ops"] = small / repeats * 1e3
    ms["step"] = wall / repeats * 1e3
    ms["Python and dispatch"] = max(
        0.0,
        ms["step"]
        - sum(
            ms.get(k, 0.0) for k in ("products", "LM head", "attention", "small ops", "C layers")
        ),
    )
    return ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_threads_option(parser, counts=True)
    parser.add_argument("--sizes", default="1,16")
    parser.add_argument("--weights", default="auto,dense")
    parser.add_argument("--attention", default="auto", help="auto (C where it runs), torch")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--peak-gflops", type=float, default=None)
    args = parser.parse_args()
    base, _ = load_default_model()
    rows = []
    for threads in args.threads:
        bandwidth = read_bandwidth(threads)
        peak = args.peak_gflops or 32 * _clock_ghz() * threads
        for weights, attention in itertools.product(
            args.weights.split(","), args.attention.split(",")
        ):
            model = FastModel(base.hf_model, weights=weights, attention=attention)
            layers = [
                m
                for m in model.transformer.layers.modules()
                if isinstance(m, BlockLinear | PackedLinear)
            ]
            layer_bytes = sum(_weight_bytes(m) for m in layers)
            head_bytes = _weight_bytes(model.transformer.output)
            layer_weights = sum(m.in_features * m.out_features for m in layers)
            head_weights = (
                model.transformer.output.in_features * model.transformer.output.out_features
            )
            for n in (int(s) for s in args.sizes.split(",")):
                torch.set_num_threads(threads)
                ms = profile_step(model, n, args.context, args.repeats)
                rows_in = max(n, model._shared.bucket(n))
                bound = {
                    "products": max(
                        layer_bytes / bandwidth / 1e6, 2 * layer_weights * rows_in / peak / 1e6
                    ),
                    "LM head": max(
                        head_bytes / bandwidth / 1e6, 2 * head_weights * rows_in / peak / 1e6
                    ),
                }
                rows.append((threads, weights, model.runtime, n, ms, bound, bandwidth, peak))
    flags = " ".join(cpu_features())
    print(f"CPU: {machine_info().get('cpu', '')}; flags: {flags}; torch {torch.__version__}")
    print(
        "\n| threads | weights | n | step ms | C layers | products | LM head | attention "
        "| small ops | Python/dispatch | products at roofline | head at roofline |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for threads, weights, runtime, n, ms, bound, _, _ in rows:
        shares = [
            f"{bound[k] / ms[k]:.0%} of {bound[k]:.1f}" if ms.get(k) else "-"
            for k in ("products", "LM head")
        ]
        cells = [
            ms.get(k, 0.0) for k in ("C layers", "products", "LM head", "attention", "small ops")
        ]
        print(
            f"| {threads} | {weights} ({runtime}) | {n} | {ms['step']:.1f} | "
            + " | ".join(f"{c:.1f}" for c in cells)
            + f" | {ms['Python and dispatch']:.1f} | {shares[0]} | {shares[1]} |"
        )
    print(
        "\nbandwidth GB/s / FMA peak GFLOP/s: "
        + ", ".join(f"{r[0]} thread(s): {r[6]:.1f} / {r[7]:.0f}" for r in rows)
    )


if __name__ == "__main__":
    main()

"""The block kernel's products for one decoder step of SmolLM2-135M's shapes, by row count.

Run from the repository root::

    taskset -c 1 .venv/bin/python benchmarks/kernel_products.py --rows 1,2,3,4,6,16

For each row count M it times ``vs_linear`` (verispec/kernels/cpu/linear.c) over 30 layers'
products (query/key/value 960 x 576, output 576 x 576, gate/up 3072 x 576, down 576 x 1536,
random Q4_1 blocks, a separate copy per layer so the weights stream from memory) and the
Q8_0 LM head (49152 x 576), on ``--threads`` threads; the median of ``--repeats`` passes.
Prints a Markdown table (ms) with the CPU's flags and the blocks' read rate.

``--against REV`` also builds the kernels' C sources as they were at git revision ``REV``
(same compiler flags) and times both libraries in the same passes, alternating, to print
each row count's total for both and their ratio (a kernel change measured under the same
machine load)::

    taskset -c 1 .venv/bin/python benchmarks/kernel_products.py --rows 1,2,3,6 --against HEAD~1

``--arithmetic both`` times the float32 products (``exact``) and the integer products
(``int8``, ``verispec/kernels/cpu/int8.c``, the same blocks regrouped in panels with half
scales, as the runtime holds them) in the same
passes, alternating, and prints both totals and their ratio::

    taskset -c 1 .venv/bin/python benchmarks/kernel_products.py --rows 1,2,4,16 --arithmetic both

``--arithmetic int8 --paths avx2,avx512vnni`` times the integer products on two of the
kernel's instruction paths (``int8_paths()``: the same bits on each) in the same passes,
alternating.

``--arithmetic int8 --scales both`` times the integer panels with float32 scales and with
half scales (the runtime's, where every scale is a half) in the same passes, alternating.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from verispec.bench.commands.flags import add_threads_option
from verispec.kernels.cpu import build as cpu_build
from verispec.kernels.cpu.features import cpu_features
from verispec.models.accelerators import blocks as cpu_linear
from verispec.models.accelerators.blocks import (
    FORMATS,
    INT8_HALF_KINDS,
    INT8_KINDS,
    library,
    quantize_blocks,
    recover_blocks,
    to_panels,
)

LAYER_SHAPES = {"qkv": (960, 576), "o": (576, 576), "w13": (3072, 576), "w2": (576, 1536)}
HEAD_SHAPE = (49152, 576)


def _blocks(rows: int, cols: int, fmt: str, seed: int) -> torch.Tensor:
    weight = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 0.05
    blocks = recover_blocks(quantize_blocks(weight, fmt), fmt)  # type: ignore[arg-type]
    assert blocks is not None
    return blocks


def _panels(blocks: torch.Tensor, fmt: str, rows: int, half: bool = True) -> torch.Tensor:
    """The integer kernel's panels of ``blocks``, with half scales as the runtime holds them
    (or float32 scales)."""
    panels = to_panels(blocks, fmt, rows, half=half)  # type: ignore[arg-type]
    assert panels is not None
    return panels


def _library_at(revision: str, folder: str) -> ctypes.CDLL:
    """The kernels' C sources at git ``revision``, compiled as verispec compiles them."""
    root = Path(__file__).resolve().parent.parent
    paths = []
    for path in (*cpu_linear._SOURCES, *cpu_linear._HEADERS):
        relative = path.relative_to(root).as_posix()
        text = subprocess.run(["git", "show", f"{revision}:{relative}"], cwd=root, check=True,
                              capture_output=True).stdout  # fmt: skip
        (Path(folder) / path.name).write_bytes(text)
        paths.append(str(Path(folder) / path.name))
    built = str(Path(folder) / "kernels.so")
    sources = [p for p in paths if p.endswith(".c")]
    subprocess.run(["cc", *cpu_build.COMPILE_FLAGS, *sources, "-o", built], check=True)
    lib = ctypes.CDLL(built)
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.vs_linear.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, i64, ptr, ptr, ctypes.c_int]
    return lib


def _forward(lib, layers, head, x, y, m: int, threads: int, kinds=FORMATS) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Seconds of each product kind over one pass of every layer and the LM head (``kinds``:
    the C code's format numbers, :data:`FORMATS` or :data:`INT8_HALF_KINDS`)."""
    spent = dict.fromkeys([*LAYER_SHAPES, "head"], 0.0)
    refused = 0
    for layer in layers:
        for name, (n, k) in LAYER_SHAPES.items():
            start = time.perf_counter()
            refused |= lib.vs_linear(kinds["q4_1"], x.data_ptr(), m, k, layer[name].data_ptr(),
                                     n, None, y.data_ptr(), threads)  # fmt: skip
            spent[name] += time.perf_counter() - start
    start = time.perf_counter()
    refused |= lib.vs_linear(kinds["q8_0"], x.data_ptr(), m, HEAD_SHAPE[1], head.data_ptr(),
                             HEAD_SHAPE[0], None, y.data_ptr(), threads)  # fmt: skip
    spent["head"] += time.perf_counter() - start
    if refused:  # e.g. --against a revision whose kernels predate these panels
        raise SystemExit(f"a library refused the formats {dict(kinds)}")
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,2,3,4,6,16")
    add_threads_option(parser)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--against", metavar="REV", help="also time the kernels at git REV")
    parser.add_argument(
        "--arithmetic",
        choices=("exact", "int8", "both"),
        default="exact",
        help="float32 products (exact, default), integer products (int8), or both, alternating",
    )
    parser.add_argument(
        "--scales",
        choices=("half", "both"),
        default="half",
        help="int8: the panels' scales as halves (the runtime's), or float32 and half alternating",
    )
    parser.add_argument(
        "--paths",
        metavar="A,B",
        help="int8: two of the kernel's instruction paths (int8_paths()), alternating",
    )
    args = parser.parse_args()
    lib = library()
    if lib is None:
        raise SystemExit("the block kernel is unavailable here (see cpu_linear.kernel_status)")
    layers = [
        {
            name: _blocks(n, k, "q4_1", 4 * i + j)
            for j, (name, (n, k)) in enumerate(LAYER_SHAPES.items())
        }
        for i in range(args.layers)
    ]
    head = _blocks(*HEAD_SHAPE, "q8_0", 10_000)
    total_bytes = sum(b.numel() for layer in layers for b in layer.values()) + head.numel()
    print(f"flags: {' '.join(cpu_features())}; {args.threads} thread(s); {args.layers} layers")
    rows = [int(r) for r in args.rows.split(",")]
    if args.arithmetic != "exact":
        panels = [
            {name: _panels(b, "q4_1", LAYER_SHAPES[name][0]) for name, b in layer.items()}
            for layer in layers
        ]
        head_panels = _panels(head, "q8_0", HEAD_SHAPE[0])
        if args.arithmetic == "int8" and args.scales == "both":
            wide = [
                {n: _panels(b, "q4_1", LAYER_SHAPES[n][0], False) for n, b in layer.items()}
                for layer in layers
            ]
            runs = {
                "float32 scales": (wide, _panels(head, "q8_0", HEAD_SHAPE[0], False), INT8_KINDS),
                "half scales": (panels, head_panels, INT8_HALF_KINDS),
            }
            _alternate(lib, args, runs, rows)
            return
        if args.arithmetic == "int8" and args.paths:
            _alternate_paths(lib, args, panels, head_panels, rows)
            return
        if args.arithmetic == "int8":
            layers, head = panels, head_panels
        else:
            runs = {
                "exact": (layers, head, FORMATS),
                "int8": (panels, head_panels, INT8_HALF_KINDS),
            }
            _alternate(lib, args, runs, rows)
            return
    kinds = INT8_HALF_KINDS if args.arithmetic == "int8" else FORMATS
    if args.against:
        with tempfile.TemporaryDirectory() as folder:
            _compare(lib, _library_at(args.against, folder), args, layers, head, rows, kinds)
        return
    print("\n| rows | " + " | ".join(LAYER_SHAPES) + " | LM head | total | blocks GB/s |")
    print("|---|" + "---|" * (len(LAYER_SHAPES) + 3))
    for m in rows:
        x = torch.randn(m, 1536)
        y = torch.empty(m, HEAD_SHAPE[0])
        per: dict[str, list[float]] = {name: [] for name in [*LAYER_SHAPES, "head"]}
        for _ in range(args.repeats + 1):
            for name, seconds in _forward(lib, layers, head, x, y, m, args.threads, kinds).items():
                per[name].append(seconds)
        ms = {name: statistics.median(times[1:]) * 1e3 for name, times in per.items()}
        total = sum(ms.values())
        print(
            f"| {m} | "
            + " | ".join(f"{ms[name]:.2f}" for name in LAYER_SHAPES)
            + f" | {ms['head']:.2f} | {total:.2f} | {total_bytes / total / 1e6:.1f} |"
        )


def _compare(lib, old, args, layers, head, rows: list[int], kinds) -> None:  # type: ignore[no-untyped-def]
    """Both libraries' totals by row count: the median of ``--repeats`` passes each, the
    two alternating pass by pass."""
    print(f"\n| rows | {args.against} (ms) | working tree (ms) | ratio |")
    print("|---|---|---|---|")
    for m in rows:
        x = torch.randn(m, 1536)
        y = torch.empty(m, HEAD_SHAPE[0])
        totals: dict[str, list[float]] = {"old": [], "new": []}
        for _ in range(args.repeats + 1):
            for name, which in (("old", old), ("new", lib)):
                totals[name].append(
                    sum(_forward(which, layers, head, x, y, m, args.threads, kinds).values())
                )
        before, after = (statistics.median(totals[n][1:]) * 1e3 for n in ("old", "new"))
        print(f"| {m} | {before:.2f} | {after:.2f} | {after / before:.2f} |")


def _alternate(lib, args, runs, rows: list[int]) -> None:  # type: ignore[no-untyped-def]
    """Two runs' totals by row count (``runs``: name -> (layers, head, kinds)), alternating
    pass by pass, the second over the first, and the second's T(M) / T(first row count)."""
    a_name, b_name = runs
    print(f"\n| rows | {a_name} (ms) | {b_name} (ms) | ratio | {b_name} T(M) / T(first) |")
    print("|---|---|---|---|---|")
    first = None
    for m in rows:
        x = torch.randn(m, 1536)
        y = torch.empty(m, HEAD_SHAPE[0])
        totals: dict[str, list[float]] = {a_name: [], b_name: []}
        for _ in range(args.repeats + 1):
            for name, (layers, head, kinds) in runs.items():
                spent = _forward(lib, layers, head, x, y, m, args.threads, kinds)
                totals[name].append(sum(spent.values()))
        a, b = (statistics.median(totals[n][1:]) * 1e3 for n in (a_name, b_name))
        first = b if first is None else first
        print(f"| {m} | {a:.2f} | {b:.2f} | {b / a:.2f} | {b / first:.2f} |")


def _alternate_paths(lib, args, layers, head, rows: list[int]) -> None:  # type: ignore[no-untyped-def]
    """The integer products on two instruction paths (``--paths A,B``), alternating pass by
    pass, as :func:`_alternate` prints them."""
    names = args.paths.split(",")
    if len(names) != 2:
        raise SystemExit(f"--paths must name two paths (A,B); got {args.paths!r}")
    for name in names:
        if name not in cpu_linear.int8_paths():
            raise SystemExit(f"--paths: this CPU runs {cpu_linear.int8_paths()}; got {name!r}")
    print(f"\n| rows | {names[0]} (ms) | {names[1]} (ms) | ratio | {names[1]} T(M) / T(first) |")
    print("|---|---|---|---|---|")
    first = None
    try:
        for m in rows:
            x = torch.randn(m, 1536)
            y = torch.empty(m, HEAD_SHAPE[0])
            totals: dict[str, list[float]] = {name: [] for name in names}
            for _ in range(args.repeats + 1):
                for name in names:
                    cpu_linear.int8_path(name)
                    spent = _forward(lib, layers, head, x, y, m, args.threads, INT8_HALF_KINDS)
                    totals[name].append(sum(spent.values()))
            a, b = (statistics.median(totals[n][1:]) * 1e3 for n in names)
            first = b if first is None else first
            print(f"| {m} | {a:.2f} | {b:.2f} | {b / a:.2f} | {b / first:.2f} |")
    finally:
        cpu_linear.int8_path("auto")


if __name__ == "__main__":
    main()

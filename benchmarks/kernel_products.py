"""The block kernel's products for one decoder step of SmolLM2-135M's shapes, by row count.

Run from the repository root::

    taskset -c 1 .venv/bin/python benchmarks/kernel_products.py --rows 1,2,3,4,6,16

For each row count M it times ``vs_linear`` (verispec/models/_cpu_linear.c) over 30 layers'
products (query/key/value 960 x 576, output 576 x 576, gate/up 3072 x 576, down 576 x 1536,
random Q4_1 blocks, a separate copy per layer so the weights stream from memory) and the
Q8_0 LM head (49152 x 576), on ``--threads`` threads; the median of ``--repeats`` passes.
Prints a Markdown table (ms) with the CPU's flags and the blocks' read rate.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from verispec.models.cpu_features import cpu_features
from verispec.models.cpu_linear import FORMATS, library, quantize_blocks, recover_blocks

LAYER_SHAPES = {"qkv": (960, 576), "o": (576, 576), "w13": (3072, 576), "w2": (576, 1536)}
HEAD_SHAPE = (49152, 576)


def _blocks(rows: int, cols: int, fmt: str, seed: int) -> torch.Tensor:
    weight = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 0.05
    blocks = recover_blocks(quantize_blocks(weight, fmt), fmt)  # type: ignore[arg-type]
    assert blocks is not None
    return blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,2,3,4,6,16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
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
    print("\n| rows | " + " | ".join(LAYER_SHAPES) + " | LM head | total | blocks GB/s |")
    print("|---|" + "---|" * (len(LAYER_SHAPES) + 3))
    for m in (int(r) for r in args.rows.split(",")):
        x = torch.randn(m, 1536)
        y = torch.empty(m, HEAD_SHAPE[0])
        per: dict[str, list[float]] = {name: [] for name in [*LAYER_SHAPES, "head"]}
        for _ in range(args.repeats + 1):
            spent = dict.fromkeys(per, 0.0)
            for layer in layers:
                for name, (n, k) in LAYER_SHAPES.items():
                    start = time.perf_counter()
                    lib.vs_linear(FORMATS["q4_1"], x.data_ptr(), m, k, layer[name].data_ptr(), n,
                                  None, y.data_ptr(), args.threads)  # fmt: skip
                    spent[name] += time.perf_counter() - start
            start = time.perf_counter()
            lib.vs_linear(FORMATS["q8_0"], x.data_ptr(), m, HEAD_SHAPE[1], head.data_ptr(),
                          HEAD_SHAPE[0], None, y.data_ptr(), args.threads)  # fmt: skip
            spent["head"] += time.perf_counter() - start
            for name, seconds in spent.items():
                per[name].append(seconds)
        ms = {name: statistics.median(times[1:]) * 1e3 for name, times in per.items()}
        total = sum(ms.values())
        print(
            f"| {m} | "
            + " | ".join(f"{ms[name]:.2f}" for name in LAYER_SHAPES)
            + f" | {ms['head']:.2f} | {total:.2f} | {total_bytes / total / 1e6:.1f} |"
        )


if __name__ == "__main__":
    main()

"""The C attention over a forward's 30 layers of caches, for 1, 2 and 4 rows of a pass.

Run from the repository root (``PYTHONPATH`` of another checkout's worktree times that
checkout's kernel, to compare two versions alternately)::

    .venv/bin/python benchmarks/attention_sweep.py --threads 2 --context 1000

Each repetition streams 64 MiB first, as a forward's weights would, so the caches are read
from memory as in decoding; prints the median and the best of ``--repeats`` passes, ms.
SmolLM2-135M's shapes: 9 query heads over 3 KV heads of 64 dimensions.
"""

from __future__ import annotations

import argparse
import time

import torch

from verispec.bench.commands.flags import add_threads_option
from verispec.models.accelerators.c_attention import attend_cpu
from verispec.models.attention import on_buffers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_threads_option(parser)
    parser.add_argument("--context", type=int, default=1000)
    parser.add_argument("--rows", default="1,2,4")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    layers, heads, kv_heads, dim, cap = 30, 9, 3, 64, args.context + 64
    caches = [
        (
            torch.randn(kv_heads, cap, dim),
            torch.cat([torch.randn(kv_heads, cap, dim), torch.ones(kv_heads, cap, 1)], -1),
        )
        for _ in range(layers)
    ]
    flush = torch.randn(64 * 2**20 // 4)
    cells = []
    for rows in (int(r) for r in args.rows.split(",")):
        q, k, v = (
            torch.randn(rows, heads, dim),
            torch.randn(rows, kv_heads, dim),
            torch.randn(rows, kv_heads, dim),
        )
        mask = torch.ones(rows, rows, dtype=torch.bool).tril()
        where = torch.tensor([args.context, cap])
        times = []
        for _ in range(args.repeats):
            flush.sum()
            start = time.perf_counter()
            for cache_k, cache_v in caches:
                on_buffers(attend_cpu, q, k, v, cache_k, cache_v, where, mask)
            times.append(time.perf_counter() - start)
        times.sort()
        cells.append(
            f"{rows} rows {1e3 * times[len(times) // 2]:.2f} ms (best {1e3 * times[0]:.2f})"
        )
    print(f"threads {args.threads}, context {args.context}: " + "; ".join(cells))


if __name__ == "__main__":
    main()

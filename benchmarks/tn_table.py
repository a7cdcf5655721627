"""T(n) of our runtime and of llama.cpp on the same GGUF file, measured the same way.

Run from the repository root (llama-cpp-python installed in ``.venv``, see the README)::

    taskset -c 1 .venv/bin/python benchmarks/tn_table.py --threads 1 --sizes 1,2,3,4,8,16

For each thread count and each n, one target step over n new tokens after a
``--context``-token prompt of random tokens, the median of ``--repeats``:

* **verispec**: :func:`verispec.drafters.budget.measure_latency` on the default model
  (a fresh tree of n nodes each repetition, the root included: ``n`` tokens), in each
  ``--arithmetic`` (``exact``: float32 products; ``int8``: integer products);
* **llama.cpp**: ``Llama.eval`` of n random tokens after the same context (rewound to the
  context before each repetition), logits for the last token only, and again with logits
  for every row (``logits_all``, what verifying a tree needs).

Prints a Markdown table with the CPU's flags.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from verispec.bench.commands.flags import add_threads_option
from verispec.bench.records import machine_info
from verispec.drafters.budget import measure_latency
from verispec.kernels.cpu.features import cpu_features
from verispec.models.default import load_default_model
from verispec.models.gguf import embedded_gguf


def llama_cpp_tn(
    sizes: list[int], context: int, threads: int, repeats: int, logits_all: bool
) -> dict[int, float]:
    """Median seconds of ``Llama.eval`` over n tokens after ``context`` tokens."""
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(embedded_gguf()), n_ctx=context + max(sizes) + 8, n_threads=threads,
        n_threads_batch=threads, logits_all=logits_all, verbose=False,
    )  # fmt: skip
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 40000, (context,), generator=generator).tolist()
    llm.eval(prompt)
    out = {}
    for n in sizes:
        times = []
        for _ in range(repeats + 2):
            llm.n_tokens = context  # rewind: the next eval overwrites the slots after it
            tokens = torch.randint(100, 40000, (n,), generator=generator).tolist()
            start = time.perf_counter()
            llm.eval(tokens)
            times.append(time.perf_counter() - start)
        out[n] = statistics.median(times[2:])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_threads_option(parser, counts=True)
    parser.add_argument("--sizes", default="1,2,3,4,8,16")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument(
        "--arithmetic", default="exact,int8", help="comma-separated: exact, int8 (both by default)"
    )
    parser.add_argument("--no-llama-cpp", action="store_true", help="verispec's rows only")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    models = [
        load_default_model(arithmetic=a, keep_source=False)[0] for a in args.arithmetic.split(",")
    ]
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for model in models:
            table = measure_latency(
                model, [n - 1 for n in sizes], context=args.context, repeats=args.repeats
            )
            ours = {n: table.at(torch.tensor([n - 1]), args.context).item() for n in sizes}
            rows.append((threads, f"verispec ({getattr(model, 'runtime', 'HF')})", ours))
        for logits_all in () if args.no_llama_cpp else (False, True):
            label = "llama.cpp" + (", logits for every row" if logits_all else "")
            rows.append(
                (
                    threads,
                    label,
                    llama_cpp_tn(sizes, args.context, threads, args.repeats, logits_all),
                )
            )
    print(f"CPU: {machine_info().get('cpu', '')}; flags: {' '.join(cpu_features())}")
    print(f"context {args.context} tokens; ms per step over n new tokens (median)\n")
    last = f"T({sizes[-1]}) / T({sizes[0]})"
    print("| threads | forward | " + " | ".join(f"T({n})" for n in sizes) + f" | {last} |")
    print("|---|---|" + "---|" * (len(sizes) + 1))
    for threads, label, times in rows:
        ratio = times[sizes[-1]] / times[sizes[0]]
        print(
            f"| {threads} | {label} | "
            + " | ".join(f"{times[n] * 1e3:.1f}" for n in sizes)
            + f" | {ratio:.1f} |"
        )


if __name__ == "__main__":
    main()

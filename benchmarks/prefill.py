"""Prefill of long prompts: the runtime against transformers, on the embedded model.

Run from the repository root::

    taskset -c 1 .venv/bin/python benchmarks/prefill.py --threads 1 --lengths 1024,4096,8192

For each prompt length (random token ids, the same for both), the seconds until the first
new token: ``FastModel.prefill`` and one pass for the root (what every decoding method
does first), and transformers' ``generate(max_new_tokens=1)`` on the same float32 weights
(greedy, SDPA attention). Both read the same model; the first token is compared. The
median of ``--repeats`` runs each, interleaved, the order alternating (ours first, then
theirs first). Prints a Markdown table with the CPU's flags.

``--paths`` compares the runtime's two prefill paths instead, to place
:data:`~verispec.models.runtime.PROMPT_PASS_TOKENS` on a CPU: the prompt pass (widened
GEMMs, fused attention) against the tree kernels, for every length::

    taskset -c 1 .venv/bin/python benchmarks/prefill.py --threads 1 --paths \
        --lengths 33,48,64,80,96,128

With ``--arithmetic int8`` (``--paths`` only: the integer model is not transformers') both
paths multiply in integers and the prompt pass is one C call, which places
:data:`~verispec.models.runtime.C_PROMPT_PASS_TOKENS`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from verispec.bench.commands.flags import add_threads_option
from verispec.core import DraftTree
from verispec.kernels.cpu.features import cpu_features
from verispec.models.default import load_default_model


def first_token_ours(model: Any, ids: torch.Tensor) -> tuple[int, float]:
    """The runtime's first new token after ``ids`` and the seconds it took."""
    start = time.perf_counter()
    model.prefill(ids)
    token = int(model.forward_tree(DraftTree.empty())[0].argmax())
    return token, time.perf_counter() - start


def first_token_transformers(hf: Any, ids: torch.Tensor) -> tuple[int, float]:
    """transformers' first new token after ``ids`` (greedy ``generate``) and its seconds."""
    start = time.perf_counter()
    with torch.no_grad():
        out = hf.generate(
            ids[None], attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=1, do_sample=False, pad_token_id=0,
        )  # fmt: skip
    return int(out[0, -1]), time.perf_counter() - start


def prefill_paths(model: Any, lengths: list[int], repeats: int) -> None:
    """Seconds of ``prefill`` plus the root's pass, with every chunk on the prompt pass and
    with every chunk on the tree kernels (interleaved, medians), and the first tokens."""
    from verispec.models import runtime

    print("\n| prompt tokens | prompt pass ms | tree kernels ms | tree / prompt | same token |")
    print("|---|---|---|---|---|")
    kept = runtime.PROMPT_PASS_TOKENS, runtime.C_PROMPT_PASS_TOKENS
    try:
        for length in lengths:
            ids = torch.randint(
                100, 40_000, (length,), generator=torch.Generator().manual_seed(length)
            )
            runs: dict[int, list[tuple[int, float]]] = {1: [], 10**9: []}
            for repeat in range(repeats):
                for threshold in (1, 10**9) if repeat % 2 == 0 else (10**9, 1):
                    runtime.PROMPT_PASS_TOKENS = runtime.C_PROMPT_PASS_TOKENS = threshold
                    runs[threshold].append(first_token_ours(model, ids))
            a = statistics.median(s for _, s in runs[1])
            b = statistics.median(s for _, s in runs[10**9])
            same = {t for t, _ in runs[1]} == {t for t, _ in runs[10**9]}
            row = f"| {length} | {1e3 * a:.1f} | {1e3 * b:.1f} | {b / a:.2f} |"
            print(f"{row} {'yes' if same else 'no'} |", flush=True)
    finally:
        runtime.PROMPT_PASS_TOKENS, runtime.C_PROMPT_PASS_TOKENS = kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="1024,4096,8192")
    add_threads_option(parser)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--paths", action="store_true", help="the prompt pass against the tree kernels"
    )
    parser.add_argument("--arithmetic", choices=("exact", "int8"), default="exact")
    args = parser.parse_args()
    if args.arithmetic != "exact" and not args.paths:
        parser.error("--arithmetic int8 compares the two prefill paths only: add --paths")
    torch.set_num_threads(args.threads)
    model, _ = load_default_model(max_length=8192 + 64, arithmetic=args.arithmetic)
    hf = model.hf_model
    print(f"flags: {' '.join(cpu_features())}; {args.threads} thread(s); runtime: {model.runtime}")
    if args.paths:
        prefill_paths(model, [int(n) for n in args.lengths.split(",")], args.repeats)
        return
    print("\n| prompt tokens | verispec s | tok/s | transformers s | tok/s | ratio | same token |")
    print("|---|---|---|---|---|---|---|")
    for length in (int(n) for n in args.lengths.split(",")):
        ids = torch.randint(100, 40_000, (length,), generator=torch.Generator().manual_seed(length))
        runs: dict[str, list[tuple[int, float]]] = {"ours": [], "theirs": []}
        for repeat in range(args.repeats):
            order = ["ours", "theirs"] if repeat % 2 == 0 else ["theirs", "ours"]
            for who in order:
                run = first_token_ours(model, ids) if who == "ours" else None
                runs[who].append(run or first_token_transformers(hf, ids))
        a = statistics.median(s for _, s in runs["ours"])
        b = statistics.median(s for _, s in runs["theirs"])
        same = {t for t, _ in runs["ours"]} == {t for t, _ in runs["theirs"]}
        print(
            f"| {length} | {a:.2f} | {length / a:.0f} | {b:.2f} | {length / b:.0f} | "
            f"{b / a:.2f}x | {'yes' if same else 'no'} |",
            flush=True,
        )


if __name__ == "__main__":
    main()

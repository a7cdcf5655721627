"""Where each method's decoding step goes, measured in one process on the same prompts.

Run from the repository root::

    taskset -c 1 .venv/bin/python benchmarks/step_split.py --threads 1 --methods ar,tr,dtr,pld \
        --limit 3 --repeats 2

The first ``--limit`` Spec-Bench questions of each category (first turn, chat template,
greedy unless ``--temperature`` says otherwise, ``--max-new-tokens`` tokens; ``--arithmetic``
as ``verispec bench``'s) are answered by every method, each question in the
next order of :func:`verispec.bench.runner.method_orders` (every method follows every
other equally often), the whole set ``--repeats`` times; every method keeps one decoder,
so what it learns carries over, as in ``verispec bench``. From the engine's own clocks
(:class:`~verispec.core.engine.StepStats`) it prints, per method: tokens a second over
whole answers (prefill included) and against the first method, the steps and how many
sent nodes, the mean milliseconds a step spends drafting, in the target's forward, in
verification, in the commit and elsewhere in the loop, and the medians of the plain and of
the drafted steps. Every answer is compared with the first method's on the same prompt.
Differences of a percent between methods are visible here where a bench over separate
runs drifts more than that.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch

import verispec
from verispec.bench.commands.flags import add_threads_option
from verispec.bench.prompts import build_prompt_ids, load_questions, select_questions
from verispec.bench.runner import method_orders
from verispec.kernels.cpu.features import cpu_features
from verispec.specs import drafter

PARTS = ("draft_s", "target_s", "verify_s", "commit_s")


def _median_ms(steps: list[Any], part: str) -> str:
    return f"{1e3 * statistics.median(getattr(s, part) for s in steps):.3f}" if steps else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", default="../shared/data/spec_bench/question.jsonl")
    parser.add_argument("--categories", default=None, help="comma-separated; default: all")
    parser.add_argument("--methods", default="ar,tr,dtr,pld")
    parser.add_argument("--limit", type=int, default=3, help="questions per category")
    parser.add_argument("--repeats", type=int, default=2)
    add_threads_option(parser)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--arithmetic", choices=("exact", "int8"), default="exact")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = verispec.load_default_model(arithmetic=args.arithmetic)
    categories = args.categories.split(",") if args.categories else None
    questions = select_questions(load_questions(args.questions), args.limit, categories, 1)
    prompts = [
        build_prompt_ids(tokenizer, [{"role": "user", "content": q.turns[0]}]) for q in questions
    ]
    methods = args.methods.split(",")
    decoders = {
        m: verispec.SpeculativeDecoder(model, drafter(m, target=model), tokenizer=tokenizer)
        for m in methods
    }
    steps: dict[str, list[Any]] = {m: [] for m in methods}
    seconds = dict.fromkeys(methods, 0.0)
    prefill = dict.fromkeys(methods, 0.0)
    tokens = dict.fromkeys(methods, 0)
    differ = dict.fromkeys(methods, 0)
    orders = method_orders(len(methods))
    for repeat in range(args.repeats):
        for index, ids in enumerate(prompts):
            order = orders[(repeat * len(prompts) + index) % len(orders)]
            answers = {}
            for method in (methods[i] for i in order):
                result = decoders[method].generate(
                    ids, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                    top_p=args.top_p, seed=args.seed,
                )  # fmt: skip
                answers[method] = result.tokens
                steps[method] += result.steps
                seconds[method] += result.total_s
                prefill[method] += result.prefill_s
                tokens[method] += len(result.tokens)
            first = answers[methods[0]]
            for method in methods:
                differ[method] += answers[method] != first

    flags = " ".join(cpu_features())
    print(
        f"\nCPU flags: {flags}; threads {args.threads}; {len(prompts)} prompts x {args.repeats}; "
        f"{args.arithmetic}; temperature {args.temperature}, top-p {args.top_p}, seed {args.seed}"
    )
    print(
        "\n| method | tok/s | vs first | steps | drafted | draft | target | verify | commit "
        "| rest | plain: target / verify / draft | drafted: target / draft | = first |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    base = tokens[methods[0]] / seconds[methods[0]]
    for method in methods:
        all_steps = steps[method]
        n = len(all_steps)
        sums = {part: sum(getattr(s, part) for s in all_steps) for part in PARTS}
        rest = seconds[method] - prefill[method] - sum(sums.values())
        plain = [s for s in all_steps if s.tree_size == 0]
        drafted = [s for s in all_steps if s.tree_size > 0]
        rate = tokens[method] / seconds[method]
        means = " | ".join(f"{1e3 * sums[part] / n:.3f}" for part in PARTS)
        print(
            f"| {method} | {rate:.2f} | {rate / base:.3f}x | {n} | {len(drafted)} | {means} "
            f"| {1e3 * rest / n:.3f} | {_median_ms(plain, 'target_s')} / "
            f"{_median_ms(plain, 'verify_s')} / {_median_ms(plain, 'draft_s')} "
            f"| {_median_ms(drafted, 'target_s')} / {_median_ms(drafted, 'draft_s')} "
            f"| {len(prompts) * args.repeats - differ[method]}/{len(prompts) * args.repeats} |"
        )
    print("\nms per step (means over all steps; medians for plain and drafted steps)")


if __name__ == "__main__":
    main()

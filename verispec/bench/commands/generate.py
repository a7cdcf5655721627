"""``verispec generate``: answer one prompt with one method and print its statistics.

The answer, then tokens/s, steps, mean accepted tokens per step (MAT) and the
draft/target/verify time split; ``--json`` also writes the per-request figures (vLLM's
spec-decode metric names where they match). The method runs as the benchmark runs it.
"""

from __future__ import annotations

import argparse
from typing import Any

from verispec.bench.commands import target
from verispec.bench.commands.flags import (
    add_generation_options,
    add_processing_options,
    bench_config,
    processing,
)
from verispec.bench.runner import TurnResult
from verispec.errors import ConfigError

__all__ = ["add_cli_args", "main"]

HELP = "answer one prompt with one method and print its statistics"
DESCRIPTION = (
    "Answer one prompt and print the answer, then tokens/s, steps, mean "
    "accepted tokens per step (MAT) and the draft/target/verify time split."
)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Declare ``verispec generate``'s flags on ``parser``."""
    parser.add_argument("--method", default="tr", metavar="SPEC", help="(default tr)")
    parser.add_argument("--prompt", required=True, help="the user prompt")
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no notices of long waits (conversion, latency tables, compilation)",
    )
    add_generation_options(parser)
    add_processing_options(parser)
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="also write the answer and its per-request figures (vLLM's spec-decode metric "
        "names where they match) to this JSON file",
    )
    target.add_model_options(parser)
    target.add_kernel_option(parser)


def main(args: argparse.Namespace) -> int:
    """Run ``verispec generate``; returns the exit status."""
    import attrs

    from verispec.bench.methods import METHODS, build_runners, check_available
    from verispec.bench.prompts import build_prompt_ids
    from verispec.core.types import GenerationParams
    from verispec.specs import parse_methods

    # 1. everything a user can get wrong, before the model loads
    specs = parse_methods(args.method, METHODS)
    if len(specs) != 1:
        raise ConfigError(f"`--method` takes one method spec; got {len(specs)}.")
    if not args.prompt.strip():
        raise ConfigError("`--prompt` must not be empty.")
    config = bench_config(args)
    settings = processing(args)
    GenerationParams(**settings)  # bad settings fail before the model loads
    target.device(args.device)
    check_available(specs)
    kernels = target.kernel_scope(args)
    target.check_model_source(args)

    # 2. load and answer
    model, tokenizer = target.load(args, specs)
    context = target.context(args, model, tokenizer, config.verifier)
    ids = build_prompt_ids(tokenizer, [{"role": "user", "content": args.prompt}], chat=args.chat)
    with kernels:
        runner = build_runners(context, specs)[specs[0].label]
        generation = attrs.evolve(config.generation(context.eos_token_ids), **settings)
        with target.frozen_heap():
            result = runner.run(ids, generation)

    # 3. print, and write the figures
    print(result.text)
    print()
    print(_stats(specs[0].label, result, len(ids)))
    if args.json:
        import json

        engine_result = getattr(runner, "last_result", None)
        record: dict[str, Any] = {
            "method": specs[0].label,
            "text": result.text,
            "tokens": list(result.tokens),
            "prompt_tokens": len(ids),
            "finish_reason": result.finish_reason,
            "seconds": result.seconds,
            "spec_decode": engine_result.spec_decode_metrics() if engine_result else None,
        }
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=2)
    return 0


def _stats(label: str, result: TurnResult, prompt_tokens: int) -> str:
    n = len(result.tokens)
    rate = n / result.seconds if result.seconds > 0 else 0.0
    mat = result.committed / result.steps if result.steps else 0.0
    lines = [
        f"method: {label}",
        f"tokens: {n} new after a {prompt_tokens}-token prompt, in {result.seconds:.2f} s "
        f"({rate:.2f} tokens/s); finish: {result.finish_reason}",
        f"steps: {result.steps} target forwards, mean accepted tokens per step (MAT) {mat:.2f}",
    ]
    if result.tree_nodes is not None and result.steps:
        lines[-1] += f", {result.tree_nodes / result.steps:.1f} draft nodes per step"
    parts = []
    for name in ("draft", "target", "verify"):
        value = getattr(result, f"{name}_s")
        if value is not None and result.seconds > 0:
            parts.append(f"{name} {value:.2f} s ({100 * value / result.seconds:.0f}%)")
    if parts:
        lines.append("time: " + ", ".join(parts))
    return "\n".join(lines)

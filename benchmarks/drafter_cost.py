"""What a drafted step costs the drafter: ``propose`` plus ``observe``, by method.

Run from the repository root::

    .venv/bin/python benchmarks/drafter_cost.py --threads 2 --methods dtr,tr,pld

On the first Spec-Bench question of each of ``--categories`` (first turn, chat template,
``--max-new-tokens`` tokens, greedy), each method generates after a short warm-up, and the
engine's own clock (``StepStats.draft_s``) is split between the steps its
:class:`~verispec.drafters.gate.DraftGate` let it draft and the steps it backed off (the
gate's ``drafting`` is wrapped to tell them apart). Prints the mean drafter milliseconds of
each kind of step. Methods sized by the device only (``dtr``, ``tr``, ``pld`` with their
defaults), which hold a gate.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import verispec
from verispec.bench.commands.flags import add_threads_option

CATEGORIES = "translation,rag,qa,humanities,math_reasoning,writing,summarization,coding"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", default="../shared/data/spec_bench/question.jsonl")
    parser.add_argument("--categories", default=CATEGORIES)
    parser.add_argument("--methods", default="dtr,tr,pld")
    add_threads_option(parser)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    questions = [json.loads(line) for line in Path(args.questions).read_text().splitlines()]
    chosen = [
        next(q for q in questions if q["category"] == category)
        for category in args.categories.split(",")
    ]
    model, tokenizer = verispec.load_default_model()
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q["turns"][0]}], add_generation_prompt=True, tokenize=False
        )
        for q in chosen
    ]
    print(f"{args.threads} thread(s), {len(prompts)} prompts, {args.max_new_tokens} new tokens")
    for spec in args.methods.split(","):
        decoder = verispec.SpeculativeDecoder(
            model, verispec.drafter(spec, target=model), tokenizer=tokenizer
        )
        decoder.generate(prompts[0], max_new_tokens=16)  # warm-up; binds the latency table
        gate = decoder.drafter.gate
        if gate is None:
            raise SystemExit(f"{spec} is not sized by the device: it has no gate to read")
        decided: list[bool] = []
        drafting = gate.drafting

        def logged(drafting=drafting, decided=decided) -> bool:
            decision = drafting()
            decided.append(decision)
            return decision

        gate.drafting = logged  # type: ignore[method-assign]
        drafted: list[float] = []
        plain: list[float] = []
        for prompt in prompts:
            decided.clear()
            result = decoder.generate(prompt, max_new_tokens=args.max_new_tokens)
            for on, step in zip(decided, result.steps, strict=True):
                (drafted if on else plain).append(step.draft_s)
        mean = lambda xs: 1e3 * sum(xs) / max(len(xs), 1)  # noqa: E731
        print(
            f"{spec:5s} drafted {len(drafted):4d} steps, {mean(drafted):.3f} ms each; "
            f"backed off {len(plain):4d} steps, {mean(plain):.3f} ms each"
        )


if __name__ == "__main__":
    main()

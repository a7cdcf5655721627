"""Where two methods' greedy answers part, and how close the reference's top two were there.

Reads a ``verispec bench`` records file (``--records``, JSON Lines) and, for every answer of
``--method`` that is not token-identical to ``--reference``'s answer to the same prompt,
finds the first token where they differ and scores that prefix with transformers' own
float32 forward (the embedded SmolLM2, or ``--model``): the top-2 logit gap there says
whether the two runs parted at a near-tie. A turn whose prompt already differs (it follows
the method's own earlier answer, which differed) is listed as such, not scored.

Usage::

    python benchmarks/divergence.py results/sb5_float32.records.jsonl \\
        --questions ../shared/data/spec_bench/question.jsonl --method dtr --reference hf
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from verispec.bench.prompts import build_prompt_ids, load_questions, shipped_questions

Key = tuple[str, int]  # (question id as text, turn)


def read_answers(path: Path) -> dict[str, dict[Key, dict[str, Any]]]:
    """Each method's recorded answers by (question id, turn); the header line is skipped."""
    answers: dict[str, dict[Key, dict[str, Any]]] = {}
    with open(path) as lines:
        for line in lines:
            record = json.loads(line)
            if "method" not in record:
                continue  # the header
            key = (str(record["question_id"]), int(record["turn"]))
            answers.setdefault(record["method"], {})[key] = record
    return answers


def prompt_ids(
    tokenizer: Any, turns: Sequence[str], answers: dict[Key, dict[str, Any]], key: Key
) -> list[int]:
    """The prompt a method answered at ``key``: the user turns so far, each followed by the
    method's own answer, as the benchmark built it (chat template on)."""
    messages = []
    for turn in range(key[1] + 1):
        messages.append({"role": "user", "content": turns[turn]})
        if turn < key[1]:
            messages.append(
                {"role": "assistant", "content": answers[(key[0], turn)]["result"]["text"]}
            )
    return build_prompt_ids(tokenizer, messages, chat=True)


def top_two(hf_model: Any, ids: Sequence[int]) -> tuple[list[int], list[float]]:
    """transformers' top-2 tokens and logits after ``ids`` (one causal float32 forward)."""
    with torch.inference_mode():
        logits = hf_model(torch.tensor([list(ids)])).logits[0, -1].float()
    values, tokens = logits.topk(2)
    return tokens.tolist(), values.tolist()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", type=Path)
    parser.add_argument("--questions", type=Path, default=None)
    parser.add_argument("--method", required=True)
    parser.add_argument("--reference", default="hf")
    args = parser.parse_args(argv)

    from verispec.models import load_default_model

    model, tokenizer = load_default_model(runtime="hf", dtype=torch.float32)
    questions = load_questions(args.questions) if args.questions else shipped_questions()
    turns = {str(q.question_id): q.turns for q in questions}
    answers = read_answers(args.records)
    mine, theirs = answers[args.method], answers[args.reference]
    shared = sorted(set(mine) & set(theirs), key=lambda k: (k[0].zfill(8), k[1]))
    identical = 0
    print(f"{args.method} against {args.reference}: {len(shared)} answers to the same questions")
    for key in shared:
        a, b = mine[key]["result"]["tokens"], theirs[key]["result"]["tokens"]
        if a == b:
            identical += 1
            continue
        ids = prompt_ids(tokenizer, turns[key[0]], mine, key)
        if ids != prompt_ids(tokenizer, turns[key[0]], theirs, key):
            print(f"q{key[0]} turn {key[1]}: the prompt differs (an earlier turn differed)")
            continue
        at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        if at is None:
            print(f"q{key[0]} turn {key[1]}: one answer is a prefix of the other (lengths "
                  f"{len(a)}, {len(b)})")  # fmt: skip
            continue
        tokens, values = top_two(model.hf_model, ids + a[:at])
        print(
            f"q{key[0]} turn {key[1]}: first differs at token {at}: {args.method} chose "
            f"{a[at]}, {args.reference} {b[at]}; transformers float32 top-2 {tokens} "
            f"logits {values[0]:.4f} / {values[1]:.4f}, gap {values[0] - values[1]:.2e}"
        )
    print(f"identical: {identical}/{len(shared)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How far the integer products (``arithmetic="int8"``) move the model, and llama.cpp's.

Two measures, on the embedded SmolLM2 (its Q4_1 GGUF file):

* **Greedy agreement**, from two ``verispec bench`` records files of the same questions:
  ``--exact`` (a run in the default arithmetic: its ``ar`` answers are transformers'
  ``generate``'s, token for token) and ``--int8`` (a run with ``--arithmetic int8`` and the
  ``llama-cpp`` peer). For each pair of answers: identical, or the token where they part.
* **Mean per-token KL divergence from the exact model**, KL(exact || other), over the exact
  model's own greedy answers (teacher forcing: every position of ``--answers`` first-turn
  answers, up to ``--tokens`` each): for verispec's integer model (one tree pass over the
  answer as a chain) and for llama.cpp (``logits_all``) on the same file.

Usage (llama-cpp-python installed)::

    taskset -c 1 .venv/bin/python benchmarks/int8_fidelity.py \\
        --exact results/bench_exact.records.jsonl --int8 results/bench_int8.records.jsonl
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from divergence import prompt_ids, read_answers

from verispec.bench.prompts import load_questions, shipped_questions
from verispec.core import DraftTree
from verispec.models import load_default_model
from verispec.models.gguf import embedded_gguf


def agreement(label: str, mine: dict, theirs: dict) -> None:
    """Identical answers out of those both runs gave, and where the others first part."""
    shared = sorted(set(mine) & set(theirs), key=lambda k: (k[0].zfill(8), k[1]))
    parts = []
    for key in shared:
        a, b = mine[key]["result"]["tokens"], theirs[key]["result"]["tokens"]
        if a != b:
            parts.append(next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                              min(len(a), len(b))))  # fmt: skip
    same = len(shared) - len(parts)
    where = (
        f"; first difference at token median {statistics.median(parts):.0f} "
        f"(min {min(parts)}, max {max(parts)})"
        if parts
        else ""
    )
    print(f"| {label} | {same}/{len(shared)} identical{where} |")


def kl(reference: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """KL(reference || other) per row, from logits (float64)."""
    p = torch.log_softmax(reference.double(), -1)
    q = torch.log_softmax(other.double(), -1)
    return (p.exp() * (p - q)).sum(-1)


def chain_logits(model: Any, prompt: Sequence[int], answer: Sequence[int]) -> torch.Tensor:
    """Logits predicting each token of ``answer`` after ``prompt`` (one tree pass)."""
    model.reset()
    model.prefill(torch.tensor(list(prompt)))
    chain = DraftTree.from_parents(list(answer[:-1]), list(range(-1, len(answer) - 2)))
    return model.forward_tree(chain)[: len(answer)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exact", type=Path, required=True)
    parser.add_argument("--int8", type=Path, required=True)
    parser.add_argument("--questions", type=Path, default=None)
    parser.add_argument("--answers", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args(argv)

    exact_runs, int8_runs = read_answers(args.exact), read_answers(args.int8)
    print("| answers | greedy agreement |\n|---|---|")
    agreement("int8 `ar` vs exact `ar` (= `generate`)", int8_runs["ar"], exact_runs["ar"])
    if "llama-cpp" in int8_runs:
        agreement("llama.cpp vs exact `ar`", int8_runs["llama-cpp"], exact_runs["ar"])
        agreement("int8 `ar` vs llama.cpp", int8_runs["ar"], int8_runs["llama-cpp"])

    exact, tokenizer = load_default_model(keep_source=False)
    integer, _ = load_default_model(arithmetic="int8", keep_source=False)
    questions = load_questions(args.questions) if args.questions else shipped_questions()
    turns = {str(q.question_id): q.turns for q in questions}
    keys = sorted((k for k in exact_runs["ar"] if k[1] == 0), key=lambda k: k[0].zfill(8))
    keys = keys[: args.answers]
    try:
        import llama_cpp

        llm = llama_cpp.Llama(model_path=str(embedded_gguf()), n_ctx=4096, logits_all=True,
                              verbose=False)  # fmt: skip
    except ImportError:
        llm = None
    ours, theirs, positions = [], [], 0
    for key in keys:
        prompt = prompt_ids(tokenizer, turns[key[0]], exact_runs["ar"], key)
        answer = exact_runs["ar"][key]["result"]["tokens"][: args.tokens]
        reference = chain_logits(exact, prompt, answer)
        ours.append(kl(reference, chain_logits(integer, prompt, answer)))
        if llm is not None:
            llm.reset()
            llm.eval(prompt + answer)
            scores = torch.tensor(llm.scores[len(prompt) - 1 : len(prompt) - 1 + len(answer)])
            theirs.append(kl(reference, scores))
        positions += len(answer)
    print(f"\nKL(exact || other), mean over {positions} positions of {len(keys)} answers:\n")
    print("| model | mean KL (nats) | median | 99th percentile |\n|---|---|---|---|")
    for label, values in (("verispec int8", ours), ("llama.cpp", theirs)):
        if values:
            v = torch.cat(values)
            print(f"| {label} | {v.mean():.2e} | {v.median():.2e} | {v.quantile(0.99):.2e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

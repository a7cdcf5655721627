"""Prompts where drafting fails: random tokens and shuffled words (issue 25's "never slower
than plain decoding" set).

Writes ``benchmarks/data/drafting_fails.jsonl`` (Spec-Bench format, two categories of four
prompts): ``random_tokens``, text decoded from token ids drawn uniformly from the embedded
SmolLM2 tokenizer's vocabulary, and ``shuffled_words``, Spec-Bench questions with their
words shuffled. Each asks the model to continue the text, so the answer follows no
pattern a drafter has seen. Deterministic (fixed seeds); run from the repository root::

    .venv/bin/python benchmarks/drafting_fails.py
    verispec bench --questions benchmarks/data/drafting_fails.jsonl --limit 4 \\
        --methods ar,tr,pld,dtr --per-category
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from verispec.models.default import load_default_model

ROOT = Path(__file__).resolve().parent
SPEC_BENCH = ROOT.parent.parent / "shared" / "data" / "spec_bench" / "question.jsonl"
OUT = ROOT / "data" / "drafting_fails.jsonl"
ASK = "Continue this text for a while, in the same style:\n\n"


def main() -> None:
    _, tokenizer = load_default_model()
    rng = random.Random(25)
    rows = []
    for i in range(4):
        ids = [rng.randrange(len(tokenizer)) for _ in range(80)]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        rows.append({"question_id": 9100 + i, "category": "random_tokens", "turns": [ASK + text]})
    questions = [json.loads(line) for line in SPEC_BENCH.read_text().splitlines()]
    for i, question in enumerate(rng.sample(questions, 4)):
        words = " ".join(question["turns"]).split()
        rng.shuffle(words)
        rows.append(
            {
                "question_id": 9200 + i,
                "category": "shuffled_words",
                "turns": [ASK + " ".join(words)],
            }
        )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} prompts to {OUT}")


if __name__ == "__main__":
    main()

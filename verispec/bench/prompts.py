"""Benchmark prompts in Spec-Bench's format, and how they become model inputs.

A question file holds one JSON object per line, ``{"question_id": 81, "category":
"writing", "turns": ["first user turn", "second"]}`` (docs/benchmarks.rst, ``--questions``).
Multi-turn questions are run as conversations: the second user turn is asked after the
model's own answer to the first. verispec ships 30 original prompts
(``verispec/data/prompts.jsonl``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import attrs

from verispec.core.validate import integer
from verispec.errors import ConfigError

__all__ = [
    "SHIPPED_PROMPTS", "Question", "build_prompt_ids", "load_questions", "parse_questions",
    "select_questions", "shipped_questions"
]  # fmt: skip


#: The prompt set verispec ships (package data).
SHIPPED_PROMPTS = Path(__file__).resolve().parent.parent / "data" / "prompts.jsonl"


@attrs.frozen
class Question:
    """One benchmark question: the file's id (kept as given), the category the
    per-category figures group by, and the user turns, asked in order as one conversation."""

    question_id: int | str
    category: str
    turns: tuple[str, ...] = attrs.field(converter=lambda turns: tuple(turns))


_KEYS = ("question_id", "category", "turns")


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _parse_line(line: str, where: str) -> Question:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno}).") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: each line must be a JSON object; got {type(record).__name__}.")
    missing = [key for key in _KEYS if key not in record]
    if missing:
        raise ConfigError(
            f"{where}: missing field(s) {', '.join(f'`{k}`' for k in missing)}; a question "
            'looks like {"question_id": 1, "category": "qa", "turns": ["..."]}.'
        )
    qid, category, turns = (record[key] for key in _KEYS)
    if isinstance(qid, bool) or not isinstance(qid, int | str):
        raise ConfigError(f"{where}: `question_id` must be an integer or a string; got {qid!r}.")
    if not _text(category):
        raise ConfigError(f"{where}: `category` must be a non-empty string; got {category!r}.")
    if not (isinstance(turns, list) and turns and all(map(_text, turns))):
        raise ConfigError(
            f"{where}: `turns` must be a non-empty list of non-empty strings; got {turns!r:.80}."
        )
    return Question(qid, category, turns)


def parse_questions(lines: Iterable[str], source: str = "<questions>") -> list[Question]:
    """Parse JSON lines into questions, skipping blank lines; :class:`ConfigError` naming
    ``source`` and the line for a line that is not a question or a repeated id, or if
    there is no question at all."""
    questions: list[Question] = []
    seen: dict[int | str, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}, line {number}"
        question = _parse_line(line, where)
        if question.question_id in seen:
            raise ConfigError(
                f"{where}: `question_id` {question.question_id!r} repeats line "
                f"{seen[question.question_id]}; ids must be unique."
            )
        seen[question.question_id] = number
        questions.append(question)
    if not questions:
        raise ConfigError(f"{source} holds no question; expected JSON lines with `turns`.")
    return questions


def load_questions(path: str | Path) -> list[Question]:
    """Read a Spec-Bench-format question file; :class:`ConfigError` if it is missing,
    unreadable or malformed (naming the line)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"the questions file {str(path)!r} does not exist or is not a file; give a "
            "Spec-Bench-format JSONL file (question_id, category, turns)."
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the questions file {str(path)!r}: {exc}.") from None
    return parse_questions(text.splitlines(), source=str(path))


def shipped_questions() -> list[Question]:
    """The 30 prompts verispec ships (``verispec/data/prompts.jsonl``)."""
    return load_questions(SHIPPED_PROMPTS)


def select_questions(
    questions: Sequence[Question],
    limit: int | None = None,
    categories: Sequence[str] | None = None,
    max_turns: int | None = None,
) -> list[Question]:
    """The first ``limit`` questions of each category, in file order.

    Args:
        limit: questions per category; ``None`` keeps all.
        categories: keep only these categories; ``None`` keeps all.
        max_turns: keep only the first ``max_turns`` turns of each conversation
            (Spec-Bench's MT-Bench questions have 2); ``None`` keeps all.

    Raises:
        ConfigError: ``limit < 1`` or ``max_turns < 1``, or a requested category does
            not occur.
    """
    if limit is not None:
        integer("limit", limit, 1, note=" (questions per category)")
    if max_turns is not None:
        integer("max_turns", max_turns, 1, note=" (turns per question)")
    present = list(dict.fromkeys(q.category for q in questions))
    if categories is not None:
        unknown = [c for c in categories if c not in present]
        if unknown:
            raise ConfigError(
                f"category {unknown[0]!r} does not occur in the questions; "
                f"available: {', '.join(present)}."
            )
    taken: Counter[str] = Counter()
    selected = []
    for q in questions:
        if categories is None or q.category in categories:
            taken[q.category] += 1
            if limit is None or taken[q.category] <= limit:
                selected.append(attrs.evolve(q, turns=q.turns[:max_turns]))
    return selected


def build_prompt_ids(
    tokenizer: Any, messages: Sequence[dict[str, str]], *, chat: bool = True
) -> list[int]:
    """Token ids of a conversation, ready for the model to answer the last user turn.

    With ``chat`` and a tokenizer that has a chat template, the template is applied
    with the generation prompt. Otherwise the turns are joined with blank lines
    (each answer included) and encoded as plain text.

    Args:
        messages: ``{"role": "user" | "assistant", "content": str}`` dicts, last one a user turn.
    """
    if not (chat and getattr(tokenizer, "chat_template", None)):
        return [int(t) for t in tokenizer.encode("\n\n".join(m["content"] for m in messages))]
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):  # a BatchEncoding
        ids = ids["input_ids"]
    ids = ids.tolist() if hasattr(ids, "tolist") else ids
    return [int(t) for t in (ids[0] if ids and isinstance(ids[0], list) else ids)]

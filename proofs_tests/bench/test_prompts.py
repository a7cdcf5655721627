"""Tests of verispec/bench/prompts.py: the shipped prompts, question files and their errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from verispec.bench.prompts import (
    Question,
    build_prompt_ids,
    load_questions,
    parse_questions,
    select_questions,
    shipped_questions,
)
from verispec.errors import ConfigError
from verispec.models.tiny import ByteTokenizer

SPEC_BENCH = (
    Path(__file__).resolve().parents[3] / "shared" / "data" / "spec_bench" / "question.jsonl"
)


def _line(qid: Any = 1, category: Any = "qa", turns: Any = ("Why?",)) -> str:
    return json.dumps({"question_id": qid, "category": category, "turns": list(turns)})


def test_shipped_prompts_cover_the_seven_categories() -> None:
    """The shipped set has 30 questions with unique ids, 4-5 per category, some multi-turn."""
    questions = shipped_questions()
    assert len(questions) == 30
    assert len({q.question_id for q in questions}) == 30
    counts: dict[str, int] = {}
    for q in questions:
        counts[q.category] = counts.get(q.category, 0) + 1
    assert set(counts) == {"chat", "coding", "translation", "summarization", "qa", "math", "rag"}
    assert all(4 <= n <= 5 for n in counts.values())
    assert any(len(q.turns) == 2 for q in questions)
    assert all(t.strip() for q in questions for t in q.turns)


def test_retrieval_prompts_are_the_longest() -> None:
    """Retrieval-style prompts carry long context: each is longer than every chat prompt."""
    questions = shipped_questions()
    rag = [len(q.turns[0]) for q in questions if q.category == "rag"]
    chat = [len(q.turns[0]) for q in questions if q.category == "chat"]
    assert min(rag) > max(chat)
    assert min(rag) > 1300


def test_a_valid_file_loads(tmp_path: Path) -> None:
    """A Spec-Bench-format file loads into Questions; blank lines are skipped."""
    path = tmp_path / "q.jsonl"
    path.write_text(_line(7, "qa", ["a", "b"]) + "\n\n" + _line("x", "math") + "\n")
    questions = load_questions(path)
    assert questions == [Question(7, "qa", ("a", "b")), Question("x", "math", ("Why?",))]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"question_id": 3, "category": "qa"}', "missing field\\(s\\) `turns`"),
        (_line(3, "qa", []), "`turns` must be a non-empty list"),
        (_line(3, "qa", ["ok", ""]), "`turns` must be a non-empty list"),
        ('{"question_id": 3, "category": "qa", "turns": "one string"}', "`turns` must be"),
        (_line(3, ""), "`category` must be a non-empty string"),
        (_line(True), "`question_id` must be an integer or a string"),
        (_line(1), "repeats line 1"),
    ],
)
def test_malformed_lines_name_their_line_number(tmp_path: Path, bad: str, message: str) -> None:
    """A bad third line (after a blank one) raises ConfigError naming the file and line 3."""
    path = tmp_path / "q.jsonl"
    path.write_text(_line(1) + "\n\n" + bad + "\n" + _line(9) + "\n")
    with pytest.raises(ConfigError, match=message) as info:
        load_questions(path)
    assert f"{path}, line 3" in str(info.value)


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    """A path that does not exist raises ConfigError naming it."""
    with pytest.raises(ConfigError, match="does not exist") as info:
        load_questions(tmp_path / "nope.jsonl")
    assert "nope.jsonl" in str(info.value)


def test_a_directory_is_not_a_questions_file(tmp_path: Path) -> None:
    """A directory path is refused like a missing file."""
    with pytest.raises(ConfigError, match="not a file"):
        load_questions(tmp_path)


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    """A file without any question raises ConfigError."""
    path = tmp_path / "empty.jsonl"
    path.write_text("\n  \n")
    with pytest.raises(ConfigError, match="holds no question"):
        load_questions(path)


def test_a_binary_file_is_refused(tmp_path: Path) -> None:
    """A file that is not UTF-8 raises ConfigError, not UnicodeDecodeError."""
    path = tmp_path / "bin.jsonl"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="cannot read"):
        load_questions(path)


def test_select_takes_the_first_n_of_each_category_in_file_order() -> None:
    """`limit` keeps the first N questions of each category and the file's order."""
    questions = parse_questions([_line(i, c) for i, c in enumerate(["a", "b", "a", "a", "c", "b"])])
    chosen = select_questions(questions, limit=2)
    assert [(q.question_id, q.category) for q in chosen] == [
        (0, "a"), (1, "b"), (2, "a"), (4, "c"), (5, "b"),
    ]  # fmt: skip
    assert select_questions(questions) == questions
    only_b = select_questions(questions, limit=1, categories=["b"])
    assert [q.question_id for q in only_b] == [1]


@pytest.mark.parametrize("limit", [0, -3, 1.5, True])
def test_select_rejects_a_limit_below_one(limit: Any) -> None:
    """`limit` must be an integer >= 1."""
    with pytest.raises(ConfigError, match="`limit` must be an integer >= 1"):
        select_questions(shipped_questions(), limit=limit)


def test_select_keeps_the_first_turns() -> None:
    """`max_turns` cuts each conversation to its first turns and keeps shorter ones whole."""
    questions = [
        Question(1, "mt", ("first", "second")),
        Question(2, "qa", ("only",)),
    ]
    chosen = select_questions(questions, max_turns=1)
    assert [q.turns for q in chosen] == [("first",), ("only",)]
    assert select_questions(questions, max_turns=2) == questions


@pytest.mark.parametrize("turns", [0, -1, 1.5, True])
def test_select_rejects_max_turns_below_one(turns: Any) -> None:
    """`max_turns` must be an integer >= 1."""
    with pytest.raises(ConfigError, match="`max_turns` must be an integer >= 1"):
        select_questions(shipped_questions(), max_turns=turns)


def test_select_rejects_an_unknown_category() -> None:
    """Asking for a category that does not occur lists the ones that do."""
    with pytest.raises(ConfigError, match="'poetry' does not occur") as info:
        select_questions(shipped_questions(), categories=["poetry"])
    assert "rag" in str(info.value)


class _ChatTokenizer(ByteTokenizer):
    """A byte tokenizer with a trivial chat template that records the messages it gets."""

    chat_template = "fake"

    def __init__(self) -> None:
        self.seen: list[list[dict[str, str]]] = []

    def apply_chat_template(self, messages: Any, **kwargs: Any) -> dict[str, list[list[int]]]:
        assert kwargs == {"add_generation_prompt": True, "tokenize": True}
        self.seen.append(list(messages))
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
        return {"input_ids": [self.encode(text)]}


def test_chat_template_sees_the_whole_conversation() -> None:
    """With a chat template, the messages (answers included) go through it unchanged."""
    tokenizer = _ChatTokenizer()
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again"},
    ]
    ids = build_prompt_ids(tokenizer, messages)
    assert tokenizer.seen == [messages]
    assert tokenizer.decode(ids) == "<user>hi<assistant>hello<user>again<assistant>"


def test_without_chat_the_turns_are_joined_as_text() -> None:
    """`chat=False` (or no template) encodes the turns joined by blank lines."""
    tokenizer = _ChatTokenizer()
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    ids = build_prompt_ids(tokenizer, messages, chat=False)
    assert tokenizer.seen == []
    assert ids == ByteTokenizer().encode("a\n\nb")


@pytest.mark.skipif(not SPEC_BENCH.is_file(), reason="Spec-Bench file not present")
def test_spec_bench_file_loads_with_its_categories() -> None:
    """Spec-Bench's question file loads: 480 questions, 13 categories, 80 two-turn."""
    questions = load_questions(SPEC_BENCH)
    assert len(questions) == 480
    assert len({q.category for q in questions}) == 13
    assert sum(len(q.turns) == 2 for q in questions) == 80
    assert len(select_questions(questions, limit=3)) == 39

"""Tests of verispec/bench/intervals.py and `verispec report --intervals`.

The records are written by the bench's own :class:`RecordLog`, with timings made by hand:
the ratio must be the report's ``vs ar`` figure, the interval must be paired by question
(a question slow for both methods moves both), and a run must tell a method that is faster
on every question from one that is faster on some and slower on others.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest

from verispec import cli
from verispec.bench.intervals import Interval, load_answers, ratio_intervals, render_intervals
from verispec.bench.prompts import Question
from verispec.bench.records import RecordLog, records_header
from verispec.bench.report import summarise
from verispec.bench.runner import BenchConfig, BenchRun, TurnRecord, TurnResult
from verispec.errors import ConfigError
from verispec.specs.grammar import MethodSpec

DATA = Path(__file__).parent / "data"
QUESTIONS = [Question(i, "qa" if i < 6 else "math", (f"q{i}",) * (2 if i % 3 == 0 else 1))
             for i in range(12)]  # fmt: skip
SPECS = (MethodSpec("ar"), MethodSpec("fast"), MethodSpec("mixed"))  # made-up timings


def _result(tokens: int, seconds: float) -> TurnResult:
    return TurnResult(tokens=list(range(tokens)), text="", seconds=seconds, steps=tokens,
                      committed=tokens, tree_nodes=0, draft_s=0.0, target_s=seconds,
                      verify_s=0.0, peak_memory=1, finish_reason="max_new_tokens")  # fmt: skip


def _records(seconds_of: Callable[[str, int, int], float]) -> list[TurnRecord]:
    """Every question's turns answered by ar, fast and mixed; ``seconds_of(method, q, turn)``."""
    return [
        TurnRecord(q.question_id, q.category, turn, m, 10, _answer(q, turn, m, seconds_of))
        for q in QUESTIONS
        for turn in range(len(q.turns))
        for m in ("ar", "fast", "mixed")
    ]


def _answer(
    q: Question, turn: int, method: str, seconds_of: Callable[[str, int, int], float]
) -> TurnResult:
    return _result(20 + int(q.question_id), seconds_of(method, int(q.question_id), turn))


def _write(path: Path, records: list[TurnRecord]) -> Path:
    header = records_header(BenchConfig(), SPECS, QUESTIONS, {})
    log = RecordLog(path, header, resume=False)
    for record in records:
        log.append(record)
    log.close()
    return path


def _seconds(method: str, question: int, turn: int) -> float:
    """Questions differ eightfold in time; ``fast`` is 1.25x ar on every one, ``mixed``
    1.5x on even questions and 0.7x on odd ones."""
    base = 0.5 * (1 + question % 4) ** 1.5 * (1 + 0.3 * turn)
    if method == "fast":
        return base / 1.25
    if method == "mixed":
        return base / (1.5 if question % 2 == 0 else 0.7)
    return base


def test_the_ratio_is_the_reports_vs_ar_figure(tmp_path: Path) -> None:
    records = _records(_seconds)
    path = _write(tmp_path / "run.records.jsonl", records)
    intervals = ratio_intervals(load_answers([path]), "ar")
    report = summarise(BenchRun(BenchConfig(), SPECS, tuple(QUESTIONS), tuple(records)))
    for method in ("fast", "mixed"):
        assert intervals["all"][method].ratio == pytest.approx(report.methods[method].speedup_vs_ar)
        for category in ("qa", "math"):
            assert intervals[category][method].ratio == pytest.approx(
                report.per_category[category][method].speedup_vs_ar
            )
    assert list(intervals) == ["all", "qa", "math"]
    assert intervals["qa"]["fast"].questions == 6 and intervals["all"]["fast"].questions == 12


def test_a_method_faster_on_every_question_has_a_collapsed_interval_above_one(
    tmp_path: Path,
) -> None:
    """Paired by question: questions whose time varies eightfold, the method 1.25x on each,
    give the interval [1.25, 1.25]; unpaired, it would be wide."""
    path = _write(tmp_path / "r.jsonl", _records(_seconds))
    fast = ratio_intervals(load_answers([path]), "ar")["all"]["fast"]
    assert fast.low == pytest.approx(1.25) and fast.high == pytest.approx(1.25)
    assert fast.verdict == "above"


def test_a_method_faster_on_some_questions_and_slower_on_others_is_level(tmp_path: Path) -> None:
    path = _write(tmp_path / "r.jsonl", _records(_seconds))
    intervals = ratio_intervals(load_answers([path]), "ar")
    mixed = intervals["all"]["mixed"]
    assert mixed.low < 1.0 < mixed.high and mixed.verdict == "level"
    assert mixed.low <= mixed.ratio <= mixed.high


def test_a_method_slower_on_every_question_is_below(tmp_path: Path) -> None:
    rng = random.Random(3)

    def seconds(method: str, question: int, turn: int) -> float:
        base = _seconds("ar", question, turn)
        return base * (rng.uniform(1.05, 1.15) if method == "fast" else 1.0)

    path = _write(tmp_path / "r.jsonl", _records(seconds))
    intervals = ratio_intervals(load_answers([path]), "ar")
    slow = intervals["all"]["fast"]
    assert slow.high < 1.0 and slow.verdict == "below"
    assert 1 / 1.15 <= slow.low <= slow.ratio <= slow.high <= 1 / 1.05
    text = render_intervals(intervals, "ar", 0.95)
    assert "fast (all, qa, math)" in text.splitlines()[-1]


def test_a_wider_level_gives_a_wider_interval_and_the_seed_fixes_it(tmp_path: Path) -> None:
    answers = load_answers([_write(tmp_path / "r.jsonl", _records(_seconds))])
    narrow = ratio_intervals(answers, "ar", level=0.5)["all"]["mixed"]
    wide = ratio_intervals(answers, "ar", level=0.99)["all"]["mixed"]
    assert wide.low < narrow.low and narrow.high < wide.high
    assert ratio_intervals(answers, "ar", seed=5) == ratio_intervals(answers, "ar", seed=5)


def test_shards_are_read_together(tmp_path: Path) -> None:
    """Two records files (a run split by category) give the intervals of the whole run."""
    records = _records(_seconds)
    whole = _write(tmp_path / "whole.jsonl", records)
    a = _write(tmp_path / "a.jsonl", [r for r in records if r.category == "qa"])
    b = _write(tmp_path / "b.jsonl", [r for r in records if r.category == "math"])
    assert ratio_intervals(load_answers([a, b]), "ar") == ratio_intervals(
        load_answers([whole]), "ar"
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"level": 1.0}, r"`level` must be in \(0, 1\); got 1.0"),
        ({"resamples": 10}, "`resamples` must be >= 100; got 10"),
        ({"baseline": "zz"}, "baseline method 'zz' has no answers.*methods there: ar, fast"),
    ],
)
def test_bad_arguments_are_refused(tmp_path: Path, kwargs: dict, match: str) -> None:
    answers = load_answers([_write(tmp_path / "r.jsonl", _records(_seconds))])
    with pytest.raises(ConfigError, match=match):
        ratio_intervals(answers, **kwargs)


def test_a_file_that_is_not_a_records_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read records file"):
        load_answers([tmp_path / "missing.jsonl"])
    report = DATA / "bench_specbench_shard_a.json"
    with pytest.raises(ConfigError, match="is not a `verispec bench` records file"):
        load_answers([report])


def test_verispec_report_prints_the_intervals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = _write(tmp_path / "r.jsonl", _records(_seconds))
    report = str(DATA / "bench_specbench_shard_a.json")
    assert cli.main(["report", report, "--intervals", "ar", "--records", str(records)]) == 0
    out = capsys.readouterr().out
    assert "95% interval" in out and "1.250x" in out
    assert out.strip().splitlines()[-1].endswith("none")  # nothing below ar
    assert cli.main(["report", report, "--records", str(records)]) == 2
    assert "`--records` is read by `--intervals METHOD`" in capsys.readouterr().err
    assert cli.main(["report", report, "--intervals", "ar", "--level", "2"]) == 2
    assert "`--level` must be in (0, 1); got 2.0" in capsys.readouterr().err


def test_an_interval_says_where_it_lies() -> None:
    assert Interval(0.9, 0.85, 0.95, 5).verdict == "below"
    assert Interval(1.1, 1.02, 1.2, 5).verdict == "above"
    assert Interval(1.0, 0.95, 1.05, 5).verdict == "level"


def test_passes_of_one_run_keep_each_answers_fastest(tmp_path: Path) -> None:
    """A file of two passes (``--repeats 2``) gives the intervals of its fastest answers:
    a stall of 3 s on one of ar's answers in the first pass, and on one of fast's in the
    second, leave the collapsed 1.25 of the clean run."""
    clean = _records(_seconds)
    stalled = []
    for repeat, (method, question) in enumerate((("ar", 2), ("fast", 7))):
        for record in clean:
            slow = record.method == method and record.question_id == question
            seconds = record.result.seconds + (3.0 if slow else 0.0)
            result = _result(len(record.result.tokens), seconds)
            stalled.append(attrs.evolve(record, result=result, repeat=repeat))
    header = records_header(BenchConfig(repeats=2), SPECS, QUESTIONS, {})
    log = RecordLog(tmp_path / "r.jsonl", header, resume=False)
    for record in stalled:
        log.append(record)
    log.close()
    fast = ratio_intervals(load_answers([tmp_path / "r.jsonl"]), "ar")["all"]["fast"]
    assert fast.low == pytest.approx(1.25) and fast.high == pytest.approx(1.25)
    first_pass_only = [r for r in stalled if r.repeat == 0]
    _write(tmp_path / "first.jsonl", first_pass_only)
    stalled_ar = ratio_intervals(load_answers([tmp_path / "first.jsonl"]), "ar")["all"]["fast"]
    assert stalled_ar.ratio > 1.3  # the stall is there in one pass

"""Tests of verispec/bench/records.py (the records file, atomic writes, the machine) and of
resuming a run (runner.py's ``finished``).

A killed ``verispec bench`` keeps every finished answer (a real ``kill -9`` of a
subprocess on the smoke model), and ``--resume`` then writes the report an
uninterrupted run writes: every figure but the timings is equal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from verispec import cli
from verispec.bench.loop import run_bench
from verispec.bench.methods import METHODS
from verispec.bench.prompts import Question
from verispec.bench.records import (
    RecordLog,
    check_writable,
    default_records_path,
    machine_info,
    records_header,
    write_atomic,
    write_json,
)
from verispec.bench.runner import BenchConfig, TurnRecord, TurnResult, record_key
from verispec.core.types import GenerationParams
from verispec.errors import ConfigError
from verispec.specs import parse_methods

SPECS = parse_methods("ar,tr:template=8", METHODS)
QUESTIONS = [Question(1, "chat", ("hi", "more")), Question(2, "qa", ("why",))]
SETUP = {"model": "tiny", "dtype": "float32", "device": "cpu"}


def _header(**config: Any) -> dict[str, Any]:
    return records_header(BenchConfig(**config), SPECS, QUESTIONS, SETUP)


def _record(question_id: int, turn: int, method: str, token: int = 7) -> TurnRecord:
    result = TurnResult(
        tokens=[token, token + 1],
        text=f"answer {token}",
        seconds=0.5,
        steps=2,
        committed=2,
        tree_nodes=None,
        draft_s=0.1,
        target_s=0.3,
        verify_s=None,
        peak_memory=1 << 20,
        finish_reason="eos",
    )
    return TurnRecord(question_id, "chat", turn, method, 12, result)


def test_records_round_trip(tmp_path: Path) -> None:
    """Appended answers are reloaded equal, keyed by (question, turn, method)."""
    path = tmp_path / "r.jsonl"
    log = RecordLog(path, _header(), resume=False)
    records = [_record(1, 0, "ar"), _record(1, 1, "ar", 9), _record("x", 0, "tr:template=8")]
    for record in records:
        log.append(record)
    log.close()
    again = RecordLog(path, _header(), resume=True)
    assert again.finished == {record_key(r): r for r in records}


def test_nothing_is_written_before_the_first_answer(tmp_path: Path) -> None:
    """Opening a log creates no file; a header-only file is started afresh without --resume."""
    path = tmp_path / "r.jsonl"
    RecordLog(path, _header(), resume=False).close()
    assert not path.exists()
    path.write_text(json.dumps(_header(seed=5)) + "\n")  # a run killed before any answer
    log = RecordLog(path, _header(), resume=False)
    log.append(_record(1, 0, "ar"))
    log.close()
    assert json.loads(path.read_text().splitlines()[0]) == _header()


def test_a_line_cut_off_by_a_kill_is_dropped(tmp_path: Path) -> None:
    """A partial last line is dropped on resume and overwritten by the next answer."""
    path = tmp_path / "r.jsonl"
    log = RecordLog(path, _header(), resume=False)
    log.append(_record(1, 0, "ar"))
    log.close()
    with open(path, "a") as file:
        file.write('{"question_id": 1, "turn": 1, "met')  # killed mid-write
    log = RecordLog(path, _header(), resume=True)
    assert list(log.finished) == [("1", 0, "ar", 0)]
    log.append(_record(1, 1, "ar"))
    log.close()
    assert list(RecordLog(path, _header(), resume=True).finished) == [
        ("1", 0, "ar", 0),
        ("1", 1, "ar", 0),
    ]


def test_a_damaged_line_is_an_error_naming_it(tmp_path: Path) -> None:
    """An unreadable line other than a cut-off tail is a ConfigError with its line number."""
    path = tmp_path / "r.jsonl"
    lines = [json.dumps(_header()), "{not json", json.dumps({"turn": 0})]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"r\.jsonl, line 2"):
        RecordLog(path, _header(), resume=True)


def test_existing_answers_need_resume(tmp_path: Path) -> None:
    """A records file holding answers is never replaced: without --resume it is an error."""
    path = tmp_path / "r.jsonl"
    log = RecordLog(path, _header(), resume=False)
    log.append(_record(1, 0, "ar"))
    log.close()
    with pytest.raises(ConfigError, match=r"`--records`.*1 answers.*--resume"):
        RecordLog(path, _header(), resume=False)


@pytest.mark.parametrize(
    ("config", "key"), [({"seed": 3}, "config.seed"), ({"top_p": 0.9}, "config.top_p")]
)
def test_resume_refuses_another_benchmark(tmp_path: Path, config: dict, key: str) -> None:
    """Records of a run with other settings are refused, naming the first differing one."""
    path = tmp_path / "r.jsonl"
    log = RecordLog(path, _header(), resume=False)
    log.append(_record(1, 0, "ar"))
    log.close()
    with pytest.raises(ConfigError, match=f"`--resume`.*`{key}`"):
        RecordLog(path, _header(**config), resume=True)


def test_default_records_path_sits_beside_the_json() -> None:
    """`out/run.json` keeps its answers in `out/run.records.jsonl`."""
    assert default_records_path("out/run.json") == Path("out/run.records.jsonl")


def test_atomic_write_leaves_nothing_behind_on_failure(tmp_path: Path) -> None:
    """A write that fails keeps the old file intact and leaves no temporary file."""
    path = tmp_path / "out.json"
    write_json(path, {"old": 1})

    def broken(tmp: Path) -> None:
        tmp.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_atomic(path, broken)
    assert json.loads(path.read_text()) == {"old": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_reports_get_the_permissions_of_a_new_file(tmp_path: Path, umask: int, mode: int) -> None:
    """A report written atomically has the mode ``open`` gives a new file under the umask
    (the temporary file it is renamed from is made 0600)."""
    import os

    old = os.umask(umask)
    try:
        write_json(tmp_path / "report.json", {"a": 1})
    finally:
        os.umask(old)
    assert (tmp_path / "report.json").stat().st_mode & 0o777 == mode


def test_unwritable_outputs_are_refused_up_front(tmp_path: Path) -> None:
    """check_writable refuses a missing directory and a directory path."""
    with pytest.raises(ConfigError, match="does not exist"):
        check_writable(tmp_path / "missing" / "x.json", "--json")
    with pytest.raises(ConfigError, match="is a directory"):
        check_writable(tmp_path, "--json")
    assert check_writable(tmp_path / "x.json", "--json") == tmp_path / "x.json"


def test_machine_info_names_the_libraries() -> None:
    """machine_info reports the CPU, thread count and library versions."""
    info = machine_info("cpu", "float32")
    assert {"cpu", "cpu_count", "torch", "transformers", "verispec"} <= set(info)
    assert info["dtype"] == "float32" and info["device"] == "cpu"


class _Runner:
    def __init__(self, label: str, log: list[tuple[str, int]], learns: bool) -> None:
        self.label, self.log, self.learns_across_prompts = label, log, learns

    def reset(self) -> None:
        pass

    def run(self, prompt_ids: Sequence[int], config: GenerationParams) -> TurnResult:
        self.log.append((self.label, len(prompt_ids)))
        return _record(0, 0, self.label, token=len(prompt_ids)).result


def test_run_bench_keeps_finished_answers_and_replays_learning_methods(smoke_context: Any) -> None:
    """Finished answers are kept as they are (and not reported again); a method that learns
    across prompts answers its finished prompts again, one that does not is not re-run."""
    log: list[tuple[str, int]] = []
    runners = {
        "ar": _Runner("ar", log, False),
        "tr:template=8": _Runner("tr:template=8", log, True),
    }
    hi = len(smoke_context.tokenizer.encode("hi"))  # what the spy answers to "hi"
    finished = {
        ("1", 0, "ar", 0): _record(1, 0, "ar", token=100),
        ("1", 0, "tr:template=8", 0): _record(1, 0, "tr:template=8", token=hi),
    }
    new: list[TurnRecord] = []
    config = BenchConfig(warmup=0, chat=False)
    run = run_bench(
        smoke_context, SPECS, QUESTIONS, config, progress=False, runners=runners,
        on_record=new.append, finished=finished,
    )  # fmt: skip
    kept = [r for r in run.records if record_key(r) in finished]
    assert kept == list(finished.values())
    assert len(run.records) == 6 and len(new) == 4
    assert [label for label, _ in log].count("ar") == 2  # turn 2 of q1, q2
    assert [label for label, _ in log].count("tr:template=8") == 3  # + the replayed turn
    turn_two = next(r for r in run.records if r.method == "ar" and r.turn == 1)
    hi_answer_more = len(smoke_context.tokenizer.encode("hi\n\nanswer 100\n\nmore"))
    assert turn_two.prompt_tokens == hi_answer_more  # the kept answer's text continues


def test_a_replay_that_differs_from_the_records_warns(smoke_context: Any) -> None:
    """A learning method whose replayed answer differs from its record raises a warning."""
    runners = {label: _Runner(label, [], True) for label in ("ar", "tr:template=8")}
    finished = {("1", 0, "ar", 0): _record(1, 0, "ar", token=100)}
    with pytest.warns(UserWarning, match=r"`ar` answered question 1 turn 0 differently"):
        run_bench(
            smoke_context, SPECS, QUESTIONS, BenchConfig(warmup=0, chat=False),
            progress=False, runners=runners, finished=finished,
        )  # fmt: skip


# -- a real kill -9 of `verispec bench --model tiny`, then --resume -----------------------

_QUESTIONS = [
    {"question_id": 1, "category": "chat", "turns": ["Say hi.", "Again."]},
    {"question_id": 2, "category": "qa", "turns": ["Why is the sky blue?"]},
    {"question_id": 3, "category": "qa", "turns": ["How do birds fly?"]},
    {"question_id": 4, "category": "code", "turns": ["Write a loop."]},
]
_TIMING = {"seconds", "tokens_per_s", "speedup_vs_hf", "speedup_vs_ar", "time_split"}
_TIMING |= {"peak_memory_mib", "machine", "prefill_s", "prefill_tokens_per_s"}


def _content(data: Any) -> Any:
    """A report without what differs between two runs of the same answers: the timings."""
    if isinstance(data, dict):
        return {k: _content(v) for k, v in data.items() if k not in _TIMING}
    return data


def test_killed_bench_keeps_its_answers_and_resumes_to_the_same_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kill -9` half-way keeps every finished answer; `--resume` then writes the report of
    an uninterrupted run (T = 0.7, top-p 0.9; ar, pld, tr, dtr; every figure but timings).
    The drafters have fixed sizes: a size chosen by the device follows measured times, so
    its trees (never its text) may differ between two runs."""
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps(q) + "\n" for q in _QUESTIONS))
    args = ["bench", "--model", "tiny", "--threads", "1", "--questions", str(questions),
            "--limit", "2", "--max-new-tokens", "12", "--no-progress", "--temperature", "0.7",
            "--top-p", "0.9", "--methods", "ar,pld:max=10,tr:template=8,dtr:budget=16"]  # fmt: skip
    killed, whole = tmp_path / "killed.json", tmp_path / "whole.json"
    records = default_records_path(killed)
    env = {**os.environ, "PYTHONPATH": str(Path(cli.__file__).resolve().parents[1])}
    process = subprocess.Popen(
        [sys.executable, "-m", "verispec", *args, "--json", str(killed)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            if records.exists() and records.read_text().count("\n") >= 7:  # header + 6 answers
                break
            time.sleep(0.02)
        assert process.poll() is None, "the run ended before it could be killed"
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait()
    kept = records.read_text().count("\n") - 1
    assert 6 <= kept < 20 and not killed.exists()  # answers kept, no report yet
    assert cli.main([*args, "--json", str(killed), "--resume"]) == 0
    assert f"resuming: {kept} answers kept" in capsys.readouterr().err
    assert cli.main([*args, "--json", str(whole)]) == 0
    resumed, uninterrupted = (json.loads(p.read_text()) for p in (killed, whole))
    assert resumed["command"].replace(str(killed), str(whole)) == uninterrupted["command"]
    assert _content({**resumed, "command": None}) == _content({**uninterrupted, "command": None})
    assert resumed["methods"]["tr:template=8"]["identical_count"] == 5  # seeded identity


@pytest.mark.filterwarnings("ignore:.*differently in two passes")  # the stand-in's answers
def test_a_resumed_run_of_several_passes_keeps_each_pass_answers(smoke_context: Any) -> None:
    """Resuming a run of two passes killed in its second keeps the answers of both passes
    (keyed by pass) and generates only the second pass's missing ones."""
    log: list[tuple[str, int]] = []
    runners = {label: _Runner(label, log, False) for label in ("ar", "tr:template=8")}
    finished = {
        (str(q), turn, label, 0): _record(q, turn, label)
        for q, turns in ((1, 2), (2, 1))
        for turn in range(turns)
        for label in runners
    }
    finished[("1", 0, "ar", 1)] = attrs.evolve(_record(1, 0, "ar"), repeat=1)
    new: list[TurnRecord] = []
    config = BenchConfig(warmup=0, chat=False, repeats=2)
    run = run_bench(
        smoke_context, SPECS, QUESTIONS, config, progress=False, runners=runners,
        on_record=new.append, finished=finished,
    )  # fmt: skip
    assert len(log) == 5 and [r.repeat for r in new] == [1] * 5
    assert sorted(record_key(r) for r in new) == sorted(
        (str(q), turn, label, 1)
        for q, turns in ((1, 2), (2, 1))
        for turn in range(turns)
        for label in runners
        if (q, turn, label) != (1, 0, "ar")
    )
    assert len(run.records) == 6

"""Every finished answer on disk as it is produced, so a killed benchmark can resume.

``verispec bench`` appends each measured answer to a JSON Lines *records file*
(``--records PATH``; by default beside ``--json``: ``out.json`` →
``out.records.jsonl``) the moment it is finished, flushed and synced, so a run
killed half-way loses at most the answer in progress. ``--resume`` reloads the
answers and :func:`~verispec.bench.runner.run_bench` generates only the missing
ones; the final report is the one an uninterrupted run would have written (its
timings are those measured when each answer was produced).

The file's first line is a header: the run's settings, methods, setup (model,
dtype, device) and a digest of the selected questions. A resumed run must match
it exactly, so answers of another benchmark are never mixed in. A last line cut
off by the kill is dropped; any other unreadable line is an error naming it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import attrs

from verispec.bench.prompts import Question
from verispec.bench.registry import MethodSpec
from verispec.bench.runner import BenchConfig, RecordKey, TurnRecord, TurnResult, record_key
from verispec.errors import ConfigError

__all__ = ["RecordLog", "default_records_path", "records_header"]

_FORMAT = "verispec-bench-records/1"


def default_records_path(json_path: str | Path) -> Path:
    """The records file beside a JSON report: ``out.json`` → ``out.records.jsonl``."""
    path = Path(json_path)
    return path.with_name(path.stem + ".records.jsonl")


def records_header(
    config: BenchConfig,
    specs: Sequence[MethodSpec],
    questions: Sequence[Question],
    setup: dict[str, Any],
) -> dict[str, Any]:
    """The header a records file must carry to be resumed by this run (JSON values only)."""
    selected = [[str(q.question_id), q.category, list(q.turns)] for q in questions]
    digest = hashlib.sha256(json.dumps(selected, ensure_ascii=False).encode()).hexdigest()
    header = {
        "format": _FORMAT,
        "config": attrs.asdict(config),
        "methods": [[spec.label, spec.name, spec.params] for spec in specs],
        "questions": {"count": len(questions), "sha256": digest},
        "setup": setup,
    }
    return dict(json.loads(json.dumps(header, default=str)))  # tuples become lists


def _record_to_json(record: TurnRecord) -> dict[str, Any]:
    data = attrs.asdict(record)
    data["result"]["tokens"] = list(record.result.tokens)
    return data


_RESULT_TYPES: dict[str, tuple[type, ...]] = {
    "text": (str,),
    "seconds": (int, float),
    "steps": (int,),
    "committed": (int,),
    "peak_memory": (int,),
    "finish_reason": (str,),
}
_OPTIONAL_FLOATS = ("draft_s", "target_s", "verify_s")


def _record_from_json(data: Any, where: str) -> TurnRecord:
    """A :class:`TurnRecord` from one line's JSON; ConfigError naming ``where`` if malformed."""

    def bad(what: str) -> ConfigError:
        return ConfigError(f"{where}: not a verispec bench record ({what}).")

    if not isinstance(data, dict) or not isinstance(data.get("result"), dict):
        raise bad("a record is an object with a `result` object")
    result = data["result"]
    tokens = result.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        raise bad("`result.tokens` must be a list of integers")
    for name, types in _RESULT_TYPES.items():
        value = result.get(name)
        if isinstance(value, bool) or not isinstance(value, types):
            raise bad(f"`result.{name}` must be {' or '.join(t.__name__ for t in types)}")
    for name in (*_OPTIONAL_FLOATS, "tree_nodes"):
        value = result.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise bad(f"`result.{name}` must be a number or null")
    qid, turn = data.get("question_id"), data.get("turn")
    if isinstance(qid, bool) or not isinstance(qid, int | str):
        raise bad("`question_id` must be an integer or a string")
    if isinstance(turn, bool) or not isinstance(turn, int) or turn < 0:
        raise bad("`turn` must be an integer >= 0")
    for name in ("category", "method"):
        if not isinstance(data.get(name), str):
            raise bad(f"`{name}` must be a string")
    if isinstance(data.get("prompt_tokens"), bool) or not isinstance(
        data.get("prompt_tokens"), int
    ):
        raise bad("`prompt_tokens` must be an integer")
    fields = {f.name for f in attrs.fields(TurnResult)}
    return TurnRecord(
        question_id=qid,
        category=data["category"],
        turn=turn,
        method=data["method"],
        prompt_tokens=data["prompt_tokens"],
        result=TurnResult(**{k: v for k, v in result.items() if k in fields}),
    )


def _first_difference(mine: Any, theirs: Any, path: str = "") -> str:
    """The first key (dotted path) where two JSON values differ."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        for key in sorted(set(mine) | set(theirs), key=str):
            if mine.get(key) != theirs.get(key):
                return _first_difference(mine.get(key), theirs.get(key), f"{path}.{key}")
    return path.lstrip(".") or "(the whole header)"


class RecordLog:
    """The records file of one run: the answers it already holds, and appending more.

    Args:
        path: the JSON Lines file.
        header: :func:`records_header` of this run.
        resume: keep the answers of an earlier run with the same header. Without it,
            a file that already holds answers is an error (never silently replaced);
            a missing file, or one holding only a header, starts afresh either way.

    Nothing is written until the first :meth:`append`.

    Raises:
        ConfigError: the file holds answers and ``resume`` is false; its header differs
            from this run's (the message names the first differing setting); a line
            other than the last is not a record; the file cannot be read.
    """

    def __init__(self, path: str | Path, header: dict[str, Any], *, resume: bool) -> None:
        self.path = Path(path)
        self.header = header
        self.finished: dict[RecordKey, TurnRecord] = {}
        self._keep_bytes = 0  # bytes of the existing file to keep (a cut-off tail dropped)
        self._file: IO[str] | None = None
        self.added = 0
        if self.path.exists():
            self._load(resume)

    def _load(self, resume: bool) -> None:
        try:
            raw = self.path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"`--records` {str(self.path)!r} cannot be read: {exc}.") from None
        # the part after the last newline is empty, or a line cut off by a kill: dropped
        complete = raw.split(b"\n")[:-1]
        parsed: list[Any] = []
        for number, line in enumerate(complete, start=1):
            try:
                parsed.append(json.loads(line))
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise ConfigError(
                    f"{self.path}, line {number}: not valid JSON; the records file is damaged."
                ) from None
            self._keep_bytes += len(line) + 1
        if not parsed:
            self._keep_bytes = 0
            return
        header, *records = parsed
        if not isinstance(header, dict) or header.get("format") != _FORMAT:
            raise ConfigError(f"{self.path}, line 1: not a verispec bench records file.")
        if not records:
            self._keep_bytes = 0  # only a header: start afresh
            return
        if not resume:
            raise ConfigError(
                f"`--records` {str(self.path)!r} already holds {len(records)} answers of an "
                "earlier run; pass --resume to continue it, or remove the file."
            )
        if header != self.header:
            key = _first_difference(self.header, header)
            raise ConfigError(
                f"`--resume`: {self.path} was written by another benchmark (it differs in "
                f"`{key}`: {_lookup(header, key)!r} there, {_lookup(self.header, key)!r} now); "
                "run with the same settings, or use another --records file."
            )
        for number, data in enumerate(records, start=2):
            record = _record_from_json(data, f"{self.path}, line {number}")
            self.finished[record_key(record)] = record

    def append(self, record: TurnRecord) -> None:
        """Write one finished answer (and the header first, on a new file); flush and sync."""
        if self._file is None:
            self._open()
        assert self._file is not None
        self._file.write(json.dumps(_record_to_json(record), ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.added += 1

    def _open(self) -> None:
        if self._keep_bytes:
            with open(self.path, "r+b") as existing:
                existing.truncate(self._keep_bytes)  # drop a line cut off by the kill
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            return
        self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._file.write(json.dumps(self.header) + "\n")

    @property
    def total(self) -> int:
        """Answers in the file: reloaded plus appended."""
        return len(self.finished) + self.added

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _lookup(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data

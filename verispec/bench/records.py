"""The benchmark's files: answers kept as they are produced, JSON read back, atomic writes.

``verispec bench`` appends each measured answer to a JSON Lines *records file* the moment
it is finished (flushed and synced); ``--resume`` reloads them (:class:`RecordLog`). The
file's first line is a header (:func:`records_header`) that a resumed run must match; a
last line cut off by a kill is dropped. docs/benchmarks.rst, "Interrupted runs", has the
rules. Answers and reports are read back by one function, :func:`from_json`, which checks
each field of an ``attrs`` class against its annotated type. Every output is written to a
temporary file beside its destination and renamed into place (:func:`write_atomic`).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

import attrs
import torch

from verispec.bench.prompts import Question
from verispec.bench.runner import BenchConfig, RecordKey, TurnRecord, record_key
from verispec.core.paths import beside, write_atomic
from verispec.errors import ConfigError
from verispec.specs import MethodSpec

__all__ = [
    "RecordLog", "check_writable", "default_records_path", "from_json", "json_object",
    "machine_info", "records_header", "write_atomic", "write_json", "write_text"
]  # fmt: skip

_FORMAT = "verispec-bench-records/1"
T = TypeVar("T")


def json_object(data: Any, where: str) -> dict[str, Any]:
    """``data`` if it is a JSON object, else :class:`ConfigError` naming ``where``."""
    if not isinstance(data, dict):
        kind = "null" if data is None else type(data).__name__
        raise ConfigError(f"`{where}` must be a JSON object; got {kind}.")
    return data


def _fits(value: Any, hint: Any) -> bool:
    """Whether a JSON value can stand for a field annotated ``hint``."""
    origin, args = typing.get_origin(hint) or hint, typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arm) for arm in args)
    if isinstance(value, bool) or value is None:
        return hint is type(value)
    if origin is tuple:  # of integers, written as a list
        return isinstance(value, list) and all(_fits(item, args[0]) for item in value)
    return isinstance(value, (int, float) if hint is float else origin)


def _shown(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_shown(arm) for arm in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        return "a list of integers"
    names = {float: "int or float", type(None): "null"}
    return names.get(hint, getattr(typing.get_origin(hint) or hint, "__name__", str(hint)))


def from_json(cls: type[T], data: Any, where: str) -> T:
    """An instance of the ``attrs`` class ``cls`` from JSON ``data``: every field without a
    default present, each value of its annotated type (an ``attrs`` class read in turn).

    Raises:
        ConfigError: naming the field (``where.field``), what it must be and what it is.
    """
    data, hints, values = json_object(data, where), typing.get_type_hints(cls), {}
    for field in attrs.fields(cls):  # type: ignore[arg-type]
        name, hint = field.name, hints[field.name]
        if name not in data:
            if field.default is attrs.NOTHING:
                raise ConfigError(f"`{where}` must have the field `{name}`; it is missing.")
        elif attrs.has(hint):
            values[name] = from_json(hint, data[name], f"{where}.{name}")
        elif _fits(data[name], hint):
            values[name] = data[name]
        else:
            raise ConfigError(f"`{where}.{name}` must be {_shown(hint)}; got {data[name]!r}.")
    return cls(**values)


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


def _first_difference(mine: Any, theirs: Any, path: str = "") -> tuple[str, Any, Any]:
    """The first key (dotted path) where two JSON values differ, and the two values there."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        for key in sorted(set(mine) | set(theirs), key=str):
            if mine.get(key) != theirs.get(key):
                return _first_difference(mine.get(key), theirs.get(key), f"{path}.{key}")
    return path.lstrip(".") or "(the whole header)", mine, theirs


class RecordLog:
    """The records file of one run: the answers it already holds, and appending more.

    Args:
        path: the JSON Lines file; ``header``: :func:`records_header` of this run.
        resume: keep the answers of an earlier run with the same header. Without it, a
            file that already holds answers is an error (never silently replaced); a
            missing file, or one holding only a header, starts afresh either way.

    Nothing is written until the first :meth:`append`.

    Raises:
        ConfigError: the file holds answers and ``resume`` is false; its header differs
            from this run's (naming the first differing setting); a line other than the
            last is not a record; the file cannot be read.
    """

    def __init__(self, path: str | Path, header: dict[str, Any], *, resume: bool) -> None:
        self.path, self.header = Path(path), header
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
        parsed: list[Any] = []
        # the part after the last newline is empty, or a line cut off by a kill: dropped
        for number, line in enumerate(raw.split(b"\n")[:-1], start=1):
            try:
                parsed.append(json.loads(line))
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise ConfigError(
                    f"{self.path}, line {number}: not valid JSON; the records file is damaged."
                ) from None
        if not parsed:
            return
        header, *records = parsed
        if not isinstance(header, dict) or header.get("format") != _FORMAT:
            raise ConfigError(f"{self.path}, line 1: not a verispec bench records file.")
        if not records:
            return  # only a header: start afresh
        if not resume:
            raise ConfigError(
                f"`--records` {str(self.path)!r} already holds {len(records)} answers of an "
                "earlier run; pass --resume to continue it, or remove the file."
            )
        if header != self.header:
            key, now, there = _first_difference(self.header, header)
            raise ConfigError(
                f"`--resume`: {self.path} was written by another benchmark (it differs in "
                f"`{key}`: {there!r} there, {now!r} now); "
                "run with the same settings, or use another --records file."
            )
        for number, data in enumerate(records, start=2):
            try:
                record = from_json(TurnRecord, data, "record")
            except ConfigError as exc:
                raise ConfigError(f"{self.path}, line {number}: {exc}") from None
            self.finished[record_key(record)] = record
        self._keep_bytes = raw.rfind(b"\n") + 1  # every whole line

    def append(self, record: TurnRecord) -> None:
        """Write one finished answer (and the header first, on a new file); flush and sync."""
        if self._file is None:
            self._file = open(self.path, "a" if self._keep_bytes else "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
            if self._keep_bytes:
                self._file.truncate(self._keep_bytes)  # drop a line cut off by the kill
            else:
                self._file.write(json.dumps(self.header) + "\n")
        self._file.write(json.dumps(attrs.asdict(record), ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.added += 1

    @property
    def total(self) -> int:
        """Answers in the file: reloaded plus appended."""
        return len(self.finished) + self.added

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def check_writable(path: str | Path, what: str) -> Path:
    """Fail now, before a long run, if ``path`` cannot be written later: create (and
    remove) a temporary file beside it and open an existing one for appending, as the
    write will (permission bits alone say yes to root and on read-only mounts)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"`{what}` must be a file path; {str(path)!r} is a directory.")
    if not path.parent.is_dir():
        raise ConfigError(f"`{what}`: the directory {str(path.parent)!r} does not exist.")
    try:
        beside(path, ".probe").unlink()
        if path.exists():
            with open(path, "a"):
                pass
    except OSError as exc:
        raise ConfigError(
            f"`{what}` must be writable; {str(path)!r} cannot be written: {exc.strerror or exc}."
        ) from None
    return path


def write_text(path: str | Path, text: str) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json(path: str | Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def machine_info(
    device: torch.device | str = "cpu", dtype: Any = None, runtime: str | None = None
) -> dict[str, Any]:
    """What ran the benchmark: CPU and its matrix instruction sets, cores, threads, GPU,
    library versions and the model runtime."""
    import transformers

    import verispec
    from verispec.kernels.cpu.features import cpu_features

    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": names[0] if names else platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "verispec": verispec.__version__,
        "device": str(device),
    }
    if dtype is not None:
        info["dtype"] = str(dtype).replace("torch.", "")
    info["cpu_flags"] = " ".join(cpu_features()) or "unknown"
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    if runtime:
        info["runtime"] = runtime
    return info

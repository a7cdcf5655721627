"""Reading benchmark reports back from JSON, and merging reports of sharded runs.

A long ``verispec bench`` run can be split into shards over disjoint answers
(typically ``--categories a,b`` in one process and ``--categories c,d`` in
another) and its JSON reports merged afterwards. :class:`~verispec.bench.report.Figures`
hold sums over answers, so the merge is addition; the ratios follow, and the speedups
over ``hf`` and ``ar`` are recomputed. Per-category figures belong to one shard each
and are kept as they are.

Reports written before the figures stored ``committed`` and ``tree_nodes`` (every
committed report up to issue 14) are read too: those two sums are recovered from
their ratios, ``round(MAT x steps)`` and ``round(nodes/step x steps)``, integers in
every report.
"""

from __future__ import annotations

import functools
import json
import operator
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verispec.bench.report import BenchReport, Figures, _commands, _with_speedups
from verispec.errors import ConfigError

__all__ = ["load_report", "merge_reports", "report_from_json"]


# Every field of a report's figures and the JSON types it may hold (None where optional):
# the sums Figures keeps, and the ratios that reports written before it stored sums
# carry instead of `committed` and `tree_nodes`.
_NUMBER = (int, float)
_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "outputs": ((int,), False),
    "new_tokens": ((int,), False),
    "seconds": (_NUMBER, False),
    "steps": ((int,), False),
    "mean_accepted": (_NUMBER, False),
    "mean_tree_size": (_NUMBER, True),
    "peak_memory_mib": (_NUMBER, False),
    "time_split": ((dict,), True),
    "speedup_vs_hf": (_NUMBER, True),
    "speedup_vs_ar": (_NUMBER, True),
    "identical_count": ((int,), True),
    "finish_reasons": ((dict,), False),
}


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _object(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"`{where}` must be a JSON object; got {_kind(data)}.")
    return data


def _figures_from_json(data: Any, where: str) -> Figures:
    data = _object(data, where)
    values = {}
    for name, (types, optional) in _FIELDS.items():
        if name not in data:
            raise ConfigError(f"`{where}` must have the field `{name}`; it is missing.")
        value = data[name]
        ok = (value is None and optional) or (
            isinstance(value, types) and not isinstance(value, bool)
        )
        if not ok:
            want = " or ".join(t.__name__ for t in types) + (" or null" if optional else "")
            raise ConfigError(f"`{where}.{name}` must be {want}; got {value!r}.")
        values[name] = value
    steps = values["steps"]
    mat, size = values.pop("mean_accepted"), values.pop("mean_tree_size")
    committed, nodes = data.get("committed"), data.get("tree_nodes", _OLD)
    for name, value in (("committed", committed), ("tree_nodes", nodes)):
        if value is not None and value is not _OLD and type(value) is not int:
            raise ConfigError(f"`{where}.{name}` must be int or null; got {value!r}.")
    values["committed"] = round(mat * steps) if committed is None else committed
    if nodes is _OLD:  # an old report: nodes/step x steps, an integer in each report
        nodes = None if size is None else round(size * steps)
    values["tree_nodes"] = nodes
    return Figures(**values)


_OLD = object()  # marks a report written before the figures stored `tree_nodes`


def report_from_json(data: Any) -> BenchReport:
    """Rebuild a report from :func:`to_json`'s output (``run`` is ``None``).

    Raises:
        ConfigError: a key is missing or holds the wrong type (the message names it).
    """
    data = _object(data, "report")
    methods, specs = {}, {}
    for label, entry in _object(data.get("methods"), "methods").items():
        entry = _object(entry, f"methods.{label}")
        name, params = entry.get("method"), entry.get("params")
        if not isinstance(name, str) or not isinstance(params, dict):
            raise ConfigError(
                f"`methods.{label}` must hold `method` (a string) and `params` (an object); "
                f"got {_kind(name)} and {_kind(params)}."
            )
        methods[label] = _figures_from_json(entry, f"methods.{label}")
        specs[label] = (name, params)
    per_category = {
        category: {
            label: _figures_from_json(figures, f"per_category.{category}.{label}")
            for label, figures in _object(group, f"per_category.{category}").items()
        }
        for category, group in _object(data.get("per_category"), "per_category").items()
    }
    mismatches = data.get("mismatches") or []
    if not isinstance(mismatches, list):
        raise ConfigError(f"`mismatches` must be a list; got {_kind(mismatches)}.")
    command = data.get("command")
    if not (command is None or isinstance(command, (str, list))):
        raise ConfigError(f"`command` must be a string or a list; got {_kind(command)}.")
    return BenchReport(
        methods=methods,
        per_category=per_category,
        reference=data.get("reference"),
        mismatches=mismatches,
        config=_object(data.get("config"), "config"),
        specs=specs,
        machine=_object(data.get("machine") or {}, "machine"),
        command=command,
    )


def load_report(path: str | Path) -> BenchReport:
    """Read a JSON report written by ``verispec bench --json``.

    Raises:
        ConfigError: the file is missing, unreadable, not JSON or not a report; the
            message names the file.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"`{path}` must be an existing JSON report; no such file.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"`{path}` must be a readable JSON report; got {exc}.") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"`{path}` must be valid JSON; got {exc}.") from None
    try:
        return report_from_json(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: not a `verispec bench --json` report: {exc}") from None


# Settings every shard must share: the answers are only comparable under the same ones.
_SHARED_CONFIG = (
    "max_new_tokens",
    "temperature",
    "seed",
    "chat",
    "warmup",
    "top_k",
    "top_p",
    "min_p",
    "verifier",
    "carry_corpus",
)
_SHARED_MACHINE = ("dtype", "device")


def _categories(report: BenchReport) -> list[str]:
    return list(report.config.get("categories") or report.per_category)


def _check_shards(reports: Sequence[BenchReport], names: Sequence[str]) -> None:
    first, first_name = reports[0], names[0]
    seen = {c: first_name for c in _categories(first)}
    for report, name in zip(reports[1:], names[1:], strict=True):
        if set(report.methods) != set(first.methods) or report.specs != first.specs:
            raise ConfigError(
                f"`methods` must be the same in every shard; got {list(first.methods)} in "
                f"{first_name} and {list(report.methods)} in {name}."
            )
        for key in _SHARED_CONFIG:
            mine, theirs = first.config.get(key), report.config.get(key)
            if mine != theirs:
                raise ConfigError(
                    f"`{key}` must be the same in every shard; got {mine!r} in {first_name} "
                    f"and {theirs!r} in {name}."
                )
        for key in _SHARED_MACHINE:
            mine, theirs = (first.machine or {}).get(key), (report.machine or {}).get(key)
            if mine != theirs:
                raise ConfigError(
                    f"`{key}` must be the same in every shard; got {mine!r} in {first_name} "
                    f"and {theirs!r} in {name}."
                )
        for category in _categories(report):
            if category in seen:
                raise ConfigError(
                    f"`categories` must not overlap between shards; got `{category}` in both "
                    f"{seen[category]} and {name}. Merge runs over disjoint answers only "
                    "(split them with `--categories`)."
                )
            seen[category] = name
        others = sorted(
            key
            for key in set(first.machine or {}) | set(report.machine or {})
            if (first.machine or {}).get(key) != (report.machine or {}).get(key)
        )
        if others:
            warnings.warn(
                f"{name} ran on a different machine than {first_name} (differs in: "
                f"{', '.join(others)}); its timings are merged as they are.",
                UserWarning,
                stacklevel=3,
            )


def merge_reports(
    reports: Sequence[BenchReport], names: Sequence[str] | None = None
) -> BenchReport:
    """Merge reports of runs over disjoint answers (e.g. split with ``--categories``).

    Per-method figures are recomputed from the shards' sums, speedups from the
    merged tokens/s of ``hf`` and ``ar``; per-category figures are taken as they
    are. ``config`` sums ``questions`` and ``answers_per_method`` and concatenates
    ``categories``; ``machine`` is the first shard's; ``command`` lists every
    shard's command line, in order. A difference in the machine other than dtype
    and device is reported with a :class:`UserWarning`.

    Args:
        reports: the shards, in the order their categories should be listed.
        names: what to call each shard in error messages (default ``report 1``...).

    Raises:
        ConfigError: no report; shards that share a category, differ in their
            methods, in ``max_new_tokens``, ``temperature``, ``seed``, ``chat``,
            ``warmup``, the sampling filters, the verifier, or in the machine's
            ``dtype`` or ``device``.
    """
    if not reports:
        raise ConfigError("`reports` must hold at least one report; got none.")
    names = list(names) if names is not None else [f"report {i + 1}" for i in range(len(reports))]
    if len(names) != len(reports):
        raise ConfigError(f"`names` must name every report; got {len(names)} names.")
    _check_shards(reports, names)
    first = reports[0]
    labels = list(first.methods)
    methods = _with_speedups(
        {
            label: functools.reduce(operator.add, [r.methods[label] for r in reports])
            for label in labels
        }
    )
    config = dict(first.config)
    config["methods"] = labels
    config["questions"] = sum(r.config.get("questions", 0) for r in reports)
    config["answers_per_method"] = sum(r.config.get("answers_per_method", 0) for r in reports)
    config["categories"] = [c for r in reports for c in _categories(r)]
    commands = [c for r in reports for c in _commands(r.command)]
    return BenchReport(
        methods=methods,
        per_category={c: group for r in reports for c, group in r.per_category.items()},
        reference=first.reference,
        mismatches=[m for r in reports for m in r.mismatches],
        config=config,
        specs=dict(first.specs),
        machine=first.machine,
        command=commands or None,
    )

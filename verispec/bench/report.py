"""Figures from a benchmark run; the tables, Markdown and JSON that show them; merging.

The figures, the JSON report and merging are defined in docs/benchmarks.rst ("What each
figure means", "JSON report", "Sharding a run"). :class:`Figures` store sums over answers
and derive every ratio, so a group's figures are the sum of its answers' and the reports of
runs over disjoint answers merge by addition (:func:`merge_reports`).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from verispec.bench.records import from_json, json_object
from verispec.bench.runner import BenchRun, TurnRecord, TurnResult
from verispec.errors import ConfigError

__all__ = [
    "BenchReport", "Figures", "identical_note", "load_report", "merge_reports",
    "render_category_table", "render_markdown", "render_table", "report_from_json", "summarise",
    "to_json"
]  # fmt: skip

_PARTS = ("draft", "target", "verify")  # the measured parts of the time split
_PEERS = ("hf", "ar")  # the baselines of the speedups and the possible references


def _split(parts: Mapping[str, float | None], seconds: float) -> dict[str, float]:
    """The time split: the measured parts (in :data:`_PARTS` order), and ``other``, the rest
    of the wall-clock time."""
    known = {p: float(parts[p]) for p in _PARTS if parts.get(p) is not None}  # type: ignore[arg-type]
    return {**known, "other": max(seconds - sum(known.values()), 0.0)}


@attrs.frozen
class Figures:
    """Sums over a group of answers of one method; every ratio is derived from them.

    Attributes:
        outputs, new_tokens, seconds, steps, committed: answers, their new tokens and
            wall-clock seconds, target forwards, tokens those forwards committed.
        tree_nodes: draft nodes scored, ``None`` where a method does not expose them.
        peak_memory_mib: the largest per-answer peak (a maximum, not a sum).
        time_split: seconds per part (draft, target, verify where measured; other);
            ``None`` where the target time is unknown.
        identical_count: answers token-identical to the reference (``None``: not compared).
        finish_reasons: answers per finish reason.
        prompt_tokens, prefill_s: the answers' prompt tokens and the seconds of their
            prompts' forwards (``TurnResult.prefill_s``); ``None`` where not measured.
        speedup_vs_hf, speedup_vs_ar: tokens/s over ``hf``'s / ``ar``'s on the same
            answers, set by the report that holds both.
    """

    outputs: int
    new_tokens: int
    seconds: float
    steps: int
    committed: int
    tree_nodes: int | None
    peak_memory_mib: float
    time_split: dict[str, float] | None
    identical_count: int | None
    finish_reasons: dict[str, int]
    prompt_tokens: int | None = None
    prefill_s: float | None = None
    speedup_vs_hf: float | None = None
    speedup_vs_ar: float | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def prefill_tokens_per_s(self) -> float | None:
        """Prompt tokens per second of the prompts' forwards (``None``: not measured)."""
        if self.prompt_tokens is None or not self.prefill_s:
            return None
        return self.prompt_tokens / self.prefill_s

    @property
    def mean_accepted(self) -> float:
        return self.committed / self.steps if self.steps else 0.0

    @property
    def mean_tree_size(self) -> float | None:
        return self.tree_nodes / self.steps if self.steps and self.tree_nodes is not None else None

    @property
    def identical(self) -> float | None:
        count = self.identical_count
        return count / self.outputs if count is not None and self.outputs else None

    def __add__(self, other: Figures) -> Figures:
        """The figures over both groups of answers (disjoint); speedups left unset."""

        def plus(mine: Any, theirs: Any) -> Any:
            if mine is None or theirs is None:
                return None
            if isinstance(mine, dict):
                return {k: mine.get(k, 0) + theirs.get(k, 0) for k in {**mine, **theirs}}
            return mine + theirs

        names = [f.name for f in attrs.fields(Figures) if not f.name.startswith("speedup")]
        sums = {name: plus(getattr(self, name), getattr(other, name)) for name in names}
        sums["peak_memory_mib"] = max(self.peak_memory_mib, other.peak_memory_mib)
        if sums["time_split"] is not None:
            sums["time_split"] = _split(sums["time_split"], sums["seconds"])
        return Figures(**sums)

    @classmethod
    def of(
        cls, result: TurnResult, identical: bool | None, prompt_tokens: int | None = None
    ) -> Figures:
        """The figures of one answer (``identical``: to the reference; ``None``: not
        compared) to a prompt of ``prompt_tokens``."""
        r, parts = result, {p: getattr(result, f"{p}_s") for p in _PARTS}
        sums = (1, len(r.tokens), r.seconds, r.steps, r.committed, r.tree_nodes)
        split = None if r.target_s is None else _split(parts, r.seconds)
        count = None if identical is None else int(identical)
        prompt = None if r.prefill_s is None else prompt_tokens
        memory = r.peak_memory / float(1 << 20)
        return cls(*sums, memory, split, count, {r.finish_reason: 1}, prompt, r.prefill_s)

    def as_dict(self) -> dict[str, Any]:
        """The sums and the ratios derived from them (the JSON report's fields)."""
        ratios = (
            "tokens_per_s", "prefill_tokens_per_s", "mean_accepted", "mean_tree_size",
            "identical",
        )  # fmt: skip
        return {**attrs.asdict(self), **{name: getattr(self, name) for name in ratios}}


@attrs.frozen
class BenchReport:
    """The summary of a :class:`~verispec.bench.runner.BenchRun`, or of several merged.

    Attributes:
        methods: figures per method label, in the run's order.
        per_category: figures per category, then per method label.
        reference: the label outputs are compared with: ``hf`` or ``ar`` at
            temperature 0, ``ar`` above (``None`` when neither ran).
        mismatches: answers that differ from the reference: method, question id,
            turn and the index of the first differing token.
        config: ``BenchConfig``'s fields plus ``methods`` (labels), ``questions``,
            ``answers_per_method`` and ``categories``.
        specs: per method label, the method's registry name and every parameter.
        run: the raw measurements (``None`` for a report loaded from JSON or merged).
        machine: what ran it, when known (loaded reports); the renderers' default.
        command: the command line that produced it, or one per shard of a merged report.
    """

    methods: dict[str, Figures]
    per_category: dict[str, dict[str, Figures]]
    reference: str | None
    mismatches: list[dict[str, Any]]
    config: dict[str, Any]
    specs: dict[str, tuple[str, dict[str, Any]]]
    run: BenchRun | None = None
    machine: dict[str, Any] | None = None
    command: str | list[str] | None = None


def _with_speedups(raw: Mapping[str, Figures]) -> dict[str, Figures]:
    """Figures of one group of answers, each with its speedups over ``hf`` and ``ar``."""
    rates = {peer: raw[peer].tokens_per_s if peer in raw else 0.0 for peer in _PEERS}

    def speedups(f: Figures) -> dict[str, Any]:
        return {f"speedup_vs_{p}": f.tokens_per_s / r if r else None for p, r in rates.items()}

    return {label: attrs.evolve(f, **speedups(f)) for label, f in raw.items()}


def _total(figures: Sequence[Figures]) -> Figures:
    return sum(figures[1:], figures[0])


def summarise(run: BenchRun) -> BenchReport:
    """Aggregate a run's answers per method and per category."""
    greedy = run.config.temperature == 0
    reference_label = next((p for p in _PEERS if p in run.labels and (greedy or p == "ar")), None)
    # transformers' peers sample with torch's global generator: compared only when greedy
    compared = {s.label for s in run.methods if greedy or not s.name.startswith("hf")}
    reference = {
        (str(r.question_id), r.turn): r.result.tokens
        for r in run.records
        if r.method == reference_label
    }

    def want(r: TurnRecord) -> Sequence[int] | None:
        return reference.get((str(r.question_id), r.turn)) if r.method in compared else None

    mismatches = []
    for r in run.records:
        expected, got = want(r), r.result.tokens
        if expected is not None and expected != got:
            pairs = enumerate(zip(expected, got, strict=False))
            first = next((i for i, (a, b) in pairs if a != b), min(len(expected), len(got)))
            where = {"method": r.method, "question_id": r.question_id, "turn": r.turn}
            mismatches.append({**where, "first_diff": first})

    def figures(r: TurnRecord) -> Figures:
        expected = want(r)
        identical = None if expected is None else expected == r.result.tokens
        return Figures.of(r.result, identical, r.prompt_tokens)

    def group(records: Sequence[TurnRecord]) -> dict[str, Figures]:
        return _with_speedups(
            {
                label: _total([figures(r) for r in records if r.method == label])
                for label in run.labels
            }
        )

    config = {
        **attrs.asdict(run.config),
        "methods": run.labels,
        "questions": len(run.questions),
        "answers_per_method": sum(len(q.turns) for q in run.questions),
        "categories": list(dict.fromkeys(q.category for q in run.questions)),
    }
    categories = dict.fromkeys(r.category for r in run.records)
    return BenchReport(
        methods=group(run.records),
        per_category={c: group([r for r in run.records if r.category == c]) for c in categories},
        reference=reference_label,
        mismatches=mismatches,
        config=config,
        specs={spec.label: (spec.name, spec.params) for spec in run.methods},
        run=run,
    )


# -- rendering: one table builder for the terminal and Markdown ------------------------


def _table(head: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        align = ["---", *(["---:"] * (len(head) - 1))]
        return "\n".join("| " + " | ".join(cells) + " |" for cells in [head, align, *rows])
    widths = [max(len(c) for c in column) for column in zip(head, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        right = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([cells[0].ljust(widths[0]), *right]).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(head), rule, *(line(cells) for cells in rows)])


def _cells(f: Figures) -> dict[str, str]:
    """Every column a table may show, for one method's figures (``-``: not known)."""

    def show(value: float | None, form: str) -> str:
        return "-" if value is None else form.format(value)

    def share(part: str) -> float | None:
        split = f.time_split or {}
        return 100 * split[part] / f.seconds if part in split and f.seconds > 0 else None

    return {
        "answers": str(f.outputs),
        "tok/s": f"{f.tokens_per_s:.2f}",
        "prefill tok/s": show(f.prefill_tokens_per_s, "{:.0f}"),
        "MAT": f"{f.mean_accepted:.2f}",
        "nodes/step": show(f.mean_tree_size, "{:.1f}"),
        "vs hf": show(f.speedup_vs_hf, "{:.2f}x"),
        "vs ar": show(f.speedup_vs_ar, "{:.2f}x"),
        "identical": show(f.identical_count, "{}/" + str(f.outputs)),
        "peak MiB": f"{f.peak_memory_mib:.0f}",
        **{p: show(share(p), "{:.0f}%") for p in _PARTS},
    }


_CATEGORY_COLUMNS = ["answers", "tok/s", "prefill tok/s", "MAT", "vs hf", "vs ar", "identical"]
_COLUMNS = [*_CATEGORY_COLUMNS[:4], "nodes/step", *_CATEGORY_COLUMNS[4:], "peak MiB", *_PARTS]


def render_table(report: BenchReport, *, markdown: bool = False) -> str:
    """The per-method table, for the terminal or (``markdown``) as Markdown."""
    rows = [[label, *(_cells(f)[c] for c in _COLUMNS)] for label, f in report.methods.items()]
    return _table(["method", *_COLUMNS], rows, markdown)


def render_category_table(report: BenchReport, *, markdown: bool = False) -> str:
    """The per-category, per-method table, for the terminal or as Markdown."""
    rows = [
        [category, label, *(_cells(f)[c] for c in _CATEGORY_COLUMNS)]
        for category, group in report.per_category.items()
        for label, f in group.items()
    ]
    return _table(["category", "method", *_CATEGORY_COLUMNS], rows, markdown)


def identical_note(report: BenchReport) -> str:
    """What the identical column compares, in one sentence."""
    if report.config.get("temperature") == 0:
        return f"token-identical to `{report.reference}` greedy outputs."
    return (
        f"token-identical to `{report.reference}` with the same seed (verispec's methods; "
        "transformers' peers sample differently and are not compared)."
    )


def _commands(command: str | list[str] | None) -> list[str]:
    return [] if command is None else [command] if isinstance(command, str) else list(command)


def render_markdown(
    report: BenchReport,
    machine: dict[str, Any] | None = None,
    command: str | list[str] | None = None,
) -> str:
    """A Markdown report: command, machine, settings, both tables, mismatches
    (``machine`` and ``command`` default to the report's own)."""
    config = report.config
    machine = machine if machine is not None else report.machine
    commands = _commands(command if command is not None else report.command)
    lines = ["# verispec bench", ""] + (["```", *commands, "```", ""] if commands else [])
    keys = ["max_new_tokens", "temperature", "seed"]
    if config.get("temperature"):
        keys += [k for k in ("top_k", "top_p", "min_p", "verifier") if k in config]
    settings = ", ".join(f"{k}={config.get(k)}" for k in keys)
    interleaved = "methods interleaved question by question"
    if (config.get("repeats") or 1) > 1:
        interleaved += f"; each answer timed in {config['repeats']} passes, the fastest kept"
    if len(commands) > 1:
        interleaved = f"merged from {len(commands)} runs over disjoint categories, {interleaved}"
    lines += [
        f"{config.get('questions')} questions ({config.get('answers_per_method')} answers per "
        f"method) over {len(config.get('categories', []))} categories; {settings}; warm-up "
        f"{config.get('warmup')} per method, excluded; {interleaved}.",
        "",
    ]
    if machine:
        lines += ["Machine: " + "; ".join(f"{k}: {v}" for k, v in machine.items()), ""]
    lines += ["## Per method", "", render_table(report, markdown=True), ""]
    lines += ["## Per category", "", render_category_table(report, markdown=True), ""]
    if report.reference is not None:
        lines += [f"Identical: {identical_note(report)}", ""]
        if report.mismatches:
            lines += ["Answers that differ (method, question, turn, first differing token):", ""]
            lines += [
                f"- `{m['method']}` question {m['question_id']} turn {m['turn']}: "
                f"token {m['first_diff']}"
                for m in report.mismatches
            ] + [""]
    lines += [
        "tok/s: new tokens per wall-clock second (prefill included). prefill tok/s: prompt "
        "tokens per second of the prompts' forwards (verispec's prefill, which leaves the last "
        "prompt token to the first step; transformers' first forward; llama.cpp's first "
        "eval). MAT: tokens committed per target forward. vs hf / vs ar: tokens/s ratio on "
        "the same answers. Peak: per-answer peak memory (process RSS on CPU, CUDA allocation "
        "on GPU). draft/target/verify: shares of wall-clock time.",
        "",
    ]
    return "\n".join(lines)


# -- JSON, and merging the reports of shards --------------------------------------------


def to_json(
    report: BenchReport,
    machine: dict[str, Any] | None = None,
    command: str | list[str] | None = None,
) -> dict[str, Any]:
    """The report as JSON-ready data (``machine`` and ``command`` default to the report's
    own); :func:`report_from_json` reads it back."""
    methods = {}
    for label, figures in report.methods.items():
        name, params = report.specs.get(label, (label, {}))
        methods[label] = {"method": name, "params": params, **figures.as_dict()}
    return {
        "methods": methods,
        "per_category": {
            category: {label: f.as_dict() for label, f in group.items()}
            for category, group in report.per_category.items()
        },
        "reference": report.reference,
        "mismatches": report.mismatches,
        "config": report.config,
        "machine": machine or report.machine or {},
        "command": command if command is not None else report.command,
    }


@attrs.frozen
class _Spec:
    """What a JSON report keeps of a method beside its figures."""

    method: str
    params: dict[str, Any]


@attrs.frozen
class _Saved:
    """What a JSON report keeps beside the figures."""

    config: dict[str, Any]
    reference: str | None = None
    mismatches: list[Any] | None = None
    machine: dict[str, Any] | None = None
    command: str | list[str] | None = None


def _group_from_json(data: Any, where: str) -> dict[str, Figures]:
    """One group's figures, with their speedups. A report written before the figures stored
    ``committed`` and ``tree_nodes`` has them recovered: ``round(MAT x steps)`` and
    ``round(nodes/step x steps)``."""
    figures = {}
    for label, entry in json_object(data, where).items():
        entry = json_object(entry, f"{where}.{label}")
        steps, mat, size = (entry.get(k) for k in ("steps", "mean_accepted", "mean_tree_size"))
        if "committed" not in entry and isinstance(steps, int) and isinstance(mat, int | float):
            nodes = round(size * steps) if isinstance(size, int | float) else None
            entry = {**entry, "committed": round(mat * steps), "tree_nodes": nodes}
        figures[label] = from_json(Figures, entry, f"{where}.{label}")
    return _with_speedups(figures)


def report_from_json(data: Any) -> BenchReport:
    """Rebuild a report from :func:`to_json`'s output (``run`` is ``None``).

    Raises:
        ConfigError: a key is missing or holds the wrong type (the message names it).
    """
    data = json_object(data, "report")
    methods = _group_from_json(data.get("methods"), "methods")
    specs = {
        label: from_json(_Spec, data["methods"][label], f"methods.{label}") for label in methods
    }
    per_category = {
        category: _group_from_json(group, f"per_category.{category}")
        for category, group in json_object(data.get("per_category"), "per_category").items()
    }
    saved = from_json(_Saved, data, "report")
    return BenchReport(
        methods,
        per_category,
        saved.reference,
        saved.mismatches or [],
        saved.config,
        {label: (spec.method, spec.params) for label, spec in specs.items()},
        machine=saved.machine or {},
        command=saved.command,
    )


def load_report(path: str | Path) -> BenchReport:
    """Read a JSON report written by ``verispec bench --json``.

    Raises:
        ConfigError: the file is missing, unreadable, not JSON or not a report (naming it).
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"`{path}` must be an existing JSON report; no such file.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"`{path}` must be a readable JSON report; got {exc}.") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"`{path}` must be valid JSON; got {exc}.") from None
    try:
        return report_from_json(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: not a `verispec bench --json` report: {exc}") from None


# Settings every shard must share: the answers are only comparable under the same ones.
_SHARED = {
    "config": "max_new_tokens temperature seed chat warmup top_k top_p min_p verifier carry_corpus "
    "repeats",
    "machine": "dtype device",
}


def _categories(report: BenchReport) -> list[str]:
    return list(report.config.get("categories") or report.per_category)


def merge_reports(
    reports: Sequence[BenchReport], names: Sequence[str] | None = None
) -> BenchReport:
    """Merge reports of runs over disjoint answers (e.g. split with ``--categories``), as
    docs/benchmarks.rst, "Sharding a run", describes: per-method figures summed, ``machine``
    the first shard's (another machine, beyond dtype and device, is a :class:`UserWarning`).

    Args:
        reports: the shards, in the order their categories should be listed.
        names: what to call each shard in error messages (default ``report 1``...).

    Raises:
        ConfigError: no report; shards that share a category, or differ in their
            methods, in a generation setting or in the machine's dtype or device.
    """
    if not reports:
        raise ConfigError("`reports` must hold at least one report; got none.")
    names = list(names) if names is not None else [f"report {i + 1}" for i in range(len(reports))]
    first, first_name = reports[0], names[0]
    seen = dict.fromkeys(_categories(first), first_name)
    for report, name in zip(reports[1:], names[1:], strict=True):
        if set(report.methods) != set(first.methods) or report.specs != first.specs:
            raise ConfigError(
                f"`methods` must be the same in every shard; got {list(first.methods)} in "
                f"{first_name} and {list(report.methods)} in {name}."
            )
        for part, keys in _SHARED.items():
            mine, theirs = getattr(first, part) or {}, getattr(report, part) or {}
            for key in keys.split():
                if mine.get(key) != theirs.get(key):
                    raise ConfigError(
                        f"`{key}` must be the same in every shard; got {mine.get(key)!r} in "
                        f"{first_name} and {theirs.get(key)!r} in {name}."
                    )
        for category in _categories(report):
            if category in seen:
                raise ConfigError(
                    f"`categories` must not overlap between shards; got `{category}` in both "
                    f"{seen[category]} and {name}. Merge runs over disjoint answers only "
                    "(split them with `--categories`)."
                )
            seen[category] = name
        mine, theirs = first.machine or {}, report.machine or {}
        others = sorted(k for k in {**mine, **theirs} if mine.get(k) != theirs.get(k))
        if others:
            warnings.warn(
                f"{name} ran on a different machine than {first_name} (differs in: "
                f"{', '.join(others)}); its timings are merged as they are.",
                UserWarning,
                stacklevel=2,
            )
    config = {
        **first.config,
        "methods": list(first.methods),
        "questions": sum(r.config.get("questions", 0) for r in reports),
        "answers_per_method": sum(r.config.get("answers_per_method", 0) for r in reports),
        "categories": [c for r in reports for c in _categories(r)],
    }
    return BenchReport(
        methods=_with_speedups({m: _total([r.methods[m] for r in reports]) for m in first.methods}),
        per_category={c: group for r in reports for c, group in r.per_category.items()},
        reference=first.reference,
        mismatches=[m for r in reports for m in r.mismatches],
        config=config,
        specs=dict(first.specs),
        machine=first.machine,
        command=[c for r in reports for c in _commands(r.command)] or None,
    )

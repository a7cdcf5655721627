"""Figures from a benchmark run, and the terminal table, JSON and Markdown that show them.

Definitions (the same for every method, overall and per category):

* **tokens/s** — new tokens over wall-clock seconds, summed over every measured
  answer (prefill included; warm-up excluded).
* **MAT** — mean accepted tokens per step: tokens committed over target forwards
  that produced them (verispec counts the extra token; for ``generate`` every target
  forward counts, the prefill included, since it yields the first token).
* **nodes/step** — draft-tree nodes scored per target forward.
* **vs hf, vs ar** — tokens/s over the tokens/s of ``hf`` / ``ar`` on the same answers.
* **identical** — the share of answers token-identical to the reference: at
  temperature 0 the greedy reference (``hf`` if it ran, else ``ar``); at temperature
  > 0 ``ar`` with the same seed, for verispec's methods (with the default verifier,
  every drafter of fixed candidates reproduces it: docs/exactness.rst, "Seeds and
  reproducibility"; draft-model trees are exact in law but draw differently).
  transformers' peers (``hf*``) sample from torch's global generator and are not
  compared at temperature > 0.
* **peak MiB** — the largest per-answer peak: CUDA allocation on a GPU, else the
  process's resident set (model weights included).
* **draft / target / verify** — shares of the wall-clock time; the rest is the loop
  and the host (``generate``'s own drafting where it cannot be separated).

:class:`Figures` store sums over answers (tokens, seconds, steps, committed tokens,
tree nodes, the time split, identical answers) and derive every ratio, so the reports
of runs over disjoint answers (a run sharded with ``--categories``) merge by addition
(``Figures.__add__``), and a report renders without its run: :mod:`verispec.bench.merge`
reads ``to_json``'s output back and merges shards.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import attrs

from verispec.bench.runner import BenchRun, TurnRecord

__all__ = [
    "BenchReport",
    "Figures",
    "identical_note",
    "render_category_table",
    "render_markdown",
    "render_table",
    "summarise",
    "to_json",
]

_MIB = float(1 << 20)


_PARTS = ("draft", "target", "verify")  # the measured parts of the time split


def _with_other(parts: dict[str, float], seconds: float) -> dict[str, float]:
    """The time split: the measured parts, and the rest of the wall-clock time."""
    return {**parts, "other": max(seconds - sum(parts.values()), 0.0)}


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
    speedup_vs_hf: float | None = None
    speedup_vs_ar: float | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

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
        nodes = None if None in (self.tree_nodes, other.tree_nodes) else 0
        split = None
        if self.time_split is not None and other.time_split is not None:
            mine, theirs = self.time_split, other.time_split
            parts = {p: mine[p] + theirs[p] for p in _PARTS if p in mine and p in theirs}
            split = _with_other(parts, self.seconds + other.seconds)
        counts = (self.identical_count, other.identical_count)
        return Figures(
            outputs=self.outputs + other.outputs,
            new_tokens=self.new_tokens + other.new_tokens,
            seconds=self.seconds + other.seconds,
            steps=self.steps + other.steps,
            committed=self.committed + other.committed,
            tree_nodes=None if nodes is None else self.tree_nodes + other.tree_nodes,  # type: ignore[operator]
            peak_memory_mib=max(self.peak_memory_mib, other.peak_memory_mib),
            time_split=split,
            identical_count=None if None in counts else sum(counts),  # type: ignore[arg-type]
            finish_reasons=dict(Counter(self.finish_reasons) + Counter(other.finish_reasons)),
        )

    def as_dict(self) -> dict[str, Any]:
        """The sums and the ratios derived from them (the JSON report's fields)."""
        ratios = ("tokens_per_s", "mean_accepted", "mean_tree_size", "identical")
        return {**attrs.asdict(self), **{name: getattr(self, name) for name in ratios}}


@attrs.frozen
class BenchReport:
    """The summary of a :class:`~verispec.bench.runner.BenchRun`, or of several merged.

    Everything the tables, the JSON and the plots show is here; ``run`` is kept only
    when the report was summarised in this process.

    Attributes:
        methods: figures per method label, in the run's order.
        per_category: figures per category, then per method label.
        reference: the label outputs are compared with: ``hf`` or ``ar`` at
            temperature 0, ``ar`` above (``None`` when neither ran).
        mismatches: answers that differ from the reference: method, question id,
            turn and the index of the first differing token.
        config: the run's settings: ``BenchConfig``'s fields plus ``methods`` (labels),
            ``questions``, ``answers_per_method`` and ``categories``.
        specs: per method label, the method's registry name and every parameter.
        run: the raw measurements (``None`` for a report loaded from JSON or merged).
        machine: what ran it, when known (loaded reports); shown unless the renderers
            are given another.
        command: the command line that produced it: a string, or for a merged
            report one string per shard, in merge order.
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


def _key(record: TurnRecord) -> tuple[str, int]:
    return (str(record.question_id), record.turn)


def _first_diff(a: Sequence[int], b: Sequence[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _figures(
    records: Sequence[TurnRecord],
    reference: dict[tuple[str, int], tuple[int, ...]] | None,
) -> Figures:
    results = [r.result for r in records]
    seconds = sum(r.seconds for r in results)
    nodes = [r.tree_nodes for r in results]
    split: dict[str, float] | None = None
    if results and all(r.target_s is not None for r in results):
        values = {p: [getattr(r, f"{p}_s") for r in results] for p in _PARTS}
        known = {p: v for p, v in values.items() if None not in v}
        split = _with_other({p: float(sum(v)) for p, v in known.items()}, seconds)
    identical_count = None
    if reference is not None:
        identical_count = sum(reference.get(_key(r)) == r.result.tokens for r in records)
    return Figures(
        outputs=len(records),
        new_tokens=sum(len(r.tokens) for r in results),
        seconds=seconds,
        steps=sum(r.steps for r in results),
        committed=sum(r.committed for r in results),
        tree_nodes=None if None in nodes else sum(nodes),  # type: ignore[arg-type]
        peak_memory_mib=max((r.peak_memory for r in results), default=0) / _MIB,
        time_split=split,
        identical_count=identical_count,
        finish_reasons=dict(Counter(r.finish_reason for r in results)),
    )


def _group(
    records: Sequence[TurnRecord], labels: Sequence[str], reference: Any, compared: set[str]
) -> dict[str, Figures]:
    raw = {
        label: _figures(
            [r for r in records if r.method == label], reference if label in compared else None
        )
        for label in labels
    }
    return _with_speedups(raw)


def _is_hf_peer(name: str) -> bool:
    """transformers' own methods (``hf``, ``hf-pld``...): they sample with torch's global RNG."""
    return name == "hf" or name.startswith("hf-")


def _with_speedups(raw: dict[str, Figures]) -> dict[str, Figures]:
    """Figures of one group of answers, each method's speedups over ``hf`` and ``ar``."""
    out = {}
    for label, figures in raw.items():
        speedups: dict[str, Any] = {}
        for peer in ("hf", "ar"):
            base = raw.get(peer)
            ok = base is not None and base.tokens_per_s > 0
            speedups[f"speedup_vs_{peer}"] = (
                figures.tokens_per_s / base.tokens_per_s if ok and base else None
            )
        out[label] = attrs.evolve(figures, **speedups)
    return out


def summarise(run: BenchRun) -> BenchReport:
    """Aggregate a run's answers per method and per category."""
    labels = run.labels
    greedy = run.config.temperature == 0
    peers = ("hf", "ar") if greedy else ("ar",)
    reference_label = next((peer for peer in peers if peer in labels), None)
    compared = {s.label for s in run.methods if greedy or not _is_hf_peer(s.name)}
    reference = None
    mismatches: list[dict[str, Any]] = []
    if reference_label is not None:
        reference = {_key(r): r.result.tokens for r in run.records if r.method == reference_label}
        for r in run.records:
            want = reference.get(_key(r))
            if (
                r.method != reference_label
                and r.method in compared
                and want is not None
                and want != r.result.tokens
            ):
                mismatches.append(
                    {
                        "method": r.method,
                        "question_id": r.question_id,
                        "turn": r.turn,
                        "first_diff": _first_diff(want, r.result.tokens),
                    }
                )
    categories = list(dict.fromkeys(r.category for r in run.records))
    per_category = {
        category: _group(
            [r for r in run.records if r.category == category], labels, reference, compared
        )
        for category in categories
    }
    return BenchReport(
        methods=_group(run.records, labels, reference, compared),
        per_category=per_category,
        reference=reference_label,
        mismatches=mismatches,
        config=_config_dict(run),
        specs={spec.label: (spec.name, spec.params) for spec in run.methods},
        run=run,
    )


# -- rendering ------------------------------------------------------------------------


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _share(figures: Figures) -> str:
    if figures.identical_count is None:
        return "-"
    return f"{figures.identical_count}/{figures.outputs}"


def _split(figures: Figures) -> list[str]:
    split = figures.time_split
    cells = []
    for part in ("draft", "target", "verify"):
        if split is None or part not in split or figures.seconds <= 0:
            cells.append("-")
        else:
            cells.append(f"{100 * split[part] / figures.seconds:.0f}%")
    return cells


_HEAD = ["method", "answers", "tok/s", "MAT", "nodes/step", "vs hf", "vs ar", "identical"]
_TAIL = ["peak MiB", "draft", "target", "verify"]


def _rows(report: BenchReport) -> list[list[str]]:
    rows = []
    for label, f in report.methods.items():
        tree = "-" if f.mean_tree_size is None else f"{f.mean_tree_size:.1f}"
        rows.append(
            [
                label,
                str(f.outputs),
                f"{f.tokens_per_s:.2f}",
                f"{f.mean_accepted:.2f}",
                tree,
                _x(f.speedup_vs_hf),
                _x(f.speedup_vs_ar),
                _share(f),
                f"{f.peak_memory_mib:.0f}",
                *_split(f),
            ]
        )
    return rows


def _category_rows(report: BenchReport) -> list[list[str]]:
    rows = []
    for category, methods in report.per_category.items():
        for label, f in methods.items():
            rows.append(
                [
                    category,
                    label,
                    str(f.outputs),
                    f"{f.tokens_per_s:.2f}",
                    f"{f.mean_accepted:.2f}",
                    _x(f.speedup_vs_hf),
                    _x(f.speedup_vs_ar),
                    _share(f),
                ]
            )
    return rows


_CATEGORY_HEAD = ["category", "method", "answers", "tok/s", "MAT", "vs hf", "vs ar", "identical"]


def _text_table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(head, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(head), rule, *(line(r) for r in rows)])


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    align = ["---", *(["---:"] * (len(head) - 1))]
    lines = ["| " + " | ".join(cells) + " |" for cells in [head, align, *rows]]
    return "\n".join(lines)


def render_table(report: BenchReport) -> str:
    """The per-method table for the terminal."""
    return _text_table(_HEAD + _TAIL, _rows(report))


def render_category_table(report: BenchReport) -> str:
    """The per-category, per-method table for the terminal."""
    return _text_table(_CATEGORY_HEAD, _category_rows(report))


def identical_note(report: BenchReport) -> str:
    """What the identical column compares, in one sentence."""
    if report.config.get("temperature") == 0:
        return f"token-identical to `{report.reference}` greedy outputs."
    return (
        f"token-identical to `{report.reference}` with the same seed (verispec's methods; "
        "transformers' peers sample differently and are not compared)."
    )


def _config_dict(run: BenchRun) -> dict[str, Any]:
    config = attrs.asdict(run.config)
    config["methods"] = run.labels
    config["questions"] = len(run.questions)
    config["answers_per_method"] = sum(len(q.turns) for q in run.questions)
    config["categories"] = list(dict.fromkeys(q.category for q in run.questions))
    return config


def _commands(command: str | list[str] | None) -> list[str]:
    if command is None:
        return []
    return [command] if isinstance(command, str) else list(command)


def render_markdown(
    report: BenchReport,
    machine: dict[str, Any] | None = None,
    command: str | list[str] | None = None,
) -> str:
    """A Markdown report: command, machine, settings, both tables, mismatches.

    ``machine`` and ``command`` default to the report's own (those of a loaded report).
    """
    config = report.config
    machine = machine if machine is not None else report.machine
    commands = _commands(command if command is not None else report.command)
    lines = ["# verispec bench", ""]
    if commands:
        lines += ["```", *commands, "```", ""]
    keys = ["max_new_tokens", "temperature", "seed"]
    if config.get("temperature"):
        keys += [k for k in ("top_k", "top_p", "min_p", "verifier") if k in config]
    settings = ", ".join(f"{k}={config.get(k)}" for k in keys)
    interleaved = "methods interleaved question by question"
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
    lines += ["## Per method", "", _md_table(_HEAD + _TAIL, _rows(report)), ""]
    lines += ["## Per category", "", _md_table(_CATEGORY_HEAD, _category_rows(report)), ""]
    if report.reference is not None:
        lines += [f"Identical: {identical_note(report)}", ""]
        if report.mismatches:
            lines += ["Answers that differ (method, question, turn, first differing token):", ""]
            lines += [
                f"- `{m['method']}` question {m['question_id']} turn {m['turn']}: "
                f"token {m['first_diff']}"
                for m in report.mismatches
            ]
            lines.append("")
    lines += [
        "tok/s: new tokens per wall-clock second (prefill included). MAT: tokens committed per "
        "target forward. vs hf / vs ar: tokens/s ratio on the same answers. Peak: per-answer "
        "peak memory (process RSS on CPU, CUDA allocation on GPU). draft/target/verify: shares "
        "of wall-clock time.",
        "",
    ]
    return "\n".join(lines)


def to_json(
    report: BenchReport,
    machine: dict[str, Any] | None = None,
    command: str | list[str] | None = None,
) -> dict[str, Any]:
    """The report as JSON-ready data: ``{"methods", "per_category", "machine", "command", ...}``.

    ``machine`` and ``command`` default to the report's own;
    :func:`~verispec.bench.merge.report_from_json` reads the result back.
    """
    methods = {}
    for label, figures in report.methods.items():
        name, params = report.specs.get(label, (label, {}))
        methods[label] = {"method": name, "params": params, **figures.as_dict()}
    return {
        "methods": methods,
        "per_category": {
            category: {label: f.as_dict() for label, f in methods.items()}
            for category, methods in report.per_category.items()
        },
        "reference": report.reference,
        "mismatches": report.mismatches,
        "config": report.config,
        "machine": machine or report.machine or {},
        "command": command if command is not None else report.command,
    }

"""How sure a speedup is: paired bootstrap intervals of tokens/s ratios from bench records.

A category of Spec-Bench holds 5 or 10 answers, and one answer's seconds move with the
machine's load by several per cent; a method at 0.97x ``ar`` in one run may be at 1.02x in
the next. This module says which of those figures the run can tell apart from 1.

The ratio of a method to a baseline over a group of answers is the report's: the method's
tokens per second (new tokens summed over the group, divided by its seconds summed) over the
baseline's on the same answers. Its interval is a percentile bootstrap, paired and by
question: each resample draws the group's questions with replacement and takes *both*
methods' answers to the drawn questions (every turn of a two-turn question), so a question
that is hard for both moves both sums together, and the turns of one conversation stay
together. ``resamples`` draws from a seeded generator: the same records give the same
intervals.

Read with care: the interval covers the noise *between answers of this run* (which
questions, how each was timed); a machine slower for the whole run, or a neighbour that
arrived halfway, moves both methods and is not in it. With few questions (a Spec-Bench
category has 5) a percentile bootstrap interval is narrower than it should be: a category
``below`` is a figure to measure again; the verdict is the overall group's.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import attrs

from verispec.errors import ConfigError

__all__ = ["Interval", "load_answers", "ratio_intervals", "render_intervals"]

ALL = "all"  # the group of every answer


@attrs.frozen
class Interval:
    """A method's tokens/s over the baseline's on one group of answers.

    Attributes:
        ratio: the point figure (the report's ``vs <baseline>``).
        low, high: the bootstrap percentile interval at the requested level.
        questions: questions in the group (answered by both methods).
    """

    ratio: float
    low: float
    high: float
    questions: int

    @property
    def verdict(self) -> str:
        """``below`` (the whole interval under 1), ``above`` (over 1) or ``level``."""
        return "below" if self.high < 1.0 else "above" if self.low > 1.0 else "level"


# one answer: (question id, category, turn, method, new tokens, seconds)
Answer = tuple[str, str, int, str, int, float]


def load_answers(paths: Sequence[str | Path]) -> list[Answer]:
    """Every answer of ``verispec bench`` records files (JSON Lines, a header first); where
    a file holds several passes (``--repeats``), each answer's fastest, as the report keeps
    (:func:`~verispec.bench.runner.fastest_passes`).

    Raises:
        ConfigError: a file that is missing or not a bench records file.
    """
    from verispec.bench.records import from_json
    from verispec.bench.runner import TurnRecord, fastest_passes

    answers: list[Answer] = []
    for path in paths:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as error:
            raise ConfigError(f"cannot read records file {str(path)!r}: {error}") from None
        try:
            header = json.loads(lines[0]) if lines else {}
            if not str(header.get("format", "")).startswith("verispec-bench-records/"):
                raise ValueError("no records header")
            records = [
                from_json(TurnRecord, json.loads(line), "record")
                for line in lines[1:]
                if line.strip()
            ]
        except (ValueError, ConfigError, AttributeError) as error:
            raise ConfigError(
                f"{str(path)!r} is not a `verispec bench` records file (JSON Lines with the "
                f"records header, one answer a line): {error}"
            ) from None
        greedy = header.get("config", {}).get("temperature", 0) == 0
        answers += [
            (str(r.question_id), r.category, r.turn, r.method, len(r.result.tokens),
             float(r.result.seconds))
            for r in fastest_passes(records, greedy)
        ]  # fmt: skip
    return answers


def ratio_intervals(
    answers: Iterable[Answer],
    baseline: str = "ar",
    *,
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> dict[str, dict[str, Interval]]:
    """Each method's tokens/s over ``baseline``'s, with a paired bootstrap interval, for
    every answer together (group ``"all"``) and for each category.

    Args:
        answers: from :func:`load_answers`; a question answered twice by one method (two
            runs' records) counts both answers.
        baseline: the method every other is divided by (it must have answers).
        level: the interval's coverage, in (0, 1).
        resamples: bootstrap draws, >= 100.
        seed: of the draws.

    Returns:
        ``{group: {method: Interval}}``, groups ``"all"`` then the categories in the order
        first seen; a method only over the questions both it and the baseline answered.

    Raises:
        ConfigError: a bad ``level`` or ``resamples``, or no answer of ``baseline``.
    """
    if not 0.0 < level < 1.0:
        raise ConfigError(f"`level` must be in (0, 1); got {level}.")
    if resamples < 100:
        raise ConfigError(f"`resamples` must be >= 100; got {resamples}.")
    # sums per (question, method): the unit the bootstrap draws is the question
    sums: dict[tuple[str, str], list[float]] = {}
    category_of: dict[str, str] = {}
    methods: dict[str, None] = {}
    for qid, category, _turn, method, tokens, seconds in answers:
        cell = sums.setdefault((qid, method), [0.0, 0.0])
        cell[0] += tokens
        cell[1] += seconds
        category_of.setdefault(qid, category)
        methods.setdefault(method, None)
    if baseline not in methods:
        raise ConfigError(
            f"the baseline method {baseline!r} has no answers in these records; methods "
            f"there: {', '.join(methods) or 'none'}."
        )
    groups: dict[str, list[str]] = {ALL: list(category_of)}
    for qid, category in category_of.items():
        groups.setdefault(category, []).append(qid)
    rng = random.Random(seed)
    out: dict[str, dict[str, Interval]] = {}
    for group, questions in groups.items():
        row: dict[str, Interval] = {}
        for method in methods:
            if method == baseline:
                continue
            paired = [
                (sums[(q, method)], sums[(q, baseline)])
                for q in questions
                if (q, method) in sums and (q, baseline) in sums
            ]
            if paired:
                row[method] = _interval(paired, level, resamples, rng)
        out[group] = row
    return out


def _ratio(paired: Sequence[tuple[Sequence[float], Sequence[float]]]) -> float:
    """Tokens per second summed over the pairs, the method's over the baseline's."""
    mine = sum(m[0] for m, _ in paired) / sum(m[1] for m, _ in paired)
    base = sum(b[0] for _, b in paired) / sum(b[1] for _, b in paired)
    return mine / base


def _interval(
    paired: list[tuple[list[float], list[float]]],
    level: float,
    resamples: int,
    rng: random.Random,
) -> Interval:
    n = len(paired)
    draws = sorted(_ratio([paired[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    k = round((1.0 - level) / 2 * (resamples - 1))  # draws left out at each end
    return Interval(_ratio(paired), draws[k], draws[-1 - k], n)


def _cells(group: str, method: str, iv: Interval) -> list[str]:
    interval = f"{iv.low:.3f}-{iv.high:.3f}"
    return [group, method, f"{iv.ratio:.3f}x", interval, str(iv.questions), iv.verdict]


def render_intervals(
    intervals: Mapping[str, Mapping[str, Interval]], baseline: str, level: float
) -> str:
    """A plain table: group, method, ratio, interval, questions, verdict."""
    head = ["group", "method", f"vs {baseline}", f"{level:.0%} interval", "questions", "verdict"]
    rows = [
        _cells(group, method, iv) for group, row in intervals.items() for method, iv in row.items()
    ]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    below: dict[str, list[str]] = {}
    for group, row in intervals.items():
        for method, iv in row.items():
            if iv.verdict == "below":
                below.setdefault(method, []).append(group)
    lines.append(
        f"below {baseline} beyond the run's noise (the {level:.0%} interval under 1): "
        + ("; ".join(f"{m} ({', '.join(g)})" for m, g in below.items()) if below else "none")
    )
    return "\n".join(lines)

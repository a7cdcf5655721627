"""Tests of verispec/bench/runner.py and loop.py: interleaving, warm-up, conversations,
and a tiny end-to-end benchmark on the smoke model (random Llama) written as JSON."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from verispec.bench.loop import run_bench
from verispec.bench.methods import METHODS, build_runners
from verispec.bench.prompts import Question, shipped_questions
from verispec.bench.records import write_json
from verispec.bench.report import summarise, to_json
from verispec.bench.runner import BenchConfig, TurnResult, method_orders
from verispec.core.types import GenerationParams
from verispec.errors import ConfigError
from verispec.specs import parse_methods


class _SpyRunner:
    """A stand-in method: answers with a fixed token per call and logs every call."""

    def __init__(self, label: str, log: list[tuple[str, str, int]]) -> None:
        self.label, self.log = label, log

    def reset(self) -> None:
        self.log.append(("reset", self.label, 0))

    def remember(self, tokens: Sequence[int]) -> None:
        self.log.append(("remember", self.label, len(tokens)))

    def run(self, prompt_ids: Sequence[int], config: GenerationParams) -> TurnResult:
        self.log.append(("run", self.label, len(prompt_ids)))
        return TurnResult(
            tokens=[65 + len(self.log) % 20] * 3,
            text=f"answer by {self.label}",
            seconds=0.01,
            steps=3,
            committed=3,
            tree_nodes=0,
            draft_s=0.0,
            target_s=0.01,
            verify_s=0.0,
            peak_memory=0,
            finish_reason="max_new_tokens",
        )


def _spy_bench(
    smoke_context: Any, warmup: int, carry: bool = False
) -> tuple[list[tuple[str, str, int]], Any]:
    specs = parse_methods("ar,hf,tr:template=8", METHODS)
    log: list[tuple[str, str, int]] = []
    runners: dict[str, Any] = {s.label: _SpyRunner(s.label, log) for s in specs}
    questions = [Question(1, "chat", ("hi", "more")), Question(2, "qa", ("why",))]
    run = run_bench(
        smoke_context,
        specs,
        questions,
        BenchConfig(warmup=warmup, chat=False, carry_corpus=carry),
        progress=False,
        runners=runners,
    )
    return log, run


def test_warmup_runs_first_then_resets_and_is_not_recorded(smoke_context: Any) -> None:
    """Each method answers `warmup` prompts and is reset before any measured answer."""
    log, run = _spy_bench(smoke_context, warmup=2)
    first_measured = 9  # 3 methods x (2 warm-up runs + 1 reset)
    warm = log[:first_measured]
    assert warm == [
        e
        for label in ("ar", "hf", "tr:template=8")
        for e in [("run", label, warm[0][2])] * 2 + [("reset", label, 0)]
    ]
    assert all(kind == "run" for kind, _, _ in log[first_measured:])
    assert len(run.records) == 3 * 3  # 3 methods x 3 turns; warm-up excluded


@pytest.mark.parametrize("carry", [False, True])
def test_carry_corpus_remembers_each_measured_answer_after_it(
    smoke_context: Any, carry: bool
) -> None:
    """With carry_corpus every measured answer is handed to its method's `remember` right
    after it is produced (warm-up answers never are, and a reset follows them); without
    it nothing is remembered."""
    log, run = _spy_bench(smoke_context, warmup=1, carry=carry)
    remembered = [e for e in log if e[0] == "remember"]
    if not carry:
        assert remembered == []
        return
    assert len(remembered) == len(run.records) == 9
    measured = log[6:]  # 3 methods x (1 warm-up run + 1 reset)
    assert all(e[0] != "remember" for e in log[:6])
    for i, (kind, label, _) in enumerate(measured):
        if kind == "run":
            assert measured[i + 1] == ("remember", label, 3)


def test_methods_are_interleaved_question_by_question_in_balanced_orders(
    smoke_context: Any,
) -> None:
    """All methods finish a question before the next starts, each question in the next of
    method_orders' orders."""
    _, run = _spy_bench(smoke_context, warmup=0)
    order = [(r.question_id, r.method, r.turn) for r in run.records]
    assert order == [
        (1, "ar", 0), (1, "ar", 1), (1, "hf", 0), (1, "hf", 1),
        (1, "tr:template=8", 0), (1, "tr:template=8", 1),
        (2, "hf", 0), (2, "tr:template=8", 0), (2, "ar", 0),
    ]  # fmt: skip


@pytest.mark.parametrize("count", range(1, 10))
def test_method_orders_balance_positions_and_predecessors(count: int) -> None:
    """Over one cycle of method_orders every method takes every position equally often and
    follows every other method equally often (once for an even count, twice for an odd
    one), and the first order is the listed one."""
    orders = method_orders(count)
    cycle = count if count % 2 == 0 else 2 * count
    assert len(orders) == (cycle if count > 1 else 1)
    assert orders[0] == list(range(count))
    assert all(sorted(order) == list(range(count)) for order in orders)
    for position in range(count):
        seen = Counter(order[position] for order in orders)
        assert set(seen.values()) == {len(orders) // count}
    follows = Counter((a, b) for order in orders for a, b in itertools.pairwise(order))
    if count > 1:
        assert len(follows) == count * (count - 1)
        assert set(follows.values()) == {1 if count % 2 == 0 else 2}


def test_method_orders_refuse_no_method() -> None:
    with pytest.raises(ConfigError, match="`count` must be at least 1; got 0"):
        method_orders(0)


def test_second_turn_sees_the_first_answer(smoke_context: Any) -> None:
    """Turn 2's prompt holds turn 1, the method's answer and turn 2 (plain-text join)."""
    _, run = _spy_bench(smoke_context, warmup=0)
    first, second = (r for r in run.records if r.question_id == 1 and r.method == "ar")
    expected = len(smoke_context.tokenizer.encode("hi\n\nanswer by ar\n\nmore"))
    assert first.prompt_tokens == len(smoke_context.tokenizer.encode("hi"))
    assert second.prompt_tokens == expected


def test_empty_inputs_are_refused(smoke_context: Any) -> None:
    """No method or no question raises ConfigError before anything runs."""
    specs = parse_methods("ar", METHODS)
    with pytest.raises(ConfigError, match="at least one method"):
        run_bench(smoke_context, [], shipped_questions()[:1], progress=False)
    with pytest.raises(ConfigError, match="at least one question"):
        run_bench(smoke_context, specs, [], progress=False)


def test_bench_config_validates_its_fields() -> None:
    """Negative warm-up, max_new_tokens < 1, a negative temperature and fewer than one
    pass are refused."""
    with pytest.raises(ConfigError, match="warmup"):
        BenchConfig(warmup=-1)
    with pytest.raises(ConfigError, match="max_new_tokens"):
        BenchConfig(max_new_tokens=0)
    with pytest.raises(ConfigError, match="temperature"):
        BenchConfig(temperature=-0.5)
    with pytest.raises(ConfigError, match="`repeats` must be an integer >= 1; got 0"):
        BenchConfig(repeats=0)


# -- end to end on the smoke model ---------------------------------------------------

_DRAFT_MODEL_METHODS = ("chain", "specinfer", "dyspec", "rsdc", "rsds")


def _e2e_methods() -> str:
    names = ["ar", "hf", "hf-pld", "tr:template=16", "tr"]
    names += [m for m in ("pld", "dtr") if METHODS[m].availability() is None]
    names += [
        f"{m}:draft_layers=2" for m in _DRAFT_MODEL_METHODS if METHODS[m].availability() is None
    ]
    return ",".join(names)


@pytest.fixture(scope="module")
def e2e_run(smoke_context: Any) -> Any:
    questions = [
        Question(1, "chat", ("Say hi.", "Again, louder.")),
        Question(2, "qa", ("Why is the sea salty?",)),
    ]
    specs = parse_methods(_e2e_methods(), METHODS)
    config = BenchConfig(max_new_tokens=5, warmup=1)
    return run_bench(smoke_context, specs, questions, config, progress=False)


def test_every_method_answers_every_turn(e2e_run: Any) -> None:
    """Each method has one record per question turn, each with 1..5 new tokens."""
    assert len(e2e_run.records) == len(e2e_run.methods) * 3
    for record in e2e_run.records:
        assert 1 <= len(record.result.tokens) <= 5
        assert record.result.steps >= 1 and record.result.seconds > 0


def test_greedy_outputs_are_token_identical_in_float64(e2e_run: Any) -> None:
    """At temperature 0 on the float64 tiny model every method reproduces `hf` greedy."""
    report = summarise(e2e_run)
    assert report.reference == "hf"
    assert report.mismatches == []
    assert all(f.identical == 1.0 for f in report.methods.values())


def test_generate_peers_count_forwards(e2e_run: Any) -> None:
    """`hf` greedy needs one forward per token (MAT 1); its draft time is zero."""
    for record in e2e_run.records:
        if record.method == "hf":
            assert record.result.steps == len(record.result.tokens)
            assert record.result.draft_s == 0.0 and record.result.verify_s is None


def test_json_report_has_the_documented_schema(e2e_run: Any, tmp_path: Path) -> None:
    """The JSON file lists every method with its figures, per category, machine and command."""
    path = tmp_path / "bench.json"
    write_json(path, to_json(summarise(e2e_run), {"cpu": "x"}, "verispec bench"))
    data = json.loads(path.read_text())
    assert list(data["methods"]) == [s.label for s in e2e_run.methods]
    for figures in data["methods"].values():
        for key in ("tokens_per_s", "mean_accepted", "speedup_vs_hf", "speedup_vs_ar"):
            assert isinstance(figures[key], float) and figures[key] > 0
        assert figures["identical"] == 1.0
        assert figures["outputs"] == 3
        assert set(figures["time_split"]) >= {"target", "other"}
    assert set(data["per_category"]) == {"chat", "qa"}
    assert data["machine"] == {"cpu": "x"} and data["command"] == "verispec bench"
    assert data["methods"]["ar"]["mean_accepted"] == 1.0


@pytest.mark.slow
def test_embedded_model_bench_is_greedy_identical(default_model: Any) -> None:
    """On SmolLM2 (chat template, real tokenizer) ar, hf and tr agree token for token."""
    from verispec.bench.runner import make_context

    model, tokenizer = default_model
    context = make_context(model, tokenizer)
    questions = [Question(1, "chat", ("Name three primary colours.", "And three secondary?"))]
    specs = parse_methods("ar,hf,tr:template=16", METHODS)
    run = run_bench(
        context, specs, questions, BenchConfig(max_new_tokens=12, warmup=0), progress=False
    )
    report = summarise(run)
    assert report.mismatches == []
    assert all(f.identical_count == 2 for f in report.methods.values())
    second = [r for r in run.records if r.turn == 1]
    first = [r for r in run.records if r.turn == 0]
    assert all(b.prompt_tokens > a.prompt_tokens + 12 for a, b in zip(first, second, strict=True))


@pytest.mark.parametrize(
    ("layers", "match"),
    [
        ("4", "fewer layers than the target's 4"),
        ("0-3", "fewer layers"),
        ("3+1", "strictly increasing"),
    ],
)
def test_self_draft_layer_choice_errors(smoke_context: Any, layers: str, match: str) -> None:
    """A self-draft with as many layers as the target, or unordered layers, is refused."""
    specs = parse_methods(f"chain:draft_layers={layers}", METHODS)
    with pytest.raises(ConfigError, match=match):
        build_runners(smoke_context, specs)


def test_default_self_draft_builds(smoke_context: Any) -> None:
    """Without `draft_layers`, a draft-model method drafts with the recommended layers."""
    runners = build_runners(smoke_context, parse_methods("chain", METHODS))
    assert set(runners) == {"chain"}


class _StallingRunner(_SpyRunner):
    """Answers with the same tokens every pass; its ``stalls`` calls (counted from 1) take
    1 s instead of 0.01."""

    def __init__(self, label: str, log: list[tuple[str, str, int]], stalls: set[int]) -> None:
        super().__init__(label, log)
        self.calls, self.stalls = 0, stalls

    def run(self, prompt_ids: Sequence[int], config: GenerationParams) -> TurnResult:
        self.calls += 1
        result = super().run(prompt_ids, config)
        seconds = 1.0 if self.calls in self.stalls else 0.01
        return attrs.evolve(result, tokens=[65 + len(prompt_ids) % 20] * 3, seconds=seconds)


def test_repeats_reset_every_method_before_each_pass_and_keep_each_answers_fastest(
    smoke_context: Any,
) -> None:
    """With ``repeats=2`` every method is reset between the passes, every answer of both
    passes is recorded (``repeat`` 0 and 1), and the run keeps each answer's faster pass:
    a stall in either pass is gone, and the answers stay in the order first measured."""
    specs = parse_methods("ar,tr:template=8", METHODS)
    log: list[tuple[str, str, int]] = []
    runners: dict[str, Any] = {
        "ar": _StallingRunner("ar", log, stalls={1}),  # q1 turn 0, first pass
        "tr:template=8": _StallingRunner("tr:template=8", log, stalls={6}),  # q2, second pass
    }
    questions = [Question(1, "chat", ("hi", "more")), Question(2, "qa", ("why",))]
    recorded: list[Any] = []
    run = run_bench(
        smoke_context, specs, questions, BenchConfig(warmup=0, chat=False, repeats=2),
        progress=False, runners=runners, on_record=recorded.append,
    )  # fmt: skip
    resets = [i for i, entry in enumerate(log) if entry[0] == "reset"]
    assert [log[i][1] for i in resets] == ["ar", "tr:template=8"]
    assert sum(1 for e in log[: resets[0]] if e[0] == "run") == 6  # the whole first pass
    assert [r.repeat for r in recorded] == [0] * 6 + [1] * 6
    assert len(run.records) == 6
    assert all(r.result.seconds == 0.01 for r in run.records)
    assert [(r.question_id, r.turn, r.method) for r in run.records] == [
        (r.question_id, r.turn, r.method) for r in recorded[:6]
    ]
    stalled = next(
        r for r in run.records if r.method == "ar" and r.turn == 0 and r.question_id == 1
    )
    assert stalled.repeat == 1


def test_passes_that_answer_differently_warn(smoke_context: Any) -> None:
    """Greedy answers that differ between passes (a nondeterministic method) are named."""
    specs = parse_methods("ar", METHODS)
    runners: dict[str, Any] = {"ar": _SpyRunner("ar", [])}  # tokens change with every call
    with pytest.warns(UserWarning, match=r"`ar` answered question 1 turn 0 differently in two"):
        run_bench(
            smoke_context, specs, [Question(1, "chat", ("hi",))],
            BenchConfig(warmup=0, chat=False, repeats=2), progress=False, runners=runners,
        )  # fmt: skip

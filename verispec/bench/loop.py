"""The benchmark loop: :func:`run_bench` (what it measures and why: docs/benchmarks.rst,
"How it measures").

Every method answers a whole conversation before the next question, in orders balanced
for what one method leaves to the next (:func:`~verispec.bench.runner.method_orders`);
each first answers ``warmup`` prompts outside the set, then forgets what it learnt, so the
measured run starts cold. With ``repeats`` above one the whole loop runs that many times,
every method reset before each pass, and each answer keeps its fastest pass
(:func:`~verispec.bench.runner.fastest_passes`; every pass is recorded). ``carry_corpus``
adds every measured answer to its method's corpus (cross-request). A resumed run keeps the
answers an interrupted one ``finished`` (:mod:`verispec.bench.records`); a method that
learns across prompts answers them again, unrecorded, to reach the state an uninterrupted
run would have.

The runners it drives, and the records it keeps, are :mod:`verispec.bench.runner`'s; the
methods it builds them from, :mod:`verispec.bench.methods`'.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence

import attrs

from verispec.bench.methods import build_runners
from verispec.bench.prompts import Question, build_prompt_ids
from verispec.bench.runner import (
    BenchConfig,
    BenchContext,
    BenchRun,
    MethodRunner,
    RecordKey,
    TurnRecord,
    fastest_passes,
    method_orders,
)
from verispec.core.types import GenerationParams
from verispec.errors import ConfigError
from verispec.specs import MethodSpec

__all__ = ["WARMUP_PROMPT", "run_bench"]

WARMUP_PROMPT = "Count from one to ten in words, then name three colours of the rainbow."
_REPLAY_DIFFERS = (
    "`{0.method}` answered question {0.question_id} turn {0.turn} differently when replayed "
    "for --resume than in the records (another machine, thread count or version?); its "
    "learnt state may differ from the interrupted run's."
)


def run_bench(
    context: BenchContext,
    specs: Sequence[MethodSpec],
    questions: Sequence[Question],
    config: BenchConfig | None = None,
    *,
    progress: bool = True,
    runners: dict[str, MethodRunner] | None = None,
    on_record: Callable[[TurnRecord], None] | None = None,
    finished: Mapping[RecordKey, TurnRecord] | None = None,
) -> BenchRun:
    """Run every method on every question and return the raw measurements.

    Args:
        context: the loaded model (see :func:`~verispec.bench.runner.make_context`).
        specs: the methods (:func:`~verispec.specs.parse_methods`).
        questions: the questions, already selected.
        progress: show a tqdm progress bar on stderr.
        runners: prebuilt runners by label (default: built from ``specs``).
        on_record: called after each newly measured answer.
        finished: answers of an interrupted run of the same benchmark, by
            :func:`~verispec.bench.runner.record_key`, kept instead of generated again
            (module docstring).

    Raises:
        ConfigError: no method or no question, or a method not available.
    """
    from tqdm.auto import tqdm

    config = config if config is not None else BenchConfig()
    if not specs:
        raise ConfigError("`methods` must name at least one method.")
    if not questions:
        raise ConfigError("`questions` must hold at least one question.")
    if runners is None:
        runners = build_runners(attrs.evolve(context, verifier=config.verifier), specs)
    finished, labels = finished or {}, [spec.label for spec in specs]
    generation = config.generation(context.eos_token_ids)
    if config.warmup:
        warm_ids = build_prompt_ids(
            context.tokenizer, [{"role": "user", "content": WARMUP_PROMPT}], chat=config.chat
        )
        warm = attrs.evolve(generation, max_new_tokens=min(config.max_new_tokens, 32))
        for label in labels:
            for _ in range(config.warmup):
                runners[label].run(warm_ids, warm)
            runners[label].reset()
    total = config.repeats * len(labels) * sum(len(q.turns) for q in questions)
    records: list[TurnRecord] = []
    orders = method_orders(len(labels))
    with tqdm(total=total, desc="verispec bench", unit="answer", disable=not progress) as bar:
        for repeat in range(config.repeats):
            if repeat:  # every pass starts as the first did: nothing learnt
                for label in labels:
                    runners[label].reset()
            for index, question in enumerate(questions):
                order = orders[index % len(orders)]
                for label in (labels[i] for i in order):
                    bar.set_postfix_str(f"{question.category} #{question.question_id} {label}")
                    records += _conversation(
                        runners[label], label, question, repeat, context, config, generation,
                        on_record, finished,
                    )  # fmt: skip
                    bar.update(len(question.turns))
    kept = fastest_passes(records, config.temperature == 0) if config.repeats > 1 else records
    return BenchRun(config, tuple(specs), tuple(questions), tuple(kept))


def _conversation(
    runner: MethodRunner,
    label: str,
    question: Question,
    repeat: int,
    context: BenchContext,
    config: BenchConfig,
    generation: GenerationParams,
    on_record: Callable[[TurnRecord], None] | None,
    finished: Mapping[RecordKey, TurnRecord],
) -> list[TurnRecord]:
    """One method's answers to every turn of ``question`` in pass ``repeat`` (a finished
    answer kept; a method that learns across prompts answers it again, unrecorded)."""
    messages: list[dict[str, str]] = []
    records = []
    for turn, user_text in enumerate(question.turns):
        messages.append({"role": "user", "content": user_text})
        ids = build_prompt_ids(context.tokenizer, messages, chat=config.chat)
        record = finished.get((str(question.question_id), turn, label, repeat))
        if record is None:
            result = runner.run(ids, generation)
            record = TurnRecord(
                question.question_id, question.category, turn, label, len(ids), result, repeat
            )
            if on_record is not None:
                on_record(record)
        elif (  # replayed, unrecorded, by a method that learns across prompts
            getattr(runner, "learns_across_prompts", False)
            and runner.run(ids, generation).tokens != record.result.tokens
        ):
            warnings.warn(_REPLAY_DIFFERS.format(record), UserWarning, stacklevel=3)
        records.append(record)
        if config.carry_corpus:
            runner.remember(record.result.tokens)
        messages.append({"role": "assistant", "content": record.result.text})
    return records

"""The benchmark loop: every method on every prompt, interleaved, warm-up excluded.

For each question, every method runs the whole conversation (turn 2 is asked
after the method's own answer to turn 1) before the next question starts, so a
slow drift of the machine (thermal throttling, a neighbour's job) hits all
methods alike. The method order rotates from one question to the next so no
method always runs first. Before measuring, each method generates ``warmup``
answers to a prompt outside the set; learnt state (Token Recycling's matrix, a
suffix corpus) is then reset so the measured run starts cold, as in the papers.

Two settings for drafters that keep a corpus of earlier answers (``suffix``,
``dtr:suffix=true``): *independent* (the default: nothing is added to the corpus, each
answer sees only its own context) and *cross-request* (``carry_corpus``: each measured
answer is added to its method's corpus once it is produced, so later questions, and the
second turn, can retrieve from it).

A run can be resumed: given the answers an earlier, interrupted run finished
(``finished``, reloaded by :mod:`verispec.bench.records`), :func:`run_bench` keeps
them and generates only the others. A method that learns across prompts (a drafter
with ``reset``: Token Recycling's matrix, DTR's calibration) first answers its
finished prompts again, unrecorded, and with ``carry_corpus`` remembers their recorded
answers, so that it reaches the remaining ones in the state an uninterrupted run would
have: the report is then the same.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import attrs

from verispec.bench.methods import METHODS
from verispec.bench.prompts import Question, build_prompt_ids
from verispec.bench.registry import MethodSpec
from verispec.bench.runners import BenchContext, MethodRunner, TurnResult
from verispec.core.types import GenerationConfig
from verispec.core.validate import integer
from verispec.errors import ConfigError

__all__ = [
    "VERIFIERS",
    "BenchConfig",
    "BenchRun",
    "RecordKey",
    "TurnRecord",
    "WARMUP_PROMPT",
    "build_runners",
    "check_available",
    "make_context",
    "run_bench",
]

WARMUP_PROMPT = "Count from one to ten in words, then name three colours of the rainbow."

#: The acceptance rules a run may use at temperature > 0 (see :class:`BenchConfig`).
VERIFIERS = ("default", "recursive")


@attrs.frozen
class BenchConfig:
    """Settings shared by every method of one benchmark run.

    Attributes:
        max_new_tokens: most tokens per answer.
        temperature: 0 for greedy; the outputs of verispec's methods are compared
            token by token with the reference at any temperature (see
            :mod:`verispec.bench.report`).
        seed: seeds every generation's random draws (the same seed for every answer).
        warmup: warm-up generations per method before measuring (not counted).
        chat: apply the tokenizer's chat template.
        top_k, top_p, min_p: the sampling filters (see
            :class:`~verispec.core.sampling.SamplingParams`).
        verifier: the acceptance rule of verispec's methods at temperature > 0:
            ``"default"`` (the coupled rule for trees of fixed candidates and plain
            decoding, recursive rejection for draft-model trees) or ``"recursive"``
            (recursive rejection for every tree).
        carry_corpus: add every measured answer to its method's corpus (cross-request).
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    warmup: int = 1
    chat: bool = True
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    verifier: Literal["default", "recursive"] = "default"
    carry_corpus: bool = False

    def __attrs_post_init__(self) -> None:
        integer("warmup", self.warmup, 0)
        if not isinstance(self.chat, bool):
            raise ConfigError(f"`chat` must be True or False; got {self.chat!r}.")
        if self.verifier not in VERIFIERS:
            raise ConfigError(
                f"`verifier` must be one of {', '.join(VERIFIERS)}; got {self.verifier!r}."
            )
        self.generation(None)  # validates the generation settings

    def generation(self, eos: Sequence[int] | None) -> GenerationConfig:
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            seed=self.seed,
            eos_token_ids=tuple(eos) if eos else None,
        )


@attrs.frozen
class TurnRecord:
    """One measured answer: which question, turn and method, and the result."""

    question_id: int | str
    category: str
    turn: int
    method: str
    prompt_tokens: int
    result: TurnResult


#: How a finished answer is found again: (question id as text, turn, method label).
RecordKey = tuple[str, int, str]


def record_key(record: TurnRecord) -> RecordKey:
    return (str(record.question_id), record.turn, record.method)


@attrs.frozen
class BenchRun:
    """Everything measured by :func:`run_bench`, before any summarising."""

    config: BenchConfig
    methods: tuple[MethodSpec, ...]
    questions: tuple[Question, ...]
    records: tuple[TurnRecord, ...]

    @property
    def labels(self) -> list[str]:
        return [spec.label for spec in self.methods]


def check_available(specs: Sequence[MethodSpec]) -> None:
    """Raise :class:`ConfigError` listing every method that cannot run here."""
    problems = []
    for spec in specs:
        reason = METHODS[spec.name].availability()
        if reason is not None:
            problems.append(f"`{spec.label}`: {reason}")
    if problems:
        raise ConfigError("method(s) not available in this installation: " + "; ".join(problems))


def make_context(
    target: Any,
    tokenizer: Any,
    verifier: str = "default",
    *,
    draft_model: Any = None,
    gguf: str | None = None,
) -> BenchContext:
    """A :class:`BenchContext` for a verispec model and its tokenizer.

    End-of-sequence ids are the union of the tokenizer's and the model's, so every
    method stops on the same tokens. ``verifier``: see :class:`BenchConfig`.
    ``draft_model``: a separate draft for the draft-model methods; ``gguf``: the GGUF
    file of the target, for the llama-cpp peers.
    """
    if verifier not in VERIFIERS:
        raise ConfigError(f"`verifier` must be one of {', '.join(VERIFIERS)}; got {verifier!r}.")
    eos: list[int] = []
    for source in (getattr(tokenizer, "eos_token_id", None), getattr(target, "eos_token_id", None)):
        if source is None:
            continue
        for token in [source] if isinstance(source, int) else list(source):
            if int(token) not in eos:
                eos.append(int(token))
    return BenchContext(
        target=target,
        tokenizer=tokenizer,
        hf_model=getattr(target, "hf_model", None),
        eos_token_ids=tuple(eos),
        verifier=verifier,
        draft_model=draft_model,
        gguf=gguf,
    )


def build_runners(context: BenchContext, specs: Sequence[MethodSpec]) -> dict[str, MethodRunner]:
    """One runner per spec, keyed by the spec's label."""
    check_available(specs)
    return {spec.label: METHODS[spec.name].build(context, spec.params) for spec in specs}


def _rotated(labels: list[str], shift: int) -> list[str]:
    shift %= len(labels)
    return labels[shift:] + labels[:shift]


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
        context: the loaded model (see :func:`make_context`).
        specs: the methods, parsed by :func:`~verispec.bench.registry.parse_methods`.
        questions: the questions, already selected.
        progress: show a tqdm progress bar on stderr.
        runners: prebuilt runners by label (built from ``specs`` and ``config.verifier``
            when ``None``).
        on_record: called after each newly measured answer (not for ``finished`` ones).
        finished: answers of an interrupted run of the same benchmark, by
            :func:`record_key`: kept as they are instead of being generated again
            (see the module docstring).

    Raises:
        ConfigError: no method or no question, or a method not available.
    """
    config = config if config is not None else BenchConfig()
    if not specs:
        raise ConfigError("`methods` must name at least one method.")
    if not questions:
        raise ConfigError("`questions` must hold at least one question.")
    if runners is None:
        runners = build_runners(attrs.evolve(context, verifier=config.verifier), specs)
    finished = finished or {}
    labels = [spec.label for spec in specs]
    generation = config.generation(context.eos_token_ids)
    tokenizer = context.tokenizer

    if config.warmup:
        warm_ids = build_prompt_ids(
            tokenizer, [{"role": "user", "content": WARMUP_PROMPT}], chat=config.chat
        )
        warm = attrs.evolve(generation, max_new_tokens=min(config.max_new_tokens, 32))
        for label in labels:
            for _ in range(config.warmup):
                runners[label].run(warm_ids, warm)
            runners[label].reset()

    total = len(labels) * sum(len(q.turns) for q in questions)
    bar = _progress_bar(total, progress)
    records: list[TurnRecord] = []
    try:
        for index, question in enumerate(questions):
            for label in _rotated(labels, index):
                bar.set_postfix_str(f"{question.category} #{question.question_id} {label}")
                messages: list[dict[str, str]] = []
                for turn, user_text in enumerate(question.turns):
                    messages.append({"role": "user", "content": user_text})
                    ids = build_prompt_ids(tokenizer, messages, chat=config.chat)
                    record = finished.get((str(question.question_id), turn, label))
                    if record is not None:
                        _replay(runners[label], ids, generation, record)
                    else:
                        record = TurnRecord(
                            question_id=question.question_id,
                            category=question.category,
                            turn=turn,
                            method=label,
                            prompt_tokens=len(ids),
                            result=runners[label].run(ids, generation),
                        )
                        if on_record is not None:
                            on_record(record)
                    records.append(record)
                    if config.carry_corpus:
                        runners[label].remember(record.result.tokens)
                    messages.append({"role": "assistant", "content": record.result.text})
                    bar.update(1)
    finally:
        bar.close()
    return BenchRun(
        config=config,
        methods=tuple(specs),
        questions=tuple(questions),
        records=tuple(records),
    )


def _replay(
    runner: MethodRunner, ids: Sequence[int], generation: GenerationConfig, record: TurnRecord
) -> None:
    """Answer a finished prompt again, unrecorded, if the method learns across prompts."""
    if not getattr(runner, "learns_across_prompts", False):
        return
    again = runner.run(ids, generation)
    if again.tokens != record.result.tokens:
        warnings.warn(
            f"`{record.method}` answered question {record.question_id} turn {record.turn} "
            "differently when replayed for --resume than in the records (another machine, "
            "thread count or version?); its learnt state may differ from the interrupted run's.",
            UserWarning,
            stacklevel=3,
        )


def _progress_bar(total: int, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="verispec bench", unit="answer", disable=not enabled)

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

Runners bind one method to a loaded model, timed the same way for all:

* :class:`EngineRunner` — verispec's :class:`~verispec.decoder.SpeculativeDecoder`
  with a drafter (or none: ``ar``). The drafter lives as long as the runner, so a
  drafter that learns across prompts (Token Recycling's adjacency matrix) keeps
  what it learnt, as in the paper; :meth:`~EngineRunner.reset` forgets it after the
  warm-up.
* :class:`HFRunner` — Hugging Face ``generate`` on the same underlying model
  (greedy, prompt lookup, early-exit self-speculation, and its static cache with
  ``torch.compile``, its documented fastest greedy path). Forward hooks count and
  time its forwards, so it reports mean accepted tokens too.
* the llama.cpp peers (:mod:`verispec.bench.llama_cpp`, an optional extra).

Work a method does before it can answer at full speed (compiling, sizing a static
cache) is never timed with an answer: it runs untimed and is summed in the runner's
``setup_s``, which the benchmark reports beside the table. Every call is timed by the
same wall clock around the whole generation (prefill included), after synchronising
the device, and the peak memory of the call is recorded: CUDA's peak allocation on a
GPU, else the process's peak resident set (``VmHWM``, reset before the call where
Linux allows it).
"""

from __future__ import annotations

import contextlib
import re
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, Protocol

import attrs
import torch

from verispec.bench.prompts import Question, build_prompt_ids
from verispec.bench.registry import MethodSpec
from verispec.core.types import Drafter, GenerationConfig, LanguageModel
from verispec.core.validate import integer
from verispec.decoder import SpeculativeDecoder
from verispec.errors import ConfigError
from verispec.verifiers import default_verifier, recursive_verifier

__all__ = [
    "VERIFIERS",
    "BenchConfig",
    "BenchContext",
    "BenchRun",
    "EngineRunner",
    "HFRunner",
    "MethodRunner",
    "RecordKey",
    "TurnRecord",
    "TurnResult",
    "WARMUP_PROMPT",
    "build_runners",
    "check_available",
    "make_context",
    "measure_call",
    "run_bench",
]


@attrs.frozen
class BenchContext:
    """What a method factory may use.

    Attributes:
        target: the model under test (a :class:`LanguageModel`).
        tokenizer: its Hugging Face tokenizer (or a stand-in with ``encode``/``decode``).
        hf_model: the underlying ``transformers`` model, for the ``hf*`` peers; ``None``
            when the target has none.
        eos_token_ids: end-of-sequence ids used by every method alike.
        verifier: the acceptance rule of the engine's methods at temperature > 0,
            ``"default"`` or ``"recursive"`` (see :class:`~verispec.bench.BenchConfig`).
        draft_model: a separate draft model for the draft-model methods (``--draft-model``);
            ``None``: they draft with a self-draft of the target.
        gguf: the GGUF file the target was loaded from, for the ``llama-cpp`` peers;
            ``None`` when there is none.
    """

    target: LanguageModel
    tokenizer: Any
    hf_model: Any = None
    eos_token_ids: tuple[int, ...] = ()
    verifier: str = "default"
    draft_model: Any = None
    gguf: str | None = None

    @property
    def device(self) -> torch.device:
        device = getattr(self.target, "device", None)
        if device is None and self.hf_model is not None:
            device = self.hf_model.device
        return torch.device(device if device is not None else "cpu")


def _token_tuple(tokens: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(t) for t in tokens)


@attrs.frozen
class TurnResult:
    """One generation (one user turn) by one method.

    Attributes:
        tokens: the new token ids.
        text: the decoded answer (special tokens skipped).
        seconds: wall-clock seconds of the whole call, prefill included.
        steps: target forwards that produced tokens (engine steps; for ``generate``,
            every target forward, the prefill included, since it yields the first token).
        committed: tokens those forwards committed (``>= len(tokens)``: the last step
            may overshoot ``max_new_tokens``).
        tree_nodes: draft nodes sent to the target, summed over steps; ``None`` where
            the method does not expose them (transformers' drafting peers).
        draft_s, target_s, verify_s: seconds drafting, in the target (forwards, the
            prefill included, and KV commits), verifying; ``None`` where a method
            cannot separate them.
        peak_memory: bytes, the call's peak (see module docstring).
        finish_reason: why generation stopped.
    """

    tokens: tuple[int, ...] = attrs.field(converter=_token_tuple)
    text: str
    seconds: float
    steps: int
    committed: int
    tree_nodes: int | None
    draft_s: float | None
    target_s: float | None
    verify_s: float | None
    peak_memory: int
    finish_reason: str


class MethodRunner(Protocol):
    """A method ready to generate."""

    def reset(self) -> None:
        """Forget what the method learnt from earlier prompts."""
        ...

    def run(self, prompt_ids: Sequence[int], config: GenerationConfig) -> TurnResult:
        """Generate an answer to ``prompt_ids`` (already templated)."""
        ...

    def remember(self, tokens: Sequence[int]) -> None:
        """Keep an answer for later prompts (a suffix corpus); a no-op for other methods."""
        ...


# -- measurement ----------------------------------------------------------------------

_HWM = re.compile(r"VmHWM:\s+(\d+)\s+kB")


def _rss_peak_bytes() -> int:
    try:
        with open("/proc/self/status") as status:
            match = _HWM.search(status.read())
        if match:
            return int(match.group(1)) * 1024
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _reset_rss_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # Linux: reset the peak resident set size (VmHWM)
    except OSError:
        pass  # not Linux, or not allowed: the peak is then the process's lifetime peak


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_call(device: torch.device, fn: Any) -> tuple[Any, float, int]:
    """Run ``fn()``; return its result, wall seconds and peak memory bytes."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        _reset_rss_peak()
    _sync(device)
    start = time.perf_counter()
    out = fn()
    _sync(device)
    seconds = time.perf_counter() - start
    if device.type == "cuda":
        peak = int(torch.cuda.max_memory_allocated(device))
    else:
        peak = _rss_peak_bytes()
    return out, seconds, peak


def _decode(tokenizer: Any, tokens: Sequence[int]) -> str:
    if tokenizer is None:
        return ""
    try:
        return str(tokenizer.decode(list(tokens), skip_special_tokens=True))
    except TypeError:
        return str(tokenizer.decode(list(tokens)))


# -- verispec's engine ----------------------------------------------------------------


class EngineRunner:
    """verispec's decoder with one drafter (``None``: autoregressive).

    The verifier is the package default, or recursive rejection at temperature > 0
    when ``context.verifier`` is ``"recursive"``. When the target is the Hugging Face
    adapter and its device gets the Triton kernels (CUDA, by default), its generations
    run with the Triton tree attention
    (:func:`verispec.kernels.hf_attention.tree_attention_where_supported`); the ``hf``
    peers keep the model's own attention.
    """

    def __init__(self, context: BenchContext, drafter: Drafter | None) -> None:
        policy = recursive_verifier if context.verifier == "recursive" else default_verifier
        self.context = context
        self.drafter = drafter
        self.decoder = SpeculativeDecoder(context.target, drafter, policy, tokenizer=None)
        self.setup_s = 0.0  # the target's compile time is the model's, reported by the CLI

    @property
    def learns_across_prompts(self) -> bool:
        """Whether the drafter keeps state from one prompt to the next (it has ``reset``)."""
        return callable(getattr(self.drafter, "reset", None))

    def reset(self) -> None:
        reset = getattr(self.drafter, "reset", None)
        if callable(reset):
            reset()

    def remember(self, tokens: Sequence[int]) -> None:
        remember = getattr(self.drafter, "remember", None)
        if callable(remember):
            remember(list(tokens))

    def run(self, prompt_ids: Sequence[int], config: GenerationConfig) -> TurnResult:
        if config.eos_token_ids is None and self.context.eos_token_ids:
            config = attrs.evolve(config, eos_token_ids=self.context.eos_token_ids)
        attention: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if type(self.context.target).__name__ == "HFModel" and self.context.hf_model is not None:
            from verispec.kernels.hf_attention import tree_attention_where_supported

            attention = tree_attention_where_supported(self.context.hf_model)
        with attention:
            result, seconds, peak = measure_call(
                self.context.device, lambda: self.decoder.generate(list(prompt_ids), config)
            )
        split = result.time_split()
        return TurnResult(
            tokens=result.tokens,
            text=_decode(self.context.tokenizer, result.tokens),
            seconds=seconds,
            steps=result.num_steps,
            committed=sum(step.committed for step in result.steps),
            tree_nodes=sum(step.tree_size for step in result.steps),
            draft_s=split["draft"],
            target_s=split["target"] + split["commit"] + result.prefill_s,
            verify_s=split["verify"],
            peak_memory=peak,
            finish_reason=result.finish_reason,
        )


# -- Hugging Face generate ------------------------------------------------------------

_STATIC_STEP = 512  # static-cache sizes are multiples of this: few sizes, few recompiles


class _ForwardClock:
    """Forward hooks that count and time an HF model's target and draft forwards.

    With ``assistant_early_exit`` transformers drafts with the same module, its
    ``config.num_hidden_layers`` lowered for the draft: such calls count as drafting.
    The hooks are attached only while one ``generate`` runs. On CUDA they record events
    instead of synchronising, so the peer is not slowed by the measurement; the times
    are read once the call has finished (and synchronised).
    """

    def __init__(self, hf_model: Any, device: torch.device) -> None:
        self.model = hf_model
        self.cuda = device.type == "cuda"
        self.full_layers = getattr(hf_model.config, "num_hidden_layers", None)
        self._started: Any = None
        self._spans: list[tuple[bool, Any, Any]] = []  # (is_draft, start, end)

    @contextlib.contextmanager
    def attached(self, compiled: bool = False) -> Iterator[None]:
        """Hooks on the model while the block runs; ``compiled``: the forward is compiled
        (hf-static), which must call the hooks, not trace them."""
        self._spans = []
        before, after = self._before, self._after
        if compiled:  # imported only here: torch._dynamo is heavy and imports Triton
            before, after = torch.compiler.disable(before), torch.compiler.disable(after)
        handles = [
            self.model.register_forward_pre_hook(before),
            self.model.register_forward_hook(after),
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _is_draft(self) -> bool:
        base = getattr(self.model, getattr(self.model, "base_model_prefix", ""), self.model)
        layers = getattr(getattr(base, "config", None), "num_hidden_layers", None)
        return layers is not None and self.full_layers is not None and layers < self.full_layers

    def _now(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _before(self, module: Any, args: Any) -> None:
        self._started = self._now()

    def _after(self, module: Any, args: Any, output: Any) -> None:
        self._spans.append((self._is_draft(), self._started, self._now()))

    def totals(self) -> tuple[int, float, float]:
        """Target forwards, target seconds, draft seconds of the last attached call."""
        calls, target_s, draft_s = 0, 0.0, 0.0
        for is_draft, start, end in self._spans:
            seconds = start.elapsed_time(end) / 1000 if self.cuda else end - start
            if is_draft:
                draft_s += seconds
            else:
                calls += 1
                target_s += seconds
        return calls, target_s, draft_s


class HFRunner:
    """``hf_model.generate`` with fixed extra keyword arguments.

    Args:
        extra: e.g. ``{"prompt_lookup_num_tokens": 10}`` or ``{"assistant_early_exit": 8}``.
        drafts: ``"none"`` (plain greedy: no draft time), ``"forwards"`` (drafts with
            early-exit forwards of the same module: the hooks time them) or ``"opaque"``
            (drafts outside any forward, e.g. prompt lookup: draft time unknown).
    """

    def __init__(
        self,
        context: BenchContext,
        extra: dict[str, Any],
        drafts: str = "none",
        *,
        static_cache: bool = False,
    ) -> None:
        if context.hf_model is None:
            raise ConfigError(
                "the `hf` methods need a target that wraps a transformers model "
                "(`.hf_model`); this one has none."
            )
        self.context = context
        self.model = context.hf_model
        self.extra = dict(extra)
        self.drafts = drafts
        self.clock = _ForwardClock(self.model, context.device)
        self.static_cache = static_cache
        self._cache_len = 0  # static cache slots the compiled forward was warmed up for
        self.setup_s = 0.0

    def reset(self) -> None:
        pass

    def remember(self, tokens: Sequence[int]) -> None:
        pass

    def _static_options(self) -> dict[str, Any]:
        """transformers' static cache of ``_cache_len`` slots, its decode step compiled."""
        from transformers import CompileConfig

        compile_config = CompileConfig(mode="default")  # the timing hooks break the graph
        compile_config._compile_all_devices = True  # type: ignore[assignment]  # else GPUs only
        return {
            "cache_implementation": "static",
            "max_cache_len": self._cache_len,
            "compile_config": compile_config,
        }

    def _ensure_static(self, prompt_tokens: int, config: GenerationConfig) -> None:
        """Size the static cache for this prompt; compile for a new size, untimed."""
        needed = prompt_tokens + config.max_new_tokens + 1
        if needed <= self._cache_len:
            return
        self._cache_len = -(-needed // _STATIC_STEP) * _STATIC_STEP
        warm = attrs.evolve(config, max_new_tokens=min(config.max_new_tokens, 4), temperature=0)
        ids = torch.zeros((1, prompt_tokens), dtype=torch.long, device=self.context.device)
        start = time.perf_counter()
        with self.clock.attached(compiled=True):  # as when measured: the graph serves both
            self._generate(ids, warm)
        self.setup_s += time.perf_counter() - start

    def _generate(self, ids: torch.Tensor, config: GenerationConfig) -> torch.Tensor:
        eos = list(config.eos_token_ids or self.context.eos_token_ids)
        kwargs: dict[str, Any] = {
            "max_new_tokens": config.max_new_tokens,
            "eos_token_id": eos or None,
            "pad_token_id": eos[0] if eos else None,
            **self.extra,
        }
        if self.static_cache:
            kwargs.update(self._static_options())
        if config.temperature > 0:
            # transformers samples from torch's global generator: seed it per call so
            # that runs repeat (verispec itself never uses the global generator).
            torch.manual_seed(config.seed)
            kwargs.update(
                do_sample=True,
                temperature=config.temperature,
                top_k=config.top_k or None,
                top_p=config.top_p,
                min_p=config.min_p or None,
            )
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        with torch.inference_mode():
            return self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)

    def run(self, prompt_ids: Sequence[int], config: GenerationConfig) -> TurnResult:
        if self.static_cache:
            self._ensure_static(len(prompt_ids), config)
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.context.device)
        with self.clock.attached(compiled=self.static_cache):
            out, seconds, peak = measure_call(
                self.context.device, lambda: self._generate(ids, config)
            )
        calls, target_s, forward_draft_s = self.clock.totals()
        tokens = [int(t) for t in out[0, ids.shape[1] :].tolist()]
        eos = set(config.eos_token_ids or self.context.eos_token_ids)
        finish = "eos" if tokens and tokens[-1] in eos else "max_new_tokens"
        steps = max(calls, 1)
        draft_s = {"none": 0.0, "forwards": forward_draft_s}.get(self.drafts)
        return TurnResult(
            tokens=tokens,
            text=_decode(self.context.tokenizer, tokens),
            seconds=seconds,
            steps=steps,
            committed=len(tokens),
            tree_nodes=0 if self.drafts == "none" else None,
            draft_s=draft_s,
            target_s=target_s,
            verify_s=None,
            peak_memory=peak,
            finish_reason=finish,
        )


# -- the benchmark loop ----------------------------------------------------------

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
    from verispec.bench.methods import METHODS  # the table builds runners defined here

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
    from verispec.bench.methods import METHODS

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

"""The benchmark's runners and what they record (what they measure and why:
docs/benchmarks.rst, "How it measures" and "The llama.cpp peers").

A runner answers one templated prompt for one method; :func:`~verispec.bench.loop.run_bench`
(:mod:`verispec.bench.loop`) drives them, in the orders :func:`method_orders` gives, and
keeps each answer's :class:`TurnRecord` (over several passes, each answer's fastest:
:func:`fastest_passes`). :class:`BenchConfig` holds the settings every method of a run
shares.

Every runner is timed by :func:`measure_call` (one wall clock around the whole call, and
its peak memory); work before a method can answer at full speed (compiling, sizing a
cache) is untimed, summed in its ``setup_s``. :class:`EngineRunner` is verispec's decoder;
:class:`HFRunner` transformers' ``generate`` on the same model, its forwards counted and
timed by hooks; :class:`LlamaCppRunner` llama-cpp-python on the target's GGUF file.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import re
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal, Protocol

import attrs
import torch

from verispec.bench.prompts import Question
from verispec.core.engine import GenerationResult
from verispec.core.types import Drafter, GenerationParams, LanguageModel
from verispec.core.validate import attrs_check, boolean, integer
from verispec.decoder import SpeculativeDecoder
from verispec.errors import ConfigError
from verispec.specs import MethodSpec
from verispec.verifiers import default_verifier, recursive_verifier

__all__ = [
    "BenchConfig", "BenchContext", "BenchRun", "EngineRunner", "HFRunner", "LlamaCppRunner",
    "MethodRunner", "RecordKey", "TurnRecord", "TurnResult", "fastest_passes",
    "llama_cpp_available", "make_context", "measure_call", "method_orders", "record_key",
]  # fmt: skip

VERIFIERS = ("default", "recursive")  # the acceptance rules at temperature > 0


def _verifier(name: str, value: str) -> str:
    if value not in VERIFIERS:
        raise ConfigError(f"`{name}` must be one of {', '.join(VERIFIERS)}; got {value!r}.")
    return value


@attrs.frozen
class BenchContext:
    """What a method factory may use: the ``target`` (a :class:`LanguageModel`), its
    ``tokenizer``, the underlying transformers model for the ``hf*`` peers (``hf_model``),
    the end-of-sequence ids every method stops on, the ``verifier`` at temperature > 0
    (see :class:`BenchConfig`), a separate ``draft_model`` for the draft-model methods
    (``None``: a self-draft of the target) and the target's ``gguf`` file for llama.cpp."""

    target: LanguageModel
    tokenizer: Any
    hf_model: Any = None
    eos_token_ids: tuple[int, ...] = ()
    verifier: str = attrs.field(default="default", validator=attrs_check(_verifier))
    draft_model: Any = None
    gguf: str | None = None

    def stop_ids(self, config: GenerationParams) -> tuple[int, ...]:
        """The ids an answer stops on: ``config``'s if it names any, else the context's."""
        return tuple(config.eos_token_ids or self.eos_token_ids)

    @property
    def device(self) -> torch.device:
        device = getattr(self.target, "device", None) or getattr(self.hf_model, "device", None)
        return torch.device(device or "cpu")


@attrs.frozen
class TurnResult:
    """One generation (one user turn) by one method.

    Attributes:
        tokens, text: the new token ids, and the answer decoded (special tokens skipped).
        seconds: wall-clock seconds of the whole call, prefill included.
        steps: target forwards that produced tokens (for ``generate``, every target
            forward, the prefill included, since it yields the first token).
        committed: tokens those forwards committed (the last may overshoot the budget).
        tree_nodes: draft nodes sent to the target, summed; ``None`` where not exposed.
        draft_s, target_s, verify_s: seconds drafting, in the target (forwards, prefill
            and KV commits), verifying; ``None`` where a method cannot separate them.
        peak_memory: bytes, the call's peak; ``finish_reason``: why generation stopped.
        prefill_s: seconds of the prompt's forward: verispec's ``prefill`` (every prompt
            token but the last, which is the first step's root), transformers' first
            forward, llama.cpp's first ``eval``; ``None`` where not measured.
    """

    tokens: tuple[int, ...] = attrs.field(converter=lambda ts: tuple(int(t) for t in ts))
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
    prefill_s: float | None = None


class MethodRunner(Protocol):
    """A method ready to answer templated ``prompt_ids``; ``reset`` forgets what it learnt
    from earlier prompts, ``remember`` keeps an answer for later ones (a suffix corpus)."""

    def reset(self) -> None: ...

    def run(self, prompt_ids: Sequence[int], config: GenerationParams) -> TurnResult: ...

    def remember(self, tokens: Sequence[int]) -> None: ...


def _rss_peak_bytes() -> int:
    with contextlib.suppress(OSError), open("/proc/self/status") as status:
        match = re.search(r"VmHWM:\s+(\d+)\s+kB", status.read())
        if match:
            return int(match.group(1)) * 1024
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def measure_call(device: torch.device, fn: Callable[[], Any]) -> tuple[Any, float, int]:
    """Run ``fn()``; return its result, wall seconds (the device synchronised before and
    after) and peak memory bytes: CUDA's peak allocation, else the process's peak resident
    set ``VmHWM``, reset before the call where Linux allows it."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.synchronize(device)
    else:  # Linux: reset the peak resident set; elsewhere it is the process's lifetime peak
        with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    start = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    peak = int(torch.cuda.max_memory_allocated(device)) if cuda else _rss_peak_bytes()
    return out, seconds, peak


def _decode(tokenizer: Any, tokens: Sequence[int]) -> str:
    if tokenizer is None:
        return ""
    try:
        return str(tokenizer.decode(list(tokens), skip_special_tokens=True))
    except TypeError:
        return str(tokenizer.decode(list(tokens)))


class EngineRunner:
    """verispec's decoder with one drafter (``None``: autoregressive), the package's
    default verifier or, at temperature > 0, recursive rejection when the context says
    so. On the Hugging Face adapter where the Triton kernels run (CUDA, by default), its
    generations use the Triton tree attention; the ``hf`` peers keep the model's own."""

    def __init__(self, context: BenchContext, drafter: Drafter | None) -> None:
        policy = recursive_verifier if context.verifier == "recursive" else default_verifier
        self.context, self.drafter = context, drafter
        self.decoder = SpeculativeDecoder(context.target, drafter, policy, tokenizer=None)
        # structured output reads the tokenizer's vocabulary: a decoder that has it
        self._with_tokenizer = functools.partial(
            SpeculativeDecoder, context.target, drafter, policy, tokenizer=context.tokenizer
        )
        self.learns_across_prompts = callable(getattr(drafter, "reset", None))
        self.setup_s = 0.0  # the target's compile time is the model's, reported by the CLI
        self.last_result: GenerationResult | None = None

    def reset(self) -> None:
        if self.learns_across_prompts:
            self.drafter.reset()  # type: ignore[union-attr]

    def remember(self, tokens: Sequence[int]) -> None:
        remember = getattr(self.drafter, "remember", None)
        if callable(remember):
            remember(list(tokens))

    def run(self, prompt_ids: Sequence[int], config: GenerationParams) -> TurnResult:
        config = attrs.evolve(config, eos_token_ids=self.context.stop_ids(config) or None)
        attention: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        hf_attention = getattr(self.context.target, "runs_hf_attention", False)
        if hf_attention and self.context.hf_model is not None:
            from verispec.kernels.hf_attention import tree_attention_where_supported

            attention = tree_attention_where_supported(self.context.hf_model)
        with attention:
            decoder = self._with_tokenizer() if config.constrained else self.decoder
            result, seconds, peak = measure_call(
                self.context.device, lambda: decoder.generate(list(prompt_ids), config)
            )
        self.last_result = result  # the per-request figures, for `verispec generate --json`
        split = result.time_split()
        return TurnResult(
            result.tokens,
            _decode(self.context.tokenizer, result.tokens),
            seconds,
            steps=result.num_steps,
            committed=sum(step.committed for step in result.steps),
            tree_nodes=sum(step.tree_size for step in result.steps),
            draft_s=split["draft"],
            target_s=split["target"] + split["commit"] + result.prefill_s,
            verify_s=split["verify"],
            peak_memory=peak,
            finish_reason=result.finish_reason,
            prefill_s=result.prefill_s,
        )


def _refuse_processing(peer: object, config: GenerationParams) -> None:
    """The peers decode without verispec's processing: refuse rather than ignore it."""
    if config.processes_logits:
        raise ConfigError(
            f"the benchmark peer {type(peer).__name__} does not apply logits processing or "
            "structured output (repetition penalty, JSON schema, regex, grammar); use a "
            "verispec method."
        )


class _Peer:
    """What the peers share: nothing learnt across prompts, a cache or context grown in
    steps (untimed), and how an answer is reported (``drafts``: see :class:`HFRunner`)."""

    context: BenchContext
    drafts = "none"
    setup_s = 0.0
    size = 0  # tokens the cache or context holds; 0: not built yet

    def reset(self) -> None:
        pass

    def remember(self, tokens: Sequence[int]) -> None:
        pass

    def _fit(self, needed: int, step: int, build: Callable[[], object]) -> None:
        """Where ``needed`` tokens exceed ``size``: grow it to a multiple of ``step`` (few
        sizes, few rebuilds) and ``build()``, its seconds added to ``setup_s``."""
        if needed > self.size:
            start, self.size = time.perf_counter(), -(-needed // step) * step
            build()
            self.setup_s += time.perf_counter() - start

    def _result(
        self,
        tokens: list[int],
        config: GenerationParams,
        seconds: float,
        peak: int,
        forwards: int,
        target_s: float | None = None,
        draft_s: float = 0.0,
        prefill_s: float | None = None,
    ) -> TurnResult:
        """The answer ``tokens`` of a call measured by :func:`measure_call`, made in
        ``forwards`` target forwards (at least one: the prefill yields a token), the first
        of them, over the prompt, ``prefill_s`` seconds."""
        eos = set(self.context.stop_ids(config))
        return TurnResult(
            tokens,
            _decode(self.context.tokenizer, tokens),
            seconds,
            steps=max(forwards, 1),
            committed=len(tokens),
            tree_nodes=0 if self.drafts == "none" else None,
            draft_s={"none": 0.0, "forwards": draft_s}.get(self.drafts),
            target_s=target_s,
            verify_s=None,
            peak_memory=peak,
            finish_reason="eos" if tokens and tokens[-1] in eos else "max_new_tokens",
            prefill_s=prefill_s,
        )


class HFRunner(_Peer):
    """``hf_model.generate`` with fixed ``extra`` keyword arguments (e.g.
    ``{"prompt_lookup_num_tokens": 10}``). ``drafts``: ``"none"`` (no draft time),
    ``"forwards"`` (``assistant_early_exit``: the same module with its
    ``num_hidden_layers`` lowered, timed as drafting) or ``"opaque"`` (outside any
    forward, e.g. prompt lookup: unknown). Hooks count and time the model's forwards (on
    CUDA they record events, read after the call). ``static_cache``: transformers' static
    cache, sized in multiples of 512 slots, its decode step compiled (untimed, for each
    new size)."""

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
        self.context, self.model, self.extra = context, context.hf_model, dict(extra)
        self.drafts, self.static_cache = drafts, static_cache
        self.cuda = context.device.type == "cuda"
        self.full_layers = getattr(self.model.config, "num_hidden_layers", None)
        self._stamps: list[tuple[bool, Any]] = []  # (drafting, time) before and after each

    def _stamp(self, *_: Any) -> None:
        """The forward hook, before and after: the time, and whether the call drafts."""
        base = getattr(self.model, getattr(self.model, "base_model_prefix", ""), self.model)
        layers = getattr(getattr(base, "config", None), "num_hidden_layers", None)
        drafting = layers is not None and self.full_layers is not None and layers < self.full_layers
        now: Any = time.perf_counter()
        if self.cuda:
            now = torch.cuda.Event(enable_timing=True)
            now.record()
        self._stamps.append((drafting, now))

    @contextlib.contextmanager
    def _hooked(self) -> Iterator[None]:
        """The hooks on the model while the block runs. Under hf-static's compiled forward
        they must be called, not traced (torch._dynamo, heavy, is imported only then)."""
        self._stamps = []
        stamp = torch.compiler.disable(self._stamp) if self.static_cache else self._stamp
        hooks = [self.model.register_forward_pre_hook(stamp)]
        hooks.append(self.model.register_forward_hook(stamp))
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()

    def _forwards(self) -> tuple[int, float, float, float | None]:
        """Target forwards, target seconds, draft seconds of the last hooked call, and the
        seconds of its first target forward (the prompt's)."""
        seconds: dict[bool, list[float]] = {False: [], True: []}
        for (_, start), (drafting, end) in zip(self._stamps[::2], self._stamps[1::2], strict=True):
            seconds[drafting].append(start.elapsed_time(end) / 1000 if self.cuda else end - start)
        first = seconds[False][0] if seconds[False] else None
        return len(seconds[False]), sum(seconds[False]), sum(seconds[True]), first

    def _generate(self, ids: torch.Tensor, config: GenerationParams) -> torch.Tensor:
        eos = list(self.context.stop_ids(config))
        kwargs: dict[str, Any] = {
            "max_new_tokens": config.max_new_tokens,
            "eos_token_id": eos or None,
            "pad_token_id": eos[0] if eos else None,
            **self.extra,
        }
        if self.static_cache:
            from transformers import CompileConfig

            compile_config = CompileConfig(mode="default")  # the timing hooks break the graph
            compile_config._compile_all_devices = True  # type: ignore[assignment]  # not GPUs only
            kwargs.update(
                cache_implementation="static",
                max_cache_len=self.size,
                compile_config=compile_config,
            )
        if config.temperature > 0:
            # transformers samples from torch's global generator: seed it per call so that
            # runs repeat (verispec itself never uses the global generator).
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

    def _compile(self, length: int, config: GenerationParams) -> None:
        """A short greedy answer to a ``length``-token prompt, hooked as when measured (one
        graph serves both): builds the compiled step for the static cache's new size."""
        warm = attrs.evolve(config, max_new_tokens=min(config.max_new_tokens, 4), temperature=0)
        with self._hooked():
            self._generate(
                torch.zeros((1, length), dtype=torch.long, device=self.context.device), warm
            )

    def run(self, prompt_ids: Sequence[int], config: GenerationParams) -> TurnResult:
        _refuse_processing(self, config)
        if self.static_cache:
            needed = len(prompt_ids) + config.max_new_tokens + 1
            self._fit(needed, 512, lambda: self._compile(len(prompt_ids), config))
        device = self.context.device
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
        with self._hooked():
            out, seconds, peak = measure_call(device, lambda: self._generate(ids, config))
        tokens = out[0, ids.shape[1] :].tolist()
        return self._result(tokens, config, seconds, peak, *self._forwards())


def llama_cpp_available() -> str | None:
    """``None`` when ``llama_cpp`` can be imported here, else why not and how to install it."""
    if importlib.util.find_spec("llama_cpp") is None:
        return (
            "llama-cpp-python is not installed; install it with `pip install "
            "'verispec[llamacpp]'` (= `pip install llama-cpp-python`: builds llama.cpp from "
            "source with a C++ compiler and cmake, ~25 min on 2 cores) or run "
            "`VERISPEC_LLAMACPP=1 bash scripts/bench.sh`."
        )
    return None


class LlamaCppRunner(_Peer):
    """``llama_cpp.Llama.generate`` on the context's GGUF file, from an empty cache each
    call; each ``Llama.eval`` is a forward. ``prompt_lookup``: ``(max_ngram_size,
    num_pred_tokens)`` of its ``LlamaPromptLookupDecoding``, or ``None`` for plain
    decoding. ``llama_class``, ``lookup_class``: stand-ins for tests. The ``Llama`` object
    is built on first use with a context of a multiple of 1024 tokens holding the prompt,
    the answer and a round of drafts, and again when a longer prompt needs more."""

    def __init__(
        self,
        context: BenchContext,
        prompt_lookup: tuple[int, int] | None = None,
        *,
        llama_class: Any = None,
        lookup_class: Any = None,
    ) -> None:
        if context.gguf is None:
            raise ConfigError(
                "the llama-cpp peers need the target's GGUF file: use --model smollm2 (the "
                "embedded GGUF) or --model FILE.gguf."
            )
        if llama_class is None or (prompt_lookup is not None and lookup_class is None):
            if (reason := llama_cpp_available()) is not None:
                raise ConfigError(reason)
            import llama_cpp
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            llama_class = llama_class or llama_cpp.Llama
            lookup_class = lookup_class or LlamaPromptLookupDecoding
        self.context, self.prompt_lookup = context, prompt_lookup
        self._llama_class, self._lookup_class = llama_class, lookup_class
        self.drafts = "none" if prompt_lookup is None else "opaque"
        self.threads = torch.get_num_threads()
        self.llama: Any = None
        self.forwards = 0  # eval calls of the current generation
        self.prefill_s: float | None = None  # seconds of its first (the prompt's)

    def _build(self) -> None:
        options: dict[str, Any] = {
            "model_path": str(self.context.gguf),
            "n_ctx": self.size,
            "n_threads": self.threads,
            "n_threads_batch": self.threads,
            "verbose": False,
        }
        if self.prompt_lookup is not None:
            ngram, tokens = self.prompt_lookup
            # Drafting keeps every row's logits; llama-cpp-python 0.3 sizes that buffer from
            # logits_all (n_batch rows without it: prompts past 512 tokens overflow it).
            lookup = self._lookup_class(max_ngram_size=ngram, num_pred_tokens=tokens)
            options.update(draft_model=lookup, logits_all=True)
        self.llama = None  # free the old context first
        llama = self._llama_class(**options)
        plain_eval = llama.eval

        def counted_eval(tokens: Sequence[int]) -> Any:
            self.forwards += 1
            if self.forwards > 1:
                return plain_eval(tokens)
            start = time.perf_counter()  # the first eval: the prompt's
            try:
                return plain_eval(tokens)
            finally:
                self.prefill_s = time.perf_counter() - start

        llama.eval, self.llama = counted_eval, llama

    def _generate(self, prompt: list[int], config: GenerationParams) -> list[int]:
        eos, llama = set(self.context.stop_ids(config)), self.llama
        llama.reset()  # an empty cache: no prompt prefix reused from the last call
        sampling = {"temp": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0}
        if config.temperature > 0:  # top_k 0 disables it in llama.cpp, as in verispec
            llama.set_seed(config.seed)
            sampling.update(
                temp=config.temperature, top_k=config.top_k, top_p=config.top_p, min_p=config.min_p
            )
        tokens: list[int] = []
        stream = llama.generate(prompt, reset=True, **sampling)
        try:
            for token in stream:
                tokens.append(int(token))
                if int(token) in eos or len(tokens) >= config.max_new_tokens:
                    break
        finally:
            stream.close()
        return tokens

    def run(self, prompt_ids: Sequence[int], config: GenerationParams) -> TurnResult:
        _refuse_processing(self, config)
        prompt = [int(t) for t in prompt_ids]
        draft_room = self.prompt_lookup[1] if self.prompt_lookup is not None else 0
        self._fit(len(prompt) + config.max_new_tokens + draft_room + 1, 1024, self._build)
        self.forwards, self.prefill_s = 0, None
        tokens, seconds, peak = measure_call(
            torch.device("cpu"), lambda: self._generate(prompt, config)
        )
        return self._result(tokens, config, seconds, peak, self.forwards, prefill_s=self.prefill_s)


@attrs.frozen
class BenchConfig:
    """Settings shared by every method of one benchmark run.

    Attributes:
        max_new_tokens: most tokens per answer; ``temperature``: 0 for greedy.
        seed: seeds every generation's random draws (the same for every answer).
        warmup: warm-up answers per method before measuring (not counted).
        chat: apply the tokenizer's chat template.
        top_k, top_p, min_p: the sampling filters (see
            :class:`~verispec.core.sampling.SamplingParams`).
        verifier: the acceptance rule of verispec's methods at temperature > 0:
            ``"default"`` (the coupled rule for trees of fixed candidates and plain
            decoding, recursive rejection for draft-model trees) or ``"recursive"``.
        carry_corpus: add every measured answer to its method's corpus (cross-request).
        repeats: passes over the whole benchmark, every method reset before each; an
            answer's figures are those of its fastest pass (:func:`fastest_passes`).
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    warmup: int = attrs.field(default=1, validator=attrs_check(integer, 0))
    chat: bool = attrs.field(default=True, validator=attrs_check(boolean))
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    verifier: Literal["default", "recursive"] = attrs.field(
        default="default", validator=attrs_check(_verifier)
    )
    carry_corpus: bool = False
    repeats: int = attrs.field(default=1, validator=attrs_check(integer, 1))

    def __attrs_post_init__(self) -> None:
        self.generation(None)  # validates the generation settings

    def generation(self, eos: Sequence[int] | None) -> GenerationParams:
        shared = ("max_new_tokens", "temperature", "top_k", "top_p", "min_p", "seed")
        settings = {name: getattr(self, name) for name in shared}
        return GenerationParams(**settings, eos_token_ids=tuple(eos) if eos else None)


@attrs.frozen
class TurnRecord:
    """One measured answer: which question, turn and method, the result, and which pass
    over the benchmark measured it (``repeat``, from 0; :attr:`BenchConfig.repeats`)."""

    question_id: int | str
    category: str
    turn: int
    method: str
    prompt_tokens: int
    result: TurnResult
    repeat: int = 0


RecordKey = tuple[str, int, str, int]
"""A finished answer: (question id as text, turn, method label, pass)."""


def record_key(record: TurnRecord) -> RecordKey:
    return (str(record.question_id), record.turn, record.method, record.repeat)


_PASSES_DIFFER = (
    "`{0.method}` answered question {0.question_id} turn {0.turn} differently in two passes "
    "of a greedy benchmark; the figures keep the faster pass's answer."
)


def fastest_passes(records: Sequence[TurnRecord], greedy: bool) -> list[TurnRecord]:
    """Each answer's record from its fastest pass (the fewest seconds per new token), in
    the order the answers were first measured.

    A machine that stalls for a second (a neighbour's burst, a page-cache flush) adds time
    to whichever answer was running; it never takes time away. Timing each answer in
    several passes and keeping the fastest, as ``timeit`` keeps the fastest repetition,
    leaves such stalls out of every method alike. A method whose own work changes between
    passes (a drafter sized by measured times may send other trees) keeps its better pass;
    the report says how many passes were run.

    Args:
        records: answers of one or more passes (:attr:`TurnRecord.repeat`).
        greedy: the answers must be token-identical between passes (a warning names any
            that is not); sampled answers may differ where trees do.
    """
    best: dict[tuple[str, int, str], TurnRecord] = {}
    for record in records:
        key = record_key(record)[:3]
        kept = best.get(key)
        if kept is None:
            best[key] = record
            continue
        if greedy and record.result.tokens != kept.result.tokens:
            warnings.warn(_PASSES_DIFFER.format(record), UserWarning, stacklevel=2)
        if _seconds_per_token(record) < _seconds_per_token(kept):
            best[key] = record
    return list(best.values())


def _seconds_per_token(record: TurnRecord) -> float:
    return record.result.seconds / max(1, len(record.result.tokens))


@attrs.frozen
class BenchRun:
    """Everything :func:`run_bench` measured, before any summarising (over several passes,
    each answer's fastest)."""

    config: BenchConfig
    methods: tuple[MethodSpec, ...]
    questions: tuple[Question, ...]
    records: tuple[TurnRecord, ...]

    @property
    def labels(self) -> list[str]:
        return [spec.label for spec in self.methods]


def make_context(
    target: Any,
    tokenizer: Any,
    verifier: str = "default",
    *,
    draft_model: Any = None,
    gguf: str | None = None,
) -> BenchContext:
    """A :class:`BenchContext` for a verispec model and its tokenizer; its end-of-sequence
    ids are the union of the tokenizer's and the model's, so every method stops alike."""
    sources = [getattr(tokenizer, "eos_token_id", None), getattr(target, "eos_token_id", None)]
    ids = [[s] if isinstance(s, int) else list(s) for s in sources if s is not None]
    eos = tuple(dict.fromkeys(int(token) for group in ids for token in group))
    hf_model = getattr(target, "hf_model", None)
    return BenchContext(target, tokenizer, hf_model, eos, verifier, draft_model, gguf)


def method_orders(count: int) -> list[list[int]]:
    """The orders in which ``count`` methods answer successive questions: a Williams design
    (Williams 1949, "Experimental designs balanced for the estimation of residual effects
    of treatments"), cycled. Over a full cycle every method answers first, second... equally
    often, and is preceded by every other method equally often: once for an even ``count``
    (``count`` orders), twice for an odd one (the ``count`` orders and their reverses). A
    rotation alone keeps each method's predecessor fixed, so whatever one method leaves
    behind (a peer's threads, its caches) would always fall on the same other method.

    Args:
        count: methods, at least 1.

    Returns:
        ``count`` or ``2 count`` permutations of ``range(count)``; the first is the
        identity, the second (for ``count`` > 1) starts with method 1.

    Raises:
        ConfigError: ``count`` below 1.
    """
    if count < 1:
        raise ConfigError(f"`count` must be at least 1; got {count}.")
    if count == 1:
        return [[0]]
    first = [0] + [(j + 1) // 2 if j % 2 else count - j // 2 for j in range(1, count)]
    label = {method: j for j, method in enumerate(first)}  # so that the first order is 0, 1...
    orders = [[label[(method + shift) % count] for method in first] for shift in range(count)]
    if count % 2:
        orders += [order[::-1] for order in orders]
    return orders

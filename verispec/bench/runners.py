"""Runners: one benchmark method bound to a loaded model, timed the same way for all.

Two kinds:

* :class:`EngineRunner` — verispec's :class:`~verispec.decoder.SpeculativeDecoder`
  with a drafter (or none: ``ar``). The drafter lives as long as the runner, so a
  drafter that learns across prompts (Token Recycling's adjacency matrix) keeps
  what it learnt, as in the paper; :meth:`reset` forgets it after the warm-up.
* :class:`HFRunner` — Hugging Face ``generate`` on the same underlying model
  (greedy, prompt lookup, early-exit self-speculation, and its static cache with
  ``torch.compile``, its documented fastest greedy path). Forward hooks count and
  time its forwards, so it reports mean accepted tokens too.

Work a method does before it can answer at full speed (compiling, sizing a static
cache) is never timed with an answer: it runs untimed and is summed in the runner's
``setup_s``, which the benchmark reports beside the table.

Every call is timed by the same wall clock around the whole generation
(prefill included), after synchronising the device, and the peak memory of the
call is recorded: CUDA's peak allocation on a GPU, else the process's peak
resident set (``VmHWM``, reset before the call where Linux allows it).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

import attrs
import torch

from verispec.core.types import Drafter, GenerationConfig, LanguageModel
from verispec.decoder import SpeculativeDecoder
from verispec.verifiers import default_verifier, recursive_verifier

__all__ = [
    "BenchContext",
    "EngineRunner",
    "HFRunner",
    "MethodRunner",
    "TurnResult",
    "measure_call",
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
            from verispec.errors import ConfigError

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

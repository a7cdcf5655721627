"""The speculative decoding loop.

``Engine.generate`` prefills the prompt, then repeats

1. propose   — the drafter sends a :class:`~verispec.core.tree.DraftTree`;
2. score     — the target scores root and tree in one ``forward_tree``;
3. verify    — the verifier keeps one path and draws one extra token (against the
               processed logits, when the generation asks for processing);
4. commit    — the target keeps only that path's KV entries;
5. observe   — the drafter learns from the outcome;

until an end-of-sequence token, a stop string or ``max_new_tokens``. With a
drafter that always sends the empty tree (:class:`verispec.drafters.Autoregressive`)
this is plain autoregressive decoding through the same code.

The core knows no concrete drafter or verifier and holds no module-level state:
it is handed a drafter and a verifier (or a policy that picks one from the
sampling parameters). The package's public face,
:class:`verispec.SpeculativeDecoder` (:mod:`verispec.decoder`), supplies the
defaults: the autoregressive drafter and the default policy (``Greedy`` at
temperature 0, ``Coupled`` otherwise: seeded identity for trees of fixed
candidates, recursive rejection for the rest). A verifier that declares
``keyed_by_position`` also gets the absolute position of the root's next token
(:class:`~verispec.core.types.PositionKeyedVerifier`).
"""

from __future__ import annotations

import functools
import os
import time
import warnings
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any, Literal

import attrs
import torch

from verispec.core._checks import (
    check_decoder_arguments,
    describe,
    generation_config,
    token_id_list,
)
from verispec.core.sampling import SamplingParams
from verispec.core.types import (
    BaseDrafter,
    DecodeState,
    Drafter,
    GenerationParams,
    LanguageModel,
    PositionKeyedVerifier,
    StepOutcome,
    TreeProcessing,
    Verdict,
    Verifier,
)
from verispec.errors import ConfigError, ContextLengthError, IncompatibleModelsError

__all__ = [
    "GenerationResult",
    "require_tokenizer_for_stop_strings",
    "Engine",
    "StepStats",
    "StreamChunk",
    "ProcessingFactory",
    "VerifierPolicy",
]

VerifierPolicy = Callable[[SamplingParams], Verifier]
# builds one generation's logits processing: (config, prompt_length=, tokenizer=,
# eos_token_ids=, vocab_size=) -> TreeProcessing, or None when the config asks for none
ProcessingFactory = Callable[..., TreeProcessing | None]


@attrs.frozen
class StepStats:
    """Per-step figures. Times are wall-clock seconds, one per phase of the step:
    drafting (propose and observe), the target's tree forward, verification and the
    commit of the accepted path's KV entries.

    On a CUDA target a step synchronises once, where the verdict is read: a phase's time
    is its host time, and kernels still running are charged to the phase that waits for
    them (verification, mostly). With ``VERISPEC_PHASE_SYNC=1`` the clock is read after
    synchronising the device, so kernel time is charged to the phase that launched it;
    on the CPU no synchronisation happens.
    """

    tree_size: int
    accepted: int  # draft tokens accepted (the extra token not counted)
    draft_s: float  # propose and observe
    target_s: float  # the tree forward
    verify_s: float  # logits processing (when asked for) and the verifier
    commit_s: float  # the target keeping the accepted path's KV entries

    @property
    def committed(self) -> int:
        return self.accepted + 1


@attrs.frozen
class GenerationResult:
    """The tokens of one generation and how they were obtained.

    Attributes:
        tokens: the new token ids (prompt excluded), truncated at the stop condition.
        text: ``tokens`` decoded, when the decoder has a tokenizer.
        prompt_length: tokens in the prompt.
        steps: one :class:`StepStats` per target forward after the prefill.
        prefill_s, total_s: wall-clock seconds of the prefill and of the whole call.
        finish_reason: ``"eos"``, ``"stop_string"``, ``"max_new_tokens"`` or ``"length"``
            (the model's context is full).
    """

    tokens: list[int]
    text: str | None
    prompt_length: int
    steps: list[StepStats]
    prefill_s: float
    total_s: float
    finish_reason: Literal["eos", "stop_string", "max_new_tokens", "length"]

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def mean_accepted_tokens(self) -> float:
        """Mean tokens committed per target forward, counting the extra token (MAT)."""
        if not self.steps:
            return 0.0
        return sum(s.committed for s in self.steps) / len(self.steps)

    @property
    def mean_tree_size(self) -> float:
        return sum(s.tree_size for s in self.steps) / len(self.steps) if self.steps else 0.0

    @property
    def decode_s(self) -> float:
        """Seconds spent after the prefill."""
        return self.total_s - self.prefill_s

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second over the whole call, prefill included."""
        return len(self.tokens) / self.total_s if self.total_s > 0 else 0.0

    def spec_decode_metrics(self) -> dict[str, Any]:
        """This request's speculative-decoding figures, named as vLLM's spec-decode metrics
        where the meaning matches (``num_drafts``, ``num_draft_tokens``,
        ``num_accepted_tokens``, ``num_accepted_tokens_per_pos``), plus MAT, the draft
        acceptance rate, nodes per step and the seconds of each phase.

        ``num_accepted_tokens_per_pos[k]`` counts the steps that accepted a draft token at
        depth ``k + 1`` (a tree's accepted path is one token per depth).
        """
        drafted = [s for s in self.steps if s.tree_size > 0]
        depth = max((s.accepted for s in self.steps), default=0)
        per_pos = [sum(1 for s in self.steps if s.accepted > k) for k in range(depth)]
        draft_tokens = sum(s.tree_size for s in self.steps)
        accepted = sum(s.accepted for s in self.steps)
        return {
            "num_steps": self.num_steps,
            "num_drafts": len(drafted),
            "num_draft_tokens": draft_tokens,
            "num_accepted_tokens": accepted,
            "num_accepted_tokens_per_pos": per_pos,
            "mean_accepted_tokens": self.mean_accepted_tokens,
            "draft_acceptance_rate": accepted / draft_tokens if draft_tokens else 0.0,
            "mean_nodes_per_step": self.mean_tree_size,
            "prefill_s": self.prefill_s,
            **{f"{phase}_s": seconds for phase, seconds in self.time_split().items()},
            "total_s": self.total_s,
        }

    def time_split(self) -> dict[str, float]:
        """Total seconds in drafting, target forwards, verification and KV commits."""
        return {
            "draft": sum(s.draft_s for s in self.steps),
            "target": sum(s.target_s for s in self.steps),
            "verify": sum(s.verify_s for s in self.steps),
            "commit": sum(s.commit_s for s in self.steps),
        }


@attrs.frozen
class StreamChunk:
    """What one step of :meth:`Engine.stream` added to the answer.

    Attributes:
        tokens: the token ids this step added (its committed tokens, cut at the stop
            condition); empty only in a last chunk that carries no step.
        text: the text they added, decoded incrementally (``""`` while a character is
            incomplete; held back text comes with a later chunk); ``None`` without a
            tokenizer.
        step: the step's :class:`StepStats` (``None`` in a last chunk with no step).
        result: on the last chunk, the whole :class:`GenerationResult`; else ``None``.
    """

    tokens: tuple[int, ...]
    text: str | None
    step: StepStats | None
    result: GenerationResult | None = None


@attrs.frozen
class _StepEvent:
    tokens: tuple[int, ...]
    step: StepStats | None
    result: GenerationResult | None


PHASE_SYNC_ENV = "VERISPEC_PHASE_SYNC"
"""Set to ``1`` to synchronise a CUDA target's device at every phase boundary of a step
(read when a decoder is built), so that each phase's time holds its own kernels: for
profiling. By default (``0``) a step synchronises once, where verification reads the
verdict, and each phase's time is its host time (kernels still running are charged to
whichever phase waits for them); the four other synchronisations made a small model's
step measurably slower on a GPU (docs/benchmarks.rst, "The H200 report (2026-11-28)")."""


def _clock_for(device: Any) -> Callable[[], float]:
    """``time.perf_counter``, after synchronising ``device`` when it is a CUDA device and
    ``VERISPEC_PHASE_SYNC=1`` (:data:`PHASE_SYNC_ENV`).

    CUDA kernels run after their launch returns: without the synchronisation a phase's
    clock stops before its kernels ran, and the next phase that syncs pays for them.
    """
    if device is None or torch.device(device).type != "cuda":
        return time.perf_counter
    if os.environ.get(PHASE_SYNC_ENV, "0").strip() != "1":
        return time.perf_counter
    cuda = torch.device(device)

    def clock() -> float:
        torch.cuda.synchronize(cuda)
        return time.perf_counter()

    return clock


def require_tokenizer_for_stop_strings(
    stop_strings: Sequence[str], tokenizer: Any, how_to_pass: str
) -> None:
    """The one check every entry point runs: stop strings are matched on decoded text, so
    they need a tokenizer; without one they would be silently ignored.

    Raises:
        ConfigError: ``stop_strings`` given and ``tokenizer`` is ``None``; the message says
            how to pass one (``how_to_pass``).
    """
    if stop_strings and tokenizer is None:
        raise ConfigError(
            f"`stop_strings` {list(stop_strings)} need the model's tokenizer to decode the "
            f"answer; pass it as {how_to_pass}, or drop `stop_strings`."
        )


class Engine:
    """Lossless speculative decoding of one sequence at a time.

    Args:
    This is the core's decoder: it is handed both its drafter and its verifier.
    :class:`verispec.SpeculativeDecoder` is the same loop with the package's defaults
    (the autoregressive drafter, the default verifier policy).

    Args:
        target: the model whose distribution the output follows.
        drafter: proposes the draft trees.
        verifier: a :class:`Verifier`, or a callable mapping :class:`SamplingParams`
            to one (a policy, e.g. :func:`verispec.verifiers.default_verifier`).
        tokenizer: a Hugging Face tokenizer, to accept string prompts, decode text,
            apply stop strings and find the end-of-sequence token.
        processing: builds each generation's logits processing from its config
            (:data:`ProcessingFactory`, e.g. :func:`verispec.processors.processing_for`);
            without one, a config that asks for processing is refused.
    """

    def __init__(
        self,
        target: LanguageModel,
        drafter: Drafter,
        verifier: Verifier | VerifierPolicy,
        tokenizer: Any = None,
        processing: ProcessingFactory | None = None,
    ) -> None:
        check_decoder_arguments(target, drafter, verifier, tokenizer)
        for name, value in (("drafter", drafter), ("verifier", verifier)):
            if value is None:
                raise ConfigError(
                    f"`{name}` must be given to verispec.core.Engine; got None. "
                    "verispec.SpeculativeDecoder supplies the package's defaults."
                )
        self.target = target
        self.drafter: Drafter = drafter
        # the optional capabilities, declared by BaseDrafter; a drafter that only follows
        # the protocol has their defaults (nothing to bind, no draft model)
        if isinstance(drafter, BaseDrafter):
            drafter.bind_target(target)  # a drafter sized by the device reads T(n) here
            draft = drafter.draft  # a draft model must share the target's vocabulary
            if draft is not None and draft.vocab_size != target.vocab_size:
                raise IncompatibleModelsError(
                    f"the draft model's vocabulary must match the target's; got "
                    f"{draft.vocab_size} "
                    f"draft logits for {target.vocab_size} target logits. Use a draft from "
                    "the same model family and tokenizer."
                )
        self._verifier = verifier
        if processing is not None and (isinstance(processing, type) or not callable(processing)):
            raise ConfigError(
                f"`processing` must be a callable building a generation's logits processing "
                f"(e.g. verispec.processors.processing_for) or None; got {describe(processing)}."
            )
        self._processing = processing
        self._clock = _clock_for(getattr(target, "device", None))
        self.tokenizer = tokenizer
        if tokenizer is not None:
            tokenizer_vocab = len(tokenizer)
            if tokenizer_vocab > target.vocab_size:
                raise IncompatibleModelsError(
                    f"the tokenizer has {tokenizer_vocab} tokens but the model's vocabulary "
                    f"has only {target.vocab_size}; they do not belong together."
                )

    def verifier_for(self, sampling: SamplingParams) -> Verifier:
        """The verifier of a generation with these sampling parameters."""
        if hasattr(self._verifier, "verify"):
            return self._verifier  # type: ignore[return-value]
        verifier = self._verifier(sampling)  # type: ignore[operator]
        if isinstance(verifier, type) or not callable(getattr(verifier, "verify", None)):
            raise ConfigError(
                f"`verifier` policy must return a verifier (with a `verify` method); it "
                f"returned {describe(verifier)} for {sampling}."
            )
        return verifier  # type: ignore[no-any-return]

    # -- helpers ----------------------------------------------------------------------

    def _prompt_ids(self, prompt: str | Sequence[int] | torch.Tensor) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ConfigError("a string `prompt` needs a tokenizer; pass token ids instead.")
            ids = list(self.tokenizer.encode(prompt))
        else:
            ids = token_id_list(prompt)
        if not ids:
            raise ConfigError("`prompt` must contain at least one token; got an empty prompt.")
        bad = [t for t in ids if not 0 <= t < self.target.vocab_size]
        if bad:
            raise ConfigError(
                f"`prompt` token ids must be in [0, {self.target.vocab_size}); got {bad[0]}."
            )
        if len(ids) >= self.target.max_length:
            raise ContextLengthError(
                f"the prompt has {len(ids)} tokens but the model's context holds "
                f"{self.target.max_length}, leaving no room to generate; shorten the prompt."
            )
        return ids

    def _processing_for(
        self, config: GenerationParams, prompt_length: int, eos_ids: set[int]
    ) -> TreeProcessing | None:
        """This generation's logits processing, or None when its config asks for none."""
        if not config.processes_logits:
            return None
        if self._processing is None:
            raise ConfigError(
                "logits processing (repetition_penalty, logits_processor, json_schema, ...) "
                "needs a decoder built with `processing=` (verispec.SpeculativeDecoder "
                "supplies verispec.processors.processing_for); this one has none."
            )
        return self._processing(
            config,
            prompt_length=prompt_length,
            tokenizer=self.tokenizer,
            eos_token_ids=sorted(eos_ids),
            vocab_size=self.target.vocab_size,
        )

    def _eos_ids(self, config: GenerationParams) -> set[int]:
        if config.eos_token_ids is not None:
            bad = [t for t in config.eos_token_ids if t >= self.target.vocab_size]
            if bad:
                raise ConfigError(
                    f"`eos_token_ids` must be in [0, {self.target.vocab_size}) (the model's "
                    f"vocabulary); got {bad[0]}."
                )
            return set(config.eos_token_ids)
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is None:
            eos = getattr(self.target, "eos_token_id", None)
        if eos is None:
            return set()
        return {int(eos)} if isinstance(eos, int) else {int(e) for e in eos}

    # -- the loop ---------------------------------------------------------------------

    def generate(
        self,
        prompt: str | Sequence[int] | torch.Tensor,
        config: GenerationParams | None = None,
        *,
        on_step: Callable[[list[int]], None] | None = None,
        **overrides: Any,
    ) -> GenerationResult:
        """Generate a continuation of ``prompt``.

        Args:
            prompt: a string (needs a tokenizer) or token ids, Shape: (S,).
            config: the settings; keyword ``overrides`` replace its fields
                (``decoder.generate(ids, max_new_tokens=64, temperature=0.7)``).
            on_step: called after every step with the token ids that step added to the
                answer (the committed tokens, cut at the stop condition), e.g. to push them
                to a streamer. Its time is not counted in the result's timings.
        """
        events = self._run(prompt, config, overrides)
        while True:
            try:
                event = next(events)
            except StopIteration as done:
                result: GenerationResult = done.value
                return result
            if on_step is not None and event.tokens:
                on_step(list(event.tokens))

    def stream(
        self,
        prompt: str | Sequence[int] | torch.Tensor,
        config: GenerationParams | None = None,
        **overrides: Any,
    ) -> Iterator[StreamChunk]:
        """Generate like :meth:`generate`, yielding each step's tokens as they are committed.

        ``for chunk in decoder.stream(prompt, max_new_tokens=64): print(chunk.text, end="")``.
        The chunks' ``tokens`` concatenate to the result's ``tokens`` and, with a tokenizer,
        their ``text`` to its ``text``; the last chunk carries the :class:`GenerationResult`.
        Time the caller spends between chunks is not counted in the result's timings.

        Args: as :meth:`generate`.
        """
        tokens: list[int] = []
        emitted = ""
        for event in self._run(prompt, config, overrides):
            tokens.extend(event.tokens)
            text: str | None = None
            if self.tokenizer is not None:
                if event.result is not None:
                    final = event.result.text or ""
                    text = final[len(emitted) :] if final.startswith(emitted) else ""
                else:
                    decoded = self.tokenizer.decode(tokens)
                    # hold back an incomplete character (or a prefix the tokenizer rewrote)
                    ready = not decoded.endswith("\ufffd") and decoded.startswith(emitted)
                    text = decoded[len(emitted) :] if ready else ""
                emitted += text
            yield StreamChunk(
                tokens=tuple(event.tokens), text=text, step=event.step, result=event.result
            )

    def _run(
        self,
        prompt: str | Sequence[int] | torch.Tensor,
        config: GenerationParams | None,
        overrides: dict[str, Any],
    ) -> Generator[_StepEvent, None, GenerationResult]:
        """The loop, as a generator of one event per step; returns the result.

        The last event carries the result too. Time spent by the consumer between events
        is subtracted from ``total_s``.
        """
        config = generation_config(config, overrides)
        require_tokenizer_for_stop_strings(
            config.stop_strings, self.tokenizer, "SpeculativeDecoder(..., tokenizer=tokenizer)"
        )
        ids = self._prompt_ids(prompt)
        sampling = config.sampling
        verifier = self.verifier_for(sampling)
        # a verifier keyed by position also gets the absolute position of the root's next
        # token; plain verifiers are called with the protocol's four arguments
        keyed: PositionKeyedVerifier | None = (
            verifier  # type: ignore[assignment]
            if getattr(verifier, "keyed_by_position", False) is True
            else None
        )
        eos_ids = self._eos_ids(config)
        processing = self._processing_for(config, len(ids), eos_ids)
        generator = torch.Generator(device="cpu").manual_seed(config.seed)
        fit = self.target.max_length - len(ids) + 1  # the last new token needs no slot
        if config.max_new_tokens > fit:
            warnings.warn(
                f"the prompt's {len(ids)} tokens leave room for {fit} new tokens in the "
                f"model's context of {self.target.max_length}: generation stops there "
                f"(finish_reason 'length'), before max_new_tokens={config.max_new_tokens}.",
                stacklevel=3,
            )

        # A target that can size its cache to the generation's longest context does it now,
        # once, instead of growing it mid-generation (an optional capability: ``reserve``).
        reserve = getattr(self.target, "reserve", None)
        if callable(reserve):
            reserve(len(ids) + config.max_new_tokens)

        clock = self._clock
        start = clock()
        paused = 0.0  # seconds the consumer held the generator between events
        self.target.prefill(torch.tensor(ids, dtype=torch.long))
        state = DecodeState(
            tokens=list(ids),
            prompt_length=len(ids),
            sampling=sampling,
            generator=generator,
        )
        allowed = getattr(processing, "allowed", None)
        if callable(allowed):  # a constraint: draft-model drafters mask their draws
            state.allowed = functools.partial(allowed, state)
        self.drafter.begin(state)
        prefill_s = clock() - start

        new_tokens: list[int] = []
        steps: list[StepStats] = []
        finish: Literal["eos", "stop_string", "max_new_tokens", "length"] = "max_new_tokens"
        last: tuple[list[int], StepStats] | None = None  # the final step, reported with the result
        while True:
            room = self.target.max_length - len(state.tokens)
            if room < 0:
                finish = "length"
                break
            state.max_nodes = room
            # 1. propose
            t0 = clock()
            tree = self.drafter.propose(state)
            if tree.num_nodes > room:
                tree = tree.truncated(room)
            if processing is not None:  # drop what the processing forbids, where exact
                tree = processing.prune(tree, state)
            t1 = clock()
            # 2. score the tree
            target_logits = self.target.forward_tree(tree)  # (N + 1, V)
            t2 = clock()
            # 3. verify (against the processed rows, each with its own prefix)
            if processing is not None:
                target_logits = processing.process(tree, target_logits, state)
            verdict: Verdict
            if keyed is not None:
                position = len(state.tokens)  # the absolute position of the root's next token
                verdict = keyed.verify(tree, target_logits, sampling, generator, position=position)
            else:
                verdict = verifier.verify(tree, target_logits, sampling, generator)
            t3 = clock()
            # 4. commit
            self.target.commit(verdict.accepted, verdict.extra_token)
            committed = verdict.committed_tokens(tree)
            state.tokens.extend(committed)
            state.step += 1
            t4 = clock()
            # 5. let the drafter learn
            self.drafter.observe(StepOutcome(tree, target_logits, verdict, state))
            t5 = clock()
            stats = StepStats(
                tree_size=tree.num_nodes,
                accepted=len(verdict.accepted),
                draft_s=(t1 - t0) + (t5 - t4),
                target_s=t2 - t1,
                verify_s=t3 - t2,
                commit_s=t4 - t3,
            )
            steps.append(stats)

            before = len(new_tokens)
            stop = self._append(new_tokens, committed, eos_ids, config)
            if stop is not None:
                finish = stop
                last = (new_tokens[before:], stats)
                break
            held = time.perf_counter()  # the consumer's pause: host time only
            yield _StepEvent(tuple(new_tokens[before:]), stats, None)
            paused += time.perf_counter() - held

        text = self.tokenizer.decode(new_tokens) if self.tokenizer is not None else None
        if finish == "stop_string" and text is not None:
            cut = min(text.find(s) + len(s) for s in config.stop_strings if s in text)
            text = text[:cut]
        result = GenerationResult(
            tokens=new_tokens,
            text=text,
            prompt_length=len(ids),
            steps=steps,
            prefill_s=prefill_s,
            total_s=clock() - start - paused,
            finish_reason=finish,
        )
        added, stats_or_none = last if last is not None else ([], None)
        yield _StepEvent(tuple(added), stats_or_none, result)
        return result

    def _append(
        self,
        new_tokens: list[int],
        committed: list[int],
        eos_ids: set[int],
        config: GenerationParams,
    ) -> Literal["eos", "stop_string", "max_new_tokens"] | None:
        """Add this step's tokens; say why generation stops, if it does.

        A stop string ends the answer at the token that completes it (the step's later
        tokens are dropped), as an end-of-sequence token does.
        """
        start = len(new_tokens)
        stop: Literal["eos", "max_new_tokens"] | None = None
        for token in committed:
            new_tokens.append(token)
            if token in eos_ids:
                stop = "eos"
                break
            if len(new_tokens) >= config.max_new_tokens:
                stop = "max_new_tokens"
                break
        if config.stop_strings and self.tokenizer is not None:

            def holds_stop(end: int) -> bool:
                tail = self.tokenizer.decode(new_tokens[max(0, end - 64) : end])
                return any(s in tail for s in config.stop_strings)

            if holds_stop(len(new_tokens)):  # then find the token that completed it
                end = next(e for e in range(start + 1, len(new_tokens) + 1) if holds_stop(e))
                del new_tokens[end:]
                return "stop_string"
        return stop

"""The values and protocols that cross verispec's layers.

* :class:`Verdict` — what a verifier decides about one draft tree.
* :class:`GenerationParams` — one generation's settings.
* :class:`DecodeState` — what a drafter sees when it proposes.
* :class:`StepOutcome` — what a drafter is told after verification.
* :class:`LanguageModel`, :class:`Drafter`, :class:`Verifier`, :class:`TreeProcessing` — the
  protocols; :class:`BaseDrafter` — a drafter's optional capabilities, with their defaults.

Shape glossary: N tree nodes, V vocabulary, S committed tokens.
"""

from __future__ import annotations

import abc
import numbers
from collections.abc import Callable, Iterable, Sequence
from typing import ClassVar, Protocol, runtime_checkable

import attrs
import torch
from torch import Generator, Tensor

from verispec.core.sampling import SamplingParams
from verispec.core.tree import DraftTree
from verispec.core.validate import attrs_check, integer, number
from verispec.errors import ConfigError

__all__ = [
    "BaseDrafter",
    "DecodeState",
    "Drafter",
    "GenerationParams",
    "LanguageModel",
    "StepOutcome",
    "PositionKeyedVerifier",
    "SEED_LIMIT",
    "TreeProcessing",
    "Verdict",
    "Verifier",
    "check_seed",
    "random_seed",
]


def _node_tuple(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


@attrs.frozen
class Verdict:
    """The outcome of verifying one draft tree.

    Attributes:
        accepted: node indices along one root-to-node path, outermost first;
            empty when no draft token was accepted.
        extra_token: the token committed after the accepted path: the
            correction sampled from the residual on rejection, or the bonus token
            sampled from the target at the last accepted node. Every step
            therefore commits ``len(accepted) + 1`` tokens.
    """

    accepted: tuple[int, ...] = attrs.field(converter=_node_tuple)
    extra_token: int

    @property
    def num_committed(self) -> int:
        return len(self.accepted) + 1

    def committed_tokens(self, tree: DraftTree) -> list[int]:
        """Token ids committed by this verdict, in order."""
        return [int(tree.tokens[i]) for i in self.accepted] + [self.extra_token]


def _token_ids(value: object) -> tuple[object, ...]:
    """A tuple of token ids; integers become ``int``, anything else is left to the validator."""
    if value is None:
        return ()
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, int | str) or not isinstance(value, Iterable):
        value = (value,)
    return tuple(
        int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v
        for v in value  # type: ignore[union-attr]
    )


def _strings(value: object) -> tuple[object, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, Iterable):
        return (value,)
    return tuple(value)


def _check_token_ids(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if value is None:
        return
    for token in value:  # type: ignore[attr-defined]
        if isinstance(token, bool) or not isinstance(token, numbers.Integral) or token < 0:
            raise ConfigError(
                f"`{attribute.name}` must hold token ids (integers >= 0); got {token!r}."
            )


def _check_stop_strings(instance: object, attribute: attrs.Attribute, value: object) -> None:
    for text in value:  # type: ignore[attr-defined]
        if not isinstance(text, str) or not text:
            hint = " (an empty string would stop generation at once)" if text == "" else ""
            raise ConfigError(
                f"`{attribute.name}` must hold non-empty strings; got {text!r}{hint}."
            )


SEED_LIMIT = 1 << 64
"""Seeds are integers in [0, 2**64): ``torch.Generator.manual_seed``'s range, and the
coupled verifier's 64-bit Philox key. The one bound: :func:`check_seed`, the CLI's
``--seed`` and :func:`random_seed` read it."""


def check_seed(name: str, value: object) -> int:
    """``value`` if it is an integer in [0, :data:`SEED_LIMIT`) (NumPy integers too, as an
    ``int``); else :class:`ConfigError` naming ``name``."""
    return integer(name, value, 0, below=SEED_LIMIT, integral=True)


def random_seed(generator: torch.Generator | None = None) -> int:
    """A seed drawn from ``generator`` (torch's global one when ``None``: then
    ``torch.manual_seed`` makes the draw repeat), in [0, :data:`SEED_LIMIT` - 1): one
    int64 draw, shifted to be non-negative."""
    half = SEED_LIMIT >> 1
    drawn = torch.randint(-half, half - 1, (1,), generator=generator, dtype=torch.int64)
    return int(drawn) + half


_SAMPLING = SamplingParams()  # its defaults are the generation config's


def _sequences(value: object) -> tuple[object, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        return (value,)  # rejected by the validator, with the value named
    return tuple(_token_ids(v) for v in value)


def _check_sequences(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if value is None:
        return
    ok = isinstance(value, tuple) and all(
        isinstance(seq, tuple)
        and seq
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in seq)
        for seq in value
    )
    if not ok or not value:
        raise ConfigError(
            f"`{attribute.name}` must be a non-empty list of non-empty lists of token ids "
            f"(integers >= 0), e.g. [[42], [7, 9]]; got {value!r}."
        )


def _processors(value: object) -> tuple[object, ...]:
    if value is None:
        return ()
    if callable(value) and not isinstance(value, list | tuple):
        return (value,)
    return tuple(value) if isinstance(value, Iterable) else (value,)


def _check_processors(instance: object, attribute: attrs.Attribute, value: object) -> None:
    for item in value:  # type: ignore[attr-defined]
        if isinstance(item, type) or not callable(item):
            raise ConfigError(
                f"`{attribute.name}` must be a list of logits processors (callables "
                f"`(input_ids, scores) -> scores`, e.g. transformers' LogitsProcessor "
                f"instances); got {type(item).__name__} {item!r}."
            )


def _check_schema(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if value is not None and not isinstance(value, str | dict):
        raise ConfigError(
            f"`{attribute.name}` must be a JSON schema as a dict or a JSON string, or None; "
            f"got {type(value).__name__} {value!r}."
        )


def _check_text(instance: object, attribute: attrs.Attribute, value: object) -> None:
    if value is not None and not (isinstance(value, str) and value):
        raise ConfigError(f"`{attribute.name}` must be a non-empty string or None; got {value!r}.")


@attrs.frozen
class GenerationParams:
    """Settings of one generation, named as in Hugging Face's ``GenerationConfig``.

    Attributes:
        max_new_tokens: most tokens to generate (>= 1).
        temperature, top_k, top_p, min_p: see :class:`SamplingParams`; ``temperature=0``
            (the default) is greedy decoding.
        eos_token_ids: generation stops after any of these (token ids >= 0); ``None``
            takes the tokenizer's or model's own when the decoder knows them.
        stop_strings: generation stops once the decoded text contains one of these
            (non-empty strings).
        seed: an integer in [0, 2**64). Seeds the ``torch.Generator`` of every random
            draw and keys the coupled rule's per-position noise (docs/exactness.rst,
            "Seeds and reproducibility").
        repetition_penalty, no_repeat_ngram_size, min_new_tokens, bad_words_ids,
            suppress_tokens: transformers' processors of those names, applied to every
            tree row with that row's prefix (:mod:`verispec.processors`).
        logits_processor: more processors, ``(input_ids, scores) -> scores`` functions of
            the prefix (transformers' ``LogitsProcessor`` instances), applied after those.
        json_schema, regex, grammar: the output must follow this JSON schema (a dict or
            a JSON string), regular expression or Lark/EBNF grammar (at most one; needs
            the decoder's tokenizer and the ``llguidance`` package).
    """

    max_new_tokens: int = attrs.field(default=128, validator=attrs_check(integer, 1))
    # the sampling fields' defaults are SamplingParams' (checked there, by `sampling`)
    temperature: float = _SAMPLING.temperature
    top_k: int = _SAMPLING.top_k
    top_p: float = _SAMPLING.top_p
    min_p: float = _SAMPLING.min_p
    eos_token_ids: tuple[int, ...] | None = attrs.field(
        default=None,
        converter=attrs.converters.optional(_token_ids),  # type: ignore[misc]
        validator=_check_token_ids,
    )
    stop_strings: tuple[str, ...] = attrs.field(
        default=(),
        converter=_strings,  # type: ignore[misc]
        validator=_check_stop_strings,
    )
    seed: int = attrs.field(default=0, validator=attrs_check(check_seed))
    # -- logits processing (verispec.processors), Hugging Face's names -------------------
    repetition_penalty: float = attrs.field(
        default=1.0, validator=attrs_check(number, 0.0, strict=True)
    )
    no_repeat_ngram_size: int = attrs.field(default=0, validator=attrs_check(integer, 0))
    min_new_tokens: int = attrs.field(default=0, validator=attrs_check(integer, 0))
    bad_words_ids: tuple[tuple[int, ...], ...] | None = attrs.field(
        default=None,
        converter=attrs.converters.optional(_sequences),  # type: ignore[misc]
        validator=_check_sequences,
    )
    suppress_tokens: tuple[int, ...] | None = attrs.field(
        default=None,
        converter=attrs.converters.optional(_token_ids),  # type: ignore[misc]
        validator=_check_token_ids,
    )
    logits_processor: tuple[object, ...] = attrs.field(
        default=(), converter=_processors, validator=_check_processors
    )
    json_schema: str | dict | None = attrs.field(default=None, validator=_check_schema)
    regex: str | None = attrs.field(default=None, validator=_check_text)
    grammar: str | None = attrs.field(default=None, validator=_check_text)

    def __attrs_post_init__(self) -> None:
        self.sampling  # noqa: B018 - validates the sampling fields eagerly
        given = [
            name for name in ("json_schema", "regex", "grammar") if getattr(self, name) is not None
        ]
        if len(given) > 1:
            raise ConfigError(
                f"give at most one of `json_schema`, `regex` and `grammar`; got {given}."
            )

    @property
    def processes_logits(self) -> bool:
        """True when a setting asks for logits processing beyond the sampling parameters."""
        return bool(
            self.repetition_penalty != 1.0
            or self.no_repeat_ngram_size
            or self.min_new_tokens
            or self.bad_words_ids
            or self.suppress_tokens
            or self.logits_processor
            or self.constrained
        )

    @property
    def constrained(self) -> bool:
        """True when the output must follow a JSON schema, a regex or a grammar."""
        return self.json_schema is not None or self.regex is not None or self.grammar is not None

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p
        )


@attrs.define
class DecodeState:
    """What a drafter sees when it proposes a tree.

    Attributes:
        tokens: every committed token id, prompt first; the last one is the root
            of the next tree.
        prompt_length: how many of ``tokens`` are the prompt.
        sampling: the processing applied to draft logits (same as the target's).
        generator: the only source of randomness a drafter may use.
        step: index of the step about to run (0 for the first).
        max_nodes: most nodes the engine can take this step (context room left).
        allowed: where the generation constrains its output (a grammar), the tokens
            allowed after each of some paths below the root: ``allowed(paths)`` is bool,
            Shape: (len(paths), V); ``None`` where nothing is constrained. A draft-model
            drafter masks its draws with it, so it spends no node on a forbidden token
            (exact: it declares the masked distribution it draws from).
    """

    tokens: list[int]
    prompt_length: int
    sampling: SamplingParams
    generator: torch.Generator
    step: int = 0
    max_nodes: int = 1 << 30
    allowed: Callable[[Sequence[Sequence[int]]], torch.Tensor] | None = None


@attrs.frozen
class StepOutcome:
    """What happened in one step, handed to ``Drafter.observe``.

    Attributes:
        tree: the tree that was verified.
        target_logits: float, Shape: (N + 1, V). Row 0 the root, row i + 1 node i.
        verdict: what the verifier kept.
        state: the decode state after the step's tokens were committed.
    """

    tree: DraftTree
    target_logits: torch.Tensor
    verdict: Verdict
    state: DecodeState


@runtime_checkable
class LanguageModel(Protocol):
    """A causal LM that can score a draft tree in one forward pass.

    The model keeps a KV cache of committed tokens plus a short list of *pending*
    committed tokens that have not been fed yet. The last pending token is the
    *root* of the next tree. A target model always has exactly one pending token
    (the root); a draft model may have more (for example an accepted leaf it never
    scored, followed by the extra token).

    ``forward_tree`` feeds the pending tokens and the tree's nodes in one pass, with
    a tree attention mask and depth-based positions, and returns the logits of the
    root and of every node. ``commit`` keeps the KV entries of the pending tokens
    and of the accepted nodes (a gather, so side branches work), drops the rest of
    the tree, and makes every accepted node that was not fed, then ``extra_token``,
    pending.

    Optional: a model may offer ``reserve(tokens: int)``; the decoder then calls it before
    each generation with the prompt length plus ``max_new_tokens``, so the model can
    allocate its cache once (``FastModel`` does).
    """

    vocab_size: int
    max_length: int

    @property
    def num_committed(self) -> int:
        """Committed tokens so far: cached plus pending."""
        ...

    def prefill(self, ids: torch.Tensor) -> None:
        """Start a new sequence from prompt ``ids`` (int64, Shape: (S,)), S >= 1.

        Every token but the last is cached; the last one is pending (the root).
        """
        ...

    def forward_tree(self, tree: DraftTree, *, extend_from: int = 0) -> torch.Tensor:
        """Score the root and the tree's nodes.

        Args:
            tree: the draft tree below the root.
            extend_from: ``0`` scores the whole tree and returns float, Shape: (N + 1, V)
                (row 0 the root, row i + 1 node i). ``k > 0`` grows the tree scored by
                the previous call of this step, whose first ``k`` nodes must equal this
                tree's first ``k`` nodes: only nodes ``k..N-1`` are fed and their logits
                returned, Shape: (N - k, V). Draft models use this to grow a tree level
                by level or node by node.
        """
        ...

    def commit(self, accepted: Sequence[int], extra_token: int) -> None:
        """Keep the pending tokens and the ``accepted`` nodes of the last tree.

        ``accepted`` are node indices of the last scored tree along one root-to-node
        path; nodes beyond what was fed are allowed and become pending, followed by
        ``extra_token``.
        """
        ...

    def reset(self) -> None:
        """Forget the sequence and free its cache."""
        ...


@runtime_checkable
class Drafter(Protocol):
    """Proposes a draft tree each step and learns from what was accepted.

    The optional capabilities (binding the target, the draft model the decoder checks)
    are declared, with their defaults, by :class:`BaseDrafter`, which verispec's drafters
    derive from; a drafter that only follows this protocol has the defaults.
    """

    needs_draft_model: ClassVar[bool]

    def begin(self, state: DecodeState) -> None:
        """Called once per generation, after the prompt is prefilled."""
        ...

    def propose(self, state: DecodeState) -> DraftTree:
        """The tree to verify this step; its size must not exceed ``state.max_nodes``."""
        ...

    def observe(self, outcome: StepOutcome) -> None:
        """Called after every verification."""
        ...


class BaseDrafter(abc.ABC):
    """A :class:`Drafter` with its optional capabilities declared, each with its default
    (as transformers' ``CandidateGenerator`` declares its own). verispec's drafters derive
    from it; the decoder reads these members directly on a drafter that does, and a
    drafter that only follows the :class:`Drafter` protocol has the defaults.
    Subclasses implement ``propose`` (and ``observe`` where they learn)."""

    needs_draft_model: ClassVar[bool] = False
    """Whether the drafter samples from a draft model (its trees' laws are then ``IID`` or
    ``WithoutReplacement``); model-free drafters send fixed candidates."""

    draft: LanguageModel | None = None
    """The draft model a drafter drafts with, or ``None`` (model-free drafters). The
    decoder checks that its vocabulary is the target's."""

    def bind_target(self, target: LanguageModel) -> None:  # noqa: B027 (a default, not abstract)
        """Called once by the decoder when it is built, with its target: a drafter that
        sizes its trees from the target (its measured step latency) reads it here. By
        default nothing."""

    def begin(self, state: DecodeState) -> None:  # noqa: B027 (a default, not abstract)
        """Called once per generation, after the prompt is prefilled. By default nothing."""

    @abc.abstractmethod
    def propose(self, state: DecodeState) -> DraftTree:
        """The tree to verify this step; its size must not exceed ``state.max_nodes``."""

    def observe(self, outcome: StepOutcome) -> None:  # noqa: B027 (a default, not abstract)
        """Called after every verification. By default nothing."""


@runtime_checkable
class Verifier(Protocol):
    """Decides which path of a draft tree to keep."""

    def verify(
        self, tree: DraftTree, target_logits: Tensor, sampling: SamplingParams, generator: Generator
    ) -> Verdict:
        """Args: target_logits: float, Shape: (N + 1, V)."""
        ...


@runtime_checkable
class PositionKeyedVerifier(Protocol):
    """A verifier whose draws are keyed by the absolute position in the sequence.

    Declared by ``keyed_by_position = True``; the decoder then also passes
    ``position``, the number of committed tokens (prompt included), which is the
    absolute position of the token drawn at the root row. A plain :class:`Verifier`
    is called without it, so verifiers written against the four-argument protocol
    keep working.
    """

    keyed_by_position: ClassVar[bool]

    def verify(
        self, tree: DraftTree, target_logits: Tensor, sampling: SamplingParams,
        generator: Generator, *, position: int | None = None,
    ) -> Verdict:  # fmt: skip
        """Args: target_logits: float, Shape: (N + 1, V); position: see the class."""
        ...


@runtime_checkable
class TreeProcessing(Protocol):
    """Logits processing of one generation, applied to every row of a step's tree.

    Row ``r``'s logits are the target's distribution after the row's *prefix*: the
    committed tokens, then the tokens on the path to the row's node. Processing each row
    with its own prefix gives every node the distribution the target would have there
    with the processing on, so verifying against the processed rows keeps the output
    exact (docs/processors.rst). Built per generation by the decoder's processing factory
    (:func:`verispec.processors.processing_for`).
    """

    def prune(self, tree: DraftTree, state: DecodeState) -> DraftTree:
        """``tree`` without nodes the processing forbids, where dropping them keeps the
        proposal laws (else ``tree`` itself); called before the target scores it."""
        ...

    def process(self, tree: DraftTree, logits: torch.Tensor, state: DecodeState) -> torch.Tensor:
        """The processed logits. Args: logits: float, Shape: (N + 1, V), not modified.
        Returns: float, Shape: (N + 1, V)."""
        ...

    # Optional: ``allowed(state, paths)``, the tokens a constraint allows after each path
    # below the root (bool, Shape: (len(paths), V)); the decoder hands it to drafters as
    # ``DecodeState.allowed``.

"""The values and protocols that cross verispec's layers.

* :class:`Verdict` — what a verifier decides about one draft tree.
* :class:`GenerationConfig` — one generation's settings.
* :class:`DecodeState` — what a drafter sees when it proposes.
* :class:`StepOutcome` — what a drafter is told after verification.
* :class:`LanguageModel`, :class:`Drafter`, :class:`Verifier` — the protocols.

Shape glossary: N tree nodes, V vocabulary, S committed tokens.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence
from typing import ClassVar, Protocol, runtime_checkable

import attrs
import torch

from verispec.core.sampling import SamplingParams
from verispec.core.tree import DraftTree
from verispec.core.validate import attrs_check, integer
from verispec.errors import ConfigError

__all__ = [
    "DecodeState",
    "Drafter",
    "GenerationConfig",
    "LanguageModel",
    "StepOutcome",
    "PositionKeyedVerifier",
    "Verdict",
    "Verifier",
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


@attrs.frozen
class GenerationConfig:
    """Settings of one generation, mirroring Hugging Face's ``GenerationConfig`` names.

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
    """

    max_new_tokens: int = attrs.field(default=128, validator=attrs_check(integer, 1))
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
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
    seed: int = attrs.field(
        default=0, validator=attrs_check(integer, 0, below=SEED_LIMIT, integral=True)
    )

    def __attrs_post_init__(self) -> None:
        self.sampling  # noqa: B018 - validates the sampling fields eagerly

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
    """

    tokens: list[int]
    prompt_length: int
    sampling: SamplingParams
    generator: torch.Generator
    step: int = 0
    max_nodes: int = 1 << 30


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

    Optional: ``bind_target(target)``, called by the decoder when it is built, for
    drafters that size their trees from the target (its measured step latency).
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


@runtime_checkable
class Verifier(Protocol):
    """Decides which path of a draft tree to keep."""

    def verify(
        self,
        tree: DraftTree,
        target_logits: torch.Tensor,
        sampling: SamplingParams,
        generator: torch.Generator,
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
        self,
        tree: DraftTree,
        target_logits: torch.Tensor,
        sampling: SamplingParams,
        generator: torch.Generator,
        *,
        position: int | None = None,
    ) -> Verdict:
        """Args: target_logits: float, Shape: (N + 1, V); position: see the class."""
        ...

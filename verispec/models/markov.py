"""A toy language model with explicit next-token tables: a Markov chain of order 1 or 2.

The exactness audits need a target and a draft whose joint laws can be enumerated.
:class:`MarkovModel` is one: the next-token logits depend only on the last ``order``
committed tokens, read from an explicit table. It implements the whole
:class:`~verispec.core.types.LanguageModel` protocol — prefill, pending tokens,
``forward_tree`` with ``extend_from``, ``commit`` with accepted nodes the model never
fed — and checks every call against the protocol, so a drafter or engine that misuses
it fails loudly instead of silently scoring the wrong context.

Notation: V vocabulary, N tree nodes, S committed tokens, L generated length.
A context shorter than ``order`` is left-padded with token 0.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from verispec.core.sampling import SamplingParams
from verispec.core.tree import DraftTree
from verispec.core.validate import integer
from verispec.errors import ConfigError, ContextLengthError, TreeStructureError

__all__ = ["MarkovModel"]


class MarkovModel:
    """A Markov chain over a tiny vocabulary that behaves like a causal LM.

    Args:
        logits: float, Shape: (V, V) for order 1 (``logits[a]`` are the next-token
            logits after token ``a``) or (V, V, V) for order 2 (``logits[a, b]`` after
            ``a, b``). ``-inf`` entries are tokens that never follow. Stored as float64.
        max_length: the context window, in tokens (committed plus tree).
        eos_token_id: reported to the decoder; ``None`` (the default) means none.

    Attributes:
        forward_calls: number of ``forward_tree`` calls so far.
        tokens_fed: tokens fed so far (pending tokens plus tree nodes), as a real
            model with a KV cache would feed them.
        call_log: ``(extend_from, nodes_fed)`` of every ``forward_tree`` call.
    """

    def __init__(
        self, logits: torch.Tensor, *, max_length: int = 4096, eos_token_id: int | None = None
    ) -> None:
        logits = torch.as_tensor(logits, dtype=torch.float64)
        if logits.dim() not in (2, 3) or any(s != logits.shape[0] for s in logits.shape):
            raise ConfigError(
                f"`logits` must have shape (V, V) or (V, V, V); got {tuple(logits.shape)}."
            )
        if bool(torch.isnan(logits).any()) or bool((logits == torch.inf).any()):
            raise ConfigError("`logits` must not contain NaN or +inf.")
        if bool((logits == -torch.inf).all(-1).any()):
            raise ConfigError("every row of `logits` needs at least one finite entry.")
        integer("max_length", max_length, 2)
        self.logits = logits
        self.order = logits.dim() - 1
        self.vocab_size = int(logits.shape[0])
        self.max_length = max_length
        self.eos_token_id = eos_token_id
        self.forward_calls = 0
        self.tokens_fed = 0
        self.call_log: list[tuple[int, int]] = []
        self.reset()

    # -- constructors -----------------------------------------------------------------

    @classmethod
    def from_probs(cls, probs: torch.Tensor, **kwargs: object) -> MarkovModel:
        """Build from transition probabilities (rows sum to 1; zeros become ``-inf`` logits)."""
        probs = torch.as_tensor(probs, dtype=torch.float64)
        return cls(probs.log(), **kwargs)  # type: ignore[arg-type]

    @classmethod
    def random(
        cls,
        vocab_size: int,
        generator: torch.Generator,
        *,
        order: int = 1,
        scale: float = 1.0,
        **kwargs: object,
    ) -> MarkovModel:
        """A chain with standard-normal logits times ``scale`` (larger: peakier rows)."""
        if order not in (1, 2):
            raise ConfigError(f"`order` must be 1 or 2; got {order!r}.")
        shape = (vocab_size,) * (order + 1)
        logits = torch.randn(shape, generator=generator, dtype=torch.float64) * scale
        return cls(logits, **kwargs)  # type: ignore[arg-type]

    # -- the chain itself -------------------------------------------------------------

    def next_logits(self, context: Sequence[int]) -> torch.Tensor:
        """float64, Shape: (V,). Next-token logits after ``context`` (left-padded with 0)."""
        if self.order == 1:
            return self.logits[context[-1] if len(context) else 0]
        a = context[-2] if len(context) >= 2 else 0
        b = context[-1] if len(context) >= 1 else 0
        return self.logits[a, b]

    def sequence_probs(
        self, context: Sequence[int], length: int, sampling: SamplingParams
    ) -> torch.Tensor:
        """The exact joint law of the next ``length`` tokens when sampling with ``sampling``.

        Returns:
            float64, Shape: (V,) * length. Entry ``[t1, ..., tL]`` is the probability
            that decoding (each token drawn from ``sampling.probs`` of the chain's
            logits) continues ``context`` with ``t1, ..., tL``.
        """
        vocab = self.vocab_size
        law = torch.zeros((vocab,) * length, dtype=torch.float64)
        for seq in itertools.product(range(vocab), repeat=length):
            prob = 1.0
            ctx = list(context)
            for token in seq:
                prob *= float(sampling.probs(self.next_logits(ctx), torch.float64)[token])
                if prob == 0.0:
                    break
                ctx.append(token)
            law[seq] = prob
        return law

    # -- the LanguageModel protocol ---------------------------------------------------

    @property
    def num_committed(self) -> int:
        return len(self._cached) + len(self._pending)

    @property
    def pending(self) -> tuple[int, ...]:
        """Committed tokens not fed yet; the last one is the root."""
        return tuple(self._pending)

    @property
    def committed(self) -> list[int]:
        """Every committed token, cached then pending."""
        return self._cached + self._pending

    def reset(self) -> None:
        self._cached: list[int] = []
        self._pending: list[int] = []
        self._tree: DraftTree | None = None  # last tree scored this step
        self._pending_fed = False

    def prefill(self, ids: torch.Tensor) -> None:
        ids_list = [int(t) for t in torch.as_tensor(ids).reshape(-1).tolist()]
        if not ids_list:
            raise ConfigError("`ids` must hold at least one token; got an empty prompt.")
        self._check_tokens("ids", ids_list)
        if len(ids_list) > self.max_length:
            raise ContextLengthError(
                f"the prompt has {len(ids_list)} tokens but `max_length` is {self.max_length}."
            )
        self.reset()
        self._cached = ids_list[:-1]
        self._pending = ids_list[-1:]
        self.forward_calls += 1
        self.tokens_fed += len(self._cached)
        self.call_log.append((0, 0))

    def forward_tree(self, tree: DraftTree, *, extend_from: int = 0) -> torch.Tensor:
        """Score the root and the nodes of ``tree``; see the protocol for ``extend_from``.

        Returns:
            float64, Shape: (N + 1, V) when ``extend_from == 0``, else (N - k, V).
        """
        if not self._pending:
            raise RuntimeError("forward_tree needs a sequence; call prefill first.")
        n = tree.num_nodes
        if n:
            self._check_tokens("tree.tokens", tree.tokens.tolist())
        if self.num_committed + n > self.max_length:
            raise ContextLengthError(
                f"{self.num_committed} committed tokens plus a tree of {n} nodes exceed "
                f"`max_length` = {self.max_length}."
            )
        k = integer("extend_from", extend_from, 0, high=n, note=" (N, the tree's nodes)")
        if k > 0:
            previous = self._tree
            if previous is None or previous.num_nodes < k:
                raise ConfigError(
                    f"`extend_from` = {k} needs a tree of at least {k} nodes scored earlier "
                    "this step."
                )
            same = torch.equal(previous.tokens[:k], tree.tokens[:k]) and torch.equal(
                previous.parents[:k], tree.parents[:k]
            )
            if not same:
                raise TreeStructureError(
                    f"the first {k} nodes of the tree must equal those scored earlier this step."
                )
        fed = n - k
        if k == 0 and not self._pending_fed:
            fed += len(self._pending)
            self._pending_fed = True
        self.forward_calls += 1
        self.tokens_fed += fed
        self.call_log.append((k, n - k))
        self._tree = tree

        context = self.committed
        tokens = tree.tokens.tolist()
        rows = [] if k else [self.next_logits(context)]
        for node in range(k, n):
            rows.append(self.next_logits(context + [tokens[i] for i in tree.path_to(node)]))
        if not rows:
            return torch.empty(0, self.vocab_size, dtype=torch.float64)
        return torch.stack(rows)

    def commit(self, accepted: Sequence[int], extra_token: int) -> None:
        """Keep the pending tokens and the accepted path; ``extra_token`` becomes pending.

        ``accepted`` indexes the last tree scored this step (empty if none was).
        """
        accepted = [int(a) for a in accepted]
        self._check_tokens("extra_token", [int(extra_token)])
        tree = self._tree
        if accepted:
            if tree is None:
                raise TreeStructureError("`accepted` must be empty when no tree was scored.")
            if any(a < 0 or a >= tree.num_nodes for a in accepted):
                raise TreeStructureError(
                    f"`accepted` must index the {tree.num_nodes} nodes of the last scored tree; "
                    f"got {accepted}."
                )
            if tree.path_to(accepted[-1]) != accepted:
                raise TreeStructureError(
                    f"`accepted` must be a root-to-node path of the last scored tree; "
                    f"got {accepted}."
                )
        tokens = [int(tree.tokens[a]) for a in accepted] if tree is not None else []
        if self.num_committed + len(tokens) + 1 > self.max_length:
            raise ContextLengthError(f"committing would exceed `max_length` = {self.max_length}.")
        if self._pending_fed:
            # the pending tokens and every scored node on the path are now in the "cache"
            self._cached += self._pending + tokens
            self._pending = [int(extra_token)]
        else:
            self._pending += [*tokens, int(extra_token)]
        self._tree = None
        self._pending_fed = False

    # -- helpers ----------------------------------------------------------------------

    def _check_tokens(self, name: str, tokens: Sequence[int]) -> None:
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise TreeStructureError(f"`{name}` must be in [0, {self.vocab_size}); got {bad[0]}.")

"""The bookkeeping every tree-decoding model shares: pending tokens, trees, commits.

:class:`TreeSequenceModel` implements the :class:`~verispec.core.types.LanguageModel`
protocol once: which tokens are committed, cached or pending, which tree was scored
and how far, the checks on trees, extensions and accepted paths, and the masks and
positions of a tree pass (SpecInfer-style token tree verification, Miao et al., 2024,
§4.2). A concrete model supplies three things:

* :meth:`~TreeSequenceModel._feed` runs new tokens: they go to the cache slots right
  after ``visible + width - Q`` (see its docstring) and see every slot before
  ``visible`` and, of the last ``width`` slots, what their mask allows;
* :meth:`~TreeSequenceModel._compact` keeps a path's entries by a gather;
* :meth:`~TreeSequenceModel._truncate` and :meth:`~TreeSequenceModel._clear` drop entries.

The queries of a tree pass are the pending tokens, then the nodes. A pending token
sees the cache and the pending tokens up to itself; a node sees the cache, every
pending token, itself and its ancestors; positions are depth-based (node ``i`` at
``root_position + depth[i]``), so each node is scored as if its path had been decoded
one token at a time. Committed token ``j`` always sits in cache slot ``j``.

Shape glossary: N tree nodes, V vocabulary, P pending tokens, Q fed tokens.
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import Tensor

from verispec.core.tree import DraftTree
from verispec.errors import ConfigError, ContextLengthError, TreeStructureError

__all__ = ["TreeSequenceModel", "layer_indices"]


def layer_indices(layers: int | Sequence[int] | None, num_layers: int) -> tuple[int, ...]:
    """Validate a layer choice: ``None`` (all), ``n`` (the first n) or increasing indices."""
    if layers is None:
        return tuple(range(num_layers))
    if isinstance(layers, bool):
        raise ConfigError(
            f"`layers` must be an int or a sequence of layer indices; got {layers!r}."
        )
    if isinstance(layers, int):
        if not 1 <= layers <= num_layers:
            raise ConfigError(
                f"`layers` must be between 1 and the model's {num_layers} layers; got {layers}."
            )
        return tuple(range(layers))
    chosen = tuple(int(i) for i in layers)
    if not chosen:
        raise ConfigError("`layers` must name at least one decoder layer; got an empty list.")
    if any(not 0 <= i < num_layers for i in chosen):
        raise ConfigError(f"`layers` indices must be in [0, {num_layers}); got {list(chosen)}.")
    if any(b <= a for a, b in itertools.pairwise(chosen)):
        raise ConfigError(
            f"`layers` indices must be strictly increasing (each layer once, in order); "
            f"got {list(chosen)}."
        )
    return chosen


class TreeSequenceModel(abc.ABC):
    """The :class:`~verispec.core.types.LanguageModel` protocol over a slot-addressed cache.

    Subclasses set ``vocab_size``, ``max_length`` and ``device`` and implement the hooks.
    """

    vocab_size: int
    max_length: int
    device: torch.device
    runtime_note: str = ""  # which model class runs the forward, and why (set by make_target)
    # The forward is a transformers model's, whose attention interface can take verispec's
    # tree attention (HFModel): the benchmark swaps it in where the kernels run.
    runs_hf_attention: ClassVar[bool] = False

    def _init_sequence(self) -> None:
        self._cached = 0  # cache entries that belong to committed tokens
        self._pending: list[int] = []
        self._tree: DraftTree | None = None  # the tree scored this step
        self._fed = 0  # nodes of that tree whose entries are in the cache
        self._pending_fed = 0  # pending tokens fed this step (0 or len(_pending))

    # -- hooks --------------------------------------------------------------------------

    @abc.abstractmethod
    def _feed(
        self, tokens: Tensor, positions: Tensor, visible: int, local_mask: Tensor | None,
        keep_rows: int | None,
    ) -> Tensor:  # fmt: skip
        """Run ``tokens`` (int64, Shape: (Q,)) at rotary ``positions`` (Shape: (Q,)).

        Their entries go to slots ``[visible + W - Q, visible + W)`` where ``W`` is the
        width of ``local_mask`` (bool, Shape: (Q, W), True = attend); every query sees
        slots ``[0, visible)`` and, of slots ``[visible, visible + W)``, what its mask row
        allows. ``local_mask=None`` means a causal pass with ``W = Q``. Returns float
        logits of the last ``keep_rows`` rows (``None``: every row; ``0``: none).
        """

    def _decode_step(self, tree: DraftTree) -> torch.Tensor | None:
        """The logits of a step, Shape: (N + 1, V), with one pending token (the root, at
        position ``_cached``, its entries in slot ``_cached``) and ``tree`` below it (node
        ``i`` in slot ``_cached + 1 + i``), by a faster path than :meth:`_feed` with the same
        bits; ``None`` where there is none (then :meth:`_feed` runs)."""
        return None

    @abc.abstractmethod
    def _compact(self, start: int, source: torch.Tensor) -> None:
        """Entries ``start + j`` become copies of entries ``source[j]`` (int64, Shape: (n,))."""

    @abc.abstractmethod
    def _truncate(self, length: int) -> None:
        """Only the first ``length`` entries are valid from now on."""

    @abc.abstractmethod
    def _clear(self) -> None:
        """Forget every entry."""

    # -- protocol -----------------------------------------------------------------------

    @property
    def num_committed(self) -> int:
        """Committed tokens so far: cached plus pending."""
        return self._cached + len(self._pending)

    @property
    def pending_tokens(self) -> list[int]:
        """Committed tokens not yet fed; the last is the root of the next tree."""
        return list(self._pending)

    def reset(self) -> None:
        """Forget the sequence (the model may keep its buffers for the next one)."""
        self._clear()
        self._init_sequence()

    def prefill(self, ids: torch.Tensor | Sequence[int]) -> None:
        """Start a new sequence from prompt ``ids`` (int64, Shape: (S,)), S >= 1.

        Every token but the last is cached; the last one is pending (the root).
        """
        ids_t = torch.as_tensor(ids, dtype=torch.long).reshape(-1).cpu()
        if ids_t.numel() == 0:
            raise ConfigError("`ids` must hold at least one token; got an empty prompt.")
        self._check_tokens(ids_t, "prompt")
        if ids_t.numel() > self.max_length:
            raise ContextLengthError(
                f"the prompt has {ids_t.numel()} tokens but the model's context holds "
                f"{self.max_length}; shorten the prompt."
            )
        self.reset()
        head = ids_t[:-1]
        if head.numel():
            self._feed(head, torch.arange(head.numel()), 0, None, keep_rows=0)
        self._cached = int(head.numel())
        self._pending = [int(ids_t[-1])]

    def forward_tree(self, tree: DraftTree, *, extend_from: int = 0) -> torch.Tensor:
        """Score the root and the tree's nodes in one pass.

        Args:
            tree: the draft tree below the root.
            extend_from: ``0`` scores the whole tree and returns float, Shape: (N + 1, V)
                (row 0 the root, row i + 1 node i). ``k > 0`` grows the tree scored by the
                previous call of this step, whose first ``k`` nodes must equal this tree's:
                only nodes ``k..N-1`` are fed, and their logits returned, Shape: (N - k, V).
        """
        if not self._pending:
            raise ConfigError("`forward_tree` needs a sequence; call `prefill(ids)` first.")
        num_nodes = tree.num_nodes
        if extend_from:
            self._check_extension(tree, extend_from)
        start = extend_from
        new_tokens = tree.tokens[start:]
        self._check_tokens(new_tokens, "tree")
        num_pending = len(self._pending)
        if self._cached + num_pending + num_nodes > self.max_length:
            raise ContextLengthError(
                f"{self._cached + num_pending} committed tokens plus a tree of {num_nodes} "
                f"nodes exceed the model's context of {self.max_length}; send a smaller tree "
                f"(`DecodeState.max_nodes` says how many fit)."
            )
        root_position = self._cached + num_pending - 1
        fast = self._decode_step(tree) if num_pending == 1 and start == 0 else None
        if fast is not None:  # the root and the tree by the model's own faster path
            logits = fast
            self._pending_fed = 1
        elif num_nodes == 0:  # a plain step: the pending tokens alone, causally (fewest ops)
            mask = torch.ones(num_pending, num_pending, dtype=torch.bool)
            if num_pending > 1:
                mask.tril_()
            tokens = torch.tensor(self._pending, dtype=torch.long)
            positions = torch.arange(self._cached, root_position + 1)
            logits = self._feed(tokens, positions, self._cached, mask, keep_rows=1)
            self._pending_fed = num_pending
        elif start == 0:
            # Feed the pending tokens, then the nodes, after the committed cache.
            queries = num_pending + num_nodes
            mask = torch.zeros(queries, queries, dtype=torch.bool)
            mask[:num_pending, :num_pending] = torch.ones(
                num_pending, num_pending, dtype=torch.bool
            ).tril_()
            mask[num_pending:, :num_pending] = True
            mask[num_pending:, num_pending:] = tree.ancestor_mask
            tokens = torch.cat([torch.tensor(self._pending, dtype=torch.long), new_tokens])
            positions = torch.cat(
                [torch.arange(self._cached, root_position + 1), tree.depth + root_position]
            )
            logits = self._feed(tokens, positions, self._cached, mask, keep_rows=num_nodes + 1)
            self._pending_fed = num_pending
        else:
            # Grow the tree scored by the previous call: its first k nodes are in the cache.
            mask = torch.ones(num_nodes - start, self._pending_fed + num_nodes, dtype=torch.bool)
            mask[:, self._pending_fed :] = tree.ancestor_mask[start:]  # (N - k, N)
            positions = tree.depth[start:] + root_position
            logits = self._feed(new_tokens, positions, self._cached, mask, keep_rows=None)
        self._tree = tree
        self._fed = num_nodes
        return logits

    def commit(self, accepted: Sequence[int], extra_token: int) -> None:
        """Keep the pending tokens and the ``accepted`` nodes of the last scored tree.

        ``accepted`` is a root-to-node path of the tree given to the last ``forward_tree``
        call (all of whose nodes were fed). Their entries are gathered into place right
        after the pending tokens' (so a side branch leaves the cache exactly as sequential
        decoding would); only the accepted entries move, and none when the path is the
        tree's first nodes in order. ``extra_token`` becomes pending. With no tree scored
        since the last commit, ``accepted`` must be empty and ``extra_token`` joins the
        pending tokens.
        """
        if not self._pending:
            raise ConfigError("`commit` needs a sequence; call `prefill(ids)` first.")
        path = [int(a) for a in accepted]
        if path:
            self._check_path(path)
        extra_token = int(extra_token)
        self._check_range(extra_token, extra_token, "extra token")  # no tensor for one id
        if self._pending_fed:
            base = self._cached + self._pending_fed
            if path != list(range(len(path))):
                source = torch.tensor(path, dtype=torch.long) + base
                self._compact(base, source.to(self.device, non_blocking=True))
            self._truncate(base + len(path))
            self._cached = base + len(path)
            self._pending = [int(extra_token)]
        else:
            self._pending = [*self._pending, int(extra_token)]
        self._tree = None
        self._fed = self._pending_fed = 0

    # -- checks -------------------------------------------------------------------------

    def _check_tokens(self, tokens: torch.Tensor, what: str) -> None:
        if tokens.numel() == 0:
            return
        self._check_range(int(tokens.min()), int(tokens.max()), what)

    def _check_range(self, low: int, high: int, what: str) -> None:
        """Token ids from ``low`` to ``high`` must be in the vocabulary."""
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            error = TreeStructureError if what == "tree" else ConfigError
            raise error(f"{what} token ids must be in [0, {self.vocab_size}); got {bad}.")

    def _check_extension(self, tree: DraftTree, extend_from: int) -> None:
        previous = self._tree
        if previous is None or not self._pending_fed:
            raise ConfigError(
                f"`extend_from={extend_from}` grows the tree scored earlier in this step, but no "
                f"tree was scored since the last commit; call with `extend_from=0` first."
            )
        if not 0 < extend_from <= min(self._fed, tree.num_nodes):
            raise ConfigError(
                f"`extend_from` must be in [0, {min(self._fed, tree.num_nodes)}] (nodes already "
                f"scored); got {extend_from}."
            )
        same = torch.equal(previous.tokens[:extend_from], tree.tokens[:extend_from]) and (
            torch.equal(previous.parents[:extend_from], tree.parents[:extend_from])
        )
        if not same:
            raise TreeStructureError(
                f"the first {extend_from} nodes of the tree must equal those scored by the "
                f"previous `forward_tree` call to extend it; they differ."
            )

    def _check_path(self, accepted: list[int]) -> None:
        tree = self._tree
        if tree is None or accepted[-1] >= tree.num_nodes or min(accepted) < 0:
            raise TreeStructureError(
                f"`accepted` nodes {accepted} must be nodes of the last scored tree "
                f"({0 if tree is None else tree.num_nodes} nodes)."
            )
        parents = tree.parents.tolist()
        expected = -1
        for node in accepted:
            if parents[node] != expected:
                raise TreeStructureError(
                    f"`accepted` must be a root-to-node path; node {node}'s parent is "
                    f"{parents[node]}, not {expected}."
                )
            expected = node

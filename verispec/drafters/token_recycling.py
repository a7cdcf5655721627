"""Token Recycling: a model-free drafter that recycles the target's own top-k candidates.

Paper: Luo et al., "Turning Trash into Treasure: Accelerating Inference of Large
Language Models with Token Recycling", ACL 2025 (arXiv:2408.08696); reference code
``Luowaterbi/TokenRecycling``.

State: an adjacency matrix ``M`` of shape (V, K), K = 8 by default, where ``M[t, j]``
is the ``j``-th most likely token the target predicted after ``t`` the last time
``t`` was scored (Sec. 3.1). Each step (Sec. 3.2, Algorithm 1 of the appendix) the
drafter expands a static tree template breadth-first from the root (the last
committed token): the node in slot ``j`` below a node with token ``t`` gets
``M[t, j]``. The template is precomputed into parent and slot arrays, so expansion is
one gather per level. After verification (Sec. 3.3) the row of the token at *every*
scored position — the root and every tree node, accepted or not — is overwritten
with the target's top-K token ids at that position.

Choices where the paper leaves room (each marked "not in the paper" in the code):

* **Initial matrix.** The paper fills ``M`` with token 0. Here rows start *unknown*
  (``-1``) and, by default (``prune_unknown=True``), an unknown slot and its subtree
  are left out of the tree, so a cold start sends a smaller tree instead of scoring
  copies of token 0. ``prune_unknown=False`` reads unknown slots as token 0, as
  published.
* **Duplicate tokens in one step.** When a token appears at several scored positions
  the published code writes all rows in one parallel scatter, so which write wins is
  unspecified (Sec. 3.3); their ablation (Sec. 5.2) finds "last occurrence" gives the
  highest MAT. Here the **last** occurrence in row order (root first, then nodes in
  breadth-first order) wins, deterministically.
* **Duplicate siblings.** Siblings come from one row of ``M``, which is a top-K list
  of distinct ids, so siblings are always distinct. Only the published cold start
  (``prune_unknown=False``) repeats token 0 among siblings; the deterministic rule stays
  exact then (a repeated sibling has residual probability 0), it only wastes nodes.
* **Persistence.** ``M`` persists across ``generate`` calls of one drafter instance,
  the paper's "hot start"; :meth:`TokenRecycling.reset` clears it.
* **Sized by the device** (``template="auto"``, the default). The paper's 80-node tree
  suits a GPU, where scoring 80 nodes costs about what one costs; on a CPU it made
  decoding slower than plain decoding. With ``"auto"`` the 80-node template is expanded
  as published and then cut: each slot ``j`` has a running acceptance rate (how often a
  node in slot ``j`` was accepted when its parent was; prior ``0.4 / (j + 1)``, four
  pseudo-tries, counts decaying by 0.999 a step), a node's value is the product of the
  rates down its path, and the most valuable nodes are kept, as many as maximise
  expected tokens per second under the target's measured latency table
  (:func:`~verispec.drafters.budget.choose_budget`, as ``dtr:budget=auto``). A
  :class:`~verispec.drafters.gate.DraftGate` sends the empty tree while drafting does not
  pay. When the rule keeps no node, a drafting step still sends the most valuable one, so
  the rates keep learning, but that node never ends the gate's backing off
  (:meth:`~verispec.drafters.gate.DraftGate.unpaid`); and since the rates carry over from
  one prompt to the next, so does the gate's state
  (:meth:`~verispec.drafters.gate.DraftGate.restart`). ``template="2.2.2"`` (or ``"80"``)
  is the published algorithm.

Kernels. The expansion and the update each have a Triton kernel
(:func:`verispec.kernels.ops.expand_template`, :func:`~verispec.kernels.ops.update_adjacency`);
the drafter calls them with its ``kernels`` and they pick the backend
(:mod:`verispec.kernels.backend`). With the kernels (by default when the target's
logits are on CUDA) ``M`` lives on the logits' device
(:func:`~verispec.kernels.ops.state_device`), is updated there without a host sync,
and the expanded tokens come to the host once per step to build the tree; otherwise
``M`` lives on the CPU and the kernels' PyTorch twins run
(:func:`verispec.kernels.reference.expand_template`,
:func:`~verispec.kernels.reference.update_adjacency`): each rule is written once.

Shape glossary: N tree nodes, V vocabulary, K candidates per token.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from verispec.core.tree import DraftTree
from verispec.core.types import DecodeState, StepOutcome
from verispec.core.validate import integer, option
from verispec.drafters.budget import LatencyTable
from verispec.drafters.candidates import tried_and_hit_lists
from verispec.drafters.gate import DeviceSized
from verispec.drafters.templates import TEMPLATES, TemplateSpec, resolve_template
from verispec.errors import ConfigError, IncompatibleModelsError
from verispec.kernels import ops
from verispec.kernels.backend import Kernels, require_triton
from verispec.kernels.cpu import topk as cpu_topk

__all__ = [
    "TEMPLATE_NAMES",
    "TokenRecycling",
    "TokenRecyclingOptions",
    "row_topk",
    "row_topk_scored",
]

_SLOT_PRIOR_TRIES = 4.0  # template="auto": pseudo-tries of each slot's prior rate
_SLOT_DECAY = 0.999  # ... and the per-step forgetting of the slots' counts
_CHUNK = 64  # row_topk's block width: best measured on a 2-core x86 CPU at V = 49,152


def _slot_prior(k: int) -> torch.Tensor:
    """Prior acceptance of a node in slot ``j`` once its parent is accepted: 0.4 / (j + 1)."""
    return 0.4 / torch.arange(1, k + 1, dtype=torch.float64)


def row_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` values and indices of every row, as ``torch.topk`` but faster on CPU.

    On the CPU (float32, V a multiple of 64 and at least ``256 k``) the C kernel of
    :mod:`verispec.kernels.cpu.topk` takes it in one pass over each row, a few times faster
    than the block search with torch ops below, itself far faster than ``torch.topk``
    (docs/benchmarks.rst). Without the kernel, each row is cut
    into blocks of 64, the ``k`` blocks with the largest maxima are kept (every top-``k``
    element lies in one of them: a block holding the ``i``-th largest element has a maximum
    that at most ``i - 1`` other blocks exceed), and the top-``k`` is taken over those
    ``64 k`` values. Ties may be broken differently from ``torch.topk``; the values
    returned are the same.

    Args:
        logits: float, Shape: (M, V).
        k: candidates per row, ``k <= V``.

    Returns:
        values (same dtype, Shape: (M, K)) and int64 indices (Shape: (M, K)), descending.
    """
    values, indices, _ = _topk_and_norm(logits, k, scored=False)
    return values, indices


def _uses_blocks(vocab: int, k: int) -> bool:
    return vocab % _CHUNK == 0 and vocab >= 4 * k * _CHUNK


def _topk_and_norm(
    logits: torch.Tensor, k: int, *, scored: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Top-``k`` values and ids of each row, and (``scored`` and where the rows are cut into
    blocks) the log-sum-exp of each row's block maxima, Shape: (M, 1); else ``None``."""
    rows, vocab = logits.shape
    if not _uses_blocks(vocab, k):
        values, indices = torch.topk(logits, k, dim=-1)
        return values, indices, None
    found = cpu_topk.topk_rows(logits, k, _CHUNK, lse=scored)  # None: not CPU float32, no C
    if found is not None:
        return found
    blocks = logits.reshape(rows, vocab // _CHUNK, _CHUNK)  # (M, V / C, C)
    block_max = blocks.amax(-1)  # (M, V / C)
    norm = torch.logsumexp(block_max.float(), dim=-1, keepdim=True) if scored else None
    if logits.device.type != "cpu" or logits.dtype != torch.float32:
        values, indices = torch.topk(logits, k, dim=-1)
        return values, indices, norm
    best_blocks = torch.topk(block_max, k, dim=-1).indices  # (M, K)
    cand = torch.gather(blocks, 1, best_blocks[:, :, None].expand(-1, -1, _CHUNK))
    values, pos = torch.topk(cand.reshape(rows, k * _CHUNK), k, dim=-1)  # (M, K)
    indices = best_blocks.gather(1, pos // _CHUNK) * _CHUNK + pos % _CHUNK
    return values, indices, norm


def row_topk_scored(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` ids of every row with a cheap probability-like score of each.

    The score of a candidate with logit ``l`` is ``exp(l - logsumexp(block maxima))``,
    where the blocks are 64 consecutive vocabulary ids (when V is a multiple of 64 and at
    least ``256 k``; otherwise the plain softmax probability). It is the candidate's
    probability under a softmax restricted to the block maxima: at least its true
    probability and at most 64 times it, at 1/64 of a full softmax's cost (a softmax over
    (81, 49152) float32 takes several milliseconds on a 2-core CPU). Whoever uses it
    calibrates it against observed acceptances rather than reading it as a probability.

    Args:
        logits: float, Shape: (M, V).
        k: candidates per row, ``k <= V``.

    Returns:
        int64 ids, Shape: (M, K), and float32 scores in (0, 1], Shape: (M, K), descending.
    """
    values, indices, norm = _topk_and_norm(logits, k, scored=True)
    if norm is None:
        norm = torch.logsumexp(logits.float(), dim=-1, keepdim=True)  # (M, 1)
    return indices, (values.float() - norm).exp_().clamp_(max=1.0)


TEMPLATE_NAMES = ("auto", *TEMPLATES)
"""The templates a name selects: ``"auto"`` (sized by the device) and :data:`TEMPLATES`."""


def _check_template(name: str, value: object) -> None:
    """A template name (:data:`TEMPLATE_NAMES`, or a size as an int), or anything else
    :func:`~verispec.drafters.templates.resolve_template` reads (index paths, a
    :class:`~verispec.drafters.templates.TreeTemplate`), whose structure it checks."""
    named = isinstance(value, str | int) and not isinstance(value, bool)
    if isinstance(value, bool) or (named and str(value) not in TEMPLATE_NAMES):
        raise ConfigError(
            f"`{name}` must be one of {', '.join(TEMPLATE_NAMES)} or a list of index paths; "
            f"got {value!r}."
        )


def _template_value(value: Any) -> Any:
    """One value per template: a size given as an int is its name (16 is ``"16"``), index
    paths are tuples (``[[0], [1]]`` is ``((0,), (1,))``); anything else as given."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, list | tuple):
        try:
            return tuple(tuple(path) for path in value)
        except TypeError:  # not paths: resolve_template says what is wrong
            return value
    return value


@attrs.frozen
class TokenRecyclingOptions:
    """TokenRecycling's parameters, checked (the one description of them)."""

    template: TemplateSpec = option(  # noqa: RUF009 (an attrs field, not a dataclass default)
        "auto",
        _check_template,
        kind="str",
        choices=TEMPLATE_NAMES,
        converter=_template_value,
        help="tree template: auto (the 80-node tree cut to what pays on this device), 2.2.2 "
        "(= 80, the published tree: the GPU setting), 8, 16, 32",
    )
    k: int = option(8, integer, 1, high=1024, help="candidates kept per token (K)")
    prune_unknown: bool = option(
        True, kind="bool", spec="prune", help="leave never-observed slots out of the tree"
    )


_DEFAULT = TokenRecyclingOptions()  # the defaults of TokenRecycling's arguments


class TokenRecycling(DeviceSized):
    """Token Recycling drafter (Luo et al., ACL 2025).

    Args:
        template: ``"auto"`` (the default: the published tree cut each step to the size
            the target's latency table pays for, see "Sized by the device" in the module
            notes), ``"2.2.2"`` or ``"80"`` (80 nodes, the published tree: the GPU
            setting), ``"8"``, ``"16"``, ``"32"`` (its first nodes in breadth-first
            order), or a list of index paths (e.g. ``[[0], [1], [0, 0]]``).
        k: K, candidates kept per token (the adjacency width).
        prune_unknown: leave out slots whose candidate was never observed (default);
            ``False`` reads them as token 0 like the published code.
        vocab_size: allocate the matrix now; otherwise it is allocated at the first
            observed step from the target logits' width.
        kernels: ``"auto"`` (the Triton kernels for logits on CUDA, PyTorch elsewhere),
            ``"triton"`` or ``"torch"``.
        latency: the target's :class:`~verispec.drafters.budget.LatencyTable` for
            ``template="auto"``; by default :class:`verispec.SpeculativeDecoder` binds it.

    Raises:
        ConfigError: ``k`` or ``kernels`` out of range, or an unknown template name.
        TreeStructureError: an invalid template path (named in the message).
        KernelUnavailableError: ``kernels="triton"`` where Triton cannot run.
    """

    def __init__(
        self,
        template: TemplateSpec = _DEFAULT.template,
        k: int = _DEFAULT.k,
        *,
        prune_unknown: bool = _DEFAULT.prune_unknown,
        vocab_size: int | None = None,
        kernels: Kernels = "auto",
        latency: LatencyTable | None = None,
    ) -> None:
        self.options = TokenRecyclingOptions(template, k, prune_unknown)
        self.k = k
        self.kernels = require_triton(kernels)
        auto = self.options.template == "auto"
        self.template = resolve_template("2.2.2" if auto else self.options.template, k)
        self._size_by_device(auto, latency)
        # template="auto": accepted / tried counts of each slot whose parent was accepted
        self._slot_tried = torch.full((k,), _SLOT_PRIOR_TRIES, dtype=torch.float64)
        self._slot_hits = self._slot_tried * _slot_prior(k)
        # the template's nodes by value, and their values, until the slots' rates change
        self._valued: tuple[list[int], list[float]] | None = None
        self._last: tuple[DraftTree, list[int]] | None = None  # the tree, its nodes' slots
        self._parent_list: list[int] = self.template.parents.tolist()
        self._slot_list: list[int] = self.template.slots.tolist()
        self.prune_unknown = prune_unknown
        self._adjacency: torch.Tensor | None = None  # int32 (V, K); -1 = unknown
        # Static tree when no slot is pruned: reused verbatim (structure cached once).
        self._full_parents = self.template.parents
        self._full_laws = self.template.laws
        if vocab_size is not None:
            self._allocate(vocab_size)

    # -- state ------------------------------------------------------------------------

    def _allocate(self, vocab_size: int) -> None:
        if vocab_size < 1:
            raise ConfigError(f"`vocab_size` must be >= 1; got {vocab_size}.")
        self._adjacency = torch.full((vocab_size, self.k), -1, dtype=torch.int32)

    @property
    def adjacency(self) -> torch.Tensor | None:
        """int32, Shape: (V, K), or ``None`` before the first step. ``-1`` = unknown."""
        return self._adjacency

    @property
    def state_bytes(self) -> int:
        """Bytes held by the adjacency matrix (V · K · 4 for int32)."""
        a = self._adjacency
        return 0 if a is None else a.numel() * a.element_size()

    def reset(self) -> None:
        """Forget every recycled candidate (the matrix becomes unknown everywhere) and,
        with ``template="auto"``, the slots' rates and the gate."""
        if self._adjacency is not None:
            self._adjacency.fill_(-1)
        self._slot_tried.fill_(_SLOT_PRIOR_TRIES)
        self._slot_hits = self._slot_tried * _slot_prior(self.k)
        self._valued = None
        self._last = None
        if self.gate is not None:
            self.gate.reset()

    # -- Drafter protocol -------------------------------------------------------------

    def begin(self, state: DecodeState) -> None:
        """Nothing to do but restart the gate: the matrix and the slots' rates are
        inherited from earlier queries (hot start), and so are the gate's mean gain and
        backing off (:meth:`~verispec.drafters.gate.DraftGate.restart`: the valuation does
        not depend on the prompt)."""
        self._last = None
        if self.gate is not None:
            self.gate.restart()

    def propose(self, state: DecodeState) -> DraftTree:
        """Expand the template from the last committed token (``"auto"``: its most valuable
        nodes, as many as pay, or the empty tree while drafting does not pay)."""
        if not self.sized_by_device:
            return self._template_tree(state.tokens[-1])
        self._last = None
        return self._gated_propose(
            "TokenRecycling(template='auto')", lambda: self._sized_tree(state)
        )

    def _expand(self, root: int) -> torch.Tensor | None:
        """The template's tokens below ``root``, Shape: (N,), ``-1`` where unknown; ``None``
        before the matrix exists (or for a root outside it)."""
        adj = self._adjacency
        if adj is None or root >= adj.shape[0]:
            return None
        t = self.template
        rows = ops.expand_template(
            adj, root, t.parents, t.slots, t.level_starts, kernels=self.kernels
        )
        return rows[1:].cpu()  # (N,) the tree's tokens on the host (a sync from a GPU)

    def _template_tree(self, root: int) -> DraftTree:
        """The whole template (the published algorithm), unknown slots pruned or read as 0."""
        tokens = self._expand(root)
        if tokens is None:
            return DraftTree.empty() if self.prune_unknown else self._zeros_tree()
        if not self.prune_unknown:  # not in the paper's wording: its zero init, read lazily
            return DraftTree.from_parents(tokens.clamp(min=0), self._full_parents, self._full_laws)
        known = tokens >= 0  # an unknown parent already made its children unknown
        if bool(known.all()):
            return DraftTree.from_parents(tokens, self._full_parents, self._full_laws)
        return self._nodes(tokens, known.nonzero().squeeze(1))

    def _nodes(self, tokens: torch.Tensor, kept: torch.Tensor) -> DraftTree:
        """The template nodes ``kept`` (increasing, every parent kept) as a tree."""
        new_index = torch.full((self.template.num_nodes,), -1, dtype=torch.long)
        new_index[kept] = torch.arange(kept.numel())
        parents = self._full_parents[kept]
        parents = torch.where(parents >= 0, new_index[parents.clamp(min=0)], -1)
        return DraftTree.from_parents(tokens[kept], parents)

    def _sized_tree(self, state: DecodeState) -> DraftTree:
        """``template="auto"``: the template's nodes valued by their slots' acceptance rates
        (a node's value is the product of the rates down its path), as many of the most
        valuable as the budget rule pays for (:func:`~verispec.drafters.budget.choose_budget`),
        then only those nodes expanded (an unknown one is left out with its subtree).
        Python lists: the template has 80 nodes, and a tensor op costs more than a loop.
        At least one node is sent (the gate decides whether drafting pays at all). The
        valuation is kept until a drafted step changes the rates."""
        adj, root = self._adjacency, state.tokens[-1]
        if adj is None or root >= adj.shape[0]:
            return DraftTree.empty()
        parents, slots = self._parent_list, self._slot_list
        if self._valued is None:
            rate = (self._slot_hits / self._slot_tried).tolist()
            value = [0.0] * len(parents)
            for i, (parent, slot) in enumerate(zip(parents, slots, strict=True)):
                value[i] = rate[slot] * (value[parent] if parent >= 0 else 1.0)
            ranked = sorted(range(len(value)), key=value.__getitem__, reverse=True)  # stable
            self._valued = ranked, [value[i] for i in ranked]
        ranked, values = self._valued
        size = min(len(ranked), state.max_nodes)
        if size == 0:
            return DraftTree.empty()
        # at least one node: the gate chose to draft (a probe while backing off), and the
        # rates learn only from nodes sent; with none, a rate once below what pays would
        # stay there for good. Such a node is unpaid: it never ends the gate's backing off
        # (the rates must rise until the rule pays for a node first).
        n = self._learning_budget(values[:size], len(state.tokens))
        token_of: dict[int, int] = {-1: root}
        rows: dict[int, list[int]] = {}
        kept: list[int] = []
        for i in sorted(ranked[:n]):  # breadth-first: parents first
            parent_token = token_of.get(parents[i])
            if parent_token is None:
                continue  # below an unknown node
            row = rows.get(parent_token)
            if row is None:
                row = rows[parent_token] = adj[parent_token].tolist()
            if row[slots[i]] >= 0:
                token_of[i] = row[slots[i]]
                kept.append(i)
        new_index = {-1: -1, **{node: j for j, node in enumerate(kept)}}
        tree = DraftTree.from_parents(
            [token_of[i] for i in kept], [new_index[parents[i]] for i in kept]
        )
        self._last = (tree, [slots[i] for i in kept])
        return tree

    def _zeros_tree(self) -> DraftTree:
        return DraftTree.from_parents(
            torch.zeros(self.template.num_nodes, dtype=torch.long),
            self._full_parents,
            self._full_laws,
        )

    def observe(self, outcome: StepOutcome) -> None:
        """Overwrite the row of every scored token with the target's top-K at that position.

        Rows: the root and every tree node, accepted or not (Sec. 3.3). A token scored
        at several positions keeps the top-K of its last position (root first, then
        breadth-first node order); not in the paper, whose parallel scatter leaves it
        unspecified.
        """
        self._gated_observe(outcome, lambda: self._learn(outcome))

    def _learn(self, outcome: StepOutcome) -> None:
        self._update(outcome)
        if self._last is not None and self._last[0] is outcome.tree:  # learn the slots' rates
            tried, hit = tried_and_hit_lists(outcome.tree, outcome.verdict)
            slot_tried, slot_hits = self._slot_tried.numpy(), self._slot_hits.numpy()  # views
            slot_tried *= _SLOT_DECAY
            slot_hits *= _SLOT_DECAY
            for slot, was_tried, was_hit in zip(self._last[1], tried, hit, strict=True):
                slot_tried[slot] += was_tried
                slot_hits[slot] += was_hit
            self._valued = None
        self._last = None

    def _update(self, outcome: StepOutcome) -> None:
        logits = outcome.target_logits  # (N + 1, V)
        vocab = logits.shape[-1]
        if self._adjacency is None:
            self._allocate(vocab)
        adj = self._adjacency
        assert adj is not None
        if adj.shape[0] != vocab:
            raise IncompatibleModelsError(
                f"this TokenRecycling matrix has {adj.shape[0]} rows but the target's "
                f"vocabulary has {vocab}; call `reset_vocabulary({vocab})` or use a new drafter."
            )
        k = min(self.k, vocab)
        root = outcome.state.tokens[-outcome.verdict.num_committed - 1]
        scored = torch.cat([torch.tensor([root]), outcome.tree.tokens])  # (N + 1,)
        # the matrix lives where the update runs: the logits' GPU with the kernels, else the CPU
        device = ops.state_device("Token Recycling update", logits.device, self.kernels)
        if adj.device != device:
            adj = self._adjacency = adj.to(device)
        top = row_topk(logits, k)[1]  # (N + 1, K) on the logits' device, no sync
        ops.update_adjacency(adj[:, :k], scored, top, kernels=self.kernels)

    def reset_vocabulary(self, vocab_size: int) -> None:
        """Reallocate the matrix for a target with another vocabulary (forgets everything)."""
        self._allocate(vocab_size)

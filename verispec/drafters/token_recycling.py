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

Kernels. The expansion and the update each have a Triton kernel
(:func:`verispec.kernels.ops.expand_template`, :func:`~verispec.kernels.ops.update_adjacency`);
``kernels`` picks (:mod:`verispec.kernels.backend`). With the kernels (by default when
the target's logits are on CUDA) ``M`` lives on the logits' device, is updated there
without a host sync, and the expanded tokens come to the host once per step to build the
tree; otherwise ``M`` lives on the CPU and the kernels' PyTorch twins run
(:func:`verispec.kernels.reference.expand_template`,
:func:`~verispec.kernels.reference.update_adjacency`): each rule is written once.

Shape glossary: N tree nodes, V vocabulary, K candidates per token.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import torch

from verispec.core.tree import DraftTree
from verispec.core.types import DecodeState, StepOutcome
from verispec.core.validate import integer, option
from verispec.drafters.templates import TemplateSpec, resolve_template
from verispec.errors import ConfigError, IncompatibleModelsError
from verispec.kernels import ops, reference
from verispec.kernels.backend import backend_for, require_triton

__all__ = [
    "TokenRecycling",
    "TokenRecyclingOptions",
    "row_topk",
    "row_topk_scored",
]

_CHUNK = 64  # row_topk's block width: best measured on a 2-core x86 CPU at V = 49,152


def row_topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` values and indices of every row, as ``torch.topk`` but faster on CPU.

    ``torch.topk`` over (81, 49152) float32 takes about 2.8 ms on a 2-core CPU. Here each
    row is cut into blocks of 64, the ``k`` blocks with the largest maxima are kept
    (every top-``k`` element lies in one of them: a block holding the ``i``-th largest
    element has a maximum that at most ``i - 1`` other blocks exceed), and the top-``k``
    is taken over those ``64 k`` values: about 0.6 ms. Ties may be broken differently
    from ``torch.topk``; the values returned are the same.

    Args:
        logits: float, Shape: (M, V).
        k: candidates per row, ``k <= V``.

    Returns:
        values (same dtype, Shape: (M, K)) and int64 indices (Shape: (M, K)), descending.
    """
    values, indices, _ = _topk_and_block_max(logits, k)
    return values, indices


def _uses_blocks(vocab: int, k: int) -> bool:
    return vocab % _CHUNK == 0 and vocab >= 4 * k * _CHUNK


def _topk_and_block_max(
    logits: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    rows, vocab = logits.shape
    if not _uses_blocks(vocab, k):
        values, indices = torch.topk(logits, k, dim=-1)
        return values, indices, None
    blocks = logits.reshape(rows, vocab // _CHUNK, _CHUNK)  # (M, V / C, C)
    block_max = blocks.amax(-1)  # (M, V / C)
    if logits.device.type != "cpu" or logits.dtype != torch.float32:
        values, indices = torch.topk(logits, k, dim=-1)
        return values, indices, block_max
    best_blocks = torch.topk(block_max, k, dim=-1).indices  # (M, K)
    cand = torch.gather(blocks, 1, best_blocks[:, :, None].expand(-1, -1, _CHUNK))
    values, pos = torch.topk(cand.reshape(rows, k * _CHUNK), k, dim=-1)  # (M, K)
    indices = best_blocks.gather(1, pos // _CHUNK) * _CHUNK + pos % _CHUNK
    return values, indices, block_max


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
    values, indices, block_max = _topk_and_block_max(logits, k)
    source = logits if block_max is None else block_max
    norm = torch.logsumexp(source.float(), dim=-1, keepdim=True)  # (M, 1)
    return indices, (values.float() - norm).exp_().clamp_(max=1.0)


@attrs.frozen
class TokenRecyclingOptions:
    """TokenRecycling's scalar parameters, checked (the one description of them)."""

    k: int = option(8, integer, 1, high=1024, help="candidates kept per token (K)")
    prune_unknown: bool = option(
        True, kind="bool", spec="prune", help="leave never-observed slots out of the tree"
    )


class TokenRecycling:
    """Token Recycling drafter (Luo et al., ACL 2025).

    Args:
        template: ``"2.2.2"`` (80 nodes, the published tree), ``"8"``, ``"16"``, ``"32"``
            (its first nodes in breadth-first order), or a list of index paths
            (e.g. ``[[0], [1], [0, 0]]``).
        k: K, candidates kept per token (the adjacency width).
        prune_unknown: leave out slots whose candidate was never observed (default);
            ``False`` reads them as token 0 like the published code.
        vocab_size: allocate the matrix now; otherwise it is allocated at the first
            observed step from the target logits' width.
        kernels: ``"auto"`` (the Triton kernels for logits on CUDA, PyTorch elsewhere),
            ``"triton"`` or ``"torch"``.

    Raises:
        ConfigError: ``k`` or ``kernels`` out of range, or an unknown template name.
        TreeStructureError: an invalid template path (named in the message).
        KernelUnavailableError: ``kernels="triton"`` where Triton cannot run.
    """

    needs_draft_model: ClassVar[bool] = False

    def __init__(
        self,
        template: TemplateSpec = "2.2.2",
        k: int = 8,
        *,
        prune_unknown: bool = True,
        vocab_size: int | None = None,
        kernels: str = "auto",
    ) -> None:
        self.options = TokenRecyclingOptions(k=k, prune_unknown=prune_unknown)
        self.k = k
        self.kernels = require_triton(kernels)
        self.template = resolve_template(template, k)
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
        """Forget every recycled candidate (the matrix becomes unknown everywhere)."""
        if self._adjacency is not None:
            self._adjacency.fill_(-1)

    # -- Drafter protocol -------------------------------------------------------------

    def begin(self, state: DecodeState) -> None:
        """Nothing to do: the matrix is inherited from earlier queries (hot start)."""

    def propose(self, state: DecodeState) -> DraftTree:
        """Expand the template from the last committed token."""
        adj = self._adjacency
        root = state.tokens[-1]
        if adj is None or root >= adj.shape[0]:
            return DraftTree.empty() if self.prune_unknown else self._zeros_tree()
        if backend_for("Token Recycling expansion", adj.device, self.kernels) == "triton":
            t = self.template
            rows = ops.expand_template(
                adj, root, t.parents, t.slots, t.level_starts, kernels="triton"
            ).cpu()  # (N + 1,) the tree's tokens to the host: a sync
        else:
            t = self.template
            rows = reference.expand_template(adj, root, t.parents, t.slots, t.level_starts)
        tokens = rows[1:]
        if not self.prune_unknown:  # not in the paper's wording: its zero init, read lazily
            return DraftTree.from_parents(tokens.clamp(min=0), self._full_parents, self._full_laws)
        known = tokens >= 0  # an unknown parent already made its children unknown
        if bool(known.all()):
            return DraftTree.from_parents(tokens, self._full_parents, self._full_laws)
        kept = known.nonzero().squeeze(1)  # (n,) still parent-before-child
        new_index = torch.cumsum(known, 0) - 1
        parents = self._full_parents[kept]
        parents = torch.where(parents >= 0, new_index[parents.clamp(min=0)], -1)
        return DraftTree.from_parents(tokens[kept], parents)

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
        device = logits.device
        if backend_for("Token Recycling update", device, self.kernels) == "triton":
            if adj.device != device:  # the matrix follows the logits (once)
                adj = self._adjacency = adj.to(device)
            top = row_topk(logits, k)[1]  # (N + 1, K) on the device, no sync
            rows = scored.to(device, non_blocking=True)
            ops.update_adjacency(adj[:, :k], rows, top, kernels="triton")
            return
        if adj.device.type != "cpu":
            adj = self._adjacency = adj.cpu()
        top = row_topk(logits, k)[1].to("cpu", torch.int32)  # (N + 1, K)
        reference.update_adjacency(adj[:, :k], scored, top)

    def reset_vocabulary(self, vocab_size: int) -> None:
        """Reallocate the matrix for a target with another vocabulary (forgets everything)."""
        self._allocate(vocab_size)

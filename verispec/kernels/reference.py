"""PyTorch twins of every Triton kernel: the CPU path and the oracle of the kernel tests.

Each function computes exactly what its kernel computes, with plain tensor ops,
in float64 where the inputs are float64. The verification twins use the same
fixed-point arithmetic as their kernels (:data:`FIXED_ONE`), so that kernel and
reference agree draw for draw, not merely up to rounding.

* :func:`tree_attention` — softmax attention of N tree queries over a prefix with
  an optional mask plus the tree with its ancestor mask (SpecInfer §4.2), GQA.
* :func:`greedy_verify` — per-row argmax and the longest path that agrees with it.
* :func:`rejection_verify` — recursive rejection sampling over one tree for the
  Deterministic, IID and WithoutReplacement laws (docs/exactness.rst).
* :func:`expand_template`, :func:`update_adjacency` — Token Recycling's
  breadth-first template expansion and top-k row update (Luo et al., ACL 2025): the
  one implementation of these rules, which the drafter calls on the PyTorch path.
* :func:`compact_kv` — gather accepted KV positions into place, every layer.

Tree structure is passed in CSR form by row (row 0 the root, row i + 1 node i):
``child_ptr`` (N + 2,) and ``child_idx`` (N,), see :func:`children_csr`. Packed
verdicts are int64 (N + 2,): ``[num_accepted, extra_token, path..., -1 ...]``.

Shape glossary: B batch, N tree nodes, V vocabulary, S prefix, H heads, D head dim,
K candidates per token.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from verispec.core.tree import follow_path

__all__ = [
    "DETERMINISTIC_CODE",
    "FIXED_ONE",
    "IID_CODE",
    "WITHOUT_REPLACEMENT_CODE",
    "children_csr",
    "compact_kv",
    "expand_template",
    "fixed_point",
    "greedy_verify",
    "rejection_verify",
    "tree_attention",
    "update_adjacency",
]

# -- tree attention ---------------------------------------------------------------------


def tree_attention(
    query: torch.Tensor,
    prefix_key: torch.Tensor,
    prefix_value: torch.Tensor,
    tree_key: torch.Tensor,
    tree_value: torch.Tensor,
    tree_mask: torch.Tensor,
    prefix_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Masked softmax attention of tree queries over prefix plus tree keys.

    Args:
        query: float, Shape: (B, H, N, D).
        prefix_key, prefix_value: Shape: (B, H_kv, S, D); H is a multiple of H_kv (GQA:
            query head h reads key/value head ``h // (H // H_kv)``).
        tree_key, tree_value: Shape: (B, H_kv, N, D), the tree nodes' own entries.
        tree_mask: bool, Shape: (B, N, N). ``tree_mask[b, i, j]``: query i sees tree key j.
        prefix_mask: bool, Shape: (B, N, S), or ``None`` (every query sees the prefix).
        scale: multiplies the scores; ``D ** -0.5`` by default.

    Returns:
        ``query``'s dtype, Shape: (B, H, N, D). Computed in float64 for float64 inputs,
        float32 otherwise. A query that sees no key gets zeros.
    """
    batch, heads, num_queries, head_dim = query.shape
    kv_heads = tree_key.shape[1]
    groups = heads // kv_heads
    compute = torch.float64 if query.dtype == torch.float64 else torch.float32
    scale = head_dim**-0.5 if scale is None else scale
    q = query.to(compute).reshape(batch, kv_heads, groups, num_queries, head_dim)
    k = torch.cat([prefix_key, tree_key], dim=2).to(compute)  # (B, H_kv, S + N, D)
    v = torch.cat([prefix_value, tree_value], dim=2).to(compute)
    tree_mask = tree_mask.expand(batch, -1, -1)
    if prefix_mask is None:
        prefix_mask = tree_mask.new_ones((batch, num_queries, prefix_key.shape[2]))
    prefix_mask = prefix_mask.expand(batch, -1, -1)
    visible = torch.cat([prefix_mask, tree_mask], dim=-1).bool()[:, None, None]  # (B,1,1,N,S+N)
    scores = torch.einsum("bkgnd,bksd->bkgns", q, k) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    probs = torch.where(visible.any(-1, keepdim=True), probs, 0.0)  # no key seen: zeros
    out = torch.einsum("bkgns,bksd->bkgnd", probs, v)
    return out.reshape(batch, heads, num_queries, head_dim).to(query.dtype)


# -- tree structure ---------------------------------------------------------------------


def children_csr(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Children by row in CSR form, siblings in stored (drawn) order.

    Args:
        parents: int64, Shape: (N,). ``-1`` for the root's children.

    Returns:
        ``child_ptr`` int64 (N + 2,) and ``child_idx`` int64 (N,): the children of row
        r are ``child_idx[child_ptr[r]:child_ptr[r + 1]]``.
    """
    n = parents.numel()
    rows = parents.long() + 1  # (N,)
    counts = torch.bincount(rows, minlength=n + 1)  # (N + 1,)
    child_ptr = torch.zeros(n + 2, dtype=torch.long, device=parents.device)
    child_ptr[1:] = torch.cumsum(counts, 0)
    child_idx = torch.sort(rows, stable=True).indices  # stable: siblings keep their order
    return child_ptr, child_idx


def _children(child_ptr: list[int], child_idx: list[int], row: int) -> list[int]:
    return child_idx[child_ptr[row] : child_ptr[row + 1]]


def _pack(accepted: list[int], extra: int, num_nodes: int, device: torch.device) -> torch.Tensor:
    packed = torch.full((num_nodes + 2,), -1, dtype=torch.long)
    packed[0] = len(accepted)
    packed[1] = extra
    if accepted:
        packed[2 : 2 + len(accepted)] = torch.tensor(accepted)
    return packed.to(device)


# -- greedy verification ----------------------------------------------------------------


def greedy_verify(
    target_logits: torch.Tensor,
    tokens: torch.Tensor,
    child_ptr: torch.Tensor,
    child_idx: torch.Tensor,
) -> torch.Tensor:
    """Follow the target's argmax down the tree (``verispec.verifiers.Greedy``'s rule).

    Args:
        target_logits: float, Shape: (N + 1, V). Ties go to the lowest token id.
        tokens: int64, Shape: (N,).
        child_ptr, child_idx: the tree in CSR form (:func:`children_csr`).

    Returns:
        int64, Shape: (N + 2,): ``[num_accepted, extra_token, path..., -1...]``. At each
        row the first child (in stored order) whose token is the argmax is accepted.
    """
    best = target_logits.argmax(-1).tolist()  # (N + 1,)
    toks, ptr, idx = tokens.tolist(), child_ptr.tolist(), child_idx.tolist()
    accepted, extra = follow_path(
        lambda row: _children(ptr, idx, row), toks, lambda row, depth: best[row]
    )
    return _pack(accepted, extra, len(toks), target_logits.device)


# -- recursive rejection verification ---------------------------------------------------

FIXED_ONE = 2.0**52
"""Probability 1 in the verification kernels' fixed point: weights are int64 multiples
of 2**-52. Sums of integers do not depend on the order of summation, so a parallel
kernel and this sequential reference agree bit for bit; every other step is one IEEE
float64 multiply, divide or compare, done the same way on both sides."""

DETERMINISTIC_CODE, IID_CODE, WITHOUT_REPLACEMENT_CODE = 1, 2, 3


def fixed_point(probs: torch.Tensor) -> torch.Tensor:
    """int64 weights ``floor(probs * 2**52)`` of non-negative ``probs`` (any float dtype)."""
    return (probs.to(torch.float64) * FIXED_ONE).to(torch.int64)


def _renormalised(weights: torch.Tensor, total: int) -> torch.Tensor:
    """``floor(weights * 2**52 / total)``: the weights rescaled to mass ~1; zeros if total 0."""
    if total <= 0:
        return torch.zeros_like(weights)
    return (weights.to(torch.float64) * (FIXED_ONE / float(total))).to(torch.int64)


def _sample(weights: torch.Tensor, total: int, uniform: float) -> int:
    """Inverse CDF: the first index whose cumulative weight exceeds ``floor(u * total)``."""
    threshold = min(int(uniform * float(total)), total - 1)
    return int((torch.cumsum(weights, 0) <= threshold).sum())


def rejection_verify(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_row: torch.Tensor,
    law_codes: torch.Tensor,
    tokens: torch.Tensor,
    child_ptr: torch.Tensor,
    child_idx: torch.Tensor,
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """Recursive rejection sampling over one draft tree, uniform draws given.

    At each row ``r`` on the walk the residual starts as ``q = target_probs[r]`` and the
    children ``c_1..c_k`` are tried in stored order; child ``c`` is accepted when
    ``u[c] * p_i(c) < r_i(c)`` (``p_i(c) = 1`` for Deterministic rows), else

    * Deterministic: ``r_{i+1} = r_i with c zeroed``;
    * IID(p): ``r_{i+1} = max(r_i - p, 0)``;
    * WithoutReplacement(p): ``r_{i+1} = max(r_i - p_i, 0)``, ``p_{i+1} = p_i with c zeroed``;

    all up to normalisation, in :data:`FIXED_ONE` fixed point. A residual left with no
    mass restarts from ``q`` (a zero-probability event that rounding can reach; the same
    rule as ``verispec.verifiers._rules``). An accepted child's row comes next; the extra
    token is sampled from the residual of the row where every child was rejected, or
    from the accepted leaf's ``q``, by inverse CDF with ``u[N]``.

    Args:
        target_probs: float, Shape: (N + 1, V). Processed target distribution per row.
        draft_probs: float, Shape: (M, V). Draft distributions of the stochastic rows.
        draft_row: int64, Shape: (N + 1,). Row of ``draft_probs`` for each tree row.
        law_codes: int64, Shape: (N + 1,). 0 leaf, 1 Deterministic, 2 IID, 3 WithoutReplacement.
        tokens: int64, Shape: (N,).
        child_ptr, child_idx: the tree in CSR form (:func:`children_csr`).
        uniforms: float64, Shape: (N + 1,). ``u[i]`` is node i's coin, ``u[N]`` the extra
            token's (the convention of ``verispec.verifiers.RecursiveRejection``).

    Returns:
        int64, Shape: (N + 2,): ``[num_accepted, extra_token, path..., -1...]``.
    """
    n = tokens.numel()
    toks, ptr, idx = tokens.tolist(), child_ptr.tolist(), child_idx.tolist()
    laws, drafts, coins = law_codes.tolist(), draft_row.tolist(), uniforms.tolist()
    accepted: list[int] = []
    row = 0
    while True:
        target = fixed_point(target_probs[row])  # (V,)
        residual, residual_mass = target.clone(), int(target.sum())
        kids = _children(ptr, idx, row)
        law = laws[row]
        if law in (IID_CODE, WITHOUT_REPLACEMENT_CODE):
            draft = fixed_point(draft_probs[drafts[row]])
            draft_mass = int(draft.sum())
        chosen = None
        for child in kids:
            x = toks[child]
            r_x = float(residual[x]) / float(residual_mass)
            if law == DETERMINISTIC_CODE:
                p_x = 1.0
            else:
                p_x = float(draft[x]) / float(draft_mass) if draft_mass > 0 else 0.0
            if coins[child] * p_x < r_x:
                chosen = child
                break
            if law == DETERMINISTIC_CODE:
                residual_mass -= int(residual[x])
                residual[x] = 0
            else:
                residual = torch.clamp(
                    _renormalised(residual, residual_mass) - _renormalised(draft, draft_mass),
                    min=0,
                )
                residual_mass = int(residual.sum())
                if law == WITHOUT_REPLACEMENT_CODE:
                    draft_mass -= int(draft[x])
                    draft[x] = 0
            if residual_mass <= 0:  # restart from q (see the docstring)
                residual, residual_mass = target.clone(), int(target.sum())
        if chosen is None:
            extra = _sample(residual, residual_mass, coins[n])
            return _pack(accepted, extra, n, target_probs.device)
        accepted.append(chosen)
        row = chosen + 1


# -- Token Recycling --------------------------------------------------------------------


def expand_template(
    adjacency: torch.Tensor,
    root: int,
    parents: torch.Tensor,
    slots: torch.Tensor,
    level_starts: Sequence[int],
) -> torch.Tensor:
    """Breadth-first expansion of a static template from ``root`` (one gather per level).

    The PyTorch path of ``verispec.drafters.TokenRecycling``'s proposal.

    Args:
        adjacency: int32 or int64, Shape: (V, K). ``-1`` marks an unknown candidate.
        root: the root token id.
        parents: int64, Shape: (N,). Template parent of each node, ``-1`` for the root's.
        slots: int64, Shape: (N,). Slot of each node in its parent's adjacency row.
        level_starts: first node of each depth, then N; nodes sorted by depth.

    Returns:
        int64, Shape: (N + 1,). Row 0 the root, row i + 1 node i's token; ``-1`` where
        the parent's token is unknown (``-1``) or the slot holds ``-1``.
    """
    n = parents.numel()
    vocab = adjacency.shape[0]
    rows = torch.empty(n + 1, dtype=torch.long, device=adjacency.device)
    rows[0] = root
    parent_rows = parents.to(adjacency.device) + 1
    slots = slots.to(adjacency.device)
    for lo, hi in itertools.pairwise(level_starts):
        parent_tok = rows[parent_rows[lo:hi]]
        cand = adjacency[parent_tok.clamp(0, vocab - 1), slots[lo:hi]].long()
        rows[lo + 1 : hi + 1] = torch.where(parent_tok >= 0, cand, -1)
    return rows


def last_occurrence_mask(tokens: torch.Tensor) -> torch.Tensor:
    """bool, Shape: (M,). True where ``tokens[i]`` does not occur again after position ``i``.

    Token Recycling's "last writer wins": a row update scatters only these positions.

    Args:
        tokens: int64, Shape: (M,).
    """
    same = tokens[:, None] == tokens[None, :]  # (M, M)
    return ~torch.triu(same, diagonal=1).any(dim=1)


def update_adjacency(
    adjacency: torch.Tensor, row_tokens: torch.Tensor, topk_ids: torch.Tensor
) -> None:
    """Overwrite ``adjacency[row_tokens[i]]`` with ``topk_ids[i]``, in place.

    A token that appears at several rows keeps the top-k of its *last* row (last
    writer wins in row order, :func:`last_occurrence_mask`). The PyTorch path of
    ``verispec.drafters.TokenRecycling``'s update.

    Args:
        adjacency: int32 or int64, Shape: (V, K).
        row_tokens: int64, Shape: (M,). Token scored at each row (root first, then nodes).
        topk_ids: integer, Shape: (M, K). The target's top-K ids at each row.
    """
    last = last_occurrence_mask(row_tokens)  # (M,)
    adjacency[row_tokens[last]] = topk_ids[last].to(adjacency.dtype)


# -- KV compaction ----------------------------------------------------------------------


def compact_kv(caches: Sequence[torch.Tensor], start: int, source: torch.Tensor) -> None:
    """Make entries ``start + j`` copies of entries ``source[j]`` in every cache, in place.

    Args:
        caches: float tensors, each Shape: (..., L, D) (e.g. (B, H_kv, L, D) per layer,
            keys and values alike, or one stacked tensor).
        start: first destination position.
        source: int64, Shape: (n,). Source positions, on the caches' device.
    """
    end = start + source.numel()
    for cache in caches:
        cache[..., start:end, :] = cache.index_select(-2, source)  # copy first: overlap-safe

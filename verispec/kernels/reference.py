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
import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from verispec.core.sampling import argmax_one
from verispec.core.tree import IID, Deterministic, DraftTree, WithoutReplacement, follow_path
from verispec.errors import NonFiniteLogitsError, TreeStructureError

__all__ = [
    "DETERMINISTIC_CODE",
    "FIXED_ONE",
    "IID_CODE",
    "WITHOUT_REPLACEMENT_CODE",
    "RejectionRow",
    "children_csr",
    "compact_kv",
    "expand_template",
    "fixed_point",
    "greedy_verify",
    "last_occurrence_mask",
    "last_rows",
    "law_code",
    "rejection_verify",
    "rejection_walk",
    "tree_attention",
    "tree_greedy_walk",
    "tree_rejection_walk",
    "update_adjacency",
]

# -- tree attention ---------------------------------------------------------------------


def tree_attention(
    query: Tensor, prefix_key: Tensor, prefix_value: Tensor, tree_key: Tensor,
    tree_value: Tensor, tree_mask: Tensor, prefix_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:  # fmt: skip
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


def _row_argmax(target_logits: torch.Tensor) -> Callable[[int], int]:
    """``best(row)``: the argmax of a row of ``target_logits``, the lowest id among ties.

    On the CPU a host read is free, so only the rows the walk visits are scanned (about
    MAT rows instead of N + 1 full-vocabulary scans); on another device every row's
    argmax comes to the host in one sync.
    """
    if target_logits.device.type == "cpu":
        return lambda row: argmax_one(target_logits[row])
    best = target_logits.argmax(-1).tolist()  # (N + 1,)
    return best.__getitem__


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
    best = _row_argmax(target_logits)
    toks, ptr, idx = tokens.tolist(), child_ptr.tolist(), child_idx.tolist()
    accepted, extra = follow_path(
        lambda row: _children(ptr, idx, row), toks, lambda row, depth: best(row)
    )
    return _pack(accepted, extra, len(toks), target_logits.device)


def tree_greedy_walk(tree: DraftTree, target_logits: torch.Tensor) -> tuple[list[int], int]:
    """:func:`greedy_verify` over a :class:`DraftTree`: ``(accepted nodes, extra token)``.

    What ``verispec.kernels.ops.greedy_verify`` runs on the PyTorch path (no CSR tensors).
    """
    best = _row_argmax(target_logits)
    return follow_path(
        tree.children.__getitem__, tree.tokens.tolist(), lambda row, depth: best(row)
    )


# -- recursive rejection verification ---------------------------------------------------

FIXED_ONE = 2.0**52
"""Probability 1 in the verification kernels' fixed point: weights are integer multiples
of 2**-52. Sums of integers do not depend on the order of summation, so a parallel
kernel and this sequential reference agree bit for bit; every other step is one IEEE
float64 multiply, divide or compare, done the same way on both sides."""

DETERMINISTIC_CODE, IID_CODE, WITHOUT_REPLACEMENT_CODE = 1, 2, 3


def fixed_point(probs: torch.Tensor) -> torch.Tensor:
    """The weights ``floor(probs * 2**52)`` of non-negative ``probs`` (the kernel's int64).

    Held as integer-valued floats: float32 for 16- and 32-bit ``probs`` (multiplying by
    a power of two and flooring are exact there), float64 for float64 ``probs``. Every
    weight is below 2**53 (``probs`` are probabilities), so the float64 sums and
    differences this module takes of them are exact, as the kernel's int64 ones are.
    """
    if probs.dtype != torch.float64:
        probs = probs.to(torch.float32)
    return torch.mul(probs, FIXED_ONE).floor_()


def _renormalised(weights: torch.Tensor, total: float) -> torch.Tensor:
    """float64 ``floor(weights * (2**52 / total))``: rescaled to mass ~1; zeros if total 0."""
    if total <= 0:
        return torch.zeros_like(weights, dtype=torch.float64)
    return torch.mul(weights.to(torch.float64), FIXED_ONE / total).floor_()


def _thresholds(uniforms: Sequence[float], total: float) -> list[float]:
    """``min(floor(u * total), total - 1)`` of each coin: the inverse CDF's thresholds."""
    return [float(min(int(u * total), total - 1)) for u in uniforms]


def law_code(law: object) -> int:
    """The kernels' code of a proposal law: 0 none (a leaf), 1 Deterministic, 2 IID,
    3 WithoutReplacement."""
    if isinstance(law, Deterministic):
        return DETERMINISTIC_CODE
    if isinstance(law, IID):
        return IID_CODE
    if isinstance(law, WithoutReplacement):
        return WITHOUT_REPLACEMENT_CODE
    return 0


class RejectionRow:
    """Recursive rejection over the children of one row, in the kernel's fixed point.

    The one implementation of the rule in PyTorch: :func:`rejection_verify` (the
    kernel's twin, hence ``RecursiveRejection`` on the PyTorch path) walks with it, and
    ``verispec.verifiers.RowRejection`` (the exact laws the audits sum) is it. Use:
    while children remain, compare the current child's coin with :meth:`accepts` (or
    read :meth:`acceptance_probability`) and either stop or call :meth:`reject`; after
    the last rejection draw the extra token with :meth:`sample`. A row without
    children samples its target.

    Arithmetic (what ``rejection_verify.py`` does): the target row ``q`` and the draft
    ``p`` are int64 weights ``floor(x * 2**52)`` (:func:`fixed_point`); child ``c`` with
    residual weight ``R[c]`` of mass ``Z`` and draft weight ``P[c]`` of mass ``W`` is
    accepted when ``u * (P[c] / W) < R[c] / Z`` (``P[c] / W`` is 1 for Deterministic
    rows), each ratio one float64 division. A rejection sets

    * Deterministic: ``R[c] = 0``, ``Z -= R[c]``;
    * IID: ``R = max(floor(R * 2**52 / Z) - floor(P * 2**52 / W), 0)``;
    * WithoutReplacement: as IID, then ``P[c] = 0``, ``W -= P[c]``;

    and a residual left without mass restarts from ``q`` (``verispec.verifiers._rules``,
    "A residual with no mass"). Deterministic rows keep ``R`` as ``q`` with a set of
    zeroed tokens, so they touch the vocabulary only to quantise ``q`` and, at the
    end, to sample.

    Args:
        target_probs: float, Shape: (V,). The row's processed target distribution.
        code: the row's law, :func:`law_code` (0 for a row without children).
        draft_probs: float, Shape: (V,), for IID and WithoutReplacement rows, else ``None``.
        child_tokens: the children's tokens in drawn order, Shape: (K,).

    Raises:
        TreeStructureError: a child the draft could not have drawn (draft probability
            0, or a repeated token without replacement), a draft with a negative entry
            or no mass. The kernel checks none of this (its inputs come from a tree
            that passed these checks on the host, or not at all).
        NonFiniteLogitsError: the draft distribution is not finite.
    """

    __slots__ = (
        "_draft",
        "_draft_at_child",
        "_draft_mass",
        "_draft_step",
        "_index",
        "_mass",
        "_residual",
        "_residual_at_current",
        "_target",
        "_target_at_child",
        "_target_mass",
        "_tokens",
        "_zeroed",
        "code",
        "restarts",
    )

    def __init__(
        self,
        target_probs: torch.Tensor,
        code: int,
        draft_probs: torch.Tensor | None,
        child_tokens: Sequence[int],
    ) -> None:
        self.code = code
        self._tokens = [int(t) for t in child_tokens]
        self._index = 0
        self.restarts = 0  # times the residual ran out of mass
        self._target = fixed_point(target_probs)  # (V,)
        index = torch.tensor(self._tokens, dtype=torch.long, device=self._target.device)
        stochastic = code in (IID_CODE, WITHOUT_REPLACEMENT_CODE) and bool(self._tokens)
        mass = self._target.sum(dtype=torch.float64).reshape(1)  # exact: integers < 2**53
        if not stochastic:
            values = torch.cat([mass, self._target[index].to(torch.float64)]).tolist()
            self._target_mass = values[0]
            self._target_at_child = values[1:]  # Deterministic: R[c] is q[c] or 0 (zeroed)
            self._zeroed: set[int] = set()
            self._mass = self._target_mass
            self._residual = self._target
            self._draft = self._target  # unused
            self._draft_mass = 0.0
            self._draft_at_child: list[float] = []
            self._draft_step: torch.Tensor | None = None
            self._residual_at_current = self._target_at_child[0] if self._tokens else 0
            return
        assert draft_probs is not None, "IID and WithoutReplacement rows need a draft"
        self._draft = fixed_point(draft_probs)  # (V,), written in place without replacement
        self._draft_step = None  # IID: the draft's renormalised weights, the same every step
        k = len(self._tokens)
        raw = draft_probs.to(device=self._target.device, dtype=torch.float64)
        values = torch.cat(
            [
                mass,
                self._draft.sum(dtype=torch.float64).reshape(1),
                torch.stack([raw.sum(), raw.amin()]),
                self._target[index].to(torch.float64),
                self._draft[index].to(torch.float64),
                raw[index],
            ]
        ).tolist()  # the row's one sync before the first coin
        self._target_mass, self._draft_mass = values[0], values[1]
        self._target_at_child = values[4 : 4 + k]
        self._draft_at_child = values[4 + k : 4 + 2 * k]
        self._check_draft(values[2], values[3], values[4 + 2 * k :])
        self._zeroed = set()
        self._mass = self._target_mass
        self._residual = self._target
        self._residual_at_current = self._target_at_child[0]

    def _check_draft(self, mass: float, minimum: float, at_children: list[float]) -> None:
        if not (math.isfinite(mass) and math.isfinite(minimum)):
            raise NonFiniteLogitsError("`draft_probs` contain NaN or infinity.")
        if minimum < 0 or mass <= 0:
            raise TreeStructureError(
                f"`draft_probs` must be non-negative with positive mass; got minimum "
                f"{minimum} and mass {mass}."
            )
        without = self.code == WITHOUT_REPLACEMENT_CODE
        seen: set[int] = set()
        for i, token in enumerate(self._tokens):
            repeated = without and token in seen
            seen.add(token)
            if repeated or not at_children[i] > 0:
                law = "WithoutReplacement" if without else "IID"
                why = "it repeats an earlier sibling" if repeated else "it has draft probability 0"
                raise TreeStructureError(
                    f"child {i} (token {token}) cannot have been drawn from this {law} "
                    f"draft distribution: {why}. The drafter's `draft_probs` must be the "
                    "distribution its children were drawn from."
                )

    @property
    def index(self) -> int:
        """Position (in drawn order) of the child being tried."""
        return self._index

    @property
    def num_children(self) -> int:
        return len(self._tokens)

    def ratios(self) -> tuple[float, float]:
        """``(p, r)`` of the current child: draft ``P[c] / W`` (1 for Deterministic rows)
        and residual ``R[c] / Z``; the coin ``u`` accepts it when ``u * p < r``."""
        r = float(self._residual_at_current) / float(self._mass)
        if self.code == DETERMINISTIC_CODE:
            return 1.0, r
        w = self._draft_mass
        p = float(self._draft_at_child[self._index]) / float(w) if w > 0 else 0.0
        return p, r

    def accepts(self, uniform: float) -> bool:
        """Whether coin ``uniform`` accepts the current child (the kernel's comparison)."""
        p, r = self.ratios()
        return uniform * p < r

    def acceptance_probability(self) -> float:
        """``a_i = P(u * p < r) = min(1, r / p)`` for ``u ~ U(0, 1)``, given every earlier
        child was rejected."""
        p, r = self.ratios()
        if p <= 0:
            return 1.0 if r > 0 else 0.0
        return min(1.0, r / p)

    def reject(self) -> None:
        """Move past the current child: update the residual (and the draft, without
        replacement)."""
        i = self._index
        token = self._tokens[i]
        self._index += 1
        more = self._index < len(self._tokens)
        if self.code == DETERMINISTIC_CODE:
            if token not in self._zeroed:
                self._zeroed.add(token)
                self._mass -= self._target_at_child[i]
            if self._mass <= 0:  # every bit of target mass was on rejected children
                self.restarts += 1
                self._zeroed = set()
                self._mass = self._target_mass
            if more:
                nxt = self._tokens[self._index]
                self._residual_at_current = (
                    0 if nxt in self._zeroed else self._target_at_child[self._index]
                )
            return
        draft_step = self._draft_step
        if draft_step is None:
            draft_step = _renormalised(self._draft, self._draft_mass)
            if self.code == IID_CODE:
                self._draft_step = draft_step
        residual = _renormalised(self._residual, self._mass).sub_(draft_step).clamp_(min=0)
        if self.code == WITHOUT_REPLACEMENT_CODE:
            self._draft_mass -= self._draft_at_child[i]
            self._draft[token] = 0
            # a later sibling repeats no token (checked), so its draft weight is unchanged
        stats = [residual.sum()]  # exact: integers < 2**53
        if more:
            stats.append(residual[self._tokens[self._index]])
        values = torch.stack(stats).tolist()  # one sync per rejection
        self._residual, self._mass = residual, values[0]
        if self._mass <= 0:  # restart from q
            self.restarts += 1
            self._residual, self._mass = self._target, self._target_mass
            if more:
                self._residual_at_current = self._target_at_child[self._index]
        elif more:
            self._residual_at_current = values[1]

    @property
    def residual_mass(self) -> float:
        """The residual's mass ``Z`` (> 0: a residual without mass restarts from ``q``)."""
        return self._mass

    def residual_weights(self) -> torch.Tensor:
        """The residual after the rejections so far: integer-valued float weights,
        Shape: (V,), of mass :attr:`residual_mass`."""
        if self.code == DETERMINISTIC_CODE and self._zeroed:
            zeroed = torch.tensor(sorted(self._zeroed), dtype=torch.long)
            return self._target.index_fill(0, zeroed.to(self._target.device), 0)
        return self._residual

    def residual(self) -> torch.Tensor:
        """The normalised residual, float64, Shape: (V,)."""
        return self.residual_weights().to(torch.float64) / float(self._mass)

    def sample(self, uniforms: Sequence[float]) -> list[int]:
        """Inverse-CDF draws from the residual, one per coin: the first index whose
        cumulative weight exceeds ``min(floor(u * Z), Z - 1)`` (the kernel's ``_sample``)."""
        cdf = torch.cumsum(self.residual_weights(), 0, dtype=torch.float64)  # (V,) exact
        thresholds = torch.tensor(_thresholds(uniforms, self._mass), dtype=torch.float64)
        return torch.searchsorted(cdf, thresholds.to(cdf.device), right=True).tolist()


def rejection_walk(
    children: Sequence[Sequence[int]],
    row_rule: Callable[[int], RejectionRow],
    uniforms: torch.Tensor,
) -> list[tuple[list[int], int]]:
    """``(accepted nodes, extra token)`` for each row of coins, the rows shared.

    Args:
        children: child nodes of each row (row 0 the root, row i + 1 node i), in drawn
            order.
        row_rule: builds the :class:`RejectionRow` of a row; asked once per row that
            some coin set visits, when the first one does.
        uniforms: float64, Shape: (S, N + 1). ``uniforms[s, i]`` is node i's coin in
            set s, ``uniforms[s, N]`` its extra token's.

    Each coin set's verdict is :func:`rejection_verify`'s with those coins; a row's
    residuals are computed once, as far as some coin set needs them.
    """
    coin_sets = uniforms.tolist()
    n = uniforms.shape[1] - 1
    rules: dict[int, RejectionRow] = {}
    tried: dict[int, list[tuple[float, float]]] = {}  # row -> (p, r) of each child tried
    ends: dict[int, list[int]] = {}  # row -> coin sets whose extra token is drawn there
    paths: list[list[int]] = []
    for s, coins in enumerate(coin_sets):
        accepted: list[int] = []
        row = 0
        while True:
            rule = rules.get(row)
            if rule is None:
                rule = rules[row] = row_rule(row)
                tried[row] = []
            ratios = tried[row]
            chosen = None
            for j, node in enumerate(children[row]):
                if len(ratios) <= j:  # the first coin set to reach child j
                    if j:
                        rule.reject()
                    ratios.append(rule.ratios())
                p, r = ratios[j]
                if coins[node] * p < r:
                    chosen = node
                    break
            if chosen is None:
                ends.setdefault(row, []).append(s)
                break
            accepted.append(chosen)
            row = chosen + 1
        paths.append(accepted)
    extra = [0] * len(coin_sets)
    for row, sets in ends.items():
        rule = rules[row]
        if rule.index < rule.num_children:  # every child rejected: the last rejection
            rule.reject()
        drawn = rule.sample([coin_sets[s][n] for s in sets])
        for s, token in zip(sets, drawn, strict=True):
            extra[s] = token
    return list(zip(paths, extra, strict=True))


def rejection_verify(
    target_probs: Tensor, draft_probs: Tensor, draft_row: Tensor, law_codes: Tensor,
    tokens: Tensor, child_ptr: Tensor, child_idx: Tensor, uniforms: Tensor,
) -> Tensor:  # fmt: skip
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
    toks, ptr, idx = tokens.tolist(), child_ptr.tolist(), child_idx.tolist()
    laws, drafts = law_codes.tolist(), draft_row.tolist()
    children = [_children(ptr, idx, row) for row in range(len(toks) + 1)]

    def row_rule(row: int) -> RejectionRow:
        code = laws[row]
        draft = draft_probs[drafts[row]] if code in (IID_CODE, WITHOUT_REPLACEMENT_CODE) else None
        return RejectionRow(target_probs[row], code, draft, [toks[c] for c in children[row]])

    ((accepted, extra),) = rejection_walk(children, row_rule, uniforms.reshape(1, -1))
    return _pack(accepted, extra, len(toks), target_probs.device)


def tree_rejection_walk(
    tree: DraftTree,
    target_row: Callable[[int], torch.Tensor],
    uniforms: torch.Tensor,
) -> list[tuple[list[int], int]]:
    """:func:`rejection_walk` over a :class:`DraftTree`, asking ``target_row(row)`` for
    the processed target distribution (Shape: (V,)) of the rows some coin set visits.

    What ``verispec.kernels.ops.rejection_verdicts`` runs on the PyTorch path: no CSR
    or law tensors, and only the visited rows' distributions are computed.

    Raises:
        TreeStructureError: a row with children has no proposal law.
    """
    children = tree.children
    tokens = tree.tokens.tolist()
    laws = tree.laws

    def row_rule(row: int) -> RejectionRow:
        kids = children[row]
        law = laws[row] if kids else None
        code = law_code(law)
        if kids and code == 0:
            raise TreeStructureError(
                f"row {row} has children but no proposal law; build the tree with "
                "DraftTree.from_parents(..., laws=...) or give `laws[row]`."
            )
        draft = law.draft_probs if isinstance(law, IID | WithoutReplacement) else None
        return RejectionRow(target_row(row), code, draft, [tokens[c] for c in kids])

    return rejection_walk(children, row_rule, uniforms)


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
    if adjacency.device.type == "cpu" and row_tokens.device.type == "cpu":
        # a drafter's few rows on the host: NumPy views, no tensor operator
        tokens = row_tokens.tolist()
        keep = last_rows(tokens)
        adjacency.numpy()[[tokens[i] for i in keep]] = topk_ids.cpu().numpy()[keep]
        return
    last = last_occurrence_mask(row_tokens)  # (M,)
    adjacency[row_tokens[last]] = topk_ids[last].to(adjacency.dtype)


def last_rows(tokens: Sequence[int]) -> list[int]:
    """The rows of :func:`last_occurrence_mask`, increasing: for each distinct token, the
    last position it occurs at (on the host, for a drafter's few rows)."""
    return sorted({token: row for row, token in enumerate(tokens)}.values())


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

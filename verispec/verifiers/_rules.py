"""The three acceptance rules of recursive rejection sampling, one tree row at a time.

At a row with target distribution ``q`` and children ``c_1 .. c_k`` (in drawn
order), the rule tries the children one after another. Before child ``i`` it holds
a *residual* ``r_i`` (``r_1 = q``); child ``i`` is accepted with probability
``a_i``; if every child is rejected, the extra token is drawn from ``r_{k+1}``.

* ``Deterministic`` (point-mass candidates: Token Recycling, prompt lookup):
  ``a_i = r_i(c_i)``, ``r_{i+1} = norm(r_i with c_i zeroed)``. This is the rule
  below with ``p_i`` the point mass at ``c_i``.
* ``IID(p)`` (SpecInfer, Miao et al. 2024, multi-round speculative sampling; a
  one-child chain is Leviathan et al. 2023 / Chen et al. 2023):
  ``p_i = p``, ``a_i = min(1, r_i(c_i) / p_i(c_i))``,
  ``r_{i+1} = norm(max(r_i - p_i, 0))``.
* ``WithoutReplacement(p)`` (recursive rejection sampling, RSD, Jeon et al. 2024,
  Algorithm 4; DySpec Algorithm 3 with its coin drawn from U(0, 1)):
  ``p_i = norm(p with c_1 .. c_{i-1} zeroed)``, then ``a_i`` and ``r_{i+1}`` as for IID.

Here ``q``, ``r`` are target-side and ``p`` draft-side (RSD writes ``q`` for the
target too; gpt-fast swaps the letters). docs/exactness.rst proves each rule exact.

*A residual with no mass* (not in the papers). ``max(r_i - p_i, 0) = 0`` forces
``r_i = p_i`` (both sum to 1), and then ``a_i = 1`` for every token ``p_i`` can
draw, so in exact arithmetic the rejection that would lead there has probability
zero. Rounding can still get there (with probability of order machine epsilon).
Then the rule *restarts* from ``q`` with the children that remain: conditioned on
the past, those are a valid proposal of the same law, so the restarted rule is
exact too and the output stays distributed as ``q``. With no child left, the
extra token is drawn from ``q`` itself.

Two helpers shared by every verifier sit here too: :func:`check_target_logits`
(the shape and vocabulary checks) and :func:`follow_target`, the walk of the rules
that compare candidates with one target token per row (``Greedy``'s argmax, the
coupled rule's seeded draw).

Shape glossary (docs/glossary): N tree nodes, V vocabulary, K children of a row.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from verispec.core.tree import (
    IID,
    Deterministic,
    DraftTree,
    ProposalLaw,
    WithoutReplacement,
    follow_path,
)
from verispec.core.types import Verdict
from verispec.errors import NonFiniteLogitsError, TreeStructureError

__all__ = [
    "RowRejection",
    "check_draft_shape",
    "check_target_logits",
    "follow_target",
    "row_acceptance",
    "row_output_law",
    "sample_index",
    "sample_indices",
    "verdict_distribution",
]


def check_draft_shape(law: ProposalLaw | None, vocab_size: int, row: int) -> None:
    """Raise :class:`TreeStructureError` unless the law's draft distribution has shape (V,)."""
    if isinstance(law, IID | WithoutReplacement) and law.draft_probs.shape != (vocab_size,):
        raise TreeStructureError(
            f"`draft_probs` of row {row} must have shape (V,) = ({vocab_size},) to match "
            f"the target logits; got {tuple(law.draft_probs.shape)}."
        )


def check_target_logits(tree: DraftTree, target_logits: torch.Tensor) -> None:
    """Raise :class:`TreeStructureError` unless the logits fit the tree.

    ``target_logits`` must be a float tensor of Shape: (N + 1, V), every tree token
    below V, and every row's draft distribution of Shape: (V,).
    """
    n = tree.num_nodes
    if (
        not isinstance(target_logits, torch.Tensor)
        or target_logits.dim() != 2
        or target_logits.shape[0] != n + 1
        or not target_logits.is_floating_point()
    ):
        raise TreeStructureError(
            f"`target_logits` must be a float tensor of shape (N + 1, V) = ({n + 1}, V); "
            f"got {getattr(target_logits, 'dtype', type(target_logits).__name__)} "
            f"{tuple(getattr(target_logits, 'shape', ()))}."
        )
    vocab_size = target_logits.shape[1]
    if n and int(tree.tokens.max()) >= vocab_size:
        raise TreeStructureError(
            f"tree tokens must be < V = {vocab_size}; got {int(tree.tokens.max())}."
        )
    for row, law in enumerate(tree.laws):
        check_draft_shape(law, vocab_size, row)


def follow_target(tree: DraftTree, target_token: Callable[[int, int], int]) -> Verdict:
    """Walk down ``tree`` following one target token per row (:func:`follow_path`).

    ``target_token(row, depth)`` is the target's token at the row (``depth`` 0 for the
    root, so the row's token sits ``depth`` positions after the root's next token).
    """
    children = tree.children
    accepted, extra = follow_path(children.__getitem__, tree.tokens.tolist(), target_token)
    return Verdict(tuple(accepted), extra)


class RowRejection:
    """The rejection walk over the children of one row.

    Use: while children remain, read :meth:`acceptance_probability` of the current
    child and either stop (accepted) or call :meth:`reject`; after the last
    rejection draw the extra token from :meth:`residual_weights`. All arithmetic
    runs in ``target_probs``' dtype (float32 or float64).

    Cost: Deterministic rows keep the residual as the target with a set of zeroed
    tokens and its mass as a host scalar, so no full-vocabulary work happens until
    the final residual. IID and WithoutReplacement rows do one fused
    subtract-and-clamp and two sums over V per rejection, with one host sync each.

    Args:
        target_probs: float, Shape: (V,). The row's processed target distribution ``q``.
        law: the proposal law of the row's children.
        child_tokens: the children's tokens in drawn order, Shape: (K,).

    Raises:
        TreeStructureError: draft shape mismatch, negative draft mass, or a child the
            draft distribution could not have drawn (probability zero, or a repeated
            token under ``WithoutReplacement``).
        NonFiniteLogitsError: the draft distribution is not finite.
    """

    def __init__(
        self, target_probs: torch.Tensor, law: ProposalLaw, child_tokens: Sequence[int]
    ) -> None:
        self._target = target_probs
        self._tokens = [int(t) for t in child_tokens]
        self._index = 0
        self.restarts = 0  # times the residual ran out of mass (see the module docstring)
        vocab_size = target_probs.shape[-1]
        if isinstance(law, Deterministic):
            self._deterministic = True
            index = torch.tensor(self._tokens, dtype=torch.long, device=target_probs.device)
            gathered = target_probs[index]  # (K,)
            values = torch.cat([target_probs.sum().reshape(1), gathered]).tolist()  # sync
            self._total = values[0]
            self._target_at_child = values[1:]
            self._mass = self._total
            self._zeroed: set[int] = set()
            return
        if not isinstance(law, IID | WithoutReplacement):
            raise TreeStructureError(
                "a row with children needs a proposal law (Deterministic, IID or "
                f"WithoutReplacement); got {type(law).__name__}."
            )
        check_draft_shape(law, vocab_size, -1)
        self._deterministic = False
        self._without_replacement = isinstance(law, WithoutReplacement)
        draft = law.draft_probs.to(device=target_probs.device, dtype=target_probs.dtype)
        index = torch.tensor(self._tokens, dtype=torch.long, device=target_probs.device)
        values = torch.cat(
            [
                torch.stack([draft.sum(), draft.amin(), target_probs.sum()]),
                draft[index],
                target_probs[index],
            ]
        ).tolist()  # the row's one sync before the first coin
        draft_mass, draft_min, target_mass = values[:3]
        k = len(self._tokens)
        self._draft_at_child = values[3 : 3 + k]
        self._residual_at_current = values[3 + k] if k else 0.0
        if not (math.isfinite(draft_mass) and math.isfinite(draft_min)):
            raise NonFiniteLogitsError("`draft_probs` contain NaN or infinity.")
        if draft_min < 0 or draft_mass <= 0:
            raise TreeStructureError(
                f"`draft_probs` must be non-negative with positive mass; got minimum "
                f"{draft_min} and mass {draft_mass}."
            )
        self._check_draws()
        self._draft = draft  # copied before the first exclusion (WoR), never written before
        self._draft_is_copy = False
        self._draft_mass = draft_mass
        self._residual = target_probs
        self._residual_mass = target_mass
        self._target_mass = target_mass

    def _check_draws(self) -> None:
        seen: set[int] = set()
        for i, (token, prob) in enumerate(zip(self._tokens, self._draft_at_child, strict=True)):
            repeated = self._without_replacement and token in seen
            if prob <= 0 or repeated:
                law = "WithoutReplacement" if self._without_replacement else "IID"
                why = "it repeats an earlier sibling" if repeated else "it has draft probability 0"
                raise TreeStructureError(
                    f"child {i} (token {token}) cannot have been drawn from this {law} "
                    f"draft distribution: {why}. The drafter's `draft_probs` must be the "
                    "distribution its children were drawn from."
                )
            seen.add(token)

    @property
    def index(self) -> int:
        """Position (in drawn order) of the child being tried."""
        return self._index

    @property
    def num_children(self) -> int:
        return len(self._tokens)

    def acceptance_probability(self) -> float:
        """``a_i`` of the current child, given every earlier child was rejected."""
        i = self._index
        if self._deterministic:
            if self._tokens[i] in self._zeroed:
                return 0.0
            return min(1.0, self._target_at_child[i] / self._mass)
        # min(1, r_i(c_i) / p_i(c_i)) with r_i = residual / mass, p_i = draft / draft mass
        ratio = (self._residual_at_current * self._draft_mass) / (
            self._residual_mass * self._draft_at_child[i]
        )
        return min(1.0, ratio)

    def reject(self) -> None:
        """Move past the current child: update the residual (and the draft, for WoR)."""
        i = self._index
        token = self._tokens[i]
        self._index += 1
        if self._deterministic:
            if token not in self._zeroed:
                self._zeroed.add(token)
                self._mass -= self._target_at_child[i]
            if self._mass <= 0:  # every bit of target mass was on rejected children
                self._restart()
            return
        # r_{i+1} ∝ max(r_i - p_i, 0) = max(R - (Z / W) P, 0) / Z, with R, P unnormalised
        residual = self._residual.sub(self._draft, alpha=self._residual_mass / self._draft_mass)
        residual.clamp_(min=0.0)
        if self._without_replacement:
            if not self._draft_is_copy:
                self._draft = self._draft.clone()
                self._draft_is_copy = True
            self._draft[token] = 0.0  # p_{i+1}: c_i can no longer be drawn
        stats = [residual.sum()]
        if self._without_replacement:
            stats.append(self._draft.sum())
        if self._index < len(self._tokens):
            stats.append(residual[self._tokens[self._index]])
        values = torch.stack(stats).tolist()  # one sync per rejection
        self._residual = residual
        self._residual_mass = values[0]
        if self._without_replacement:
            self._draft_mass = values[1]
        if self._index < len(self._tokens):
            self._residual_at_current = values[-1]
        if self._residual_mass <= 0:
            self._restart()

    def _restart(self) -> None:
        """The residual has no mass left: start again from the target (module docstring)."""
        self.restarts += 1
        if self._deterministic:
            self._zeroed = set()
            self._mass = self._total
            return
        self._residual = self._target
        self._residual_mass = self._target_mass
        if self._index < len(self._tokens):
            self._residual_at_current = float(self._target[self._tokens[self._index]])

    def residual_weights(self) -> torch.Tensor:
        """Unnormalised weights of the residual after the rejections so far, Shape: (V,).

        Always has positive mass (a residual without mass restarts from the target).
        """
        if not self._deterministic:
            return self._residual
        if not self._zeroed:
            return self._target
        zeroed = torch.tensor(sorted(self._zeroed), dtype=torch.long, device=self._target.device)
        weights = self._target.index_fill(0, zeroed, 0.0)
        if not bool(weights.sum() > 0):  # tokens' rounding left mass, but the rest is 0
            self.restarts += 1
            return self._target
        return weights

    def residual(self) -> torch.Tensor:
        """The normalised residual, Shape: (V,)."""
        weights = self.residual_weights()
        return weights / weights.sum()


def row_acceptance(
    target_probs: torch.Tensor, law: ProposalLaw, child_tokens: Sequence[int]
) -> tuple[list[float], torch.Tensor]:
    """Every child's acceptance probability (given the earlier ones were rejected).

    Returns:
        ``[a_1, .., a_K]`` and the normalised residual after all K rejections,
        Shape: (V,), in ``target_probs``' dtype.
    """
    walk = RowRejection(target_probs, law, child_tokens)
    accept = []
    for _ in range(walk.num_children):
        accept.append(walk.acceptance_probability())
        walk.reject()
    return accept, walk.residual()


def row_output_law(
    target_probs: torch.Tensor, law: ProposalLaw, child_tokens: Sequence[int]
) -> torch.Tensor:
    """The exact law of the token a row emits, given its children's tokens.

    The token is the accepted child's, or the residual sample if all are
    rejected. Averaged over the law of the children's draws this must equal
    ``target_probs``: that is what the audits check. Shape: (V,).
    """
    accept, residual = row_acceptance(target_probs, law, child_tokens)
    out = torch.zeros_like(target_probs)
    reach = 1.0
    for token, a in zip(child_tokens, accept, strict=True):
        out[int(token)] += reach * a
        reach *= 1.0 - a
    return out + reach * residual


def verdict_distribution(
    tree: DraftTree, target_probs: torch.Tensor
) -> dict[tuple[tuple[int, ...], int], float]:
    """The exact law of the verdict ``(accepted nodes, extra token)`` for a fixed tree.

    Args:
        tree: the draft tree (its children fixed; the law of their draws is not used
            here beyond the acceptance rule).
        target_probs: float, Shape: (N + 1, V). Processed target distribution of
            every row (row 0 the root, row i + 1 node i).

    Returns:
        Probability of each outcome with positive probability.
    """
    tokens = tree.tokens.tolist()
    out: dict[tuple[tuple[int, ...], int], float] = {}

    def emit(path: tuple[int, ...], weights: torch.Tensor, mass: float) -> None:
        for token, prob in enumerate(weights.tolist()):
            if prob > 0:
                out[(path, token)] = out.get((path, token), 0.0) + mass * prob

    def walk(row: int, path: tuple[int, ...], mass: float) -> None:
        kids = tree.children[row]
        if not kids:
            emit(path, target_probs[row] / target_probs[row].sum(), mass)
            return
        law = tree.laws[row]
        assert law is not None, "a row with children has a law"
        accept, residual = row_acceptance(target_probs[row], law, [tokens[c] for c in kids])
        for node, a in zip(kids, accept, strict=True):
            if a > 0:
                walk(node + 1, (*path, node), mass * a)
            mass *= 1.0 - a
        if mass > 0:
            emit(path, residual, mass)

    walk(0, (), 1.0)
    return out


def sample_indices(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF samples from non-negative ``weights`` (Shape: (V,)) with mass > 0.

    Each U(0, 1) draw in ``uniforms`` (float64, Shape: (S,)) becomes index ``i`` with
    probability ``weights[i] / weights.sum()`` (CDF accumulated in float64); an index
    of weight 0 is never returned. Returns int64, Shape: (S,).
    """
    cdf = weights.cumsum(0, dtype=torch.float64)  # (V,)
    total = cdf[-1:]
    # u * total can round up to total; keeping the threshold below it keeps the index
    # on a token of positive weight (cdf only rises there)
    below_total = torch.nextafter(total, torch.zeros_like(total))
    thresholds = torch.minimum(uniforms.to(cdf.device) * total, below_total)  # (S,)
    return torch.searchsorted(cdf, thresholds, right=True)


def sample_index(weights: torch.Tensor, uniform: float) -> int:
    """One inverse-CDF sample; see :func:`sample_indices`. One host sync."""
    uniforms = torch.tensor([uniform], dtype=torch.float64, device=weights.device)
    return int(sample_indices(weights, uniforms)[0])

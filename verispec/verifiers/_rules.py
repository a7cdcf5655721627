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

*Arithmetic.* The rule is written once, in PyTorch, as the Triton kernel's twin
(:class:`verispec.kernels.reference.RejectionRow`): probabilities are int64 multiples
of 2**-52, so the kernel and the PyTorch walk agree draw for draw, on any device.
:class:`RowRejection` is that class built from a proposal law; ``RecursiveRejection``
runs it through :func:`verispec.kernels.ops.rejection_verdicts`, and the exact laws
below (:func:`row_output_law`, :func:`verdict_distribution`) read its acceptance
probabilities and residuals, so the audits check the arithmetic the verifier runs.

Two helpers shared by every verifier sit here too: :func:`check_target_logits`
(the shape and vocabulary checks) and :func:`follow_target`, the walk of the rules
that compare candidates with one target token per row (``Greedy``'s argmax, the
coupled rule's seeded draw).

Shape glossary (docs/glossary): N tree nodes, V vocabulary, K children of a row.
"""

from __future__ import annotations

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
from verispec.errors import TreeStructureError
from verispec.kernels.reference import RejectionRow, law_code

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


class RowRejection(RejectionRow):
    """The rejection walk over the children of one row: the kernels' rule, from a law.

    :class:`verispec.kernels.reference.RejectionRow` (the Triton kernel's PyTorch twin,
    in its 2**-52 fixed point, which the verifiers run) built from a
    :class:`~verispec.core.tree.ProposalLaw`. Use: while children remain, read
    :meth:`acceptance_probability` of the current child and either stop (accepted) or
    call :meth:`reject`; after the last rejection the extra token is drawn from
    :meth:`residual`, here in ``target_probs``' dtype.

    Args:
        target_probs: float, Shape: (V,). The row's processed target distribution ``q``.
        law: the proposal law of the row's children.
        child_tokens: the children's tokens in drawn order, Shape: (K,).

    Raises:
        TreeStructureError: no law, a draft shape mismatch, negative draft mass, or a
            child the draft distribution could not have drawn (probability zero, or a
            repeated token under ``WithoutReplacement``).
        NonFiniteLogitsError: the draft distribution is not finite.
    """

    __slots__ = ("_dtype",)

    def __init__(
        self, target_probs: torch.Tensor, law: ProposalLaw, child_tokens: Sequence[int]
    ) -> None:
        if not isinstance(law, Deterministic | IID | WithoutReplacement):
            raise TreeStructureError(
                "a row with children needs a proposal law (Deterministic, IID or "
                f"WithoutReplacement); got {type(law).__name__}."
            )
        check_draft_shape(law, target_probs.shape[-1], -1)
        draft = law.draft_probs if isinstance(law, IID | WithoutReplacement) else None
        self._dtype = target_probs.dtype
        super().__init__(target_probs, law_code(law), draft, child_tokens)

    def residual(self) -> torch.Tensor:
        """The normalised residual in ``target_probs``' dtype, Shape: (V,)."""
        return super().residual().to(self._dtype)


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

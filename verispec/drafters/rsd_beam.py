"""RSD-S: Recursive Speculative Decoding with Stochastic Beam Search.

Jeon et al., "Recursive Speculative Decoding: Accelerating LLM Inference via Sampling
Without Replacement", ICML 2024 (RSD-S), built on Stochastic Beam Search (Kool, van
Hoof and Welling, "Stochastic Beams and Where to Find Them", ICML 2019).

Each beam ``i`` (a tree node) carries ``phi_i``, the log draft probability of its path,
and ``G_i``, its perturbed score. The root has ``phi = 0`` and ``G = 0``. To grow a level,
every child ``y`` of every beam gets ``phi_iy = phi_i + log p_i(y)`` and a Gumbel
``G_iy ~ Gumbel(phi_iy)``; the children of beam ``i`` are then shifted to have maximum
``G_i`` with the truncated Gumbel transform, in the numerically stable form of Kool et
al. (2019, appendix B.3)::

    Z  = max_y G_iy
    u  = G_i - G_iy + log1mexp(G_iy - Z)          # log1mexp(x) = log(1 - exp(x))
    G~ = G_i - max(u, 0) - log1p(exp(-|u|))

and the ``W`` children with the largest ``G~`` over all beams form the next level. The
tree has depth ``L`` and at most ``W`` nodes per level (``W * L`` in all).

Law of the children: within one parent, the shift is increasing in ``G_iy``, so the
selected children of a parent, in decreasing ``G~``, are the first draws of a
Gumbel-top-k sequence, i.e. sequential draws without replacement from ``p_i``; how many
are selected depends only on the scores, which (by the memorylessness of the
exponential race behind Gumbel-top-k) are independent of the identity of the next draw
given the earlier ones. Hence each parent's children follow ``WithoutReplacement(p_i)``
in stored order (the paper's Theorem 3.2), and recursive rejection sampling stays exact.
At temperature 0 the noise is dropped: the tree is a deterministic beam search on the
draft's log-probabilities and the law is ``DETERMINISTIC``.

Nodes are stored level by level, each level in decreasing ``G~`` (so siblings keep draw
order). Draft calls per step: ``L``, batching each level of ``W`` beams.
"""

from __future__ import annotations

import attrs
import torch

from verispec.core.tree import DETERMINISTIC, DraftTree, ProposalLaw, WithoutReplacement
from verispec.core.types import DecodeState, LanguageModel
from verispec.core.validate import integer, option, or_none
from verispec.drafters._draft_model import DraftModelDrafter
from verispec.drafters._draws import processed_probs, race_without_replacement, top_indices

__all__ = [
    "RSDStochasticBeam",
    "RSDStochasticBeamOptions",
    "log1mexp",
    "shifted_gumbels",
    "stochastic_beam_level",
]


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(x))`` for ``x <= 0``, accurate on both sides of ``-log 2`` (Mächler 2012)."""
    return torch.where(x > -0.6931471805599453, torch.log(-torch.expm1(x)), torch.log1p(-x.exp()))


def shifted_gumbels(gumbels: torch.Tensor, maximum: torch.Tensor) -> torch.Tensor:
    """Shift each row of Gumbels so that its maximum becomes ``maximum`` (Kool et al. B.3).

    Args:
        gumbels: float, Shape: (..., V). ``G_iy``; ``-inf`` for impossible tokens.
        maximum: float, Shape: (...). ``G_i``, the parent's perturbed score.

    Returns:
        float, Shape: (..., V). ``G~_iy``; the row maximum equals ``maximum`` and
        ``-inf`` stays ``-inf``.
    """
    top = gumbels.max(-1, keepdim=True).values
    target = maximum.unsqueeze(-1)
    u = target - gumbels + log1mexp(gumbels - top)
    shifted = target - u.clamp_min(0) - torch.log1p(torch.exp(-u.abs()))
    return shifted.masked_fill(gumbels == -torch.inf, -torch.inf)


def stochastic_beam_level(
    scores: torch.Tensor,
    log_path: torch.Tensor,
    probs: torch.Tensor,
    width: int,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One level of Stochastic Beam Search, batched over leading dimensions.

    The shift is increasing within a row, so only each row's ``W`` largest Gumbels can
    be among the ``W`` kept children: the shift runs on those ``R * W`` candidates, not
    on all ``R * V`` (not in Kool et al.'s Algorithm 2, which shifts every child; same
    result, far less work for a large vocabulary). Those ``W`` largest Gumbels, with
    their tokens, are the ``W`` first arrivals of the row's exponential race
    (``G_iy = phi_i - log(arrival time)``), drawn without perturbing every token by
    :func:`~verispec.drafters._draws.race_without_replacement`.

    Args:
        scores: float, Shape: (..., R). Perturbed score ``G_i`` of each beam.
        log_path: float, Shape: (..., R). ``phi_i``, log draft probability of each beam.
        probs: float, Shape: (..., R, V). Draft distribution at each beam.
        width: beams to keep (W).
        generator: source of the Gumbel noise; ``None`` drops the noise (beam search).

    Returns:
        ``(beam, token, new_scores, new_log_path, valid)``, each Shape: (..., W'),
        W' = min(W, R * min(W, V)), in decreasing new score: the parent beam and token of
        each kept child, its ``G~`` and ``phi``, and False where fewer than W' children
        have positive probability.
    """
    per_row = min(width, probs.shape[-1])
    if generator is None:
        candidates = top_indices(probs, per_row)  # each row's best tokens, (..., R, K)
    else:
        candidates, times, _ = race_without_replacement(probs, per_row, generator)
    phi = log_path.unsqueeze(-1) + probs.gather(-1, candidates).log()  # (..., R, K)
    if generator is None:
        keys = phi
    else:
        # G_iy = phi_i + log p(y) - log E_y ~ Gumbel(phi_iy); the row maximum is candidate 0
        gumbels = log_path.unsqueeze(-1) - times.log()
        keys = shifted_gumbels(gumbels, scores)
    flat = keys.flatten(-2)  # (..., R * K)
    best = torch.topk(flat, min(width, flat.shape[-1]), dim=-1)
    beam = torch.div(best.indices, per_row, rounding_mode="floor")
    token = candidates.flatten(-2).gather(-1, best.indices)
    new_log_path = phi.flatten(-2).gather(-1, best.indices)
    return beam, token, best.values, new_log_path, best.values > -torch.inf


@attrs.frozen(kw_only=True)
class RSDStochasticBeamOptions:
    """RSDStochasticBeam's parameters, checked."""

    width: int = option(4, integer, 1, help="beam width W")
    depth: int = option(4, integer, 1, help="tree depth L")
    budget: int | None = option(None, or_none(integer), 1, help="cap on the tree size (nodes)")


_DEFAULT = RSDStochasticBeamOptions()  # the defaults of RSDStochasticBeam's arguments


class RSDStochasticBeam(DraftModelDrafter):
    """RSD-S: a draft tree of width ``W`` and depth ``L`` by Stochastic Beam Search.

    Args:
        draft: the draft model (same vocabulary as the target).
        width: beams per level (W >= 1).
        depth: levels (L >= 1).
        budget: optional cap on the number of nodes (default ``W * L``).
    """

    def __init__(
        self,
        draft: LanguageModel,
        *,
        width: int = _DEFAULT.width,
        depth: int = _DEFAULT.depth,
        budget: int | None = _DEFAULT.budget,
    ) -> None:
        super().__init__(draft)
        self.options = RSDStochasticBeamOptions(width=width, depth=depth, budget=budget)
        self.width, self.depth = width, depth
        full = self.width * self.depth
        self.budget = full if budget is None else min(full, budget)

    def __repr__(self) -> str:
        return f"RSDStochasticBeam(width={self.width}, depth={self.depth}, budget={self.budget})"

    def propose(self, state: DecodeState) -> DraftTree:
        started = self.start_levels(state, self.budget)
        if started is None:
            return DraftTree.empty()
        limit, level_logits, generator = started
        sampling = state.sampling
        # float64 scores: the arrival times of the race are float64
        scores = torch.zeros(1, dtype=torch.float64, device=level_logits.device)  # G of root
        log_path = torch.zeros(1, dtype=torch.float64, device=level_logits.device)  # its phi
        level_rows = [0]
        laws: dict[int, ProposalLaw] = {}
        count = 0
        for level in range(self.depth):
            if level > 0:
                level_logits = self.score_new_nodes()  # (R, V)
            level_logits = self.masked(state, level_rows, level_logits)
            probs = processed_probs(level_logits, sampling)  # (R, V)
            noise = None if sampling.is_greedy else generator
            beam, token, new_scores, new_log_path, valid = stochastic_beam_level(
                scores, log_path, probs, self.width, noise
            )
            keep = min(int(valid.sum()), limit - count)  # valid is a prefix: sorted keys
            beams, tokens = beam[:keep].tolist(), token[:keep].tolist()
            for b in set(beams):
                laws[level_rows[b]] = (
                    DETERMINISTIC if sampling.is_greedy else WithoutReplacement(probs[b])
                )
            self.add_nodes(tokens, [level_rows[b] - 1 for b in beams])
            level_rows = list(range(count + 1, count + 1 + keep))
            count += keep
            scores, log_path = new_scores[:keep], new_log_path[:keep]
            if count >= limit or keep == 0:
                break
        return self.build(laws)

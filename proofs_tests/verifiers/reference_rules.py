"""An independent, exact enumeration of acceptance rules, in plain Python float64.

Nothing here imports verispec: the rules are written again from their textbook
statements (docs/exactness.rst, the proposal laws), so that the audits compare the library
against a second implementation instead of against itself.

A *draw law* says how a row's children are proposed (fixed candidates, i.i.d. from
``p``, or sequentially without replacement from ``p``); a *verification rule* says
how they are judged. The correct pairs are (fixed, deterministic), (iid, iid) and
(wor, wor). The known-wrong ones the audits must reject are built from the same
pieces: the i.i.d. rule on draws without replacement, draft-softmax verification of
top-k candidates, an acceptance coin from N(0, 1), and a residual left unnormalised.

``output_laws`` enumerates every sequence of draws and integrates every uniform
coin analytically (``P(u < a) = a``): prefixes whose continuation states are equal
are merged, which is exact. It has no fallback for a residual without mass: the
probability of reaching one is dropped, so a rule that gets there shows a deficit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Dist = tuple[float, ...]


def normalise(weights: Sequence[float]) -> Dist | None:
    """``weights / sum(weights)``, or ``None`` when there is no mass."""
    total = math.fsum(weights)
    if total <= 0:
        return None
    return tuple(w / total for w in weights)


def without(dist: Dist, token: int) -> Dist | None:
    """``norm(dist with token zeroed)``."""
    return normalise([0.0 if i == token else w for i, w in enumerate(dist)])


def positive_part(residual: Dist, draft: Dist) -> list[float]:
    return [max(r - p, 0.0) for r, p in zip(residual, draft, strict=True)]


def point_mass(vocab_size: int, token: int) -> Dist:
    return tuple(1.0 if i == token else 0.0 for i in range(vocab_size))


# -- verification rules --------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """How a row's children are judged.

    ``accept(residual, draft, token)`` is the acceptance probability, ``advance``
    gives the next residual (``None`` when it has no mass), ``next_draft`` the draft
    distribution the verifier assumes for the next child, and ``coin`` maps the
    intended acceptance probability to the real one (identity for U(0, 1)).
    """

    name: str
    accept: Callable[[Dist, Dist, int], float]
    advance: Callable[[Dist, Dist, int], Dist | None]
    next_draft: Callable[[Dist, int], Dist | None]
    coin: Callable[[float], float] = lambda a: a
    uses_point_mass: bool = False


def _ratio(residual: Dist, draft: Dist, token: int) -> float:
    return min(1.0, residual[token] / draft[token])


def _residual(residual: Dist, draft: Dist, token: int) -> Dist | None:
    return normalise(positive_part(residual, draft))


DETERMINISTIC = Rule(
    "deterministic",
    accept=lambda r, p, c: r[c],
    advance=lambda r, p, c: without(r, c),
    next_draft=lambda p, c: p,
    uses_point_mass=True,
)
IID = Rule("iid", accept=_ratio, advance=_residual, next_draft=lambda p, c: p)
WOR = Rule("wor", accept=_ratio, advance=_residual, next_draft=without)


def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


# DySpec Algorithm 3 as printed: accept when a N(0, 1) draw is below the ratio.
WOR_NORMAL_COIN = Rule(
    "wor, coin ~ N(0,1)", accept=_ratio, advance=_residual, next_draft=without, coin=_normal_cdf
)
# max(r - p, 0) used as is: the next ratio reads an unnormalised residual.
WOR_UNNORMALISED = Rule(
    "wor, unnormalised residual",
    accept=_ratio,
    advance=lambda r, p, c: tuple(positive_part(r, p)) if any(positive_part(r, p)) else None,
    next_draft=without,
)
DETERMINISTIC_UNNORMALISED = Rule(
    "deterministic, unnormalised residual",
    accept=lambda r, p, c: r[c],
    advance=lambda r, p, c: tuple(0.0 if i == c else w for i, w in enumerate(r)),
    next_draft=lambda p, c: p,
    uses_point_mass=True,
)


# -- draw laws -----------------------------------------------------------------------


@dataclass(frozen=True)
class Draws:
    """How children are proposed: ``kind`` is "fixed", "iid" or "wor"."""

    kind: str
    draft: Dist | None = None
    tokens: tuple[int, ...] = ()

    def choices(self, state: Dist | None, depth: int) -> list[tuple[int, float]]:
        """(token, probability) of the next child."""
        if self.kind == "fixed":
            return [(self.tokens[depth], 1.0)]
        assert state is not None
        return [(c, w) for c, w in enumerate(state) if w > 0]

    def next_state(self, state: Dist | None, token: int) -> Dist | None:
        if self.kind == "wor":
            assert state is not None
            return without(state, token)
        return state


def output_laws(target: Dist, draws: Draws, rule: Rule, max_children: int) -> list[list[float]]:
    """Exact law of the emitted token for every child count ``0 .. max_children``.

    With ``k`` children the emitted token is the first accepted child's, or a draw
    from the residual after ``k`` rejections. Returns ``laws[k][token]``.
    """
    vocab_size = len(target)
    laws = [[0.0] * vocab_size for _ in range(max_children + 1)]
    # a frontier of merged states after `depth` rejections:
    # (residual, draw state, verifier's draft) -> probability of getting there
    verify_draft0 = draws.draft if draws.draft is not None else target
    frontier: dict[tuple, float] = {(target, draws.draft, verify_draft0): 1.0}
    for depth in range(max_children + 1):
        nxt: dict[tuple, float] = {}
        for (residual, draw_state, verify_draft), reach in frontier.items():
            # stop here: every one of `depth` children was rejected
            total = math.fsum(residual)
            for token, w in enumerate(residual):
                laws[depth][token] += reach * w / total
            if depth == max_children:
                continue
            for token, prob in draws.choices(draw_state, depth):
                judged = point_mass(vocab_size, token) if rule.uses_point_mass else verify_draft
                assert judged is not None
                accept = rule.coin(rule.accept(residual, judged, token))
                for k in range(depth + 1, max_children + 1):
                    laws[k][token] += reach * prob * accept
                if accept >= 1.0:
                    continue
                new_residual = rule.advance(residual, judged, token)
                if new_residual is None:
                    # No mass left. For a correct rule this rejection has probability 0;
                    # for a wrong one the mass is lost, and the audit sees a deficit.
                    continue
                key = (
                    new_residual,
                    draws.next_state(draw_state, token),
                    rule.next_draft(verify_draft, token),
                )
                nxt[key] = nxt.get(key, 0.0) + reach * prob * (1.0 - accept)
        frontier = nxt
    return laws


def max_error(law: Sequence[float], target: Sequence[float]) -> float:
    return max(abs(a - b) for a, b in zip(law, target, strict=True))

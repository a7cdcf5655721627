"""The exact-law audit has power: each known-wrong acceptance rule fails it.

The wrong rules (built in ``reference_rules.py`` from the same pieces as the right
ones) are the bugs found in published systems and papers (docs/errata.rst):

* the i.i.d. rule applied to draws without replacement;
* top-k (deterministic) candidates verified as if sampled from the draft softmax,
  the bias reported against EAGLE-style and recurrent drafting;
* the acceptance coin drawn from N(0, 1), as DySpec's Algorithm 3 prints;
* the residual ``max(r - p, 0)`` used without renormalising it.

Each is run through the audit of ``test_rules.py`` (exact law for every child
count, float64, tolerance 1e-12) on ten seeded generic (target, draft) pairs; the
audit must fail on every one of them, by a margin (> 1e-3) far above the
tolerance, while the correct rule passes on the same pairs.
"""

from __future__ import annotations

import random

import pytest
from reference_rules import (
    DETERMINISTIC,
    DETERMINISTIC_UNNORMALISED,
    IID,
    WOR,
    WOR_NORMAL_COIN,
    WOR_UNNORMALISED,
    Dist,
    Draws,
    Rule,
    max_error,
    normalise,
    output_laws,
)

TOL = 1e-12
MARGIN = 1e-3
VOCAB_SIZE = 5
CHILDREN = 4


def _generic_pairs(count: int = 10, seed: int = 0) -> list[tuple[Dist, Dist]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        target = normalise([rng.expovariate(1.0) for _ in range(VOCAB_SIZE)])
        draft = normalise([rng.expovariate(1.0) for _ in range(VOCAB_SIZE)])
        assert target is not None and draft is not None
        pairs.append((target, draft))
    return pairs


PAIRS = _generic_pairs()


def audit_error(target: Dist, draws: Draws, rule: Rule) -> float:
    """The exact-law audit's statistic: worst error over child counts 1..CHILDREN."""
    laws = output_laws(target, draws, rule, CHILDREN)
    return max(max_error(law, target) for law in laws[1:])


def _top_k(draft: Dist) -> tuple[int, ...]:
    return tuple(sorted(range(VOCAB_SIZE), key=lambda t: -draft[t])[:CHILDREN])


# (name, draws from (target, draft), wrong rule, the right rule for the same draws)
WRONG = [
    ("iid rule on draws without replacement", lambda q, p: Draws("wor", p), IID, WOR),
    (
        "top-k candidates verified as draft samples",
        lambda q, p: Draws("fixed", p, _top_k(p)),
        WOR,
        DETERMINISTIC,
    ),
    ("coin from N(0,1) (DySpec Alg. 3)", lambda q, p: Draws("wor", p), WOR_NORMAL_COIN, WOR),
    ("unnormalised residual", lambda q, p: Draws("wor", p), WOR_UNNORMALISED, WOR),
    (
        "unnormalised residual, deterministic",
        lambda q, p: Draws("fixed", None, _top_k(p)),
        DETERMINISTIC_UNNORMALISED,
        DETERMINISTIC,
    ),
]


@pytest.mark.parametrize(("name", "draws", "wrong", "right"), WRONG, ids=[w[0] for w in WRONG])
@pytest.mark.parametrize("case", range(len(PAIRS)))
def test_wrong_rule_fails_the_exact_law_audit(name, draws, wrong, right, case) -> None:
    """The wrong rule misses the target by more than 1e-3; the right rule meets it to 1e-12."""
    target, draft = PAIRS[case]
    assert audit_error(target, draws(target, draft), right) < TOL
    assert audit_error(target, draws(target, draft), wrong) > MARGIN, name

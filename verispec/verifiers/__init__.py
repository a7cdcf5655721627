"""Acceptance rules: given a draft tree and the target's logits, which path is kept.

* :class:`Greedy` — temperature 0: follow the target's argmax.
* :class:`Coupled` — temperature > 0, trees of fixed candidates: follow the target's
  draw at each absolute position, keyed by (seed, position), so the text is plain
  seeded sampling whatever the drafter; other trees go to recursive rejection.
* :class:`RecursiveRejection` — any temperature, for the three proposal laws
  (Deterministic, IID, WithoutReplacement); lossless.
* :func:`verdict_distribution`, :class:`RowRejection` — the same rules as exact
  probabilities, for analysis and for the audits in ``proofs_tests/verifiers``.

Two policies map sampling parameters to a verifier: :func:`default_verifier` (what
``verispec.SpeculativeDecoder`` uses when given no verifier) and
:func:`recursive_verifier` (recursive rejection for every tree at temperature > 0:
exact, but without seeded identity across drafters).
"""

from verispec.core.sampling import SamplingParams
from verispec.core.types import Verifier
from verispec.verifiers._rules import RowRejection, verdict_distribution
from verispec.verifiers.coupled import BLOCK, Coupled, position_noise, seeded_sample
from verispec.verifiers.greedy import Greedy
from verispec.verifiers.recursive import RecursiveRejection

__all__ = [
    "BLOCK",
    "Coupled",
    "Greedy",
    "RecursiveRejection",
    "RowRejection",
    "default_verifier",
    "position_noise",
    "recursive_verifier",
    "seeded_sample",
    "verdict_distribution",
]


def default_verifier(sampling: SamplingParams, *, kernels: str = "auto") -> Verifier:
    """``Greedy`` at temperature 0; otherwise ``Coupled``: the coupled rule for trees of
    fixed candidates (and for plain decoding), recursive rejection for draft-model trees.

    ``kernels``: ``"auto"``, ``"triton"`` or ``"torch"``, passed to the verifiers
    (:mod:`verispec.kernels.backend`).
    """
    if sampling.is_greedy:
        return Greedy(kernels=kernels)
    return Coupled(fallback=RecursiveRejection(kernels=kernels))


def recursive_verifier(sampling: SamplingParams, *, kernels: str = "auto") -> Verifier:
    """``Greedy`` at temperature 0, recursive rejection sampling for every tree otherwise."""
    if sampling.is_greedy:
        return Greedy(kernels=kernels)
    return RecursiveRejection(kernels=kernels)

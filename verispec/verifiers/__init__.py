"""Acceptance rules: given a draft tree and the target's logits, which path is kept.

* :class:`Greedy` — temperature 0: follow the target's argmax.
* :class:`RecursiveRejection` — any temperature, for the three proposal laws
  (Deterministic, IID, WithoutReplacement); lossless.
* :func:`verdict_distribution`, :class:`RowRejection` — the same rules as exact
  probabilities, for analysis and for the audits in ``proofs_tests/verifiers``.
"""

from verispec.core.sampling import SamplingParams
from verispec.core.types import Verifier
from verispec.verifiers._rules import RowRejection, verdict_distribution
from verispec.verifiers.greedy import Greedy
from verispec.verifiers.recursive import RecursiveRejection

__all__ = [
    "Greedy",
    "RecursiveRejection",
    "RowRejection",
    "default_verifier",
    "verdict_distribution",
]


def default_verifier(sampling: SamplingParams, *, kernels: str = "auto") -> Verifier:
    """``Greedy`` at temperature 0, recursive rejection sampling otherwise.

    ``kernels``: ``"auto"``, ``"triton"`` or ``"torch"``, passed to the verifier
    (:mod:`verispec.kernels.backend`).
    """
    if sampling.is_greedy:
        return Greedy(kernels=kernels)
    return RecursiveRejection(kernels=kernels)

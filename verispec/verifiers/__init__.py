"""Acceptance rules: given a draft tree and the target's logits, which path is kept."""

from verispec.core.sampling import SamplingParams
from verispec.core.types import Verifier
from verispec.verifiers.greedy import Greedy

__all__ = ["Greedy", "default_verifier"]


def default_verifier(sampling: SamplingParams) -> Verifier:
    """``Greedy`` at temperature 0, recursive rejection sampling otherwise."""
    if sampling.is_greedy:
        return Greedy()
    from verispec.verifiers.recursive import RecursiveRejection

    return RecursiveRejection()

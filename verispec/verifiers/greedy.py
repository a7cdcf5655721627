"""Greedy verification (temperature 0).

Follow the target's argmax down the tree: at each row, the child whose token is
the target's argmax is accepted; the walk stops at the first row with no such
child, and that row's argmax is the extra (bonus) token. The output is exactly
the target's greedy continuation, whatever the proposal law of the children.

Implementation: :func:`verispec.kernels.ops.greedy_verify`, which picks the backend
(:mod:`verispec.kernels.backend`): on CUDA by default the Triton kernels (a row argmax
and a walk on the device, one host sync), elsewhere their PyTorch twin
(:func:`verispec.kernels.reference.tree_greedy_walk`, which on the CPU takes the argmax
only of the rows the walk visits).
"""

from __future__ import annotations

from torch import Generator, Tensor

from verispec.core.sampling import SamplingParams
from verispec.core.tree import DraftTree
from verispec.core.types import Verdict
from verispec.errors import TreeStructureError
from verispec.kernels import ops
from verispec.kernels.backend import require_triton

__all__ = ["Greedy"]


class Greedy:
    """The temperature-0 verifier: the longest path that agrees with the target's argmax.

    Args:
        kernels: ``"auto"`` (Triton on CUDA, PyTorch elsewhere), ``"triton"`` or ``"torch"``.

    Raises:
        ConfigError: ``kernels`` is not one of those.
        KernelUnavailableError: ``kernels="triton"`` where Triton cannot run.
    """

    kernels: str = "auto"  # also for subclasses that do not call __init__

    def __init__(self, kernels: str = "auto") -> None:
        self.kernels = require_triton(kernels)

    def __repr__(self) -> str:
        return f"Greedy(kernels={self.kernels!r})"

    def verify(
        self, tree: DraftTree, target_logits: Tensor, sampling: SamplingParams | None = None,
        generator: Generator | None = None,
    ) -> Verdict:  # fmt: skip
        """Args:
        tree: the draft tree.
        target_logits: float, Shape: (N + 1, V). Row 0 the root, row i + 1 node i.
        sampling, generator: unused; greedy decoding draws nothing.
        """
        if target_logits.dim() != 2 or target_logits.shape[0] != tree.num_nodes + 1:
            raise TreeStructureError(
                f"`target_logits` must have shape (N + 1, V) = ({tree.num_nodes + 1}, V); "
                f"got {tuple(target_logits.shape)}."
            )
        return ops.greedy_verify(tree, target_logits, kernels=self.kernels)

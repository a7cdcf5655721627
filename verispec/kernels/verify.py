"""Verifiers backed by the verification kernels (drop-in for ``verispec.verifiers``).

* :class:`KernelGreedy` gives ``verispec.verifiers.Greedy``'s verdicts.
* :class:`KernelRecursiveRejection` gives ``verispec.verifiers.RecursiveRejection``'s
  rule with the same draws (one uniform per node, coin ``i`` for node ``i``, then one
  for the extra token, drawn in one call from the generator), computed in the
  kernels' fixed point: its verdicts equal ``RecursiveRejection(torch.float64)``'s
  except when a coin lands within rounding (about 1e-15) of an acceptance threshold.

Both run the Triton kernels on CUDA and the PyTorch references elsewhere
(:mod:`verispec.kernels.backend`), with one host sync per verification.

Shape glossary: N tree nodes, V vocabulary.
"""

from __future__ import annotations

import torch

from verispec.core.sampling import SamplingParams
from verispec.core.tree import DraftTree
from verispec.core.types import Verdict
from verispec.kernels import ops

__all__ = ["KernelGreedy", "KernelRecursiveRejection"]


class KernelGreedy:
    """Greedy tree verification (temperature 0) by the greedy kernels."""

    def verify(
        self,
        tree: DraftTree,
        target_logits: torch.Tensor,
        sampling: SamplingParams | None = None,
        generator: torch.Generator | None = None,
    ) -> Verdict:
        """Args: target_logits: float, Shape: (N + 1, V). ``sampling``, ``generator`` unused."""
        return ops.greedy_verify(tree, target_logits)


class KernelRecursiveRejection:
    """Recursive rejection sampling (all three proposal laws) by the rejection kernel."""

    def verify(
        self,
        tree: DraftTree,
        target_logits: torch.Tensor,
        sampling: SamplingParams,
        generator: torch.Generator,
    ) -> Verdict:
        """Args: target_logits: float, Shape: (N + 1, V); processed with ``sampling``."""
        target_probs = sampling.probs(target_logits, torch.float64)  # (N + 1, V)
        uniforms = torch.rand(
            tree.num_nodes + 1, generator=generator, dtype=torch.float64, device=generator.device
        )
        return ops.rejection_verify(tree, target_probs, uniforms)

"""Recursive rejection sampling over a draft tree: one verifier for every proposal law.

Walk the tree from the root. At each row, process that row's target logits with
the sampling parameters, then try its children in the order they were drawn with
the acceptance rule of the row's proposal law (``verispec.verifiers._rules``):

* ``Deterministic`` — point-mass candidates (Token Recycling, prompt lookup,
  top-k trees);
* ``IID(p)`` — multi-round speculative sampling (SpecInfer, Miao et al. 2024); a
  chain of one child per node is speculative sampling (Leviathan et al. 2023,
  Chen et al. 2023);
* ``WithoutReplacement(p)`` — recursive rejection sampling (RSD, Jeon et al.
  2024, Algorithm 4; DySpec; Sequoia).

An accepted child becomes the next row; when every child of a row is rejected,
the extra token is drawn from the row's last residual; when a leaf is accepted,
the extra token is drawn from the leaf's target distribution. The verdict is then
distributed exactly as the target would generate those tokens (docs/exactness.rst).

Randomness: one uniform coin per node, drawn in one call from the given
``torch.Generator`` (coin ``i`` belongs to node ``i``), plus one uniform for the
extra token's inverse-CDF sample.

Implementation: :func:`verispec.kernels.ops.rejection_verdicts`, which picks the
backend (:mod:`verispec.kernels.backend`): the Triton kernel for CUDA tensors by
default, else its PyTorch twin (:class:`verispec.kernels.reference.RejectionRow`),
which processes only the rows on the accepted path. Both run one rule in 2**-52
fixed point, so for the same coins they return the same verdict.

Shape glossary (docs/glossary): N tree nodes, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Generator, Tensor

from verispec.core.sampling import SamplingParams
from verispec.core.tree import DraftTree
from verispec.core.types import Verdict
from verispec.core.validate import integer
from verispec.errors import ConfigError
from verispec.kernels import ops
from verispec.kernels.backend import require_triton
from verispec.verifiers._rules import check_target_logits

__all__ = ["RecursiveRejection"]


class RecursiveRejection:
    """The lossless tree verifier for the Deterministic, IID and WithoutReplacement laws.

    Args:
        residual_dtype: precision in which the target rows are processed (softmax,
            top-k, top-p), ``torch.float32`` (default) or ``torch.float64``; the rule
            itself runs in 2**-52 fixed point on every backend.
        kernels: ``"auto"`` (Triton on CUDA, PyTorch elsewhere), ``"triton"`` or ``"torch"``.

    At temperature 0 the processed distributions are point masses and the verdict
    equals :class:`~verispec.verifiers.Greedy`'s.

    Raises:
        ConfigError: ``residual_dtype`` or ``kernels`` out of range.
        KernelUnavailableError: ``kernels="triton"`` where Triton cannot run.
    """

    def __init__(
        self, residual_dtype: torch.dtype = torch.float32, *, kernels: str = "auto"
    ) -> None:
        if residual_dtype not in (torch.float32, torch.float64):
            raise ConfigError(
                f"`residual_dtype` must be torch.float32 or torch.float64; got {residual_dtype}."
            )
        self.residual_dtype = residual_dtype
        self.kernels = require_triton(kernels)

    def __repr__(self) -> str:
        return f"RecursiveRejection(residual_dtype={self.residual_dtype}, kernels={self.kernels!r})"

    def verify(
        self, tree: DraftTree, target_logits: Tensor, sampling: SamplingParams, generator: Generator
    ) -> Verdict:
        """Keep one root-to-node path of ``tree`` and draw the extra token.

        Args:
            tree: the draft tree; every row with children must carry its proposal law.
            target_logits: float, Shape: (N + 1, V). Row 0 the root, row i + 1 node i.
            sampling: the processing applied to the target logits (the drafter applied
                the same to its own).
            generator: the only source of randomness.

        Raises:
            TreeStructureError: shapes do not match the tree, a token is outside the
                vocabulary, a row with children has no law, or a child could not have
                been drawn from its row's draft distribution.
            NonFiniteLogitsError: a row on the walked path has NaN or infinite logits,
                or a visited draft distribution is not finite (the Triton path checks
                every target row and no draft distribution).
        """
        return self.sample_verdicts(tree, target_logits, sampling, generator, 1)[0]

    def sample_verdicts(
        self,
        tree: DraftTree,
        target_logits: torch.Tensor,
        sampling: SamplingParams,
        generator: torch.Generator,
        num_samples: int,
    ) -> list[Verdict]:
        """``num_samples`` independent verdicts for one tree; ``verify`` is the case of one.

        On the PyTorch path everything that does not depend on the coins (each visited
        row's target distribution and residuals) is computed once, when the first
        sample needs it, and shared; each sample then costs a few Python comparisons.
        Used by the sampled audits and to estimate a tree's acceptance. On a CPU
        generator it consumes the random stream exactly as ``num_samples`` successive
        :meth:`verify` calls do, and returns the same verdicts. Arguments and errors as
        :meth:`verify`; ``num_samples`` must be an integer >= 1.
        """
        integer("num_samples", num_samples, 1)
        check_target_logits(tree, target_logits)
        # coins[s][i] for node i of sample s; coins[s][N] for its extra token
        coins = torch.rand(
            num_samples, tree.num_nodes + 1, generator=generator, dtype=torch.float64,
            device=generator.device,
        )  # fmt: skip
        dtype = self.residual_dtype

        def probs(logits: torch.Tensor) -> torch.Tensor:
            return sampling.probs(logits, dtype)

        return ops.rejection_verdicts(tree, target_logits, coins, probs=probs, kernels=self.kernels)

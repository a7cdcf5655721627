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
extra token's inverse-CDF sample. Only the rows on the accepted path are processed.

``kernels`` picks the implementation of :meth:`RecursiveRejection.verify`
(:mod:`verispec.kernels.backend`): on CUDA by default the Triton kernel
(:func:`verispec.kernels.ops.rejection_verify`), which walks the tree on the device
with the same coins in float64 fixed point (its decisions are those of
``residual_dtype=torch.float64`` unless a coin lands within about 1e-15 of a
threshold); elsewhere the walk below.

Shape glossary (docs/glossary): N tree nodes, V vocabulary.
"""

from __future__ import annotations

import torch

from verispec.core.sampling import SamplingParams
from verispec.core.tree import DraftTree
from verispec.core.types import Verdict
from verispec.core.validate import integer
from verispec.errors import ConfigError, TreeStructureError
from verispec.kernels import ops
from verispec.kernels.backend import backend_for, require_triton
from verispec.verifiers._rules import RowRejection, check_target_logits, sample_indices

__all__ = ["RecursiveRejection"]


class RecursiveRejection:
    """The lossless tree verifier for the Deterministic, IID and WithoutReplacement laws.

    Args:
        residual_dtype: precision of the processed target distributions and of the
            residuals on the PyTorch path, ``torch.float32`` (default) or ``torch.float64``
            (the Triton kernel always works in float64 fixed point).
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
        self,
        tree: DraftTree,
        target_logits: torch.Tensor,
        sampling: SamplingParams,
        generator: torch.Generator,
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
        if backend_for("rejection verification", target_logits.device, self.kernels) == "torch":
            return self.sample_verdicts(tree, target_logits, sampling, generator, 1)[0]
        check_target_logits(tree, target_logits)
        target_probs = sampling.probs(target_logits, torch.float64)  # (N + 1, V)
        # the coins of sample_verdicts(..., 1): one row of N + 1 uniforms from the generator
        coins = torch.rand(
            1, tree.num_nodes + 1, generator=generator, dtype=torch.float64,
            device=generator.device,
        )[0]  # fmt: skip
        return ops.rejection_verify(tree, target_probs, coins, kernels="triton")

    def sample_verdicts(
        self,
        tree: DraftTree,
        target_logits: torch.Tensor,
        sampling: SamplingParams,
        generator: torch.Generator,
        num_samples: int,
    ) -> list[Verdict]:
        """``num_samples`` independent verdicts for one tree; ``verify`` is the case of one.

        Everything that does not depend on the coins (each visited row's target
        distribution, acceptance probabilities and residual) is computed once, when
        the first sample needs it, and shared; each sample then costs a few Python
        comparisons. Used by the sampled audits and to estimate a tree's acceptance.
        On a CPU generator it consumes the random stream exactly as ``num_samples``
        successive :meth:`verify` calls do, and returns the same verdicts. Arguments
        and errors as :meth:`verify`; ``num_samples`` must be an integer >= 1.
        """
        integer("num_samples", num_samples, 1)
        n = tree.num_nodes
        check_target_logits(tree, target_logits)
        # coins[s][i] for node i of sample s; coins[s][n] for its extra token
        coins = torch.rand(
            num_samples, n + 1, generator=generator, dtype=torch.float64, device=generator.device
        )
        coin_rows = coins.tolist()
        tokens = tree.tokens.tolist()
        children = tree.children
        plans: dict[int, _RowPlan] = {}
        paths: list[tuple[int, ...]] = []
        ends: dict[tuple[int, bool], list[int]] = {}  # (row, is_leaf) -> samples ending there
        for sample, coin in enumerate(coin_rows):
            accepted: list[int] = []
            row = 0
            while True:
                plan = plans.get(row)
                if plan is None:
                    plan = plans[row] = self._plan(tree, target_logits, sampling, row, tokens)
                kids = children[row]
                if plan.walk is None:  # a leaf (or the bare root): the bonus token
                    ends.setdefault((row, True), []).append(sample)
                    break
                for j, node in enumerate(kids):
                    if coin[node] < plan.acceptance(j):
                        accepted.append(node)
                        row = node + 1
                        break
                else:  # every child rejected: the correction token
                    ends.setdefault((row, False), []).append(sample)
                    break
            paths.append(tuple(accepted))
        extra = [0] * num_samples
        for (row, is_leaf), samples in ends.items():
            weights = plans[row].bonus_weights() if is_leaf else plans[row].residual_weights()
            drawn = sample_indices(weights, coins[samples, n]).tolist()
            for sample, token in zip(samples, drawn, strict=True):
                extra[sample] = token
        return [Verdict(path, token) for path, token in zip(paths, extra, strict=True)]

    def _plan(
        self,
        tree: DraftTree,
        target_logits: torch.Tensor,
        sampling: SamplingParams,
        row: int,
        tokens: list[int],
    ) -> _RowPlan:
        target_probs = sampling.probs(target_logits[row], self.residual_dtype)  # (V,)
        kids = tree.children[row]
        if not kids:
            return _RowPlan(target_probs, None)
        law = tree.laws[row]
        if law is None:
            raise TreeStructureError(
                f"row {row} has children but no proposal law; build the tree with "
                "DraftTree.from_parents(..., laws=...) or give `laws[row]`."
            )
        return _RowPlan(target_probs, RowRejection(target_probs, law, [tokens[c] for c in kids]))


class _RowPlan:
    """One visited row: its target distribution and its rejection walk, advanced lazily.

    ``acceptance(j)`` is ``a_j`` given children ``0 .. j-1`` were rejected, computed
    the first time a sample asks for it; the walk is never advanced further than the
    samples so far needed.
    """

    __slots__ = ("_accept", "_residual", "target_probs", "walk")

    def __init__(self, target_probs: torch.Tensor, walk: RowRejection | None) -> None:
        self.target_probs = target_probs
        self.walk = walk
        self._accept: list[float] = []
        self._residual: torch.Tensor | None = None

    def acceptance(self, j: int) -> float:
        accept = self._accept
        walk = self.walk
        assert walk is not None
        while len(accept) <= j:
            if accept:
                walk.reject()
            accept.append(walk.acceptance_probability())
        return accept[j]

    def residual_weights(self) -> torch.Tensor:
        """The residual after every child was rejected (unnormalised, mass > 0)."""
        if self._residual is None:
            walk = self.walk
            assert walk is not None and len(self._accept) == walk.num_children
            walk.reject()
            self._residual = walk.residual_weights()
        return self._residual

    def bonus_weights(self) -> torch.Tensor:
        return self.target_probs

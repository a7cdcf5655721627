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

Shape glossary (docs/glossary): N tree nodes, V vocabulary.
"""

from __future__ import annotations

import torch

from verispec.core.sampling import SamplingParams
from verispec.core.tree import DraftTree
from verispec.core.types import Verdict
from verispec.errors import ConfigError, TreeStructureError
from verispec.verifiers._rules import RowRejection, check_draft_shape, sample_index

__all__ = ["RecursiveRejection"]


class RecursiveRejection:
    """The lossless tree verifier for the Deterministic, IID and WithoutReplacement laws.

    Args:
        residual_dtype: precision of the processed target distributions and of the
            residuals, ``torch.float32`` (default) or ``torch.float64``.

    At temperature 0 the processed distributions are point masses and the verdict
    equals :class:`~verispec.verifiers.Greedy`'s.
    """

    def __init__(self, residual_dtype: torch.dtype = torch.float32) -> None:
        if residual_dtype not in (torch.float32, torch.float64):
            raise ConfigError(
                f"`residual_dtype` must be torch.float32 or torch.float64; got {residual_dtype}."
            )
        self.residual_dtype = residual_dtype

    def __repr__(self) -> str:
        return f"RecursiveRejection(residual_dtype={self.residual_dtype})"

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
                or a visited draft distribution is not finite.
        """
        n = tree.num_nodes
        self._check(tree, target_logits)
        # one coin per node (coin i for node i) and one for the extra token
        coins = torch.rand(
            n + 1, generator=generator, dtype=torch.float64, device=generator.device
        ).tolist()
        tokens = tree.tokens.tolist()
        children = tree.children
        accepted: list[int] = []
        row = 0
        while True:
            target_probs = sampling.probs(target_logits[row], self.residual_dtype)  # (V,)
            kids = children[row]
            if not kids:  # a leaf (or the bare root): the bonus token
                return Verdict(accepted, sample_index(target_probs, coins[n]))
            law = tree.laws[row]
            if law is None:
                raise TreeStructureError(
                    f"row {row} has children but no proposal law; build the tree with "
                    "DraftTree.from_parents(..., laws=...) or give `laws[row]`."
                )
            walk = RowRejection(target_probs, law, [tokens[c] for c in kids])
            for node in kids:
                if coins[node] < walk.acceptance_probability():
                    break
                walk.reject()
            else:  # every child rejected: the correction token
                extra = sample_index(walk.residual_weights(), coins[n])
                return Verdict(accepted, extra)
            accepted.append(node)
            row = node + 1

    @staticmethod
    def _check(tree: DraftTree, target_logits: torch.Tensor) -> None:
        n = tree.num_nodes
        if (
            not isinstance(target_logits, torch.Tensor)
            or target_logits.dim() != 2
            or target_logits.shape[0] != n + 1
            or not target_logits.is_floating_point()
        ):
            raise TreeStructureError(
                f"`target_logits` must be a float tensor of shape (N + 1, V) = ({n + 1}, V); "
                f"got {getattr(target_logits, 'dtype', type(target_logits).__name__)} "
                f"{tuple(getattr(target_logits, 'shape', ()))}."
            )
        vocab_size = target_logits.shape[1]
        if n and int(tree.tokens.max()) >= vocab_size:
            raise TreeStructureError(
                f"tree tokens must be < V = {vocab_size}; got {int(tree.tokens.max())}."
            )
        for row, law in enumerate(tree.laws):
            check_draft_shape(law, vocab_size, row)

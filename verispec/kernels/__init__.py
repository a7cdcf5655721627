"""Triton kernels for the hot path of a speculative step, each with a PyTorch twin.

``verispec.kernels.ops`` holds the host wrappers: they validate, allocate, build
the grid and run the Triton kernel on CUDA (``triton`` is optional) and the
reference in :mod:`verispec.kernels.reference` elsewhere. ``VERISPEC_KERNELS``
(``auto`` / ``triton`` / ``reference``) or :func:`use_backend` overrides the choice.

* tree attention (block-sparse over the ancestor mask; :mod:`.block_order` for
  DySpec's depth-first node order; :mod:`.hf_attention` for transformers);
* greedy and recursive rejection tree verification (:mod:`.verify` wraps them as
  verifiers);
* Token Recycling's template expansion and adjacency update;
* KV cache compaction.

The ``@triton.jit`` modules (tree_attention, greedy_verify, rejection_verify,
token_recycling, kv_compaction) are imported only when a Triton kernel runs.
"""

from verispec.kernels.backend import use_backend
from verispec.kernels.block_order import (
    block_friendly_order,
    count_nonempty_blocks,
    dfs_order,
    permute_tree,
)
from verispec.kernels.ops import (
    compact_kv,
    expand_template,
    greedy_verify,
    rejection_verify,
    tree_attention,
    update_adjacency,
)
from verispec.kernels.verify import KernelGreedy, KernelRecursiveRejection

__all__ = [
    "KernelGreedy",
    "KernelRecursiveRejection",
    "block_friendly_order",
    "compact_kv",
    "count_nonempty_blocks",
    "dfs_order",
    "expand_template",
    "greedy_verify",
    "permute_tree",
    "rejection_verify",
    "tree_attention",
    "update_adjacency",
    "use_backend",
]

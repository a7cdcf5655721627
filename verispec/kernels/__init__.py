"""Triton kernels for the hot path of a speculative step, each with a PyTorch twin.

``verispec.kernels.ops`` holds the host wrappers: they validate, allocate, build
the grid and run the Triton kernel or its PyTorch twin in
:mod:`verispec.kernels.reference`, as the switch in :mod:`verispec.kernels.backend`
says (``kernels="auto" | "triton" | "torch"``; ``auto``: Triton on CUDA, PyTorch
elsewhere). The rules' owners call them through it: :class:`~verispec.verifiers.Greedy`
and :class:`~verispec.verifiers.RecursiveRejection` (verification),
:class:`~verispec.drafters.TokenRecycling` (template expansion and adjacency update),
the HF adapter's KV cache (compaction) and its ``"verispec"`` attention.

* tree attention (block-sparse over the ancestor mask, causal without a mask, split
  over the prefix; :mod:`.block_order` for DySpec's depth-first node order;
  :mod:`.hf_attention` for transformers);
* greedy and recursive rejection tree verification;
* Token Recycling's template expansion and adjacency update;
* KV cache compaction.

The ``@triton.jit`` modules (tree_attention, greedy_verify, rejection_verify,
token_recycling, kv_compaction) are imported only when a Triton kernel runs;
``benchmarks/compile_check.py`` (a CI tool outside the package) compiles them for sm_90
and sm_80 without a GPU.
"""

from verispec.kernels.backend import (
    backend_for,
    tree_attention_backend,
    use_backend,
)
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

__all__ = [
    "backend_for",
    "block_friendly_order",
    "compact_kv",
    "count_nonempty_blocks",
    "dfs_order",
    "expand_template",
    "greedy_verify",
    "permute_tree",
    "rejection_verify",
    "tree_attention",
    "tree_attention_backend",
    "update_adjacency",
    "use_backend",
]

"""verispec's kernels: the C kernels of the CPU and the Triton kernels of the GPU.

What lives here, by folder:

* :mod:`verispec.kernels.cpu`: the C sources (block and integer products, the tree
  attention, a whole decoder layer, the logits' top-k), their builder
  (:mod:`~verispec.kernels.cpu.build`: once per machine and source, loaded with ``ctypes``)
  and the CPU's instruction sets (:mod:`~verispec.kernels.cpu.features`). The modules that
  hand them to the model are the runtime's accelerators, in
  :mod:`verispec.models.accelerators`.
* :mod:`verispec.kernels.triton`: the ``@triton.jit`` modules (tree attention, greedy and
  recursive rejection verification, Token Recycling's template expansion and adjacency
  update, KV compaction, the static attention and batch-invariant products of CUDA graphs),
  imported only when a Triton kernel runs.
* here: the host wrappers and their switch. :mod:`verispec.kernels.ops` validates,
  allocates, builds the grid and runs the Triton kernel or its PyTorch twin in
  :mod:`verispec.kernels.reference`, as :mod:`verispec.kernels.backend` says
  (``kernels="auto" | "triton" | "torch"``; ``auto``: Triton on CUDA, PyTorch elsewhere);
  :mod:`verispec.kernels.graph_ops` holds the operators of CUDA graphs,
  :mod:`verispec.kernels.hf_attention` the ``"verispec"`` attention of transformers,
  :mod:`verispec.kernels.block_order` DySpec's depth-first node order and
  :mod:`verispec.kernels.dtypes` the dtype names and the ``"auto"`` rule.

The rules' owners call them through :mod:`~verispec.kernels.ops`:
:class:`~verispec.verifiers.Greedy` and :class:`~verispec.verifiers.RecursiveRejection`
(verification), :class:`~verispec.drafters.TokenRecycling` (template expansion and
adjacency update), the HF adapter's KV cache (compaction) and its attention.
``benchmarks/compile_check.py`` (a CI tool outside the package) compiles the Triton
kernels for sm_90 and sm_80 without a GPU.
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

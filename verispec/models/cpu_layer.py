"""A whole decoder layer of the runtime in one C call on the CPU (``_cpu_layer.c``).

With the products reading GGUF blocks (:mod:`verispec.models.cpu_linear`) and the
attention in C (:mod:`verispec.models.cpu_attention`), what remained of a one-token step
on a small CPU was dispatch: about fifteen torch operators a layer (two norms, rotary,
slicing, SwiGLU, residuals) and the Python between them, some 40 % of the step.
:class:`LayerKernel` runs the decoder layers (:class:`~verispec.models.llama.Block`: norm,
query/key/value product, rotary, attention, output product and residual, norm, gate/up
product, SwiGLU, down product and residual), all of them, as one call a forward into the
library those kernels are built in.

Every step works row by row on the row-invariant products and attention, so a token's
result depends on its own input and the keys it sees only: a tree node equals decoding its
path one token at a time, bit for bit, as with the torch forward. The numbers differ from
the torch forward's by rounding (the norm's sum and SiLU's ``exp`` are computed in C).
:class:`~verispec.models.runtime.FastModel` uses it when every product of every layer is
a :class:`~verispec.models.cpu_linear.BlockLinear` and the C attention runs (eager,
float32, CPU); ``attention="torch"`` turns both off.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import cast

import torch

from verispec.models.cpu_attention import cpu_attention_available
from verispec.models.cpu_linear import BlockLinear, library, tensors_replaced
from verispec.models.llama import Block, KVCache, PassInputs

__all__ = ["LayerKernel"]


class _Weights(ctypes.Structure):
    """One product's weights as ``vs_layer`` reads them (``vs_weights`` in the C file)."""

    _fields_ = [
        ("kind", ctypes.c_int64),
        ("weight", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("n", ctypes.c_int64),
        ("k", ctypes.c_int64),
    ]


class LayerKernel:
    """Decoder layers (:class:`~verispec.models.llama.Block`) run as one C call a forward.

    Build it with :meth:`for_blocks`; call it with the layers' input and their caches. It
    reads the blocks' weights in place (a weight edited in place is seen), and reads them
    again after any product's tensor was replaced
    (:func:`~verispec.models.cpu_linear.tensors_replaced`).
    """

    def __init__(self, blocks: Sequence[Block]) -> None:
        first = blocks[0].attention
        self._blocks = tuple(blocks)
        self._heads = (first.n_heads, first.n_kv_heads, first.head_dim)
        self._eps = blocks[0].attention_norm.eps
        self._products = tuple(
            cast(BlockLinear, p)
            for b in blocks
            for p in (b.attention.wqkv, b.attention.wo, b.feed_forward.w13, b.feed_forward.w2)
        )
        norms = [(b.attention_norm.weight, b.ffn_norm.weight) for b in blocks]
        pointers = ctypes.c_void_p * len(blocks)
        self._norms = norms  # referenced: the pointers below stay valid
        self._attn_norms = pointers(*(a.data_ptr() for a, _ in norms))
        self._ffn_norms = pointers(*(f.data_ptr() for _, f in norms))
        self._subsets: dict[tuple[int, ...], LayerKernel] = {}
        self._bind()
        # the caches last seen, their identities, pointer arrays and capacity (_pointers)
        self._held_caches: tuple[KVCache, ...] = ()
        self._cache_ids: tuple[int, ...] = ()
        self._cache_keys = self._cache_values = (ctypes.c_void_p * 0)()
        self._capacity = 0

    def _pointers(
        self, caches: Sequence[KVCache]
    ) -> tuple[ctypes.Array[ctypes.c_void_p], ctypes.Array[ctypes.c_void_p]]:
        """The caches' key and value pointer arrays, rebuilt when other caches come (the
        runtime replaces its caches when they grow). Keyed by the caches' identities, which
        reads no cache object: a decoding step starts right after the products have streamed
        their weights through the CPU's caches, where reading 60 tensors' addresses cost
        about 0.1 ms. The caches are kept referenced, so an identity stays theirs."""
        ids = tuple(map(id, caches))
        if ids != self._cache_ids:
            array = ctypes.c_void_p * len(caches)
            self._cache_keys = array(*(c.k.data_ptr() for c in caches))
            self._cache_values = array(*(c.v.data_ptr() for c in caches))
            self._capacity = caches[0].k.shape[1]
            self._held_caches, self._cache_ids = tuple(caches), ids
        return self._cache_keys, self._cache_values

    def _bind(self) -> None:
        """Read the products' current tensors (kept referenced, so their memory stays)."""
        self._replacements = tensors_replaced()
        self._held = tuple((p.blocks, p.bias) for p in self._products)
        self._weights = (_Weights * len(self._products))(
            *(
                _Weights(
                    p.kind,
                    blocks.data_ptr(),
                    None if bias is None else bias.data_ptr(),
                    p.out_features,
                    p.in_features,
                )
                for p, (blocks, bias) in zip(self._products, self._held, strict=True)
            )
        )

    @classmethod
    def for_blocks(cls, blocks: Sequence[Block]) -> LayerKernel | None:
        """A kernel for ``blocks``, or ``None`` where it cannot run them: a product that is
        not a :class:`BlockLinear`, norms not float32 or of different epsilons, a head
        dimension or width the C code does not take, or no built library."""
        if not blocks or library() is None:
            return None
        eps = blocks[0].attention_norm.eps
        for block in blocks:
            attention, ffn = block.attention, block.feed_forward
            products = (attention.wqkv, attention.wo, ffn.w13, ffn.w2)
            norms = (block.attention_norm, block.ffn_norm)
            if not all(isinstance(p, BlockLinear) for p in products):
                return None
            if any(
                n.weight.dtype != torch.float32 or n.weight.device.type != "cpu" or n.eps != eps
                for n in norms
            ):
                return None
            if norms[0].weight.numel() % 8 or ffn.hidden_dim % 8:
                return None
            if not cpu_attention_available(attention.head_dim):
                return None
        return cls(blocks)

    def subset(self, layers: Sequence[int]) -> LayerKernel:
        """The kernel of these layers only, in this order (a self-draft's), kept."""
        key = tuple(layers)
        if key not in self._subsets:
            self._subsets[key] = LayerKernel([self._blocks[i] for i in key])
        return self._subsets[key]

    def __call__(
        self, x: torch.Tensor, inputs: PassInputs, caches: Sequence[KVCache]
    ) -> torch.Tensor:
        """The last layer's output for ``x`` (Shape: (Q, E), float32), each layer writing
        its new keys and values into its cache; arguments as
        :meth:`verispec.models.llama.Block.forward`, one cache per layer (a tree pass)."""
        lib = library()
        if lib is None:
            raise RuntimeError("the CPU kernels are unavailable (see cpu_linear.kernel_status)")
        if len(caches) != len(self._blocks):
            raise ValueError(f"{len(self._blocks)} layers need as many caches; got {len(caches)}")
        if tensors_replaced() != self._replacements:
            self._bind()  # a product's tensors may have been replaced
        out = x.contiguous().clone()
        cos, sin = inputs.cos.contiguous(), inputs.sin.contiguous()
        mask = inputs.local_mask.contiguous().view(torch.uint8)
        start = int(inputs.where[0])
        keys, values = self._pointers(caches)
        capacity = self._capacity
        heads, kv_heads, head_dim = self._heads
        q_len, width = out.shape
        status = lib.vs_layers(
            len(caches), out.data_ptr(), q_len, width, self._attn_norms, self._ffn_norms,
            self._eps, self._weights, cos.data_ptr(), sin.data_ptr(), keys, values, capacity,
            heads, kv_heads, head_dim, start, mask.data_ptr(), mask.shape[1],
            torch.get_num_threads(),
        )  # fmt: skip
        if status != 0:
            raise RuntimeError(
                f"the C layers refused their arguments or ran out of memory: Q={q_len}, "
                f"width={width}, start={start}, cache capacity {capacity}, "
                f"mask {tuple(mask.shape)}"
            )
        return out

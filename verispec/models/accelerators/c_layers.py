"""A whole decoder layer of the runtime in one C call on the CPU (``kernels/cpu/layer.c``).

With the products reading GGUF blocks (:mod:`verispec.models.accelerators.blocks`) and the
attention in C (:mod:`verispec.models.accelerators.c_attention`), what remained of a one-token step
on a small CPU was dispatch: about fifteen torch operators a layer (two norms, rotary,
slicing, SwiGLU, residuals) and the Python between them, a large part of the step.
:class:`LayerKernel` runs the decoder layers (:class:`~verispec.models.llama.Block`: norm,
query/key/value product, rotary, attention, output product and residual, norm, gate/up
product, SwiGLU, down product and residual), all of them, as one call a forward into the
library those kernels are built in.

Every step works row by row on the row-invariant products and attention, so a token's
result depends on its own input and the keys it sees only: a tree node equals decoding its
path one token at a time, bit for bit, as with the torch forward. The numbers differ from
the torch forward's by rounding (the norm's sum and SiLU's ``exp`` are computed in C).
:class:`~verispec.models.runtime.FastModel` uses it when every product of every layer is
a :class:`~verispec.models.accelerators.blocks.BlockLinear` and the C attention runs (eager,
float32, CPU); ``attention="torch"`` turns both off.

:meth:`LayerKernel.forward` runs the whole tree pass around the layers in the same call:
the embedding and rotary rows, the final norm, and for a decoding step (one pending token
and a draft tree below it, whose mask and positions it builds from the parents) the LM head
when it is a block product. In a step that follows the layers' weights through the CPU's
caches, each torch operator and Python line around them costs tens of
microseconds (docs/runtime.rst); the runtime's decoding steps run no torch operator at all
(:meth:`CLayers.decode_step`).

:class:`CLayers` is the accelerator: where every product is a block one and the C attention
runs, it runs the runtime's tree passes and decoding steps instead of
:meth:`Transformer.forward <verispec.models.llama.Transformer.forward>`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

from verispec.core.tree import DraftTree
from verispec.models.accelerators.base import Accelerator, Plan, find
from verispec.models.accelerators.blocks import BlockLinear, library, tensors_replaced
from verispec.models.accelerators.c_attention import CAttention, cpu_attention_available
from verispec.models.invariance import min_pass_tokens
from verispec.models.llama import Block, KVCache, Pass, PassInputs

if TYPE_CHECKING:
    from verispec.models.llama import Transformer

__all__ = ["CLayers", "LayerKernel"]


def _int64s(values: torch.Tensor | Sequence[int]) -> tuple[Any, int]:
    """Int64 values as a C pointer argument, and their count: a contiguous tensor's address,
    or a C array made of a list (a decoding step's single token and position)."""
    if isinstance(values, torch.Tensor):
        if values.dtype != torch.int64 or not values.is_contiguous() or values.device.type != "cpu":
            raise ValueError("token ids and positions must be contiguous int64 CPU tensors")
        return values.data_ptr(), values.numel()
    return (ctypes.c_int64 * len(values))(*values), len(values)


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
    (:func:`~verispec.models.accelerators.blocks.tensors_replaced`).
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
        # forward()'s model, embedding, rotary tables, final norm, head record and its blocks
        self._ends: tuple[Any, ...] | None = None

    def _pointers(
        self, caches: Sequence[KVCache]
    ) -> tuple[ctypes.Array[ctypes.c_void_p], ctypes.Array[ctypes.c_void_p]]:
        """The caches' key and value pointer arrays, rebuilt when other caches come (the
        runtime replaces its caches when they grow). Keyed by the caches' identities, which
        reads no cache object: a decoding step starts right after the products have streamed
        their weights through the CPU's caches, where reading 60 tensors' addresses is a
        measurable part of the step. The caches are kept referenced, so an identity stays theirs."""
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
        self._ends = None  # the head's may have been replaced too
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
        lib = self._library(caches)
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

    def forward(
        self,
        model: Transformer,
        tokens: torch.Tensor | Sequence[int],
        positions: torch.Tensor | Sequence[int],
        caches: Sequence[KVCache],
        start: int,
        mask: torch.Tensor | None = None,
        *,
        parents: Sequence[int] | None = None,
        rows: int = 0,
        prompt: bool = False,
        cache_only: bool = False,
    ) -> torch.Tensor:
        """A tree pass of ``model`` (whose decoder layers these are) from token ids, in one
        C call: the embedding and rotary rows, the layers, the final norm, and with
        ``rows`` > 0 the LM head on the last ``rows`` rows (a decoding step). With
        ``prompt``, a prompt's causal pass instead (no mask: each token sees every slot up to
        its own, through the prompt attention, ``kernels/cpu/prompt_attention.c``, whose rows
        are not row-invariant).

        Args:
            tokens: int64, Shape: (Q,) (a tensor or a list of ints).
            positions: int64, Shape: (Q,); with ``parents``, the root's position only.
            caches: one per layer; the new keys and values go to slots ``start`` on.
            mask: bool, Shape: (Q, W), which of the pass's slots each token sees (``None``
                with ``parents``: the tree's).
            parents: a root (``tokens[0]``) and the ``Q - 1`` nodes of a draft tree below
                it, node i's parent (``-1``: the root) before it: each node one position
                below its parent, seeing the root, its ancestors and itself.
            rows: 0 for the final-normed rows, Shape: (Q, E); else the logits of the last
                ``rows`` rows, Shape: (rows, V) (the head must be a
                :class:`~verispec.models.accelerators.blocks.BlockLinear`: :meth:`runs_head`).
            prompt: a causal prompt pass (no ``mask``, no ``parents``, ``rows`` 0).
            cache_only: with ``prompt``, write the caches only: the last layer stops at its
                keys and values, and no row is returned (Shape: (0, E)).

        Returns:
            float32, as ``rows`` says. The same bits, row by row, however the rows are split
            between passes: the embedding and rotary rows are copies, the norm is
            :meth:`__call__`'s, the head the block product's.
        """
        lib = self._library(caches)
        _, embedding, cos, sin, norm, head, _ = self._ends_of(model)
        if rows and head is None:
            raise ValueError("this model's LM head is not a block product; pass rows=0")
        token_ptr, q_len = _int64s(tokens)
        position_ptr, q_pos = _int64s(positions)
        if prompt:
            if mask is not None or parents is not None or rows or q_pos != q_len:
                raise ValueError(
                    f"a prompt pass takes a position for each token and no mask, parents or "
                    f"head rows; got {q_len} tokens, {q_pos} positions, rows={rows}"
                )
        elif cache_only:
            raise ValueError("cache_only=True is for a prompt pass (prompt=True)")
        elif parents is not None:
            parent_ptr, nodes = _int64s(parents)
            if nodes != q_len - 1 or q_pos != 1 or mask is not None:
                raise ValueError(
                    f"a tree pass takes the root's position and its nodes' parents, no mask; "
                    f"got {q_len} tokens, {q_pos} positions, {nodes} parents"
                )
        elif q_pos != q_len:
            raise ValueError(f"{q_len} tokens need as many positions; got {q_pos}")
        elif mask is None:
            raise ValueError("a pass needs a mask or its tree's parents; got neither")
        mask_ptr, mask_width = None, 0  # with parents, the C code builds the tree's
        if mask is not None:
            mask_u8 = mask.contiguous().view(torch.uint8)
            mask_ptr, mask_width = mask_u8.data_ptr(), mask_u8.shape[1]
        width = embedding.shape[1]
        if rows:
            shape = (rows, head.n)  # type: ignore[union-attr]
        else:
            shape = (0 if cache_only else q_len, width)
        out = torch.empty(shape, dtype=torch.float32)
        keys, values = self._pointers(caches)
        heads, kv_heads, head_dim = self._heads
        status = lib.vs_forward(
            len(caches), token_ptr, position_ptr, None if parents is None else parent_ptr, q_len,
            width, embedding.data_ptr(), embedding.shape[0], cos.data_ptr(), sin.data_ptr(),
            cos.shape[0], self._attn_norms, self._ffn_norms, norm.data_ptr(), self._eps,
            self._weights, ctypes.byref(head) if rows else None, rows, keys, values,
            self._capacity, heads, kv_heads, head_dim, start, mask_ptr, mask_width,
            None if cache_only else out.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        if status != 0:
            raise RuntimeError(
                f"the C forward refused its arguments or ran out of memory: Q={q_len}, "
                f"start={start}, rows={rows}, cache capacity {self._capacity}, mask width "
                f"{mask_width} (token ids must be in [0, {embedding.shape[0]}), positions in "
                f"[0, {cos.shape[0]}), a node's parent before it)"
            )
        return out

    def _library(self, caches: Sequence[KVCache]) -> ctypes.CDLL:
        """The built kernels, after checking ``caches`` and reading the products' tensors
        again where any was replaced."""
        lib = library()
        if lib is None:
            raise RuntimeError("the CPU kernels are unavailable (see blocks.kernel_status)")
        if len(caches) != len(self._blocks):
            raise ValueError(f"{len(self._blocks)} layers need as many caches; got {len(caches)}")
        if tensors_replaced() != self._replacements:
            self._bind()  # a product's tensors may have been replaced
        return lib

    def integer_products(self) -> bool:
        """Whether every product of these layers multiplies in integers
        (``arithmetic="int8"``), whose prompt form is the product itself."""
        return all(p.arithmetic == "int8" for p in self._products)

    def runs_head(self, model: Transformer) -> bool:
        """Whether :meth:`forward` can run ``model``'s LM head (a block product)."""
        return self._ends_of(model)[5] is not None

    def _ends_of(self, model: Transformer) -> tuple[Any, ...]:
        """What :meth:`forward` reads around the layers: ``(model, embedding, cos table, sin
        table, final norm weight, head record or None, head blocks)``, kept (and read again
        for another model, or when a product's tensors were replaced, as a move or cast of
        the model does)."""
        if self._ends is not None and self._ends[0] is model:
            return self._ends
        output = model.output
        head = None
        if isinstance(output, BlockLinear) and output.bias is None:
            head = _Weights(output.kind, output.blocks.data_ptr(), None,
                            output.out_features, output.in_features)  # fmt: skip
        embedding = model.tok_embeddings.weight.detach()
        tables = (model.rope_cos, model.rope_sin, model.norm.weight.detach())
        names = ("embedding", "cos", "sin", "norm")
        for name, t in zip(names, (embedding, *tables), strict=True):
            if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous():
                raise ValueError(f"the C forward needs a float32, contiguous CPU {name}")
        held = output.blocks if head is not None else None
        self._ends = (model, embedding, *tables, head, held)
        return self._ends


class CLayers(Accelerator):
    """The accelerator that runs a tree pass (the embedding and rotary rows, every layer, the
    final norm) in one C call (:meth:`LayerKernel.forward`), and, where every product is a
    block one and the LM head too, a whole decoding step (:meth:`decode_step`).

    It attaches where the C attention runs (:class:`~.c_attention.CAttention`) and every
    product of every layer is a :class:`~.blocks.BlockLinear`
    (:meth:`LayerKernel.for_blocks`).

    Attributes:
        model: the model whose layers it runs.
        kernel: its :class:`LayerKernel`.
        decodes: whether :meth:`decode_step` runs (one-row passes and a block-product head).
        prompts: whether the runtime's prompt passes run here (:meth:`prompt_pass`): where
            every product multiplies in integers, its prompt form is its tree form, so the C
            layers run the prompt pass's own products (float32 products have GEMMs over
            widened weights there, which these layers do not run).
    """

    label = "+C layers"
    replaces = CAttention

    def __init__(self, model: Transformer, kernel: LayerKernel) -> None:
        self.model, self.kernel = model, kernel
        groups = model.args.n_heads // model.args.n_kv_heads
        self.decodes = min_pass_tokens(model, groups) == 1 and kernel.runs_head(model)
        self.prompts = kernel.integer_products()
        self.forward = self.tree_pass

    @classmethod
    def attach(
        cls, model: Transformer, plan: Plan, attached: Sequence[Accelerator]
    ) -> CLayers | None:
        if find(attached, CAttention) is None:
            return None
        kernel = LayerKernel.for_blocks(model.blocks)
        return None if kernel is None else cls(model, kernel)

    def _kernel(self, layers: tuple[int, ...] | None) -> LayerKernel:
        return self.kernel if layers is None else self.kernel.subset(layers)

    def tree_pass(self, p: Pass) -> torch.Tensor:
        """:meth:`Transformer.forward <verispec.models.llama.Transformer.forward>`'s tree
        pass (same arguments, same rows to rounding: the norms' sums of squares are computed
        in C), in one C call. A step runs right after the layers have streamed their weights
        through the CPU's caches, where each Python or torch call costs tens of
        microseconds."""
        kernel = self._kernel(p.layers)
        return kernel.forward(
            self.model, p.tokens, p.positions, p.caches, int(p.where[0]), p.local_mask
        )

    def prompt_pass(self, p: Pass, *, cache_only: bool = False) -> torch.Tensor:
        """A prompt's causal pass (``PassKind.PROMPT``; ``p.local_mask`` causal, as wide as
        its tokens) in one C call: the same products as :meth:`tree_pass`, the prompt
        attention (``kernels/cpu/prompt_attention.c``), the final-normed rows (none with
        ``cache_only``: the last layer then writes its keys and values only)."""
        if p.local_mask.shape != (p.tokens.numel(), p.tokens.numel()):
            raise ValueError(
                f"a prompt pass is causal over its own tokens; got a mask of shape "
                f"{tuple(p.local_mask.shape)} for {p.tokens.numel()} tokens"
            )
        return self._kernel(p.layers).forward(
            self.model, p.tokens, p.positions, p.caches, int(p.where[0]), prompt=True,
            cache_only=cache_only,
        )  # fmt: skip

    def decode_step(
        self,
        token: int,
        position: int,
        caches: list[KVCache],
        start: int,
        tree: DraftTree | None = None,
        layers: tuple[int, ...] | None = None,
    ) -> torch.Tensor:
        """A decoding step's logits, Shape: (N + 1, V): ``token`` at ``position`` (row 0)
        and the N nodes of ``tree`` below it (none: a plain step), their keys and values
        written from slot ``start`` of every cache on, the embedding, the layers, the final
        norm and the LM head in one C call (a block-product head: :attr:`decodes`). Bit for
        bit the rows of a :meth:`tree_pass` and the model's ``logits`` on them."""
        nodes = tree.tokens.tolist() if tree is not None else []
        parents = tree.parents.tolist() if tree is not None else []
        return self._kernel(layers).forward(
            self.model, [token, *nodes], (position,), caches, start, parents=parents,
            rows=1 + len(nodes),
        )  # fmt: skip

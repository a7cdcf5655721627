"""The fast runtime: verispec's own Llama-family forward behind the ``LanguageModel`` protocol.

:class:`FastModel` runs a :class:`~verispec.models.llama.Transformer` built from a
loaded ``transformers`` model (Llama, Qwen2, Mistral: SmolLM2 included) and keeps its
KV cache the way tree decoding wants it: one preallocated key and value tensor per
layer, the pending tokens and tree nodes written into their slots in place, a commit
that moves only the accepted nodes' entries, attention over the used slots only. No
cache is allocated or copied per step (the buffers grow by doubling, rarely).

What makes it fast are the accelerators of :mod:`verispec.models.accelerators`, each in its
own module, switchable off by an option, and installed on the plain model from outside:
:class:`FastModel` makes one :class:`~verispec.models.accelerators.base.Plan` of its options
and offers the model to each accelerator once, when it is built
(:func:`~verispec.models.accelerators.registry.accelerate`):

* **GGUF blocks** (CPU, float32, ``weights="auto"``): every matrix that is exactly Q4_1 or
  Q8_0 blocks (a model dequantized from a GGUF file, as the embedded SmolLM2) is read as
  those blocks by a C kernel whose rows are invariant from one row up
  (:mod:`~verispec.models.accelerators.blocks`): the same weights at a sixth of the bytes;
  with ``arithmetic="int8"``, multiplied in integers.
* **Prepacked weights** (CPU, float32 and bfloat16): every other ``nn.Linear`` is replaced
  by a :class:`~verispec.models.accelerators.onednn.PackedLinear`, whose weight is reordered
  once into oneDNN's blocked layout.
* **Compiled buckets** (optional, ``compile=True``): the forward compiled with
  ``torch.compile`` once per bucket of tree sizes
  (:mod:`~verispec.models.accelerators.compiled`); :meth:`FastModel.warm_up` compiles them
  all up front and says how long it took.
* **CUDA graphs** (on CUDA, by default): one captured forward per bucket, replayed
  (:mod:`~verispec.models.accelerators.graphs`), with Triton's static attention where it
  runs. The same code runs on a GPU, without prepacking.
* **The attention and the layers in C** (CPU, float32, eager, ``attention="auto"``): each
  layer's tree-pass attention core is the C kernel
  (:mod:`~verispec.models.accelerators.c_attention`), and where every product is a block
  one, all the layers and a whole decoding step run as one C call
  (:mod:`~verispec.models.accelerators.c_layers`).

How many rows each pass and product runs on, so that a token's logits are the same in a
1-node and a 60-node step, is :mod:`verispec.models.invariance`'s rule. ``dtype="auto"``
(:func:`~verispec.kernels.dtypes.auto_dtype`) picks float32 where the weights are a GGUF
file's blocks and the block kernel runs (the products read the blocks: the fastest choice,
and exact), else bfloat16 only where the CPU multiplies it natively (AVX-512 BF16 or AMX)
and float32 elsewhere (:func:`~verispec.kernels.cpu.features.default_dtype`).

Shape glossary: N tree nodes, V vocabulary, Q fed tokens, E model width.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import torch
from torch import Tensor

from verispec.core.notices import waiting
from verispec.core.tree import DraftTree
from verispec.core.validate import boolean, integer
from verispec.errors import ConfigError
from verispec.kernels.dtypes import FLOAT_DTYPES, auto_dtype, dtype_names
from verispec.kernels.ops import compact_kv, graph_kernels_unavailable
from verispec.models._sequence import TreeSequenceModel, layer_indices
from verispec.models.accelerators.base import Accelerator, Plan, find
from verispec.models.accelerators.blocks import (
    ARITHMETICS,
    BlockProducts,
    holds_blocks,
    kernel_status,
    source_id,
)
from verispec.models.accelerators.buckets import BUCKETS, BucketedForward
from verispec.models.accelerators.c_attention import CAttention
from verispec.models.accelerators.c_layers import CLayers
from verispec.models.accelerators.onednn import Prepacked
from verispec.models.accelerators.probe import row_invariant_kernels
from verispec.models.accelerators.registry import accelerate
from verispec.models.invariance import VALUE_BLOCK, min_pass_tokens, min_product_rows
from verispec.models.llama import KVCache, Pass, PassKind, Transformer, from_hf

_A = TypeVar("_A", bound=Accelerator)
__all__ = [
    "C_PROMPT_PASS_TOKENS",
    "PROMPT_PASS_TOKENS",
    "WEIGHTS",
    "FastModel",
    "prompt_pass_tokens",
]

_MIN_CAPACITY = 1024  # first cache allocation, in slots; doubles when full
# Prompt tokens per prefill pass: bounds the activations (8,192 rows of the gate/up
# product are 100 MB); the fused attention needs no score matrix.
_PREFILL_CHUNK = 8192
PROMPT_PASS_TOKENS = 64
"""At one thread, a prefill chunk of at least this many tokens runs as a prompt pass
(``PassKind.PROMPT``, :class:`~verispec.models.llama.PassKind`): float32 GEMMs over the
widened blocks and one fused attention call. Shorter ones run the tree kernels: widening a
matrix costs about as much as a few rows of its product, and their rows stay equal to
one-token decoding's. With more threads the threshold is :func:`prompt_pass_tokens`'s; where
the prompt pass runs in C, :data:`C_PROMPT_PASS_TOKENS`."""

C_PROMPT_PASS_TOKENS = 32
"""The same threshold where the prompt pass is one C call (integer products with the C
layers: :meth:`~verispec.models.accelerators.c_layers.CLayers.prompt_pass`), at any thread
count: its products are the tree kernels' own, and its causal attention and feed-forward in
chunks cost less than the tree attention from a few dozen tokens on
(``benchmarks/prefill.py --paths --arithmetic int8``; docs/benchmarks.rst)."""


def prompt_pass_tokens(threads: int) -> int:
    """The shortest prefill chunk that runs as a prompt pass on ``threads`` threads:
    :data:`PROMPT_PASS_TOKENS` at one thread, twice that from two: a second thread speeds the
    tree kernels up more than the prompt pass on a short prompt. The thresholds sit near
    where the two paths cross on the CPUs measured (``benchmarks/prefill.py --paths``;
    figures in docs/benchmarks.rst); not measured beyond two threads."""
    return PROMPT_PASS_TOKENS if threads <= 1 else 2 * PROMPT_PASS_TOKENS


_SLOT_ALIGN = VALUE_BLOCK  # attended slots are padded to whole value blocks (see _feed_once)


class FastModel(TreeSequenceModel):
    """A Llama-family model on verispec's own forward, as a ``LanguageModel``.

    Batch size 1. Build it from a loaded ``transformers`` model; the weights are copied
    (fused, cast, prepacked) and the source model is kept as :attr:`hf_model` (the
    reference, and the ``hf`` peers of the benchmark), unless ``keep_source=False``.

    Args:
        hf_model: ``LlamaForCausalLM``, ``Qwen2ForCausalLM`` or ``MistralForCausalLM``
            (SmolLM2 is a Llama).
        dtype: weight dtype: ``torch.float32``, ``torch.bfloat16``, ``torch.float16``,
            ``torch.float64`` or ``"auto"`` (:func:`~verispec.kernels.dtypes.auto_dtype`:
            float32 for a GGUF file's blocks on a CPU the block kernel runs on, else
            :func:`~verispec.kernels.cpu.features.default_dtype`); ``None`` keeps the
            source model's.
        max_length: cap on the context (prompt plus generated plus tree); defaults to
            ``max_position_embeddings``.
        prepack: ``"auto"`` prepacks for oneDNN where it helps (CPU, float32 or native
            bfloat16); ``False`` runs the plain ``nn.Linear`` forward.
        compile: compile the forward (off by default). On the CPU, once per tree-size
            bucket (:mod:`verispec.models.accelerators.compiled`); on CUDA with graphs, once for all
            buckets, then captured per bucket (:mod:`verispec.models.accelerators.graphs`). Call
            :meth:`warm_up` to compile before use.
        cuda_graphs: replay the forward from CUDA graphs, one per bucket
            (:mod:`verispec.models.accelerators.graphs`); ``"auto"``: on CUDA.
        batch_invariant: on CUDA, every product (the projections, the LM head, both
            products of the attention) and every norm runs a Triton kernel with one fixed
            tiling and summation order, so a row's
            result does not depend on how many rows run with it: tree rows equal sequential
            rows bit for bit, as the CPU kernels give
            (:mod:`verispec.kernels.triton.batch_invariant`, :mod:`verispec.kernels.graph_ops`).
            Off by default; ``True`` needs CUDA (or Triton's interpreter on the CPU, for
            tests).
        keep_source: keep a reference to ``hf_model`` as :attr:`hf_model`. ``False``
            drops it (:attr:`hf_model` is ``None``), so that its weights are freed once
            no one else holds the model: the runtime's copies are all it needs (about
            510 MiB less resident memory for SmolLM2 in float32).
        weights: how the CPU products read float32 weights. ``"auto"`` (default): every
            matrix that is exactly a GGUF low-bit block format (Q4_1, Q4_0, Q8_0: a model
            dequantized from a GGUF file, as the embedded SmolLM2) is read as those blocks
            by verispec's CPU kernel (:mod:`verispec.models.accelerators.blocks`): the same
            weights, bit for bit, at a sixth of the bytes; the others as ``"dense"``.
            ``"blocks"``: the same, but an error if the kernel cannot run or a matrix is not
            exactly blocks.
            ``"dense"``: float32 matrices (oneDNN when prepacked). ``"q4_1"``: round the
            projections to Q4_1 and the LM head to Q8_0 first, as llama.cpp's Q4_1 files
            hold them, then read them as blocks: a *different model* (4-bit weights), for
            float32 models that do not come from such a file.
        attention: ``"auto"`` (default): on the CPU in float32, eager, the attention runs
            as one C call a layer (:mod:`verispec.models.accelerators.c_attention`; its rows
            depend on their own keys only, so tree rows still equal sequential decoding bit
            for bit);
            ``"torch"``: :func:`~verispec.models.attention.attend`'s torch operators (and
            :func:`~verispec.models.attention.attend_static` in CUDA graphs, which attends to
            the whole cache, masked); ``"triton"``: in CUDA graphs, the Triton kernel that
            reads only the cache's used slots, in a fixed order
            (:func:`verispec.kernels.graph_ops.static_attention`; needs CUDA or Triton's
            interpreter). ``"auto"`` picks it with CUDA graphs where Triton is installed;
            ``batch_invariant=True`` implies it.
        arithmetic: how the CPU block products multiply
            (:data:`~verispec.models.accelerators.blocks.ARITHMETICS`). ``"exact"`` (default):
            float32 products of the widened weights, the model unchanged. ``"int8"``: each
            row's activations are rounded to 8-bit codes per 32 values (llama.cpp's Q8_1)
            and multiplied by the weights' codes in integer instructions
            (``kernels/cpu/int8.c``), the LM head and the prompt pass included: a *different
            model*, the one llama.cpp computes, whose tree rows cost less than float32
            ones (figures: docs/benchmarks.rst). Matrices that are exactly Q4_1, Q4_0 or
            Q8_0 blocks keep their codes; any other (a dense model) is rounded to Q8_0 blocks at
            load. Needs the CPU kernel, float32
            (``dtype`` float32 or ``"auto"``) and ``weights`` other than ``"dense"``.
            Speculative decoding is exact with respect to this model: every method's
            answer equals its own ``ar``'s (docs/runtime.rst, "Integer arithmetic").
        gguf_file: the GGUF file ``hf_model`` was dequantized from
            (:func:`~verispec.models.load_model` passes it). Its matrices are then read as
            the file's own blocks (:mod:`verispec.models.gguf_rows`), in every format
            llama.cpp's presets write, F16 and BF16 as halves, where float32 recovery
            finds only Q4_1, Q4_0 and Q8_0; each is checked to widen to the weights bit for
            bit (docs/models.rst, "GGUF formats").

    The caches are kept across sequences (``reset`` forgets the tokens, not the
    buffers), so a second generation allocates nothing.

    Raises:
        UnsupportedModelError: an architecture or rotary scaling the runtime does not
            cover (use :class:`~verispec.models.HFModel`).
    """

    def __init__(
        self,
        hf_model: Any,
        *,
        dtype: torch.dtype | str | None = None,
        max_length: int | None = None,
        prepack: bool | str = "auto",
        compile: bool = False,
        cuda_graphs: bool | str = "auto",
        keep_source: bool = True,
        weights: str = "auto",
        attention: str = "auto",
        batch_invariant: bool = False,
        arithmetic: str = "exact",
        gguf_file: str | os.PathLike[str] | None = None,
    ) -> None:
        boolean("keep_source", keep_source)
        boolean("batch_invariant", batch_invariant)
        if arithmetic not in ARITHMETICS:
            raise ConfigError(f"`arithmetic` must be one of {ARITHMETICS}; got {arithmetic!r}.")
        if attention not in ("auto", "torch", "triton"):
            raise ConfigError(
                f"`attention` must be 'auto', 'torch' or 'triton'; got {attention!r}."
            )
        if weights not in WEIGHTS:
            raise ConfigError(f"`weights` must be one of {WEIGHTS}; got {weights!r}.")
        source = None if gguf_file is None else Path(gguf_file).expanduser()
        if source is not None and not source.is_file():
            raise ConfigError(f"`gguf_file` must be a GGUF file; got {str(gguf_file)!r}, no file.")
        config = hf_model.config
        context = int(getattr(config, "max_position_embeddings", 2048))
        window = getattr(config, "sliding_window", None)
        if window and getattr(config, "use_sliding_window", True):
            context = min(context, int(window))  # no sliding window is applied
        if max_length is not None:
            integer("max_length", max_length, 2)
            context = min(context, max_length)
        device = next(hf_model.parameters()).device
        if arithmetic == "int8":
            dtype = _int8_dtype(device, dtype, weights, batch_invariant)
        if dtype == "auto":
            dtype = auto_dtype(device, blocks=holds_blocks(hf_model, source))
        if dtype is not None and dtype not in FLOAT_DTYPES:
            raise ConfigError(f"`dtype` must be one of {dtype_names()} or 'auto'; got {dtype!r}.")
        if prepack not in (True, False, "auto"):
            raise ConfigError(f"`prepack` must be True, False or 'auto'; got {prepack!r}.")
        if cuda_graphs not in (True, False, "auto"):
            raise ConfigError(f"`cuda_graphs` must be True, False or 'auto'; got {cuda_graphs!r}.")
        if cuda_graphs is True and device.type != "cuda":
            raise ConfigError(f"`cuda_graphs=True` needs a CUDA model; got {device}.")
        unavailable = graph_kernels_unavailable(device)
        for name, wanted in (("batch_invariant", batch_invariant), ("attention", attention)):
            if wanted in (True, "triton") and unavailable is not None:
                raise ConfigError(
                    f"`{name}={wanted!r}` needs the Triton kernels, which cannot run here: "
                    f"{unavailable}"
                )
        transformer = from_hf(hf_model, dtype=dtype, max_positions=context)  # type: ignore[arg-type]
        graphs = cuda_graphs is True or (cuda_graphs == "auto" and device.type == "cuda")
        if batch_invariant:
            weights, prepack, attention = "dense", False, "triton"  # Triton replaces them
        elif attention == "auto" and graphs and unavailable is None:
            attention = "triton"  # reads the used slots only (docs/runtime.rst, CUDA graphs)
        plan = Plan(
            device,
            weights,
            arithmetic,
            attention,
            prepack,
            compile,
            graphs,
            batch_invariant,
            source,
        )
        # What runs around the plain forward, chosen here once (models/accelerators/).
        shared = _SharedRuntime(
            transformer,
            hf_model if keep_source else None,
            accelerate(transformer, plan),
            config=config,
            source_name=type(hf_model).__name__,
            eos_token_id=_eos_token_id(hf_model),
            batch_invariant=batch_invariant,
        )
        self._setup(shared, context, tuple(range(transformer.args.n_layers)))

    @classmethod
    def _view(cls, shared: _SharedRuntime, max_length: int, layers: tuple[int, ...]) -> FastModel:
        view = cls.__new__(cls)
        view._setup(shared, max_length, layers)
        return view

    def _setup(self, shared: _SharedRuntime, max_length: int, layers: tuple[int, ...]) -> None:
        self._shared = shared
        self.transformer = shared.transformer
        self.hf_model = shared.hf_model
        self.config = shared.config
        self.layer_indices = layers
        self.vocab_size = self.transformer.args.vocab_size
        self.max_length = max_length
        self.device = self.transformer.rope_cos.device
        self.dtype = self.transformer.weight_dtype
        self.eos_token_id = shared.eos_token_id
        # None (every layer) keeps the full model's call the plain one
        full = layers == tuple(range(len(self.transformer.layers)))
        self._layers_arg = None if full else layers
        self._caches: list[KVCache] = []
        self._init_sequence()

    # -- construction -------------------------------------------------------------------

    def self_draft(
        self, layers: int | Sequence[int], *, max_length: int | None = None
    ) -> FastModel:
        """A draft model that runs only ``layers`` of this model, sharing its weights.

        The view runs the chosen decoder layers in order, then the final norm and the
        LM head, with its own cache. No weight is copied.

        Args:
            layers: ``n`` for the first ``n`` layers, or strictly increasing layer indices.
        """
        chosen = layer_indices(layers, self.transformer.args.n_layers)
        return FastModel._view(
            self._shared, self.max_length if max_length is None else max_length, chosen
        )

    @property
    def num_layers(self) -> int:
        return len(self.layer_indices)

    @property
    def row_invariant(self) -> bool:
        """Whether this machine's kernels make every tree row equal sequential decoding, bit
        for bit, at this model's shapes and dtype
        (:func:`~verispec.models.accelerators.probe.row_invariant_kernels`; see
        docs/runtime.rst, "Tree rows and sequential decoding")."""
        if self._shared.batch_invariant:
            return True  # every product and norm is a fixed-order Triton kernel
        args = self.transformer.args
        q_width = args.n_heads * args.head_dim
        return row_invariant_kernels(
            self.dtype if self._shared.find(Prepacked) else self.transformer.compute_dtype,
            self.device,
            head_dim=args.head_dim,
            widths=tuple(sorted({args.dim, q_width, args.hidden_dim})),
            groups=args.n_heads // args.n_kv_heads,
        )

    @property
    def runtime(self) -> str:
        """What runs the forward: ``"eager"``, ``"compiled"``, ``"cuda-graphs"`` or
        ``"compiled+cuda-graphs"``, plus ``"+GGUF blocks"`` if products read low-bit blocks
        (``weights``), ``"+int8 products"`` with ``arithmetic="int8"``, ``"+oneDNN"`` if
        weights are prepacked, ``"+C attention"`` if the attention is one C call a layer,
        ``"+Triton attention"`` if the static passes run
        :func:`~verispec.kernels.graph_ops.static_attention`, ``"+batch-invariant"`` with
        ``batch_invariant=True``."""
        wrapper = self._shared.wrapper
        name = "eager" if wrapper is None else wrapper.name
        accelerators = self._shared.accelerators
        replaced = {a.replaces for a in accelerators if a.replaces is not None}
        return name + "".join(a.describe() for a in accelerators if type(a) not in replaced)

    @property
    def kernel_id(self) -> str:
        """The C kernels' source hash (:func:`~verispec.models.accelerators.blocks.source_id`) where
        the forward runs them, else ``""``: latency tables are keyed by it."""
        in_c = self._shared.find(BlockProducts) or self._shared.find(CAttention)
        return source_id() if in_c else ""

    @property
    def setup_s(self) -> float:
        """Seconds spent compiling or capturing graphs so far (0 in eager mode); shared
        with self-drafts."""
        wrapper = self._shared.wrapper
        return 0.0 if wrapper is None else float(wrapper.setup_s)

    def warm_up(self) -> float:
        """Compile (or capture) every bucket now; return the seconds it took.

        A no-op returning 0 in eager mode. Each self-draft view builds its own graphs with
        its own ``warm_up``. Call it before timing anything.
        """
        wrapper = self._shared.wrapper
        if wrapper is None:
            return 0.0
        self._reserve(1)
        with waiting("compiling the runtime's graphs, one per tree-size bucket"):
            return float(wrapper.warm_up(self._caches, self._layers_arg))

    # -- introspection (tests, debugging) -----------------------------------------------

    def kv_cache(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The committed entries of each run layer: keys, values, Shape: (1, Hkv, S, D)."""
        return [
            (c.k[None, :, : self._cached], c.v[None, :, : self._cached, : c.head_dim])
            for c in self._caches
        ]

    # -- TreeSequenceModel hooks --------------------------------------------------------

    def _clear(self) -> None:
        """Nothing to free: the buffers serve the next sequence (stale slots are masked)."""

    def _truncate(self, length: int) -> None:
        """Nothing to move: a pass writes its slots and attends only to those before them."""

    def _compact(self, start: int, source: torch.Tensor) -> None:
        compact_kv([t for c in self._caches for t in (c.k, c.v)], start, source)

    def reserve(self, tokens: int) -> None:
        """Size the cache for a sequence of up to ``tokens`` committed tokens plus a tree.

        The decoder calls it before each generation with the prompt length plus
        ``max_new_tokens``, so the cache is allocated once, not grown mid-generation.
        """
        self._reserve(min(tokens, self.max_length) + self._shared.largest_pass + _SLOT_ALIGN)

    def _reserve(self, slots: int) -> None:
        """Make every cache hold at least ``slots`` slots (allocate, or double and copy)."""
        capacity = self._caches[0].capacity if self._caches else 0
        if slots <= capacity:
            return
        new_capacity = max(self._shared.first_capacity(self.max_length), 2 * capacity)
        while new_capacity < slots:
            new_capacity *= 2
        fresh = self.transformer.setup_caches(new_capacity, len(self.layer_indices))
        for old, new in zip(self._caches, fresh, strict=False):
            new.k[:, :capacity] = old.k
            new.v[:, :capacity] = old.v
        self._caches = fresh

    def _decode_step(self, tree: DraftTree) -> torch.Tensor | None:
        """With the C layers and a block-product head (eager CPU, float32), the whole step
        in one C call (:meth:`~verispec.models.accelerators.c_layers.CLayers.decode_step`):
        no mask, index or position tensor is built, no torch operator runs around it."""
        layers = self._shared.layers
        if layers is None or not layers.decodes:
            return None
        start = self._cached  # as _feed_once places the rows: from slot `visible`, unpadded
        self._reserve(-(-(start + 1 + tree.num_nodes) // _SLOT_ALIGN) * _SLOT_ALIGN)
        return layers.decode_step(
            self._pending[0], start, self._caches, start, tree, self._layers_arg
        )

    def _feed(
        self, tokens: Tensor, positions: Tensor, visible: int, local_mask: Tensor | None,
        keep_rows: int | None,
    ) -> Tensor:  # fmt: skip
        """See :meth:`TreeSequenceModel._feed`. A long causal pass runs in chunks."""
        queries = tokens.numel()
        if queries == 0:  # nothing to feed (extend_from == N)
            return torch.empty((0, self.vocab_size), dtype=torch.float32, device=self.device)
        if local_mask is None:  # causal prefill, in chunks of _PREFILL_CHUNK tokens
            threshold = self._shared.prompt_pass_tokens()
            for first in range(0, queries, _PREFILL_CHUNK):
                last = min(first + _PREFILL_CHUNK, queries)
                causal = torch.ones(last - first, last - first, dtype=torch.bool).tril_()
                rows = keep_rows if last == queries else 0
                logits = self._feed_once(
                    tokens[first:last], positions[first:last], visible + first, causal, rows,
                    prompt=last - first >= threshold,
                )  # fmt: skip
            return logits
        return self._feed_once(tokens, positions, visible, local_mask, keep_rows)

    @torch.no_grad()  # not inference_mode: callers may modify the logits in place
    def _feed_once(
        self, tokens: Tensor, positions: Tensor, visible: int, local_mask: Tensor,
        keep_rows: int | None, *, prompt: bool = False,
    ) -> Tensor:  # fmt: skip
        """One pass; ``prompt``: a prefill chunk, run eagerly as a ``PassKind.PROMPT`` pass
        (:class:`~verispec.models.llama.PassKind`); any other pass is a tree pass."""
        queries, width = local_mask.shape
        # Pad to the bucket: pad tokens attend only to themselves, and their slots, after
        # the real ones, are masked for every real token.
        padded = self._shared.bucket(queries)
        if padded > queries:
            pad = padded - queries
            tokens = torch.cat([tokens, tokens.new_zeros(pad)])
            positions = torch.cat([positions, positions.new_zeros(pad)])
            grown = torch.zeros(padded, width + pad, dtype=torch.bool)
            grown[:queries, :width] = local_mask
            grown[queries:, width:] = torch.eye(pad, dtype=torch.bool)
            local_mask, width = grown, width + pad
        start = visible + width - padded
        # Attend to a multiple of _SLOT_ALIGN slots, the extra ones masked: with the
        # row-invariant kernels, a product's result then does not depend on how many
        # slots this pass happens to use.
        length = -(-(start + padded) // _SLOT_ALIGN) * _SLOT_ALIGN
        self._reserve(length)
        where = torch.tensor([start, length])
        rows = queries if keep_rows is None else keep_rows
        forward = self._shared.prompt_forward(rows == 0) if prompt else self._shared.forward
        if self.device.type != "cpu":  # the host built them (on the CPU: no call at all)
            tokens, positions, local_mask = (
                t.to(self.device, non_blocking=True) for t in (tokens, positions, local_mask)
            )
        with torch.inference_mode():
            hidden = forward(
                Pass(tokens, positions, self._caches, where, local_mask, self._layers_arg)
            )  # (padded, E)
        if rows == 0:
            return torch.empty((0, self.vocab_size), dtype=torch.float32, device=self.device)
        # The head's rows: as many as its product's row invariance needs (invariance.py).
        least = self._shared.head_rows
        first = max(0, min(queries - rows, padded - least))
        logits = self.transformer.logits(hidden[first : max(queries, first + least)])
        return logits[queries - rows - first : queries - first]

    def __repr__(self) -> str:
        return (
            f"FastModel({self._shared.source_name}, layers={self.num_layers}/"
            f"{len(self.transformer.layers)}, vocab_size={self.vocab_size}, "
            f"max_length={self.max_length}, dtype={self.dtype}, device={self.device}, "
            f"runtime={self.runtime})"
        )


WEIGHTS = ("auto", "blocks", "dense", "q4_1")
"""How :class:`FastModel` reads float32 weights on the CPU (its ``weights`` argument)."""


def _int8_dtype(device: torch.device, dtype: Any, weights: str, batch_invariant: bool) -> Any:
    """The dtype ``arithmetic="int8"`` runs in (float32), after checking that it can run:
    a CPU with the block kernel, float32 (or ``"auto"``), block products."""
    ok, why = kernel_status() if device.type == "cpu" else (False, f"the model is on {device}")
    if not ok:
        raise ConfigError(f"`arithmetic='int8'` needs verispec's CPU kernel: {why}.")
    if dtype not in ("auto", None, torch.float32):
        raise ConfigError(f"`arithmetic='int8'` runs in float32; got dtype={dtype!r}.")
    if weights == "dense" or batch_invariant:
        raise ConfigError(
            "`arithmetic='int8'` multiplies block codes: it needs weights='auto', 'blocks' or "
            f"'q4_1' and batch_invariant=False; got weights={weights!r}, "
            f"batch_invariant={batch_invariant!r}."
        )
    return torch.float32


def _min_rows(runtime: _SharedRuntime) -> int:
    """Tokens a pass runs on at least (the rule: :mod:`verispec.models.invariance`)."""
    args = runtime.transformer.args
    return min_pass_tokens(runtime.transformer, args.n_heads // args.n_kv_heads)


@attrs.define(eq=False)
class _SharedRuntime:
    """The runtime a :class:`FastModel` and its self-draft views share, built once: the
    weights (``transformer``), the source model and its metadata, and what runs around the
    plain forward (which kernels, the compiled or graphed wrapper). Each model keeps its
    own caches and sequence; this holds nothing of a sequence."""

    transformer: Transformer
    hf_model: Any  # None: dropped (keep_source=False)
    accelerators: tuple[Accelerator, ...]  # installed on ``transformer``, in order
    config: Any = None  # the source's config
    source_name: str = ""  # the source's class name
    eos_token_id: Any = None
    batch_invariant: bool = False  # every product and norm a fixed-order Triton kernel
    wrapper: BucketedForward | None = attrs.field(
        init=False, default=attrs.Factory(lambda s: s.find(BucketedForward), takes_self=True)
    )  # compiled or graphed buckets; None: eager
    layers: CLayers | None = attrs.field(
        init=False, default=attrs.Factory(lambda s: s.find(CLayers), takes_self=True)
    )  # tree passes and decoding steps in one C call
    min_rows: int = attrs.field(
        init=False, default=attrs.Factory(_min_rows, takes_self=True)
    )  # tokens a pass runs on at least
    head_rows: int = attrs.field(
        init=False,
        default=attrs.Factory(lambda s: min_product_rows(s.transformer.output), takes_self=True),
    )  # rows the LM head's product runs on at least (invariance.py), read once

    def find(self, kind: type[_A]) -> _A | None:
        """The installed accelerator of class ``kind``, or ``None``."""
        return find(self.accelerators, kind)

    @property
    def forward(self) -> Any:
        """What runs a tree pass: the buckets' forward, the C layers', or the plain one."""
        if self.wrapper is not None:
            return self.wrapper
        return self.transformer if self.layers is None else self.layers.forward

    def prompt_forward(self, cache_only: bool) -> Any:
        """What runs a prompt pass (``PassKind.PROMPT``): one C call where the C layers run
        it (:attr:`CLayers.prompts <verispec.models.accelerators.c_layers.CLayers.prompts>`:
        no torch operator between the products), else the plain forward's prompt pass."""
        if self.layers is not None and self.layers.prompts:
            return functools.partial(self.layers.prompt_pass, cache_only=cache_only)
        return functools.partial(self.transformer, kind=PassKind.PROMPT, cache_only=cache_only)

    def prompt_pass_tokens(self) -> int:
        """The shortest prefill chunk that runs as a prompt pass here, on torch's threads:
        :data:`C_PROMPT_PASS_TOKENS` where the C layers run it, else
        :func:`prompt_pass_tokens`."""
        if self.layers is not None and self.layers.prompts:
            return C_PROMPT_PASS_TOKENS
        return prompt_pass_tokens(torch.get_num_threads())

    def bucket(self, queries: int) -> int:
        """Rows one forward computes for ``queries`` tokens (padding included)."""
        if self.wrapper is not None:
            return int(self.wrapper.bucket(max(queries, self.min_rows)))
        return max(queries, self.min_rows)

    @property
    def largest_pass(self) -> int:
        """The largest bucket's tokens (:data:`~verispec.models.accelerators.buckets.BUCKETS`
        in eager mode): the slots a tree pass may need past the committed ones."""
        return (self.wrapper.buckets if self.wrapper is not None else BUCKETS)[-1]

    def first_capacity(self, max_length: int) -> int:
        """Slots of the first cache allocation: 1,024 in eager mode; 4,096 when compiled
        (growing recompiles, counted in ``setup_s``); the whole context with CUDA graphs
        (a graph holds the cache's addresses: it never grows)."""
        if self.wrapper is None:
            return _MIN_CAPACITY
        full = max_length + self.largest_pass + _SLOT_ALIGN
        if self.wrapper.capacity_cap is not None:
            full = min(full, self.wrapper.capacity_cap)
        return -(-full // _SLOT_ALIGN) * _SLOT_ALIGN


def _eos_token_id(hf_model: Any) -> Any:
    generation_config = getattr(hf_model, "generation_config", None)
    eos = getattr(generation_config, "eos_token_id", None)
    return eos if eos is not None else getattr(hf_model.config, "eos_token_id", None)

"""A Llama-family decoder of our own: the plain forward the fast runtime runs.

Llama, Qwen2 and Mistral (and so SmolLM2) share one decoder: RMSNorm, grouped-query
attention with rotary positions, a SwiGLU feed-forward. :class:`Transformer` is that
decoder written for one sequence and for tree decoding, after gpt-fast's ``model.py``:

* one small module per block; the three attention projections are one matrix
  (``wqkv``) and the gate and up projections another (``w13``), since each group is
  one matrix product;
* :class:`KVCache` is a module of its own: one preallocated key and one value tensor
  per layer, Shape: (Hkv, capacity, D). A forward writes its Q new entries into slots
  ``[start, start + Q)`` in place and attends to slots ``[0, start + Q)`` only. The
  caches are handed to :meth:`Transformer.forward`, not kept in it, so a target and
  its self-draft (a subset of the layers) share the weights and keep their own caches;
* the rotary tables are computed once, for every position, by the Hugging Face
  model's own rotary module (so every rope type it computes statically is exact);
* the attention is explicit (:mod:`verispec.models.attention`): one matrix product of the
  queries of each key/value group against the used slots (no key repeated per head), the
  mask, and a softmax written as matrix products so that its result for a token does not
  depend on the other tokens of the pass.

The queries of one forward are any Q tokens at any positions: the pending tokens
and a draft tree's nodes. They see every committed slot and, among the last slots,
what a boolean ``local_mask`` allows (causal for the pending tokens, ancestors for
tree nodes).

A forward takes one record, :class:`~verispec.models.passes.Pass` (the tokens, their
positions, the caches, the slots, the mask, the layers run); what its layers read besides
the hidden states travels through them as another, :class:`~verispec.models.passes.PassInputs`
(the rotary rows, the slots, the mask, the pass's kind), as gpt-fast passes ``input_pos``,
``freqs_cis`` and ``mask``. Each :class:`Attention` calls the core of the pass's kind from its
:attr:`~Attention.cores` (a prompt's prefill, a tree pass, a CUDA graph's static pass).

This module imports no kernel. What makes it fast (block and integer products, weights
prepacked for oneDNN, the attention and the layers in C, compiled or graphed buckets) are
the accelerators of :mod:`verispec.models.accelerators`, which the runtime
(:mod:`verispec.models.runtime`) hands this model from outside, once, when it is built: a
product module swapped in (gpt-fast's ``quantize.py`` does the same), an attention core
set in :attr:`Attention.cores`, or a forward run instead of :meth:`Transformer.forward`.
This forward stays the reference.

Numerics: float32 and float64 run in their own dtype. With bfloat16 (or float16)
weights the activations between matrix products stay in float32 (the residual
stream, norms, rotary, attention and its cache); only the inputs of the weight
matrix products are rounded, as autocast does, so no error accumulates in the
residual stream.

Shape glossary: Q new tokens, S used slots, H query heads, Hkv key/value heads,
D head dim, E model width, F feed-forward width, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast, runtime_checkable

import attrs
import torch
from torch import nn
from torch.nn import functional as F

from verispec.errors import UnsupportedModelError
from verispec.models.attention import (
    AttentionCore,
    attend,
    attend_prompt,
    attend_static,
    write_prompt_cache,
)
from verispec.models.passes import KVCache, Pass, PassInputs, PassKind

__all__ = [
    "KVCache",
    "ModelArgs",
    "Pass",
    "PassInputs",
    "PassKind",
    "Product",
    "Transformer",
    "from_hf",
]

_ARCHITECTURES = {"llama", "qwen2", "mistral"}
_STATIC_ROPE = {"default", "linear", "llama3", "yarn"}  # tables independent of length
PROMPT_MLP_ROWS = 1024
"""Rows of a prompt pass's feed-forward per GEMM (:meth:`FeedForward._prompt_forward`)."""


@attrs.frozen
class ModelArgs:
    """The shape of a Llama-family decoder.

    Attributes:
        vocab_size: V. dim: E. n_layers: decoder layers. n_heads: H. n_kv_heads: Hkv.
        head_dim: D. hidden_dim: F. norm_eps: RMSNorm epsilon.
        qkv_bias: the query/key/value projections have biases (Qwen2).
        o_bias, mlp_bias: the output and feed-forward projections have biases.
    """

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int
    norm_eps: float
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False

    @classmethod
    def from_hf_config(cls, config: Any) -> ModelArgs:
        """Read a ``transformers`` Llama, Qwen2 or Mistral config.

        Raises:
            UnsupportedModelError: another architecture, an activation other than SiLU,
                a rotary scaling that depends on the sequence length, or a sliding
                window smaller than the context.
        """
        model_type = getattr(config, "model_type", None)
        if model_type not in _ARCHITECTURES:
            raise UnsupportedModelError(
                f"the fast runtime runs Llama, Qwen2 and Mistral decoders; got model_type "
                f"{model_type!r}. Use verispec.HFModel for other architectures."
            )
        if getattr(config, "hidden_act", "silu") != "silu":
            raise UnsupportedModelError(
                f"the fast runtime needs hidden_act='silu'; got {config.hidden_act!r}."
            )
        heads = int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        bias = bool(getattr(config, "attention_bias", False))
        return cls(
            vocab_size=int(config.vocab_size),
            dim=int(config.hidden_size),
            n_layers=int(config.num_hidden_layers),
            n_heads=heads,
            n_kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(head_dim),
            hidden_dim=int(config.intermediate_size),
            norm_eps=float(config.rms_norm_eps),
            qkv_bias=bias or model_type == "qwen2",
            o_bias=bias,
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
        )


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype activations live in: float32 for half-precision weights."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich, 2019), computed in the activations' dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: Shape: (Q, E). ``x * rsqrt(mean(x**2) + eps) * weight``, one fused op."""
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class Attention(nn.Module):
    """Grouped-query attention with rotary positions over the used cache slots.

    Attributes:
        cores: the attention core of each kind of pass (:class:`PassKind`):
            :func:`~verispec.models.attention.attend` for tree passes,
            :func:`~verispec.models.attention.attend_prompt` for a prompt's,
            :func:`~verispec.models.attention.attend_static` for CUDA graphs'. An accelerator
            may replace one (same arguments, :data:`~verispec.models.attention.AttentionCore`)
            when the runtime is built; nothing here imports it.
    """

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        q_width, kv_width = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
        self.wqkv = nn.Linear(args.dim, q_width + 2 * kv_width, bias=args.qkv_bias)
        self.wo = nn.Linear(q_width, args.dim, bias=args.o_bias)
        self.cores: dict[PassKind, AttentionCore] = {
            PassKind.TREE: attend,
            PassKind.PROMPT: attend_prompt,
            PassKind.STATIC: attend_static,
        }
        # The softmax scale 1/sqrt(D) is folded into the query rows of ``wqkv`` (from_hf).

    def forward(self, x: torch.Tensor, inputs: PassInputs, cache: KVCache) -> torch.Tensor:
        """x: Shape: (Q, E); ``inputs``: the pass's (:class:`PassInputs`)."""
        q_len = x.shape[0]
        heads, kv_heads, head_dim = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = _matmul(self.wqkv, x, inputs.kind)
        qk = qkv[:, : (heads + kv_heads) * head_dim].view(q_len, -1, head_dim)
        qk = _rope(qk, inputs.cos, inputs.sin)
        v = qkv[:, (heads + kv_heads) * head_dim :].view(q_len, kv_heads, head_dim)
        out = self.cores[inputs.kind](qk[:, :heads], qk[:, heads:], v, cache, inputs)
        return _matmul(self.wo, out, inputs.kind)

    def write_cache(self, x: torch.Tensor, inputs: PassInputs, cache: KVCache) -> None:
        """A prompt pass's keys and values of ``x`` to the cache, and nothing else: what the
        last layer of a prefill chunk whose rows nobody reads must do (the same bits as
        :meth:`forward` writes there)."""
        q_len = x.shape[0]
        heads, kv_heads, head_dim = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = _matmul(self.wqkv, x, inputs.kind)
        k = _rope(
            qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(q_len, -1, head_dim),
            inputs.cos,
            inputs.sin,
        )
        v = qkv[:, (heads + kv_heads) * head_dim :].view(q_len, kv_heads, head_dim)
        write_prompt_cache(k, v, cache, int(inputs.where[0]))


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(x W1) * x W3)``, with W1 and W3 as one matrix ``w13``."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.hidden_dim = args.hidden_dim
        self.w13 = nn.Linear(args.dim, 2 * args.hidden_dim, bias=args.mlp_bias)
        self.w2 = nn.Linear(args.hidden_dim, args.dim, bias=args.mlp_bias)

    def forward(self, x: torch.Tensor, kind: PassKind = PassKind.TREE) -> torch.Tensor:
        if kind is PassKind.PROMPT:
            return self._prompt_forward(x)
        gate, up = _matmul(self.w13, x, kind).split(self.hidden_dim, -1)
        return _matmul(self.w2, F.silu(gate) * up, kind)

    def _prompt_forward(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` of a prompt pass, the same values row by row: the weights widened
        once, then chunks of :data:`PROMPT_MLP_ROWS` rows, ``silu(gate) * up`` in place. A
        chunk's gate/up product stays below glibc's mmap threshold, so its memory is reused
        from layer to layer instead of being mapped and zero-filled again (a whole 4,096-row
        product paid a fifth of its GEMM time in page faults: docs/benchmarks.rst)."""
        w13, w2 = _prompt_linear(self.w13), _prompt_linear(self.w2)
        out = x.new_empty(x.shape[0], self.w2.out_features)
        for first in range(0, x.shape[0], PROMPT_MLP_ROWS):
            gate, up = w13(x[first : first + PROMPT_MLP_ROWS]).split(self.hidden_dim, -1)
            out[first : first + PROMPT_MLP_ROWS] = w2(F.silu(gate, inplace=True).mul_(up))
        return out


class Block(nn.Module):
    """One decoder layer: pre-norm attention, pre-norm feed-forward, residuals."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args)

    def forward(self, x: torch.Tensor, inputs: PassInputs, cache: KVCache) -> torch.Tensor:
        """x: Shape: (Q, E), the layer's input; returns its output, same shape."""
        h = x + self.attention(self.attention_norm(x), inputs, cache)
        return h + self.feed_forward(self.ffn_norm(h), inputs.kind)

    def write_cache(self, x: torch.Tensor, inputs: PassInputs, cache: KVCache) -> None:
        """Only the keys and values of ``x`` to the cache (:meth:`Attention.write_cache`)."""
        self.attention.write_cache(self.attention_norm(x), inputs, cache)


class Transformer(nn.Module):
    """A Llama-family decoder over one sequence; see the module docstring.

    Build it with :func:`from_hf`, make caches with :meth:`setup_caches`, then call
    :meth:`forward` for the hidden states of new tokens and :meth:`logits` for the
    rows whose next-token logits are needed.
    """

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)  # (positions, D)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)

    @property
    def blocks(self) -> list[Block]:
        """The decoder layers, in order."""
        return cast(list[Block], list(self.layers))

    @property
    def weight_dtype(self) -> torch.dtype:
        return self.tok_embeddings.weight.dtype

    @property
    def compute_dtype(self) -> torch.dtype:
        return _compute_dtype(self.weight_dtype)

    def setup_caches(self, capacity: int, num_layers: int | None = None) -> list[KVCache]:
        """Fresh caches of ``capacity`` slots, one per layer (or for ``num_layers`` layers)."""
        device = self.rope_cos.device
        shape = (self.args.n_kv_heads, capacity, self.args.head_dim)
        return [
            KVCache(*shape, self.compute_dtype).to(device)
            for _ in range(self.args.n_layers if num_layers is None else num_layers)
        ]

    def forward(
        self, p: Pass, *, kind: PassKind = PassKind.TREE, cache_only: bool = False
    ) -> torch.Tensor:
        """The final-normed hidden states of the pass's tokens.

        Args:
            p: the pass (:class:`~verispec.models.passes.Pass`: tokens, positions, caches,
                slots, mask, layers; ``where`` a 0-d tensor for a ``STATIC`` pass).
            kind: the kind of pass (:class:`~verispec.models.passes.PassKind`).
            cache_only: with ``kind=PassKind.PROMPT``, a pass whose rows nobody reads (a
                prefill chunk before the root): it writes every layer's keys and values and
                skips what only the rows need, the last layer's attention and feed-forward
                and the final norm, and returns Shape: (0, E). The cache holds the same bits.

        Returns:
            Shape: (Q, E), in the compute dtype.
        """
        x = self.tok_embeddings(p.tokens).to(self.compute_dtype)  # (Q, E)
        cos, sin = self.rope_cos[p.positions], self.rope_sin[p.positions]
        inputs = PassInputs(cos, sin, p.where, p.local_mask, kind)
        return self._write_caches(x, inputs, p) if cache_only else self._blocks(x, inputs, p)

    def _blocks(self, x: torch.Tensor, inputs: PassInputs, p: Pass) -> torch.Tensor:
        """The pass's decoder layers one module at a time, then the final norm."""
        blocks = self.blocks if p.layers is None else [self.blocks[i] for i in p.layers]
        for block, cache in zip(blocks, p.caches, strict=True):
            x = block(x, inputs, cache)
        return self.norm(x)

    def _write_caches(self, x: torch.Tensor, inputs: PassInputs, p: Pass) -> torch.Tensor:
        """:meth:`_blocks` for a pass whose rows nobody reads: the last layer writes only its
        keys and values (its output would feed nothing but the rows)."""
        blocks = self.blocks if p.layers is None else [self.blocks[i] for i in p.layers]
        for block, cache in zip(blocks[:-1], p.caches[:-1], strict=True):
            x = block(x, inputs, cache)
        blocks[-1].write_cache(x, inputs, p.caches[-1])
        return x[:0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head: hidden Shape: (R, E) to logits Shape: (R, V), float32 or float64."""
        out = _matmul(self.output, hidden)
        return out if out.dtype in (torch.float32, torch.float64) else out.float()


@runtime_checkable
class Product(Protocol):
    """A weight product with a form of its own for a prompt pass's many rows (an
    accelerator's, such as the block products): the plain model calls it there instead of
    the product itself. An ``nn.Linear`` has none."""

    def prompt_product(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """``x -> y`` for several row chunks of one prompt pass (float32 in and out), the
        same values as a row-by-row product to rounding; set up once per pass."""
        ...


def _matmul(linear: nn.Module, x: torch.Tensor, kind: PassKind = PassKind.TREE) -> torch.Tensor:
    """``linear(x)``, rounding ``x`` to the weights' dtype and the result back (half weights);
    in a prompt pass, the product's own prompt form where it has one (:class:`Product`)."""
    if kind is PassKind.PROMPT and isinstance(linear, Product):
        return linear.prompt_product()(x)
    weight_dtype = cast(torch.dtype, getattr(linear, "weight_dtype", None) or linear.weight.dtype)
    if weight_dtype == x.dtype:
        return linear(x)
    return linear(x.to(weight_dtype)).to(x.dtype)


def _prompt_linear(linear: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x -> _matmul(linear, x, PassKind.PROMPT)`` for several row chunks of one prompt
    pass, a :class:`Product`'s prompt form set up once rather than per chunk."""
    if isinstance(linear, Product):
        return linear.prompt_product()
    return lambda x: _matmul(linear, x, PassKind.PROMPT)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, rotate-half convention: x: (Q, heads, D); cos, sin: (Q, D).

    ``x * cos + rotate_half(x) * sin`` with each product and sum rounded as that
    expression's separate operations round them (``a - b`` is ``a + (-b)`` exactly), with
    two half-width temporaries instead of five full ones."""
    half = x.shape[-1] // 2
    cos, sin = cos[:, None], sin[:, None]
    out = x * cos
    out[..., :half] -= x[..., half:] * sin[..., :half]
    out[..., half:] += x[..., :half] * sin[..., half:]
    return out


# -- conversion from transformers -----------------------------------------------------


def from_hf(hf_model: Any, *, dtype: torch.dtype | None = None, max_positions: int) -> Transformer:
    """A :class:`Transformer` with the weights of a loaded ``transformers`` model.

    Args:
        hf_model: ``LlamaForCausalLM``, ``Qwen2ForCausalLM`` or ``MistralForCausalLM``.
        dtype: weight dtype (default: the model's).
        max_positions: rotary tables are computed for positions ``[0, max_positions)``.

    Raises:
        UnsupportedModelError: see :meth:`ModelArgs.from_hf_config`.
    """
    args = ModelArgs.from_hf_config(hf_model.config)
    decoder = hf_model.model
    rotary = decoder.rotary_emb
    rope_type = getattr(rotary, "rope_type", "default")
    if rope_type not in _STATIC_ROPE:
        raise UnsupportedModelError(
            f"the fast runtime precomputes rotary tables, which rope_type {rope_type!r} does "
            f"not allow (it depends on the sequence length); use verispec.HFModel."
        )
    source = next(hf_model.parameters())
    dtype = dtype or source.dtype
    with torch.device("meta"):  # no initialisation: every parameter is copied below
        model = Transformer(args)
    model = model.to_empty(device=source.device).to(source.dtype)  # exact copies; cast last
    with torch.no_grad():
        model.tok_embeddings.weight.copy_(decoder.embed_tokens.weight)
        model.output.weight.copy_(hf_model.get_output_embeddings().weight)
        model.norm.weight.copy_(decoder.norm.weight)
        for block, layer in zip(model.blocks, decoder.layers, strict=True):
            attn, mlp = layer.self_attn, layer.mlp
            _copy_fused(block.attention.wqkv, [attn.q_proj, attn.k_proj, attn.v_proj])
            # the softmax scale, folded into the query rows (exact for a power-of-two D)
            q_rows = args.n_heads * args.head_dim
            block.attention.wqkv.weight[:q_rows] *= args.head_dim**-0.5
            if block.attention.wqkv.bias is not None:
                block.attention.wqkv.bias[:q_rows] *= args.head_dim**-0.5
            _copy_fused(block.attention.wo, [attn.o_proj])
            _copy_fused(block.feed_forward.w13, [mlp.gate_proj, mlp.up_proj])
            _copy_fused(block.feed_forward.w2, [mlp.down_proj])
            block.attention_norm.weight.copy_(layer.input_layernorm.weight)
            block.ffn_norm.weight.copy_(layer.post_attention_layernorm.weight)
        compute = _compute_dtype(dtype)
        probe = torch.zeros(1, dtype=compute, device=source.device)
        positions = torch.arange(max_positions, device=source.device)[None]
        cos, sin = rotary(probe, positions)  # (1, positions, D), attention scaling applied
    model = model.to(device=source.device)
    # Weights and embeddings in ``dtype``; norms and rotary tables in the compute dtype.
    for module in model.modules():
        if isinstance(module, nn.Linear | nn.Embedding):
            module.to(dtype)
        elif isinstance(module, RMSNorm):
            module.to(compute)
    if getattr(hf_model.config, "tie_word_embeddings", False):
        model.output.weight = model.tok_embeddings.weight  # one tensor, as in the source
    model.rope_cos = cos[0].to(compute)
    model.rope_sin = sin[0].to(compute)
    return model.eval().requires_grad_(False)


def _copy_fused(target: nn.Linear, sources: Sequence[nn.Linear]) -> None:
    """The sources' rows, one after the other, copied into ``target`` (no concatenated copy
    in between: that would write every fused weight twice)."""
    row = 0
    for source in sources:
        rows = source.weight.shape[0]
        target.weight[row : row + rows].copy_(source.weight)
        if target.bias is not None and source.bias is not None:
            target.bias[row : row + rows].copy_(source.bias)
        elif target.bias is not None:
            target.bias[row : row + rows].zero_()
        row += rows

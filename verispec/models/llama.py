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
* the attention is explicit: one matrix product of the queries of each key/value
  group against the used slots (no key repeated per head), the mask, and a softmax
  written as matrix products so that its result for a token does not depend on the
  other tokens of the pass (see :func:`attend`).

The queries of one forward are any Q tokens at any positions: the pending tokens
and a draft tree's nodes. They see every committed slot and, among the last slots,
what a boolean ``local_mask`` allows (causal for the pending tokens, ancestors for
tree nodes).

What one forward reads besides the hidden states and the caches travels through the
blocks as one record, :class:`PassInputs` (the rotary rows, the cache slots, the mask and
the pass's kind), as gpt-fast passes ``input_pos``, ``freqs_cis`` and ``mask``. Which
attention kernel runs is decided outside the forward: each :class:`Attention` holds the
kernel of its ordinary passes (:class:`AttentionKernel`: torch operators, the C kernel,
or an opaque operator for compiled graphs), set once by the runtime when it is built, and
a pass whose inputs are of another kind says so in :attr:`PassInputs.kind` (a prompt's
prefill, a CUDA graph's static pass).

What makes it fast (weights prepacked for oneDNN, static shapes per tree-size
bucket, ``torch.compile``, kernels in C) is wrapped around this module by
:mod:`verispec.models.runtime`, switchable off; this forward stays the reference.

Numerics: float32 and float64 run in their own dtype. With bfloat16 (or float16)
weights the activations between matrix products stay in float32 (the residual
stream, norms, rotary, attention and its cache); only the inputs of the weight
matrix products are rounded, as autocast does, so no error accumulates in the
residual stream.

Shape glossary: Q new tokens, S used slots, H query heads, Hkv key/value heads,
D head dim, E model width, F feed-forward width, V vocabulary.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

import attrs
import torch
from torch import nn
from torch.nn import functional as F

from verispec.core.tree import DraftTree
from verispec.errors import UnsupportedModelError
from verispec.models.cpu_attention import attend_cpu
from verispec.models.cpu_linear import BlockLinear
from verispec.models.invariance import VALUE_BLOCK, min_tokens

__all__ = [
    "AttentionKernel",
    "KVCache",
    "ModelArgs",
    "PassInputs",
    "PassKind",
    "Transformer",
    "attend",
    "attend_prompt",
    "attend_static",
    "from_hf",
]

_ARCHITECTURES = {"llama", "qwen2", "mistral"}
_STATIC_ROPE = {"default", "linear", "llama3", "yarn"}  # tables independent of length
PROMPT_MLP_ROWS = 1024
"""Rows of a prompt pass's feed-forward per GEMM (:meth:`FeedForward._prompt_forward`)."""


class PassKind(enum.Enum):
    """What kind of pass a forward is, which decides its attention kernel (and, for a prompt,
    its products): the caller that builds the pass names it."""

    TREE = "tree"
    """Pending tokens and tree nodes: every row row-invariant; the attention is each
    :class:`Attention`'s own :attr:`~Attention.kernel`."""
    PROMPT = "prompt"
    """A prompt's causal prefill chunk: kernels made for many rows, not row-invariant
    (:func:`attend_prompt`, the block products' float32 GEMM). Every decoding method
    prefills alike, and the first token comes from the next tree pass's root row."""
    STATIC = "static"
    """A CUDA graph's pass: ``where`` is a 0-d start on the device, the mask ``(Q, Q)``
    (:func:`attend_static`)."""


class AttentionKernel(enum.Enum):
    """The attention core of an :class:`Attention`'s tree passes, chosen once by the runtime."""

    TORCH = "torch"
    """:func:`attend`: torch operators, the reference."""
    C = "c"
    """:func:`~verispec.models.cpu_attention.attend_cpu`: one C call (CPU, float32, eager)."""
    OPAQUE = "opaque"
    """``verispec::cached_attention``: :func:`attend` as one opaque operator, so that
    ``torch.compile`` keeps it out of its graphs (its slot count changes every step)."""


class PassInputs(NamedTuple):
    """What every layer of one forward reads besides its input and its cache (built once
    per pass by :meth:`Transformer.forward`)."""

    cos: torch.Tensor
    """The rotary table's rows of the pass's positions, Shape: (Q, D)."""
    sin: torch.Tensor
    """As ``cos``, for the sines."""
    where: torch.Tensor
    """int64 ``[start, length]``: the new entries go to slots ``[start, start + Q)`` and the
    tokens attend to slots ``[0, length)``; for a ``STATIC`` pass a 0-d ``start`` on the
    device (the whole cache is attended)."""
    local_mask: torch.Tensor
    """bool, Shape: (Q, W): which of the W slots before ``start + Q`` each token sees (every
    earlier slot is seen, every later one is not)."""
    kind: PassKind = PassKind.TREE
    """The kind of pass (:class:`PassKind`)."""


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


class KVCache(nn.Module):
    """One layer's keys and values, preallocated, written in place by :func:`attend`.

    Buffers ``k``: Shape: (Hkv, capacity, D) and ``v``: Shape: (Hkv, capacity, D + 1),
    whose last column is all ones, so that one product of softmax weights with ``v``
    gives both the weighted values and the weights' sum (see :func:`attend`). Slot ``j``
    holds the entry of the token the caller put there; the runtime keeps committed
    token ``j`` in slot ``j``.
    """

    k: torch.Tensor
    v: torch.Tensor

    def __init__(self, n_kv_heads: int, capacity: int, head_dim: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.capacity, self.head_dim = capacity, head_dim
        values = torch.zeros(n_kv_heads, capacity, head_dim + 1, dtype=dtype)
        values[..., head_dim] = 1.0
        self.register_buffer("k", torch.zeros(n_kv_heads, capacity, head_dim, dtype=dtype))
        self.register_buffer("v", values)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    where: torch.Tensor,
    local_mask: torch.Tensor,
) -> torch.Tensor:
    """Write the new keys and values into the cache, then attend over the used slots.

    Args:
        q: Shape: (Q, H, D), rotated. k: Shape: (Q, Hkv, D), rotated. v: Shape: (Q, Hkv, D).
        cache_k, cache_v: a :class:`KVCache`'s buffers, written in place.
        where: int64 ``[start, length]``: the new entries go to slots ``[start, start + Q)``
            and the queries attend to slots ``[0, length)``.
        local_mask: bool, Shape: (Q, W), True = attend: which of the W slots before
            ``start + Q`` each query sees; every slot before those is seen by all, every
            slot from ``start + Q`` on by none.

    Returns:
        Shape: (Q, H * D).

    The softmax is written out so that a query's result depends only on the keys it sees,
    in their order, not on how many other queries run with it or where masked slots lie
    between its keys: the scores are one matrix product (each an independent dot
    product), the maximum is exact, and the weighted sum of the values and the sum of the
    weights come from one product per block of :data:`VALUE_BLOCK` slots (the values carry
    a column of ones), whose accumulation runs over the block's slots in order, and the
    blocks' sums are added in the order sequential decoding adds them
    (:func:`_weighted_values`). Where the CPU's kernels have those properties (checked by
    :func:`verispec.models.invariance.row_invariant_kernels`), a tree node's logits equal, bit
    for bit, those of decoding its path one token at a time (see docs/runtime.rst).
    """
    start, length = (int(i) for i in where.tolist())
    q_len, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    cache_k[:, start : start + q_len] = k.transpose(0, 1)
    cache_v[:, start : start + q_len, :head_dim] = v.transpose(0, 1)
    keys, values = cache_k[:, :length], cache_v[:, :length]  # (Hkv, S, D), (Hkv, S, D + 1)
    # The queries of one key/value head side by side: (Hkv, G * Q, D), G = H / Hkv.
    groups = heads // kv_heads
    q = q.view(q_len, kv_heads, groups, head_dim).permute(1, 2, 0, 3)
    rows = _padded_rows(groups, q_len)  # the products' row count (a one-token pass is padded)
    queries = q.reshape(kv_heads, groups * q_len, head_dim)
    if rows > groups * q_len:
        queries = torch.cat(
            [queries, queries.new_zeros(kv_heads, rows - groups * q_len, head_dim)], 1
        )
    scores = torch.bmm(queries, keys.transpose(1, 2))[:, : groups * q_len]
    grid = scores.view(kv_heads, groups, q_len, length)  # (Hkv, G, Q, S)
    width = local_mask.shape[1]
    visible = start + q_len - width
    grid[..., visible : visible + width].masked_fill_(~local_mask, float("-inf"))
    grid[..., visible + width :] = float("-inf")
    weights = (scores - scores.amax(-1, keepdim=True)).exp_()  # unnormalised softmax
    summed = _weighted_values(weights, values, local_mask, start, groups)  # (Hkv, G * Q, D + 1)
    out = (summed[..., :head_dim] / summed[..., head_dim:]).view(kv_heads, groups, q_len, -1)
    return out.permute(2, 0, 1, 3).reshape(q_len, heads * head_dim)


@torch.library.custom_op("verispec::cached_attention", mutates_args=("cache_k", "cache_v"))
def _cached_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    where: torch.Tensor,
    local_mask: torch.Tensor,
) -> torch.Tensor:
    return attend(q, k, v, cache_k, cache_v, where, local_mask)


@_cached_attention.register_fake
def _(q: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
    return q.new_empty((q.shape[0], q.shape[1] * q.shape[2]))  # (Q, H * D)


CACHED_ATTENTION = torch.ops.verispec.cached_attention
""":func:`attend` as an opaque operator (``AttentionKernel.OPAQUE``), same arguments."""


def _weighted_values(
    weights: torch.Tensor, values: torch.Tensor, local_mask: torch.Tensor, start: int, groups: int
) -> torch.Tensor:
    """The softmax weights times the values, each row's terms summed in the order and
    grouping of decoding its token one at a time.

    A query at position ``p`` sees ``p + 1`` keys; sequential decoding has them in slots
    ``0..p``. Their products are summed per block of :data:`VALUE_BLOCK` keys (one batched
    product each, whose sum runs over the block's slots in order, zeros adding nothing)
    and the blocks' sums added left to right. A tree row's keys are the committed slots
    plus its ancestors, spread among the tree's slots: its k-th visible key is the one
    sequential decoding has in slot k. Where that moves a key into another block (the
    tree straddles a block boundary), the row's last blocks are summed again from its
    visible keys gathered into sequential order.

    Args:
        weights: Shape: (Hkv, G * Q, S), zero where a query does not look.
        values: Shape: (Hkv, S, D + 1).
        local_mask, start: as for :func:`attend` (S = its ``length``).

    Returns:
        Shape: (Hkv, G * Q, D + 1).
    """
    length, real = values.shape[1], weights.shape[1]
    rows = _padded_rows(groups, real // groups)
    padded = weights
    if rows > real:
        padded = torch.cat([weights, weights.new_zeros(weights.shape[0], rows - real, length)], 1)
    blocks = [
        torch.bmm(padded[..., first : first + VALUE_BLOCK], values[:, first : first + VALUE_BLOCK])[
            :, :real
        ]
        for first in range(0, length, VALUE_BLOCK)
    ]
    _resum_straddling_rows(blocks, weights, values, local_mask, start, groups)
    summed = blocks[0]
    for block in blocks[1:]:
        summed = summed + block
    return summed


def _padded_rows(groups: int, q_len: int) -> int:
    """Rows the attention's products run on for ``q_len`` tokens of ``groups`` query heads
    per key/value head: :func:`~verispec.models.invariance.min_tokens` tokens at least (zero
    rows added and dropped), so that a row's bits do not depend on the pass's size."""
    return max(q_len, min_tokens(groups)) * groups


def _resum_straddling_rows(
    blocks: list[torch.Tensor],
    weights: torch.Tensor,
    values: torch.Tensor,
    local_mask: torch.Tensor,
    start: int,
    groups: int,
) -> None:
    """Recompute, in ``blocks``, the block sums of the rows whose visible keys sit in
    another block than sequential decoding puts them (see :func:`_weighted_values`)."""
    q_len, width = local_mask.shape
    first = start + q_len - width  # every slot before it is seen by every query
    if first // VALUE_BLOCK == (start + q_len - 1) // VALUE_BLOCK:
        return  # the local slots lie in one block: a key's rank and slot share it
    seen = local_mask.cumsum(1)  # (Q, W): how many local slots each query sees so far
    ranks = first + seen - 1  # the slot sequential decoding gives each seen local key
    slots = first + torch.arange(width, device=local_mask.device)
    moved = local_mask & (ranks // VALUE_BLOCK != slots // VALUE_BLOCK)
    rows = moved.any(1).nonzero().flatten()
    if rows.numel() == 0:
        return
    kv_heads, rows_n = weights.shape[0], rows.numel()
    base = first // VALUE_BLOCK * VALUE_BLOCK
    span = len(blocks) * VALUE_BLOCK - base
    # Slot of each row's key of rank base + i, i < span: committed, then the row's local
    # keys in order; invalid entries point at slot ``base`` with weight zero.
    index = torch.full((rows_n, span), base, dtype=torch.long, device=weights.device)
    valid = torch.zeros(rows_n, span, dtype=torch.bool, device=weights.device)
    index[:, : first - base] = torch.arange(base, first, device=weights.device)
    valid[:, : first - base] = True
    row, column = local_mask[rows].nonzero(as_tuple=True)
    rank = seen[rows][row, column] - 1 + first - base
    index[row, rank], valid[row, rank] = column + first, True
    grid = weights.view(kv_heads, groups, q_len, -1)[:, :, rows]  # (Hkv, G, R, S)
    gathered_w = grid.gather(3, index.expand(kv_heads, groups, rows_n, span))
    gathered_w = gathered_w.masked_fill_(~valid, 0.0).permute(0, 2, 1, 3)  # (Hkv, R, G, span)
    gathered_v = values[:, index]  # (Hkv, R, span, D + 1)
    # As many rows per product as a one-token pass has: pad the G rows with zero rows.
    padded_rows = min_tokens(groups) * groups
    padded = gathered_w.new_zeros(kv_heads, rows_n, padded_rows, span)
    padded[:, :, :groups] = gathered_w
    padded = padded.view(kv_heads * rows_n, padded_rows, span)
    gathered_v = gathered_v.view(kv_heads * rows_n, span, -1)
    positions = (torch.arange(groups, device=weights.device) * q_len)[:, None] + rows  # (G, R)
    for i in range(span // VALUE_BLOCK):
        cut = slice(i * VALUE_BLOCK, (i + 1) * VALUE_BLOCK)
        block = torch.bmm(padded[..., cut], gathered_v[:, cut])[:, :groups]
        block = block.view(kv_heads, rows_n, groups, -1).transpose(1, 2)  # (Hkv, G, R, D + 1)
        blocks[base // VALUE_BLOCK + i][:, positions.flatten()] = block.reshape(
            kv_heads, groups * rows_n, -1
        )


def attend_static(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    where: torch.Tensor,
    local_mask: torch.Tensor,
) -> torch.Tensor:
    """:func:`attend` with static shapes and no host read, for CUDA graphs.

    ``where`` is a 0-d int64 tensor on the device: the first slot of the new entries,
    which see every slot before it and, among themselves, what ``local_mask`` (Shape:
    (Q, Q)) allows. The queries attend to the whole cache (every later slot masked), so
    nothing depends on a value read on the host. Same arguments otherwise, same result to
    rounding: the value product is one product over the whole cache, not summed per block
    in sequential decoding's order as :func:`attend` does (a GPU's products promise no
    row-invariant bits anyway).
    """
    q_len, heads, head_dim = q.shape
    kv_heads, capacity = k.shape[1], cache_k.shape[1]
    slots = where + torch.arange(q_len, device=q.device)
    cache_k.index_copy_(1, slots, k.transpose(0, 1))
    cache_v[..., :head_dim].index_copy_(1, slots, v.transpose(0, 1))
    columns = torch.arange(capacity, device=q.device) - where  # < 0: committed
    local = local_mask[:, columns.clamp(0, q_len - 1)] & (columns >= 0) & (columns < q_len)
    mask = local | (columns < 0)  # (Q, capacity)
    groups = heads // kv_heads
    q = q.view(q_len, kv_heads, groups, head_dim).permute(1, 2, 0, 3)
    scores = torch.bmm(q.reshape(kv_heads, groups * q_len, head_dim), cache_k.transpose(1, 2))
    scores = scores.view(kv_heads, groups, q_len, capacity).masked_fill(~mask, float("-inf"))
    weights = (scores - scores.amax(-1, keepdim=True)).exp_()
    summed = torch.bmm(weights.view(kv_heads, groups * q_len, capacity), cache_v)
    out = (summed[..., :head_dim] / summed[..., head_dim:]).view(kv_heads, groups, q_len, -1)
    return out.permute(2, 0, 1, 3).reshape(q_len, heads * head_dim)


def attend_prompt(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    where: torch.Tensor,
    local_mask: torch.Tensor,
) -> torch.Tensor:
    """:func:`attend` for a prompt's causal pass (``local_mask`` causal): the cache written,
    then one fused ``scaled_dot_product_attention`` over slots ``[0, start + Q)``
    (PyTorch's flash attention on the CPU: 2-3x the C attention's speed on a prompt; with
    no earlier slots its own causal masking, which skips the masked blocks: another 2x at
    4,096 tokens). Its rows depend on the kernel's blocking, so it serves prefill only
    (``PassKind.PROMPT``)."""
    start = int(where[0])
    q_len, heads, head_dim = q.shape
    write_prompt_cache(k, v, cache_k, cache_v, start)
    slots, width = start + q_len, local_mask.shape[1]
    mask = None
    if start > 0 or width != q_len:
        mask = torch.ones(q_len, slots, dtype=torch.bool, device=q.device)
        mask[:, slots - width :] = local_mask
    values = cache_v[None, :, :slots, :head_dim]
    if values.is_cuda:  # rows of D + 1 floats are not 16-byte aligned; fused CUDA kernels
        # may load rows as 16-byte vectors. Suspected, not shown, in the 7B-shaped prompt
        # pass's misaligned address on the H200 (docs/benchmarks.rst, 2026-11-28).
        values = values.contiguous()
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        cache_k[None, :, :slots],
        values,
        attn_mask=mask,
        is_causal=mask is None,
        scale=1.0,  # the softmax scale is folded into the query rows (from_hf)
        enable_gqa=True,
    )  # (1, H, Q, D)
    return out[0].transpose(0, 1).reshape(q_len, heads * head_dim)


def write_prompt_cache(
    k: torch.Tensor, v: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, start: int
) -> None:
    """Write a prompt pass's keys and values (Shape: (Q, KV heads, D)) to slots
    ``[start, start + Q)`` of the cache."""
    q_len, _, head_dim = k.shape
    cache_k[:, start : start + q_len] = k.transpose(0, 1)
    cache_v[:, start : start + q_len, :head_dim] = v.transpose(0, 1)


class Attention(nn.Module):
    """Grouped-query attention with rotary positions over the used cache slots (:func:`attend`).

    Attributes:
        kernel: the attention core of its tree passes (:class:`AttentionKernel`), set once
            by the runtime when it is built; ``TORCH`` unless set.
        static_attention: the attention core of its static passes (CUDA graphs):
            :func:`attend_static` unless the runtime swaps in another with its arguments.
    """

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        q_width, kv_width = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
        self.wqkv = nn.Linear(args.dim, q_width + 2 * kv_width, bias=args.qkv_bias)
        self.wo = nn.Linear(q_width, args.dim, bias=args.o_bias)
        self.kernel = AttentionKernel.TORCH
        self.static_attention: Callable[..., torch.Tensor] = attend_static
        # The softmax scale 1/sqrt(D) is folded into the query rows of ``wqkv`` (from_hf).

    def forward(self, x: torch.Tensor, inputs: PassInputs, cache: KVCache) -> torch.Tensor:
        """x: Shape: (Q, E); ``inputs``: the pass's (:class:`PassInputs`)."""
        q_len = x.shape[0]
        heads, kv_heads, head_dim = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = _matmul(self.wqkv, x, inputs.kind)
        qk = qkv[:, : (heads + kv_heads) * head_dim].view(q_len, -1, head_dim)
        qk = _rope(qk, inputs.cos, inputs.sin)
        v = qkv[:, (heads + kv_heads) * head_dim :].view(q_len, kv_heads, head_dim)
        args = (qk[:, :heads], qk[:, heads:], v, cache.k, cache.v, inputs.where, inputs.local_mask)
        if inputs.kind is PassKind.PROMPT:
            out = attend_prompt(*args)
        elif inputs.kind is PassKind.STATIC:
            out = self.static_attention(*args)
        elif self.kernel is AttentionKernel.C:
            out = attend_cpu(*args)
        elif self.kernel is AttentionKernel.OPAQUE:
            out = CACHED_ATTENTION(*args)
        else:
            out = attend(*args)
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
        write_prompt_cache(k, v, cache.k, cache.v, int(inputs.where[0]))


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
        chunk's gate/up product (12 MB) stays below glibc's mmap threshold, so its memory is
        reused from layer to layer instead of being mapped and zero-filled again (a 4,096-row
        product, 50 MB, paid ~20 % of its GEMM time in page faults, one thread, AVX2)."""
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
        # FastModel sets it: every layer of a tree pass in one C call (models.cpu_layer)
        self.cpu_layers: Any = None
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
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        caches: list[KVCache],
        where: torch.Tensor,
        local_mask: torch.Tensor,
        layers: tuple[int, ...] | None = None,
        *,
        kind: PassKind = PassKind.TREE,
        cache_only: bool = False,
    ) -> torch.Tensor:
        """The final-normed hidden states of ``tokens``.

        Args:
            tokens: int64, Shape: (Q,).
            positions: int64, Shape: (Q,); the rotary position of each token.
            caches: one per decoder layer run.
            where, local_mask, kind: as for :class:`PassInputs` (``where`` a 0-d tensor
                for a ``STATIC`` pass).
            layers: run only these decoder layers, in order (a self-draft); all if None.
            cache_only: with ``kind=PassKind.PROMPT``, a pass whose rows nobody reads (a
                prefill chunk before the root): it writes every layer's keys and values and
                skips what only the rows need, the last layer's attention and feed-forward
                and the final norm, and returns Shape: (0, E). The cache holds the same bits.

        Returns:
            Shape: (Q, E), in the compute dtype.
        """
        if kind is PassKind.TREE and self.cpu_layers is not None:
            return self._c_layers(tokens, positions, caches, where, local_mask, layers)
        x = self.tok_embeddings(tokens).to(self.compute_dtype)  # (Q, E)
        inputs = PassInputs(
            self.rope_cos[positions], self.rope_sin[positions], where, local_mask, kind
        )
        if cache_only:
            return self._write_caches(x, inputs, caches, layers)
        return self._blocks(x, inputs, caches, layers)

    def _c_layers(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        caches: list[KVCache],
        where: torch.Tensor,
        local_mask: torch.Tensor,
        layers: tuple[int, ...] | None,
    ) -> torch.Tensor:
        """:meth:`forward`'s tree pass in one C call (``cpu_layers``): the embedding and
        rotary rows, every layer and the final norm (its sum of squares in C, as the layers'
        norms: the same rows as the module path to rounding). A step runs right after the
        layers have streamed their weights through the CPU's caches, where each Python or
        torch call costs tens of microseconds."""
        kernel = self.cpu_layers if layers is None else self.cpu_layers.subset(layers)
        start = int(where[0])
        return kernel.forward(self, tokens, positions, caches, start, local_mask)

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
        norm and the LM head in one C call (``cpu_layers``, with a block-product head:
        :meth:`~verispec.models.cpu_layer.LayerKernel.runs_head`). Bit for bit the rows of a
        :meth:`forward` tree pass and :meth:`logits` on them."""
        kernel = self.cpu_layers if layers is None else self.cpu_layers.subset(layers)
        nodes = tree.tokens.tolist() if tree is not None else []
        parents = tree.parents.tolist() if tree is not None else []
        return kernel.forward(
            self, [token, *nodes], (position,), caches, start, parents=parents, rows=1 + len(nodes)
        )

    def _blocks(
        self,
        x: torch.Tensor,
        inputs: PassInputs,
        caches: list[KVCache],
        layers: tuple[int, ...] | None,
    ) -> torch.Tensor:
        """The decoder layers one module at a time, then the final norm."""
        blocks = self.blocks if layers is None else [self.blocks[i] for i in layers]
        for block, cache in zip(blocks, caches, strict=True):
            x = block(x, inputs, cache)
        return self.norm(x)

    def _write_caches(
        self,
        x: torch.Tensor,
        inputs: PassInputs,
        caches: list[KVCache],
        layers: tuple[int, ...] | None,
    ) -> torch.Tensor:
        """:meth:`_blocks` for a pass whose rows nobody reads: the last layer writes only
        its keys and values (its output would feed nothing but the rows)."""
        blocks = self.blocks if layers is None else [self.blocks[i] for i in layers]
        for block, cache in zip(blocks[:-1], caches[:-1], strict=True):
            x = block(x, inputs, cache)
        blocks[-1].write_cache(x, inputs, caches[-1])
        return x[:0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head: hidden Shape: (R, E) to logits Shape: (R, V), float32 or float64."""
        out = _matmul(self.output, hidden)
        return out if out.dtype in (torch.float32, torch.float64) else out.float()


def _matmul(linear: nn.Module, x: torch.Tensor, kind: PassKind = PassKind.TREE) -> torch.Tensor:
    """``linear(x)``, rounding ``x`` to the weights' dtype and the result back (half weights);
    in a prompt pass, a block product's float32 GEMM (:meth:`BlockLinear.widened
    <verispec.models.cpu_linear.BlockLinear.widened>`)."""
    if kind is PassKind.PROMPT and isinstance(linear, BlockLinear):
        return linear.widened(x)  # float32 in, float32 out
    weight_dtype = cast(torch.dtype, getattr(linear, "weight_dtype", None) or linear.weight.dtype)
    if weight_dtype == x.dtype:
        if type(linear) is BlockLinear and not torch.compiler.is_compiling():
            return linear.eager(x)  # what its forward calls, without the module call
        return linear(x)
    return linear(x.to(weight_dtype)).to(x.dtype)


def _prompt_linear(linear: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x -> _matmul(linear, x, PassKind.PROMPT)`` for several row chunks of one prompt
    pass, a block product's weight widened once rather than per chunk."""
    if isinstance(linear, BlockLinear):
        return linear.widened_product()
    return functools.partial(_matmul, linear, kind=PassKind.PROMPT)


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
    model = Transformer(args).to(source.dtype)  # copies below are exact; the cast comes last
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
    target.weight.copy_(torch.cat([s.weight for s in sources], dim=0))
    if target.bias is not None:
        biases: list[torch.Tensor] = [
            s.bias if s.bias is not None else torch.zeros_like(s.weight[:, 0]) for s in sources
        ]
        target.bias.copy_(torch.cat(biases))

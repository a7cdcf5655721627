"""The reference attention of the plain model: torch operators, one core per kind of pass.

:class:`~verispec.models.llama.Attention` calls one of these cores, by the pass's
:class:`~verispec.models.passes.PassKind`; all take the same arguments, ``(q, k, v, cache,
inputs)`` (the rotated queries and keys, the values, the layer's
:class:`~verispec.models.passes.KVCache` and the pass's
:class:`~verispec.models.passes.PassInputs`), and return Shape: (Q, H * D):

* :func:`attend` (tree passes): the cache written, then the attention over the used slots,
  with a softmax whose row results do not depend on the other rows of the pass;
* :func:`attend_prompt` (a prompt's causal prefill): one fused
  ``scaled_dot_product_attention``;
* :func:`attend_static` (CUDA graphs): static shapes, no host read;
* :func:`cached_attention`: :func:`attend` as one opaque operator, for compiled graphs.

Faster cores (the C attention, the Triton static attention) are accelerators
(:mod:`verispec.models.accelerators`), which the runtime hands each
:class:`~verispec.models.llama.Attention` from outside.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.nn import functional as F

from verispec.models.invariance import VALUE_BLOCK, min_tokens
from verispec.models.passes import KVCache, PassInputs

__all__ = [
    "AttentionCore",
    "attend",
    "attend_prompt",
    "attend_static",
    "cached_attention",
    "on_buffers",
    "write_prompt_cache",
]

AttentionCore = Callable[[Tensor, Tensor, Tensor, KVCache, PassInputs], Tensor]
"""An attention core: ``(q, k, v, cache, inputs) -> out``, arguments as :func:`attend`'s."""


def on_buffers(
    core: AttentionCore, q: Tensor, k: Tensor, v: Tensor, cache_k: Tensor, cache_v: Tensor,
    where: Tensor, local_mask: Tensor,
) -> Tensor:  # fmt: skip
    """``core`` run on a cache's bare buffers (written in place) and a pass's ``where`` and
    ``local_mask``: how tests and benchmarks call a core without a model."""
    empty = q.new_empty(0)  # the rotary rows: a core reads none
    return core(
        q, k, v, KVCache.over(cache_k, cache_v), PassInputs(empty, empty, where, local_mask)
    )


def attend(q: Tensor, k: Tensor, v: Tensor, cache: KVCache, inputs: PassInputs) -> Tensor:
    """Write the new keys and values into the cache, then attend over the used slots.

    Args:
        q: Shape: (Q, H, D), rotated. k: Shape: (Q, Hkv, D), rotated. v: Shape: (Q, Hkv, D).
        cache: the layer's :class:`~verispec.models.passes.KVCache`, written in place.
        inputs: the pass's record: the new entries go to slots ``[start, start + Q)`` and the
            queries attend to slots ``[0, length)`` (``inputs.where``); each query sees the
            local slots ``inputs.local_mask`` allows, every slot before those, and no slot
            from ``start + Q`` on.

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
    :func:`verispec.models.accelerators.probe.row_invariant_kernels`), a tree node's logits
    equal, bit for bit, those of decoding its path one token at a time (see docs/runtime.rst).
    """
    return _attend(q, k, v, cache.k, cache.v, inputs.where, inputs.local_mask)


def _attend(
    q: Tensor, k: Tensor, v: Tensor, cache_k: Tensor, cache_v: Tensor, where: Tensor,
    local_mask: Tensor,
) -> Tensor:  # fmt: skip
    """:func:`attend` on the cache's buffers and the record's tensors."""
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
    q: Tensor, k: Tensor, v: Tensor, cache_k: Tensor, cache_v: Tensor, where: Tensor,
    local_mask: Tensor,
) -> Tensor:  # fmt: skip
    return _attend(q, k, v, cache_k, cache_v, where, local_mask)


@_cached_attention.register_fake
def _(q: Tensor, *rest: Tensor) -> Tensor:
    return q.new_empty((q.shape[0], q.shape[1] * q.shape[2]))  # (Q, H * D)


def cached_attention(q: Tensor, k: Tensor, v: Tensor, cache: KVCache, inputs: PassInputs) -> Tensor:
    """:func:`attend` as one opaque operator (``verispec::cached_attention``): the tree
    passes' core of a compiled forward
    (:class:`~verispec.models.accelerators.compiled.CompiledForward`), which keeps it out of
    its graphs (its slot count changes every step)."""
    return torch.ops.verispec.cached_attention(
        q, k, v, cache.k, cache.v, inputs.where, inputs.local_mask
    )


def _weighted_values(
    weights: Tensor, values: Tensor, local_mask: Tensor, start: int, groups: int
) -> Tensor:
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
    blocks: list[Tensor],
    weights: Tensor,
    values: Tensor,
    local_mask: Tensor,
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


def attend_static(q: Tensor, k: Tensor, v: Tensor, cache: KVCache, inputs: PassInputs) -> Tensor:
    """:func:`attend` with static shapes and no host read, for CUDA graphs.

    ``inputs.where`` is a 0-d int64 tensor on the device: the first slot of the new entries,
    which see every slot before it and, among themselves, what ``inputs.local_mask`` (Shape:
    (Q, Q)) allows. The queries attend to the whole cache (every later slot masked), so
    nothing depends on a value read on the host. Same arguments otherwise, same result to
    rounding: the value product is one product over the whole cache, not summed per block
    in sequential decoding's order as :func:`attend` does (a GPU's products promise no
    row-invariant bits anyway).
    """
    cache_k, cache_v, where, local_mask = cache.k, cache.v, inputs.where, inputs.local_mask
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


def attend_prompt(q: Tensor, k: Tensor, v: Tensor, cache: KVCache, inputs: PassInputs) -> Tensor:
    """:func:`attend` for a prompt's causal pass (``local_mask`` causal): the cache written,
    then one fused ``scaled_dot_product_attention`` over slots ``[0, start + Q)``
    (PyTorch's flash attention on the CPU: faster than the C attention on a prompt; with no
    earlier slots its own causal masking, which skips the masked blocks). Its rows depend on the
    kernel's blocking, so it serves prefill only (``PassKind.PROMPT``)."""
    cache_k, cache_v, local_mask = cache.k, cache.v, inputs.local_mask
    start = int(inputs.where[0])
    q_len, heads, head_dim = q.shape
    write_prompt_cache(k, v, cache, start)
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


def write_prompt_cache(k: Tensor, v: Tensor, cache: KVCache, start: int) -> None:
    """Write a prompt pass's keys and values (Shape: (Q, KV heads, D)) to slots
    ``[start, start + Q)`` of the cache."""
    q_len, _, head_dim = k.shape
    cache.k[:, start : start + q_len] = k.transpose(0, 1)
    cache.v[:, start : start + q_len, :head_dim] = v.transpose(0, 1)

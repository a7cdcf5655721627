"""The Triton tree attention as a Hugging Face ``transformers`` attention function.

:func:`register` adds ``"verispec"`` to transformers' ``AttentionInterface`` (and the
matching mask builder, sdpa's, to ``AttentionMaskInterface``), so any model that
follows the attention interface (Llama, Qwen2, Mistral, SmolLM2...) can run with
``model.set_attn_implementation("verispec")``; :func:`enable` does both, and
:func:`tree_attention_where_supported` does it for the length of a ``with`` block when Triton
is asked for (the benchmark's engine runs use it; by default, sdpa stays: it is faster at
these sizes).

The function reads the usual arguments: queries (B, H, Q, D), keys and values
(B, H_kv, S + Q, D) whose last Q entries are the queries' own, and a 4-D boolean
mask (B, 1, Q, S + Q). Its last Q columns become the kernel's tree mask, whose
empty tiles are skipped; the first S columns, its prefix mask (full tiles are read
without loading the mask). A ``None`` mask means causal (a prefill): the kernel then
compares positions itself and no (Q, Q) mask is built.

It falls back to transformers' sdpa function, with one ``RuntimeWarning`` per
reason, wherever the kernel does not apply: tensors not on CUDA (unless
``use_backend("triton")`` or ``VERISPEC_KERNELS=triton`` forces the interpreter),
dropout, float (additive) masks, per-head masks, soft-capping, position biases,
attention sinks, paged caches.

Shape glossary: B batch, H heads, D head dim, S cached tokens.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from verispec.kernels.backend import interpreting, requested_backend, tree_attention_backend
from verispec.kernels.block_order import block_states
from verispec.kernels.dtypes import FLOAT_DTYPES
from verispec.kernels.ops import attention_blocks, launch_tree_attention

__all__ = [
    "NAME",
    "enable",
    "register",
    "tree_attention_where_supported",
    "verispec_attention_forward",
]

NAME = "verispec"
_warned: set[str] = set()
# The mask object of the current forward pass and its tile tables: every layer gets
# the same mask tensor, so the tables are built once per pass. The strong reference
# keeps the identity check sound (no other tensor can take the same id meanwhile).
_cache: dict[str, Any] = {}


def register() -> str:
    """Register ``"verispec"`` with transformers' attention and mask interfaces."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, verispec_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def enable(hf_model: Any) -> None:
    """Register the function and switch ``hf_model`` (all its layers) to it."""
    register()
    hf_model.set_attn_implementation(NAME)


@contextlib.contextmanager
def tree_attention_where_supported(hf_model: Any, kernels: str = "auto") -> Iterator[bool]:
    """Inside the block ``hf_model`` runs the "verispec" attention where Triton is asked for.

    Only on request: ``kernels="triton"``, or ``"auto"`` inside ``use_backend("triton")``
    or with ``VERISPEC_KERNELS=triton`` (where
    :func:`~verispec.kernels.backend.tree_attention_backend` allows it on the model's
    device). By default the model keeps its own attention (sdpa with the tree mask), on
    CUDA too: at the tree and context sizes the adapter runs, the kernel's fixed cost a
    call loses to sdpa and made the adapter's step slower (docs/kernels.rst, "Tree
    attention or sdpa"). The previous attention implementation is restored on exit.
    Yields whether the kernel was switched on.
    """
    device = next(hf_model.parameters()).device
    requested = kernels if kernels != "auto" else requested_backend()
    if requested != "triton" or tree_attention_backend(device, requested) != "triton":
        yield False
        return
    previous = hf_model.config._attn_implementation
    enable(hf_model)
    try:
        yield True
    finally:
        hf_model.set_attn_implementation(previous)


def _note_fallback(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(
            f"verispec tree attention falls back to sdpa: {reason}.", RuntimeWarning, stacklevel=3
        )


def _fallback_reason(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float,
    kwargs: dict[str, Any],
) -> str | None:
    if tree_attention_backend(query.device) == "torch":
        return f"tensors on {query.device.type!r} (the kernel runs on CUDA)"
    if dropout:
        return "dropout is on (training)"
    for name in ("softcap", "position_bias", "s_aux", "sinks"):
        if kwargs.get(name) is not None:
            return f"`{name}` is not supported"
    if kwargs.get("cache") is not None:
        return "paged KV caches are not supported"
    if query.dtype not in FLOAT_DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        return f"dtype {query.dtype} is not supported"
    heads, q_len, head_dim = query.shape[1], query.shape[2], query.shape[3]
    kv_heads, kv_len = key.shape[1], key.shape[2]
    if key.shape[-1] != head_dim or value.shape[-1] != head_dim or head_dim > 256:
        return "key, value and query head dims differ or exceed 256"
    if heads % kv_heads or kv_len < q_len:
        return "the heads or key length do not fit a cache-plus-queries layout"
    if attention_mask is not None:
        if attention_mask.dtype != torch.bool:
            return "float (additive) attention masks are not supported; pass a boolean mask"
        batch = query.shape[0]
        shape = tuple(attention_mask.shape)
        if len(shape) != 4 or shape[1] != 1 or shape[0] not in (1, batch):
            return "only 4-D masks shared by all heads, (B, 1, Q, K), are supported"
        if shape[2:] != (q_len, kv_len):
            return "the mask does not match the query and key lengths"
    return None


def _tables(
    mask: torch.Tensor | None,
    causal: bool,
    q_len: int,
    kv_len: int,
    head_dim: int,
    dtype: torch.dtype,
    device: Any,
) -> tuple[
    torch.Tensor | None,
    torch.Tensor | None,
    tuple[torch.Tensor | None, torch.Tensor | None],
    int,
    int,
]:
    """Tree mask (``None``: causal), prefix mask and their tile tables; cached per mask object."""
    block_m, block_n = attention_blocks(q_len, head_dim, dtype)
    key = (block_m, block_n, q_len, kv_len, causal, str(device), interpreting())
    if _cache.get("mask") is mask and _cache.get("key") == key:
        return _cache["value"]  # type: ignore[no-any-return]
    prefix = kv_len - q_len
    tree_mask: torch.Tensor | None
    if mask is None:  # causal: the kernel compares positions, no (Q, Q) mask
        tree_mask = None if causal else torch.ones(1, q_len, q_len, dtype=torch.bool, device=device)
        prefix_mask = None
    else:
        full = mask[:, 0]  # (B, Q, S + Q)
        tree_mask = full[..., prefix:]
        prefix_mask = full[..., :prefix] if prefix else None
    states = (
        None if tree_mask is None else block_states(tree_mask, block_m, block_n),
        None if prefix_mask is None else block_states(prefix_mask, block_m, block_n),
    )
    value = (tree_mask, prefix_mask, states, block_m, block_n)
    _cache.update(mask=mask, key=key, value=value)
    return value


def verispec_attention_forward(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: tree attention, or sdpa where it does not apply.

    Args:
        query: Shape: (B, H, Q, D).
        key, value: Shape: (B, H_kv, S + Q, D); the last Q entries are the queries' own.
        attention_mask: bool, Shape: (B, 1, Q, S + Q) (True = attend), or ``None`` (causal).

    Returns:
        ``(output, None)``, output Shape: (B, Q, H, D), like transformers' sdpa function.
    """
    reason = _fallback_reason(module, query, key, value, attention_mask, dropout, kwargs)
    if reason is not None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        _note_fallback(reason)
        return sdpa_attention_forward(  # type: ignore[no-any-return]
            module, query, key, value, attention_mask,
            dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs,
        )  # fmt: skip
    batch, heads, q_len, head_dim = query.shape
    kv_len = key.shape[2]
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    tree_mask, prefix_mask, states, block_m, block_n = _tables(
        attention_mask, causal, q_len, kv_len, head_dim, query.dtype, query.device
    )
    prefix = kv_len - q_len
    out = torch.empty(batch, q_len, heads, head_dim, dtype=query.dtype, device=query.device)
    launch_tree_attention(
        query, key[:, :, :prefix], value[:, :, :prefix], key[:, :, prefix:], value[:, :, prefix:],
        tree_mask, prefix_mask, out.permute(0, 2, 1, 3), scaling,
        block_m=block_m, block_n=block_n, states=states,
    )  # fmt: skip
    return out, None

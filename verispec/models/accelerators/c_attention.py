"""The runtime's attention on the CPU in one call per layer (``kernels/cpu/attention.c``).

:func:`~verispec.models.attention.attend` writes the attention out in about fifty torch
operators a layer; on a small CPU their dispatch costs more than their arithmetic.
:func:`attend_cpu`
does the same in one call to the C kernel built with the block products
(:mod:`verispec.models.accelerators.blocks`): cache write, scores, mask, softmax and value product.

Each query row has its own arithmetic, over the keys it sees in slot order (every
committed slot, then the local slots its mask allows), its sums accumulated key by key in
that order: a row's bits depend only on its own keys, so a tree node equals decoding its
path one token at a time by construction, at any context length (no value blocks to
re-sum, see docs/runtime.rst). Its results differ from
:func:`~verispec.models.attention.attend`'s by rounding (another summation order, its own
vectorised ``exp``).

What the rows of a pass share is memory: all rows of one KV group (its heads, for every
token of the pass) read the same cached keys and values, and the kernel reads each key
block and value line once for all of them. An extra tree row costs its arithmetic, not
another sweep of the cache (figures: docs/benchmarks.rst); the bits are the same.

A prompt's causal pass (``PassKind.PROMPT``) has its own kernel,
:func:`attend_prompt_cpu` (``kernels/cpu/prompt_attention.c``): flash attention, one sweep of
the keys and values a block of tokens, instead of PyTorch's fused attention, which is
slower on the CPUs measured (figures: docs/benchmarks.rst). Like PyTorch's, its rows are
not those of the decoding kernel; every decoding method prefills alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from verispec.models.accelerators.base import Accelerator, Plan
from verispec.models.accelerators.blocks import library
from verispec.models.accelerators.buckets import BucketedForward
from verispec.models.attention import attend_prompt
from verispec.models.llama import KVCache, PassInputs, PassKind

if TYPE_CHECKING:
    from verispec.models.llama import Transformer

__all__ = ["CAttention", "attend_cpu", "attend_prompt_cpu", "cpu_attention_available"]


def cpu_attention_available(head_dim: int) -> bool:
    """Whether :func:`attend_cpu` runs here for this head dimension (a multiple of 8)."""
    return head_dim % 8 == 0 and library() is not None


def attend_cpu(q: Tensor, k: Tensor, v: Tensor, cache: KVCache, inputs: PassInputs) -> Tensor:
    """:func:`~verispec.models.attention.attend` (same arguments, float32 on the CPU), in C."""
    lib = library()
    if lib is None:
        raise RuntimeError("the CPU kernels are unavailable (see blocks.kernel_status)")
    cache_k, cache_v, start = cache.k, cache.v, int(inputs.where[0])
    q_len, heads, head_dim = q.shape
    kv_heads, capacity = k.shape[1], cache_k.shape[1]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    mask = inputs.local_mask.contiguous().view(torch.uint8)
    out = torch.empty(q_len, heads * head_dim)
    status = lib.vs_attend(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), cache_k.data_ptr(), cache_v.data_ptr(),
        capacity, q_len, heads, kv_heads, head_dim, start, mask.data_ptr(), mask.shape[1],
        out.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    if status != 0:
        raise RuntimeError(
            f"the CPU attention refused its arguments: Q={q_len}, heads={heads}/{kv_heads}, "
            f"head_dim={head_dim}, start={start}, capacity={capacity}, mask {tuple(mask.shape)}"
        )
    return out


def attend_prompt_cpu(
    q: Tensor, k: Tensor, v: Tensor, cache: KVCache, inputs: PassInputs
) -> Tensor:
    """:func:`~verispec.models.attention.attend_prompt` (same arguments, float32 on the CPU) in
    C: the keys and values written to the cache, then each token attends to every slot
    before its own and itself (a prompt pass is causal). A pass whose local mask is wider
    than its tokens (a padded one) runs :func:`~verispec.models.attention.attend_prompt`."""
    lib = library()
    if lib is None:
        raise RuntimeError("the CPU kernels are unavailable (see blocks.kernel_status)")
    q_len, heads, head_dim = q.shape
    if inputs.local_mask.shape[1] != q_len:
        return attend_prompt(q, k, v, cache, inputs)
    cache_k, cache_v, start = cache.k, cache.v, int(inputs.where[0])
    kv_heads, capacity = k.shape[1], cache_k.shape[1]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty(q_len, heads * head_dim)
    status = lib.vs_attend_prompt(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), cache_k.data_ptr(), cache_v.data_ptr(),
        capacity, q_len, heads, kv_heads, head_dim, start, out.data_ptr(),
        torch.get_num_threads(),
    )  # fmt: skip
    if status != 0:
        raise RuntimeError(
            f"the CPU prompt attention refused its arguments or ran out of memory: Q={q_len}, "
            f"heads={heads}/{kv_heads}, head_dim={head_dim}, start={start}, capacity={capacity}"
        )
    return out


class CAttention(Accelerator):
    """The accelerator that sets every layer's tree-pass attention core to :func:`attend_cpu`
    and its prompt-pass core to :func:`attend_prompt_cpu`: on the CPU in float32, eager (no
    compiled or graphed forward), ``attention="auto"``, where the kernels are built and the
    head dimension is a multiple of 8."""

    label = "+C attention"

    @classmethod
    def attach(
        cls, model: Transformer, plan: Plan, attached: Sequence[Accelerator]
    ) -> CAttention | None:
        eager = not any(isinstance(a, BucketedForward) for a in attached)
        if not (
            plan.attention == "auto"
            and eager
            and plan.device.type == "cpu"
            and model.compute_dtype == torch.float32
            and cpu_attention_available(model.args.head_dim)
        ):
            return None
        for block in model.blocks:
            block.attention.cores[PassKind.TREE] = attend_cpu
            block.attention.cores[PassKind.PROMPT] = attend_prompt_cpu
        return cls()

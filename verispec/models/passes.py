"""What one forward reads and writes: the pass record, its kind, and the caches.

A forward of the plain model (:class:`~verispec.models.llama.Transformer`) takes one
:class:`Pass`; each of its layers reads one :class:`PassInputs` (built once per pass) and
writes its own :class:`KVCache`. The attention cores (:mod:`verispec.models.attention`) and
every accelerator read the same records, so no long argument list is written twice.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

__all__ = ["KVCache", "Pass", "PassInputs", "PassKind"]


class PassKind(enum.Enum):
    """What kind of pass a forward is, which decides its attention core (and, for a prompt,
    its products): the caller that builds the pass names it."""

    TREE = "tree"
    """Pending tokens and tree nodes: every row row-invariant."""
    PROMPT = "prompt"
    """A prompt's causal prefill chunk: kernels made for many rows, not row-invariant
    (:func:`~verispec.models.attention.attend_prompt`, a :class:`Product`'s prompt form).
    Every decoding method prefills alike, and the first token comes from the next tree
    pass's root row."""
    STATIC = "static"
    """A CUDA graph's pass: ``where`` is a 0-d start on the device, the mask ``(Q, Q)``
    (:func:`~verispec.models.attention.attend_static`)."""


class PassInputs(NamedTuple):
    """What every layer of one forward reads besides its input and its cache, built once per
    pass from its :class:`Pass` (the rotary rows of its positions)."""

    cos: Tensor
    """The rotary table's rows of the pass's positions, Shape: (Q, D)."""
    sin: Tensor
    """As ``cos``, for the sines."""
    where: Tensor
    """int64 ``[start, length]``: the new entries go to slots ``[start, start + Q)`` and the
    tokens attend to slots ``[0, length)``; for a ``STATIC`` pass a 0-d ``start`` on the
    device (the whole cache is attended)."""
    local_mask: Tensor
    """bool, Shape: (Q, W): which of the W slots before ``start + Q`` each token sees (every
    earlier slot is seen, every later one is not)."""
    kind: PassKind = PassKind.TREE
    """The kind of pass (:class:`PassKind`)."""


class KVCache(nn.Module):
    """One layer's keys and values, preallocated, written in place by the attention
    (:func:`~verispec.models.attention.attend`).

    Buffers ``k``: Shape: (Hkv, capacity, D) and ``v``: Shape: (Hkv, capacity, D + 1),
    whose last column is all ones, so that one product of softmax weights with ``v``
    gives both the weighted values and the weights' sum (see
    :func:`~verispec.models.attention.attend`). Slot ``j`` holds the entry of the token the
    caller put there; the runtime keeps committed token ``j`` in slot ``j``.
    """

    k: Tensor
    v: Tensor

    def __init__(self, n_kv_heads: int, capacity: int, head_dim: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.capacity, self.head_dim = capacity, head_dim
        values = torch.zeros(n_kv_heads, capacity, head_dim + 1, dtype=dtype)
        values[..., head_dim] = 1.0
        self.register_buffer("k", torch.zeros(n_kv_heads, capacity, head_dim, dtype=dtype))
        self.register_buffer("v", values)

    @classmethod
    def over(cls, k: Tensor, v: Tensor) -> KVCache:
        """A cache whose buffers are ``k`` and ``v`` themselves (Shape: (Hkv, capacity, D) and
        (Hkv, capacity, D + 1)), written in place: to run an attention core on bare tensors."""
        cache = cls(k.shape[0], 0, k.shape[2], k.dtype)
        cache.capacity, cache.k, cache.v = k.shape[1], k, v
        return cache


class Pass(NamedTuple):
    """One forward's arguments: which tokens, at which positions, into which caches and
    slots, through which layers (:meth:`Transformer.forward
    <verispec.models.llama.Transformer.forward>` and every forward an accelerator runs
    instead take it)."""

    tokens: Tensor
    """int64, Shape: (Q,)."""
    positions: Tensor
    """int64, Shape: (Q,): the rotary position of each token."""
    caches: Sequence[KVCache]
    """One cache per decoder layer run."""
    where: Tensor
    """As :attr:`PassInputs.where`."""
    local_mask: Tensor
    """As :attr:`PassInputs.local_mask`."""
    layers: tuple[int, ...] | None = None
    """Run only these decoder layers, in order (a self-draft); all if None."""

"""A KV cache with room to grow, truncation and gather, for tree decoding.

Hugging Face's ``DynamicLayer`` concatenates on every update, copying the whole
cache each forward pass. :class:`TreeKVCache` keeps one preallocated buffer per
layer that doubles when full, so a forward pass writes only its new entries, a
rejected tree is dropped by moving a length, and :meth:`TreeKVCache.compact`
moves only the accepted nodes' entries (the tail) into place.

It plugs into a transformers model through the ``Cache.update(keys, values,
layer_idx)`` call that every attention module makes. Shape glossary: H key/value
heads, D head dim, S cached tokens.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from verispec.kernels.ops import compact_kv

__all__ = ["TreeKVCache"]


class _BufferLayer(DynamicLayer):
    """One layer's keys and values in a growing buffer; ``length`` entries are valid."""

    def __init__(self, min_capacity: int, max_capacity: int) -> None:
        super().__init__()
        self.min_capacity = min_capacity
        self.max_capacity = max_capacity
        self.length = 0
        self._key_buffer: torch.Tensor | None = None  # (1, H, capacity, D)
        self._value_buffer: torch.Tensor | None = None

    def _reserve(self, needed: int, like_keys: torch.Tensor, like_values: torch.Tensor) -> None:
        capacity = 0 if self._key_buffer is None else self._key_buffer.shape[-2]
        if needed <= capacity:
            return
        new_capacity = max(self.min_capacity, 2 * capacity, needed)
        new_capacity = min(new_capacity, max(self.max_capacity, needed))
        batch, heads, _, key_dim = like_keys.shape
        keys = like_keys.new_empty((batch, heads, new_capacity, key_dim))
        values = like_values.new_empty((batch, heads, new_capacity, like_values.shape[-1]))
        if self._key_buffer is not None and self.length:
            keys[:, :, : self.length] = self._key_buffer[:, :, : self.length]
            assert self._value_buffer is not None
            values[:, :, : self.length] = self._value_buffer[:, :, : self.length]
        self._key_buffer, self._value_buffer = keys, values

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append keys and values (Shape: (1, H, q, D)); return all valid entries."""
        if not self.is_initialized:
            self.dtype, self.device = key_states.dtype, key_states.device
            self.is_initialized = True
        new_length = self.length + key_states.shape[-2]
        self._reserve(new_length, key_states, value_states)
        assert self._key_buffer is not None and self._value_buffer is not None
        self._key_buffer[:, :, self.length : new_length] = key_states
        self._value_buffer[:, :, self.length : new_length] = value_states
        self.length = new_length
        self.keys = self._key_buffer[:, :, :new_length]
        self.values = self._value_buffer[:, :, :new_length]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def valid(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The valid keys and values, Shape: (1, H, length, D); ``None`` before any update."""
        if self._key_buffer is None or self._value_buffer is None:
            return None, None
        return self._key_buffer[:, :, : self.length], self._value_buffer[:, :, : self.length]

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)
        if self._key_buffer is not None:
            assert self._value_buffer is not None
            self.keys = self._key_buffer[:, :, : self.length]
            self.values = self._value_buffer[:, :, : self.length]

    def buffers(self) -> list[torch.Tensor]:
        """The key and value buffers (Shape: (1, H, capacity, D)); empty before any update."""
        if self._key_buffer is None or self._value_buffer is None:
            return []
        return [self._key_buffer, self._value_buffer]

    def reset(self) -> None:
        self.length = 0
        self._key_buffer = self._value_buffer = None
        self.keys = self.values = None  # type: ignore[assignment]
        self.is_initialized = False


class TreeKVCache(Cache):
    """A ``transformers`` cache whose layers can be truncated and gathered.

    Args:
        num_layers: decoder layers of the model (layers a self-draft skips stay empty).
        max_capacity: the most entries a layer will ever hold (the context length).
        min_capacity: the first allocation, in entries.
    """

    def __init__(self, num_layers: int, max_capacity: int, min_capacity: int = 256) -> None:
        layers = [
            _BufferLayer(min(min_capacity, max_capacity), max_capacity) for _ in range(num_layers)
        ]
        super().__init__(layers=layers)  # type: ignore[arg-type]

    @property
    def buffer_layers(self) -> list[_BufferLayer]:
        return self.layers  # type: ignore[return-value]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return max((layer.length for layer in self.buffer_layers), default=0)

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` entries of every layer."""
        for layer in self.buffer_layers:
            layer.truncate(length)

    def compact(self, start: int, source: torch.Tensor) -> None:
        """Keep entries ``[0, start)`` then entries ``source`` (int64 on the cache's device).

        Only ``len(source)`` entries per layer move: the accepted path of a tree.
        """
        buffers = [buffer for layer in self.buffer_layers for buffer in layer.buffers()]
        with torch.no_grad():
            # One Triton launch for every layer on CUDA; index_select + copy elsewhere.
            compact_kv(buffers, start, source)
        self.truncate(start + source.numel())

    def reset(self) -> None:
        for layer in self.buffer_layers:
            layer.reset()

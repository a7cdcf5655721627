"""A seconds-to-load stand-in for the embedded model: a tiny random Llama and a byte tokenizer.

``verispec bench --model tiny`` uses it to exercise the whole benchmark path (every
method, tables, JSON, Markdown, PNG) in seconds, for tests and for checking an
installation. Its figures mean nothing about speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["ByteTokenizer", "load_smoke_model"]


class ByteTokenizer:
    """UTF-8 bytes as tokens: id ``b + 2`` for byte ``b``; 0 = BOS, 1 = EOS. No chat template."""

    bos_token_id = 0
    eos_token_id = 1
    chat_template = None
    _OFFSET = 2

    def __len__(self) -> int:
        return 256 + self._OFFSET

    def encode(self, text: str) -> list[int]:
        return [self.bos_token_id, *(b + self._OFFSET for b in text.encode("utf-8"))]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        data = bytes(int(i) - self._OFFSET for i in ids if int(i) >= self._OFFSET)
        return data.decode("utf-8", errors="replace")


def load_smoke_model(
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    *,
    runtime: str = "auto",
    compile: bool = False,
    keep_source: bool = True,
) -> tuple[Any, ByteTokenizer]:
    """A 4-layer random Llama over the byte vocabulary, and its :class:`ByteTokenizer`.

    ``runtime``, ``compile`` and ``keep_source`` as for
    :func:`verispec.models.default.make_target`.
    """
    from verispec.models.default import make_target
    from verispec.models.tiny import tiny_llama

    tokenizer = ByteTokenizer()
    llama = tiny_llama(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_layers=4,
        max_length=4096,
        dtype=dtype,
        device=device,
    )
    target = make_target(llama.hf_model, runtime=runtime, compile=compile, keep_source=keep_source)
    return target, tokenizer

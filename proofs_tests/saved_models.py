"""Tiny models saved to disk as a user's would be: a ``save_pretrained`` directory with a
byte-level tokenizer (258 tokens: 256 bytes, ``<s>``, ``</s>``), made here, offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def byte_tokenizer() -> Any:
    """A ``PreTrainedTokenizerFast`` over bytes: ids 0-255 the bytes, 256 ``<s>``, 257 ``</s>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: i for i, symbol in enumerate(sorted(alphabet))}
    vocab["<s>"], vocab["</s>"] = 256, 257
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")


def save_tiny_model(
    directory: Path, *, seed: int = 0, num_layers: int = 4, tokenizer: bool = True
) -> Path:
    """A tiny random float32 Llama over :func:`byte_tokenizer`'s vocabulary, saved to
    ``directory`` (with the tokenizer unless ``tokenizer=False``); returns ``directory``."""
    from verispec.models.tiny import tiny_llama

    hf_model = tiny_llama(
        vocab_size=258, hidden_size=32, num_layers=num_layers, seed=seed, dtype=torch.float32
    ).hf_model
    hf_model.config.eos_token_id = hf_model.generation_config.eos_token_id = 257
    hf_model.config.bos_token_id = hf_model.generation_config.bos_token_id = 256
    hf_model.generation_config.pad_token_id = 257
    hf_model.save_pretrained(directory)
    if tokenizer:
        byte_tokenizer().save_pretrained(directory)
    return directory

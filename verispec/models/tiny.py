"""Tiny randomly initialised causal LMs for fast tests (Llama, Qwen2, Mistral).

Each factory builds a ``transformers`` model from a small config, initialises its
weights from a seeded ``torch.Generator`` (never the global RNG), and wraps it in
:class:`~verispec.models.hf.HFModel`. In float64 their logits make exact
comparisons (tree forward against sequential forward, to 1e-9) meaningful.

The weights are drawn with a larger standard deviation than a trained model's
init so that the next-token distributions are far from uniform: greedy
continuations are then well defined and drafts are sometimes right.

:func:`load_smoke_model` (``verispec bench --model tiny``) is the seconds-to-load
stand-in for the embedded model: a 4-layer random Llama over the bytes of
:class:`ByteTokenizer`, to exercise the whole benchmark path (every method, tables,
JSON, Markdown, PNG) in tests and when checking an installation. Its figures mean
nothing about speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from verispec.errors import ConfigError
from verispec.kernels.cpu.features import default_dtype
from verispec.models.hf import HFModel
from verispec.models.target import make_target

if TYPE_CHECKING:
    from verispec.models.target import Runtime

__all__ = ["tiny_llama", "tiny_mistral", "tiny_model", "tiny_qwen2"]


def _common_config(
    vocab_size: int, hidden_size: int, num_layers: int, max_length: int, attention: str
) -> dict[str, Any]:
    return {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": max_length,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": None,
        "tie_word_embeddings": False,
        "attn_implementation": attention,
    }


def _seeded_init(model: torch.nn.Module, seed: int, std: float) -> None:
    generator = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                param.fill_(1.0)
            elif name.endswith(".bias"):
                values = torch.randn(param.shape, generator=generator, dtype=torch.float64)
                param.copy_(0.1 * values)
            else:
                values = torch.randn(param.shape, generator=generator, dtype=torch.float64)
                param.copy_(std * values)


def tiny_model(
    architecture: str = "llama",
    *,
    vocab_size: int = 64,
    hidden_size: int = 32,
    num_layers: int = 2,
    max_length: int = 256,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    device: str | torch.device = "cpu",
    attention: str = "sdpa",
    std: float = 0.3,
) -> HFModel:
    """A tiny random causal LM wrapped in :class:`HFModel`.

    Args:
        architecture: ``"llama"``, ``"qwen2"`` or ``"mistral"``.
        vocab_size: V, the logits width.
        hidden_size: model width (4 attention heads, 2 key/value heads).
        num_layers: decoder layers.
        max_length: ``max_position_embeddings`` (and the context of the wrapper).
        seed: seeds the weights; the same seed gives the same model.
        dtype: parameter dtype; float64 for exact comparisons.
        attention: ``"sdpa"`` or ``"eager"``.
        std: standard deviation of the random weights.
    """
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    common = _common_config(vocab_size, hidden_size, num_layers, max_length, attention)
    model: Any
    if architecture == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif architecture == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False))
    elif architecture == "mistral":
        model = MistralForCausalLM(MistralConfig(**common, sliding_window=max_length))
    else:
        raise ConfigError(
            f"`architecture` must be 'llama', 'qwen2' or 'mistral'; got {architecture!r}."
        )
    model = model.to(dtype=dtype)
    _seeded_init(model, seed, std)
    model = model.to(device)
    model.generation_config.eos_token_id = 1
    model.generation_config.pad_token_id = 1
    return HFModel(model)


def tiny_llama(**kwargs: Any) -> HFModel:
    """A tiny random Llama; keyword arguments as :func:`tiny_model`."""
    return tiny_model("llama", **kwargs)


def tiny_qwen2(**kwargs: Any) -> HFModel:
    """A tiny random Qwen2 (attention biases on q/k/v); arguments as :func:`tiny_model`."""
    return tiny_model("qwen2", **kwargs)


def tiny_mistral(**kwargs: Any) -> HFModel:
    """A tiny random Mistral (window = context); arguments as :func:`tiny_model`."""
    return tiny_model("mistral", **kwargs)


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
        """The text of ``ids``; an id past the bytes (a random model with a larger
        vocabulary, such as one of SmolLM2's shape) reads as U+FFFD."""
        data = bytearray()
        for i in map(int, ids):
            if i >= len(self):
                data += "\ufffd".encode()
            elif i >= self._OFFSET:
                data.append(i - self._OFFSET)
        return data.decode("utf-8", errors="replace")

    def token_bytes(self) -> list[bytes]:
        """Each id's bytes, BOS and EOS as their names: the token list structured output
        (``llguidance``) reads."""
        return [b"<s>", b"</s>", *(bytes([b]) for b in range(256))]


def load_smoke_model(
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
    *,
    runtime: Runtime = "auto",
    compile: bool = False,
    keep_source: bool = True,
    weights: str = "auto",
    arithmetic: str = "exact",
) -> tuple[Any, ByteTokenizer]:
    """A 4-layer random Llama over the byte vocabulary, and its :class:`ByteTokenizer`.

    ``runtime``, ``compile``, ``keep_source``, ``weights`` and ``arithmetic`` as for
    :func:`verispec.models.target.make_target`.
    """
    tokenizer = ByteTokenizer()
    if dtype == "auto":  # random weights: no blocks to read
        dtype = torch.float32 if arithmetic == "int8" else default_dtype(device)
    llama = tiny_llama(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_layers=4,
        max_length=4096,
        dtype=dtype,
        device=device,
    )
    target = make_target(
        llama.hf_model,
        runtime=runtime,
        compile=compile,
        keep_source=keep_source,
        weights=weights,
        arithmetic=arithmetic,
    )
    return target, tokenizer

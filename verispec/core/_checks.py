"""The checks of the decoder's public arguments, where they enter.

Each raises :class:`~verispec.errors.ConfigError` naming the argument, what was
given and what is allowed, so a wrong argument fails at construction (or at the
start of ``generate``), never as an ``AttributeError`` deep inside the loop.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import attrs
import torch

from verispec.core.types import GenerationParams
from verispec.errors import ConfigError

__all__ = ["check_decoder_arguments", "describe", "generation_config", "token_id_list"]


def check_decoder_arguments(
    target: object, drafter: object, verifier: object, tokenizer: object
) -> None:
    """Raise :class:`ConfigError` unless ``SpeculativeDecoder``'s arguments have the right kinds."""
    _check_target(target)
    _check_drafter(drafter)
    _check_verifier(verifier)
    if tokenizer is not None and not all(
        callable(getattr(tokenizer, name, None)) for name in ("encode", "decode", "__len__")
    ):
        raise ConfigError(
            "`tokenizer` must be a Hugging Face tokenizer (with `encode`, `decode` and "
            f"`len()`) or None; got {describe(tokenizer)}."
        )


def describe(value: object) -> str:
    text = repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{type(value).__name__} {text}"


def _check_target(target: object) -> None:
    missing = [
        name
        for name in ("prefill", "forward_tree", "commit", "reset")
        if not callable(getattr(target, name, None))
    ]
    missing += [name for name in ("vocab_size", "max_length") if not hasattr(target, name)]
    if missing or isinstance(target, type):
        raise ConfigError(
            "`target` must be a LanguageModel instance (prefill, forward_tree, commit, reset, "
            f"vocab_size, max_length); got {describe(target)}"
            + (f", which lacks {', '.join(missing)}." if missing else ".")
            + " Load one with verispec.load_default_model() or verispec.models.HFModel."
        )


def _check_drafter(drafter: object) -> None:
    if drafter is None:
        return
    methods = ("begin", "propose", "observe")
    if isinstance(drafter, type) or not all(callable(getattr(drafter, m, None)) for m in methods):
        raise ConfigError(
            "`drafter` must be a Drafter instance (with begin, propose and observe) or None; "
            f"got {describe(drafter)}. Build one, e.g. verispec.drafters.TokenRecycling()."
        )


def _check_verifier(verifier: object) -> None:
    if verifier is None:
        return
    instance = not isinstance(verifier, type) and callable(getattr(verifier, "verify", None))
    policy = callable(verifier) and not isinstance(verifier, type)
    if not (instance or policy):
        raise ConfigError(
            "`verifier` must be a Verifier instance (with a `verify` method), a callable "
            "mapping SamplingParams to one, or None; got "
            f"{describe(verifier)}. E.g. verispec.verifiers.RecursiveRejection()."
        )


def generation_config(config: object, overrides: dict[str, Any]) -> GenerationParams:
    """``config`` (default: ``GenerationParams()``) with ``overrides`` applied, checked."""
    if config is None:
        config = GenerationParams()
    if not isinstance(config, GenerationParams):
        raise ConfigError(
            f"`config` must be a GenerationParams or None; got {describe(config)}. Pass "
            "GenerationParams(**settings), or the settings as keywords of generate()."
        )
    if overrides:
        fields = [f.name for f in attrs.fields(GenerationParams)]
        unknown = sorted(set(overrides) - set(fields))
        if unknown:
            raise ConfigError(
                f"`{unknown[0]}` is not a generation setting; allowed: {', '.join(fields)}."
            )
        config = attrs.evolve(config, **overrides)
    return config


def token_id_list(prompt: object) -> list[int]:
    """Token ids from a 1-D integer tensor or array, a (1, S) one (what a tokenizer returns
    with ``return_tensors="pt"``: a batch of one), or a flat sequence of integers."""
    if not isinstance(prompt, torch.Tensor | Sequence) and hasattr(prompt, "__array__"):
        prompt = torch.as_tensor(prompt)  # a NumPy array: checked as a tensor
    if isinstance(prompt, torch.Tensor):
        if prompt.dtype == torch.bool or prompt.is_floating_point() or prompt.is_complex():
            raise ConfigError(
                f"`prompt` must hold integer token ids; got a tensor of dtype {prompt.dtype}."
            )
        if prompt.dim() == 2 and prompt.shape[0] == 1:
            prompt = prompt[0]
        if prompt.dim() != 1:
            raise ConfigError(
                "`prompt` must be one sequence, Shape: (S,) or (1, S); got a tensor of shape "
                f"{tuple(prompt.shape)}. Generate one sequence per call (no batches)."
            )
        return [int(t) for t in prompt.tolist()]
    if not isinstance(prompt, Sequence):
        raise ConfigError(
            f"`prompt` must be a string or token ids (a list or a 1-D tensor); got "
            f"{describe(prompt)}."
        )
    ids = []
    for token in prompt:
        if isinstance(token, torch.Tensor) and token.dim() == 0:
            token = token.item()
        if isinstance(token, Sequence | torch.Tensor) and not isinstance(token, str):
            raise ConfigError(
                "`prompt` must be one flat sequence of token ids; got a nested sequence. "
                "Generate one sequence per call (no batches)."
            )
        if isinstance(token, bool) or not isinstance(token, numbers.Integral):
            raise ConfigError(f"`prompt` must hold integer token ids; got {token!r}.")
        ids.append(int(token))
    return ids

"""Which model runs a loaded ``transformers`` causal LM as the decoding target.

:func:`make_target` wraps it on verispec's fast runtime (:class:`~verispec.models.FastModel`)
where the runtime covers the architecture, or in the Hugging Face adapter
(:class:`~verispec.models.HFModel`), and says which and why. The loaders
(:func:`~verispec.models.loading.load_model`,
:func:`~verispec.models.default.load_default_model`) end with it;
``verispec.models.default`` re-exports it (its documented path).
"""

from __future__ import annotations

from typing import Any

import torch

from verispec.errors import ConfigError, UnsupportedModelError
from verispec.models.hf import HFModel
from verispec.models.runtime import FastModel

__all__ = ["RUNTIMES", "make_target"]

RUNTIMES = ("auto", "fast", "hf")
"""What ``runtime=`` takes: the fast runtime where it covers the model, the runtime, the adapter."""


def make_target(
    hf_model: Any,
    *,
    runtime: str = "auto",
    dtype: torch.dtype | str | None = None,
    max_length: int | None = None,
    compile: bool = False,
    keep_source: bool = True,
    weights: str = "auto",
) -> FastModel | HFModel:
    """Wrap a loaded ``transformers`` causal LM as the decoding target.

    Args:
        hf_model: the model, already on its device.
        runtime: ``"fast"`` (verispec's runtime, :class:`FastModel`), ``"hf"`` (the
            :class:`HFModel` adapter) or ``"auto"``: the runtime where it supports the
            architecture, the adapter elsewhere.
        dtype: for the runtime, the weight dtype (``"auto"``: bfloat16 where the CPU
            multiplies it natively, else float32; ``None``: the model's own). The adapter
            runs the model in its own dtype.
        max_length: optional cap on the context.
        compile: compile the runtime's forward per tree-size bucket (see :class:`FastModel`).
        keep_source: the runtime keeps ``hf_model`` (``False``: drops its reference, see
            :class:`FastModel`); the adapter always keeps it.
        weights: how the runtime's CPU products read the weights (:class:`FastModel`):
            ``"auto"`` reads GGUF low-bit blocks where the weights are exactly such blocks.

    The returned model's ``runtime_note`` says which was picked and why.

    Raises:
        ConfigError: an unknown ``runtime``.
        UnsupportedModelError: ``runtime="fast"`` for a model it does not cover.
    """
    if runtime not in RUNTIMES:
        raise ConfigError(f"`runtime` must be one of {RUNTIMES}; got {runtime!r}.")
    model: FastModel | HFModel
    if runtime == "hf":
        model = HFModel(hf_model, max_length=max_length)
        note = "HF adapter (asked for with runtime='hf')"
    else:
        try:
            model = FastModel(
                hf_model,
                dtype=dtype,
                max_length=max_length,
                compile=compile,
                keep_source=keep_source,
                weights=weights,
            )
            note = f"fast runtime ({model.runtime}, {str(model.dtype).replace('torch.', '')})"
        except UnsupportedModelError as error:
            if runtime == "fast":
                raise
            model = HFModel(hf_model, max_length=max_length)
            note = f"HF adapter: the fast runtime does not cover this model ({error})"
    model.runtime_note = note
    return model

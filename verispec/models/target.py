"""Which model runs a loaded ``transformers`` causal LM as the decoding target.

:func:`make_target` wraps it on verispec's fast runtime (:class:`~verispec.models.FastModel`)
where the runtime covers the architecture, or in the Hugging Face adapter
(:class:`~verispec.models.HFModel`), and says which and why. The loaders
(:func:`~verispec.models.loading.load_model`,
:func:`~verispec.models.default.load_default_model`) end with it;
``verispec.models.default`` re-exports it (its documented path).
"""

from __future__ import annotations

import os
from typing import Any, Literal, get_args

import torch

from verispec.core.validate import choice
from verispec.errors import ConfigError, UnsupportedModelError
from verispec.kernels.dtypes import FLOAT_DTYPES
from verispec.models.hf import HFModel
from verispec.models.runtime import FastModel

__all__ = [
    "DTYPES",
    "RUNTIMES",
    "DType",
    "Runtime",
    "check_dtype",
    "check_runtime",
    "make_target",
]

Runtime = Literal["auto", "fast", "hf"]
"""What runs a model (:func:`make_target`): the fast runtime where it covers the model, the
runtime, the adapter; checked by :func:`check_runtime`."""
RUNTIMES: tuple[Runtime, ...] = get_args(Runtime)

DType = Literal["float32", "bfloat16", "float16", "auto"]
"""A weight dtype by name (``"auto"``: :func:`~verispec.kernels.dtypes.auto_dtype`);
checked by :func:`check_dtype`."""
DTYPES: tuple[DType, ...] = get_args(DType)


def check_runtime(value: object, name: str = "runtime") -> Runtime:
    """``value`` if it is one of :data:`RUNTIMES`; else :class:`ConfigError` naming ``name``."""
    checked: Runtime = choice(name, value, RUNTIMES)
    return checked


def check_dtype(value: object, name: str = "dtype") -> torch.dtype | Literal["auto"]:
    """A dtype name of :data:`DTYPES` as its ``torch.dtype`` (``"auto"`` kept), or one of
    :data:`~verispec.kernels.dtypes.FLOAT_DTYPES` as given; else :class:`ConfigError` naming
    ``name``."""
    if isinstance(value, torch.dtype) and value in FLOAT_DTYPES:
        return value
    shown = ", ".join(map(str, FLOAT_DTYPES))
    checked = choice(name, value, DTYPES, note=f" or one of {shown}")
    return "auto" if checked == "auto" else getattr(torch, checked)


def make_target(
    hf_model: Any,
    *,
    runtime: Runtime = "auto",
    dtype: torch.dtype | DType | None = None,
    max_length: int | None = None,
    compile: bool = False,
    keep_source: bool = True,
    weights: str = "auto",
    arithmetic: str = "exact",
    gguf_file: str | os.PathLike[str] | None = None,
) -> FastModel | HFModel:
    """Wrap a loaded ``transformers`` causal LM as the decoding target.

    Args:
        hf_model: the model, already on its device.
        runtime: ``"fast"`` (verispec's runtime, :class:`FastModel`), ``"hf"`` (the
            :class:`HFModel` adapter) or ``"auto"``: the runtime where it supports the
            architecture, the adapter elsewhere.
        dtype: for the runtime, the weight dtype (``"auto"``:
            :func:`~verispec.kernels.dtypes.auto_dtype`, float32 where the weights are a
            GGUF file's blocks the CPU kernel reads, else bfloat16 where the CPU multiplies
            it natively and float32 elsewhere; ``None``: the model's own). The adapter runs
            the model in its own dtype.
        max_length: optional cap on the context.
        compile: compile the runtime's forward per tree-size bucket (see :class:`FastModel`).
        keep_source: the runtime keeps ``hf_model`` (``False``: drops its reference, see
            :class:`FastModel`); the adapter always keeps it.
        weights: how the runtime's CPU products read the weights (:class:`FastModel`):
            ``"auto"`` reads GGUF low-bit blocks where the weights are exactly such blocks.
        arithmetic: ``"exact"`` (default) or ``"int8"``: integer products of the blocks'
            codes and 8-bit activations, a different model (:class:`FastModel`); it needs
            the fast runtime on a CPU.
        gguf_file: the GGUF file ``hf_model`` was read from: the runtime reads its
            matrices' blocks from it, every format the presets write (:class:`FastModel`).

    The returned model's ``runtime_note`` says which was picked and why.

    Raises:
        ConfigError: an unknown ``runtime``, or ``arithmetic="int8"`` where the fast
            runtime does not run it.
        UnsupportedModelError: ``runtime="fast"`` for a model it does not cover.
    """
    check_runtime(runtime)
    if arithmetic == "int8" and runtime == "hf":
        raise ConfigError("`arithmetic='int8'` runs on the fast runtime only; got runtime='hf'.")
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
                arithmetic=arithmetic,
                gguf_file=gguf_file,
            )
            note = f"fast runtime ({model.runtime}, {str(model.dtype).replace('torch.', '')})"
        except UnsupportedModelError as error:
            if runtime == "fast" or arithmetic != "exact":
                raise
            model = HFModel(hf_model, max_length=max_length)
            note = f"HF adapter: the fast runtime does not cover this model ({error})"
    model.runtime_note = note
    return model

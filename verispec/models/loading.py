"""Load a user's model: a local ``transformers`` model directory or a GGUF file.

:func:`load_model` is :func:`~verispec.models.default.load_default_model` for any
causal LM on disk (no hub is contacted):

* a **directory** written by ``save_pretrained`` (``config.json`` and weights) is loaded
  with ``AutoModelForCausalLM.from_pretrained``; its tokenizer from the same directory
  unless ``tokenizer`` names another;
* a **GGUF file** is dequantized on the first load (a Llama by verispec, bit for bit as
  ``transformers`` would, in seconds; any other architecture by ``transformers``, which
  needs the ``gguf`` package) and the result cached under
  :func:`~verispec.models.default.default_cache_dir`, keyed by the file's path, size and
  modification time, so later loads take seconds (:mod:`verispec.models.gguf_convert`,
  :mod:`verispec.models.gguf`; the embedded SmolLM2 file shares
  :func:`~verispec.models.default.load_default_model`'s cache). Its tokenizer comes from
  the file's own metadata unless ``tokenizer`` names one.

The loaded model is wrapped by :func:`~verispec.models.target.make_target`: the fast
runtime where it covers the architecture, else the Hugging Face adapter.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from verispec.core import paths
from verispec.core.notices import notice
from verispec.errors import ConfigError, ModelFileError
from verispec.kernels.dtypes import auto_dtype
from verispec.models import gguf, gguf_convert
from verispec.models.accelerators.blocks import BlockLinear, holds_blocks, kernel_status
from verispec.models.gguf_rows import KERNEL_TYPES
from verispec.models.invariance import RowProduct
from verispec.models.target import DType, Runtime, check_dtype, check_runtime, make_target

__all__ = ["check_model", "load_model", "model_source"]


def model_source(path: str | os.PathLike[str]) -> tuple[str, Path]:
    """``("dir", path)`` or ``("gguf", path)`` for a model on disk.

    Raises:
        ConfigError: the path does not exist, or is neither a model directory (with a
            ``config.json``) nor a ``.gguf`` file.
    """
    resolved = Path(path).expanduser()
    if resolved.is_dir():
        if not (resolved / "config.json").is_file():
            raise ConfigError(
                f"model directory `{path}` has no config.json; a model directory is what "
                "`save_pretrained` writes (config.json, weights, tokenizer files)."
            )
        return "dir", resolved
    if resolved.is_file():
        if resolved.suffix.lower() != ".gguf":
            raise ConfigError(
                f"a model file must be a GGUF file (*.gguf); got `{path}`. Pass a model "
                "directory for other formats."
            )
        return "gguf", resolved
    raise ConfigError(
        f"model `{path}` does not exist; give a model directory, a .gguf file, or one of "
        "the built-in names (smollm2, tiny)."
    )


def check_model(
    path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None
) -> None:
    """What :func:`load_model` would find wrong with ``path`` before any long work, found in
    a fraction of a second: :func:`model_source`'s checks and, for a GGUF file not converted
    yet, its layout (:func:`verispec.models.gguf.check_file`: a file cut short).

    Raises:
        ConfigError: as :func:`model_source`.
        ModelFileError: (a ``ConfigError``) a GGUF file that is not GGUF, cut short or corrupt.
    """
    kind, source = model_source(path)
    if kind == "gguf":
        root = Path(cache_dir).expanduser() if cache_dir is not None else paths.cache_dir()
        if not (gguf.converted_dir(source, root) / "config.json").is_file():
            gguf.check_file(source)


def _read_causal_lm(directory: Path, dtype: Any, what: str) -> Any:
    """transformers' model from a ``save_pretrained`` directory, every weight read.

    Raises:
        ModelFileError: naming ``what``: the files cannot be read, or some weight is not in
            them (transformers would initialise it at random and carry on).
    """
    from transformers import AutoModelForCausalLM

    try:
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            str(directory), dtype=dtype, attn_implementation="sdpa", output_loading_info=True
        )
    except Exception as exc:  # OSError, ValueError, safetensors' errors, struct.error...
        raise ModelFileError(
            f"cannot load a causal LM from {what}: {gguf.exception_text(exc)}"
        ) from None
    hf_model, info = loaded
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise ModelFileError(
            f"cannot load a causal LM from {what}: {len(missing)} weights are missing from "
            f"its files (e.g. {missing[0]}); a weight shard is missing or incomplete."
        )
    return hf_model


# the attribute of the loaded transformers model (``model.hf_model``) that records
# ``load_model``'s ``max_length``: ``generate(custom_generate=...)`` on that model builds
# its runtime with the same cap (verispec.custom_generate.target_for)
MAX_LENGTH_ATTRIBUTE = "_verispec_max_length"


def load_model(
    path: str | os.PathLike[str],
    *,
    tokenizer: str | os.PathLike[str] | None = None,
    dtype: torch.dtype | DType = torch.float32,
    device: str | torch.device = "cpu",
    runtime: Runtime = "auto",
    max_length: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    compile: bool = False,
    keep_source: bool = True,
    weights: str = "auto",
    arithmetic: str = "exact",
) -> tuple[Any, Any]:
    """Load a causal LM from a local directory or GGUF file, and its tokenizer.

    Args:
        path: a ``save_pretrained`` directory or a ``.gguf`` file.
        tokenizer: a directory holding the tokenizer, when ``path`` has none (or another
            one is wanted).
        dtype, device, runtime, max_length, cache_dir, compile, keep_source, weights: as for
            :func:`~verispec.models.default.load_default_model`, and ``arithmetic`` too.
            ``dtype="auto"`` is decided by the weights
            (:func:`~verispec.kernels.dtypes.auto_dtype`), for a directory as for a GGUF
            file: they are read in float32 where GGUF blocks would keep it, and cast to the
            rule's dtype if they are not blocks.

    Returns:
        ``(model, tokenizer)``: a :class:`~verispec.models.FastModel` (or an
        :class:`~verispec.models.HFModel`) and a Hugging Face tokenizer.

    Raises:
        ConfigError: a path that is not a model, or an unknown ``runtime``.
        ModelFileError: (a ``ConfigError``) a file or directory that cannot be read: not
            GGUF, truncated, a missing shard, an architecture transformers does not know,
            a tokenizer that cannot be loaded. Nothing is left in the cache; a damaged
            converted copy of a GGUF file is converted again (once).
    """
    from transformers import AutoTokenizer

    check_runtime(runtime)
    dtype = check_dtype(dtype)
    kind, source = model_source(path)
    gguf_file = source if kind == "gguf" else None  # its blocks are read from it too
    what = f"the converted copy of `{path}`" if kind == "gguf" else f"`{path}`"
    auto = dtype == "auto"
    if auto:  # the weights decide (auto_dtype): read in float32 where blocks would keep it
        dtype = auto_dtype(device, blocks=kernel_status()[0])
    if kind == "gguf":
        root = Path(cache_dir).expanduser() if cache_dir is not None else paths.cache_dir()
        converted = gguf.converted_dir(source, root)
        if not (converted / "config.json").is_file():
            gguf_convert.convert(source, converted)
        try:
            hf_model = _read_causal_lm(converted, dtype, what)
        except ModelFileError as exc:  # a damaged cache entry: made again from the file
            notice(f"{exc}; converting `{path}` again")
            shutil.rmtree(converted, ignore_errors=True)
            gguf_convert.convert(source, converted)
            hf_model = _read_causal_lm(converted, dtype, what)
        source = converted
    else:
        hf_model = _read_causal_lm(source, dtype, what)
    hf_model = hf_model.to(device)
    if auto and dtype == torch.float32 and arithmetic == "exact":  # float32 where blocks are
        dtype = auto_dtype(device, blocks=holds_blocks(hf_model, gguf_file))
        if dtype != torch.float32:  # cast only then: `to` casts the buffers too
            hf_model = hf_model.to(dtype)
    tokenizer_source = Path(tokenizer).expanduser() if tokenizer is not None else source
    try:
        loaded_tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_source))
    except Exception as exc:
        hint = "" if tokenizer is not None else " Pass its tokenizer directory (--tokenizer)."
        raise ModelFileError(
            f"cannot load a tokenizer from `{tokenizer_source}`: {exc}.{hint}"
        ) from None
    model = make_target(
        hf_model,
        runtime=runtime,
        dtype=dtype,
        max_length=max_length,
        compile=compile,
        keep_source=keep_source,
        weights=weights,
        arithmetic=arithmetic,
        gguf_file=gguf_file,
    )
    if kind == "gguf":
        model.runtime_note += _dense_note(model, gguf.matrix_formats(Path(path)))
    kept = getattr(model, "hf_model", None)  # None where keep_source=False dropped it
    if kept is not None and max_length is not None:
        setattr(kept, MAX_LENGTH_ATTRIBUTE, max_length)
    return model, loaded_tokenizer


def _dense_note(model: Any, formats: dict[str, int]) -> str:
    """What the target line adds for a GGUF file whose matrices do not all run on the block
    kernels: how many run as dense products, and the file's formats that have no block
    kernel (K-quants, 5-bit formats...); ``""`` when every matrix reads its blocks."""
    transformer = getattr(model, "transformer", None)
    if transformer is None:
        return ""  # the HF adapter: every product is transformers' own
    products = [m for m in transformer.modules() if isinstance(m, nn.Linear | RowProduct)]
    dense = [m for m in products if not isinstance(m, BlockLinear)]
    if not dense:
        return ""
    others = sorted(f for f in formats if f not in _READ_AS_BLOCKS)
    named = f" (the file's {', '.join(others)} matrices have no block kernel)" if others else ""
    return f"; {len(dense)} of {len(products)} products run as dense float32{named}"


_READ_AS_BLOCKS = {*KERNEL_TYPES, "F32"}  # GGUF types the kernels read (F32: dense anyway)

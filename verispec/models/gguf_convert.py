"""A GGUF file converted once to a ``transformers`` model directory: :func:`convert`.

The copy is written to a temporary directory beside its final place and renamed into
place, so an interrupted conversion never leaves a half-written cache. A Llama file is
converted by verispec itself (:func:`write_converted`), bit for bit as ``transformers``
converts it; any other file by ``transformers``.

``transformers`` converts a GGUF file through the ``gguf`` package's reader, which builds a
numpy view for every metadata value (and reads the file three times: config, tokenizer,
weights), and maps names by rebuilding ``gguf``'s name table for every module; widening the
weights is the small part (docs/models.rst, "GGUF formats", has the times).
:func:`write_converted` writes the same converted copy (``config.json``,
``model.safetensors``, the tokenizer files) from verispec's own header reader
(:func:`verispec.models.gguf.header`) and block decoder
(:func:`verispec.models.gguf_codes.dequantize`).

It covers the files whose conversion is a plain mapping: architecture ``llama`` (not one
``transformers`` reads as Mistral), tensors named as llama.cpp's converter names a Llama's
(``_LLAMA_TOP``, ``_LLAMA_LAYER``), of the :data:`~verispec.models.gguf_codes.DECODED`
types or F32, F16 and BF16. The result is what ``transformers`` writes:

* the config from ``transformers``' own table of GGUF keys
  (``GGUF_TO_TRANSFORMERS_MAPPING["config"]``), read as its loader reads it;
* each weight widened to float32 as the ``gguf`` package widens it, a zero's sign
  included, and a Llama's query and key rows put back in the order ``transformers`` gives
  them (llama.cpp's converter interleaves each head's two rotary halves);
* the tokenizer ``transformers`` builds from the file's metadata
  (``PreTrainedTokenizerFast``, whose GGUF reader reads only the vocabulary and merges).

Any other file returns ``False`` and is converted by ``transformers``.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verispec.core.notices import waiting
from verispec.errors import ModelFileError
from verispec.models.gguf import TensorInfo, check_file, file_error, header
from verispec.models.gguf_codes import DECODED, dequantize

__all__ = ["convert", "write_converted"]

_LLAMA_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LLAMA_LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
"""llama.cpp's tensor names (GGUF's standard names) of a Llama, and ``transformers``': of
the whole model, and of layer ``N`` (``blk.N.attn_q`` is ``model.layers.N.self_attn.q_proj``)."""

_NAME = re.compile(r"(?:blk\.(\d+)\.)?(\w+)\.(weight|bias)")
_PLAIN = {0: np.float32, 1: np.float16}  # GGML types F32 and F16
_BF16 = 30


def _hf_name(name: str) -> str | None:
    """``transformers``' name for a Llama tensor of a GGUF file, or None."""
    match = _NAME.fullmatch(name)
    if match is None:
        return None
    layer, part, kind = match.groups()
    if layer is None:
        return f"{_LLAMA_TOP[part]}.{kind}" if part in _LLAMA_TOP else None
    return f"model.layers.{layer}.{_LLAMA_LAYER[part]}.{kind}" if part in _LLAMA_LAYER else None


def _config(values: dict[str, Any], tensors: list[TensorInfo]) -> dict[str, Any] | None:
    """The config dict ``transformers``' loader reads from these metadata, or None where
    its table cannot be had."""
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_TO_TRANSFORMERS_MAPPING
    except ImportError:
        return None
    table: dict[str, dict[str, Any]] = GGUF_TO_TRANSFORMERS_MAPPING["config"]  # type: ignore[assignment]
    tied = all(t.name != "output.weight" for t in tensors)
    config: dict[str, Any] = {"tie_word_embeddings": tied}
    for key, value in values.items():
        prefix, _, rest = key.partition(".")
        renamed = table.get(prefix, {}).get(rest)
        if renamed is not None and renamed != -1:
            config[renamed] = value
    if "vocab_size" not in config and isinstance(values.get("tokenizer.ggml.tokens"), int):
        config["vocab_size"] = values["tokenizer.ggml.tokens"]  # its length
    return config


def _weight(tensor: TensorInfo, data: np.ndarray) -> np.ndarray | None:
    """The tensor widened to float32 as the ``gguf`` package widens it, Shape: numpy's
    (the row length last); None for a type not read here."""
    from gguf.constants import GGML_QUANT_SIZES

    shape = tuple(reversed(tensor.shape))
    count = int(np.prod(shape))
    if tensor.kind in _PLAIN:
        dtype = np.dtype(_PLAIN[tensor.kind])
        raw = np.frombuffer(data, dtype, count, tensor.start)
        return raw.astype(np.float32).reshape(shape)
    if tensor.kind == _BF16:
        raw = np.frombuffer(data, np.uint16, count, tensor.start)
        return (raw.astype(np.uint32) << 16).view(np.float32).reshape(shape)
    known = {int(kind): kind for kind in GGML_QUANT_SIZES}
    if tensor.kind not in known or known[tensor.kind].name not in DECODED:
        return None  # (a type newer than the gguf package, IQ2_XXS...: transformers' words)
    kind = known[tensor.kind].name
    block, block_bytes = GGML_QUANT_SIZES[known[tensor.kind]]
    cols, rows = tensor.shape[0], count // tensor.shape[0]
    nbytes = rows * cols // block * block_bytes
    raw = np.frombuffer(data, np.uint8, nbytes, tensor.start).reshape(rows, -1)
    return dequantize(kind, raw, cols).reshape(shape)


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Query or key rows (or biases) in ``transformers``' order: llama.cpp's converter
    interleaves each head's two rotary halves, ``transformers`` puts them back."""
    half = weight.shape[0] // heads // 2
    rows = weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(2, 1)
    return np.ascontiguousarray(rows.reshape(weight.shape))


def write_converted(gguf: Path, staging: Path) -> bool:
    """Write the converted copy of ``gguf`` into ``staging`` (an empty directory), as
    ``transformers`` converts it; ``False``, with nothing written, for a file this module
    does not cover (see the module's notes), or whose header verispec's reader does not
    read (:func:`~verispec.models.gguf.header`).

    Raises:
        ModelFileError: ``transformers`` cannot build the file's tokenizer.
    """
    from safetensors.torch import save_file
    from transformers import CONFIG_MAPPING, GenerationConfig, PreTrainedTokenizerFast

    try:
        values, tensors = header(gguf)
    except ModelFileError:  # a version or alignment transformers' reader has its words for
        return False
    name = str(values.get("general.name", ""))
    if values.get("general.architecture") != "llama" or "mistral" in name.lower():
        return False  # transformers reads a "llama" file named Mistral as a Mistral
    with open(gguf, "rb") as handle:
        if handle.read(8)[4:6] == b"\0\0":  # a big-endian file: its tensors are too
            return False
    names = {tensor.name: _hf_name(tensor.name) for tensor in tensors}
    if None in names.values():
        return False
    config_dict = _config(values, tensors)
    if config_dict is None or config_dict.get("model_type") != "llama":
        return False
    config = CONFIG_MAPPING["llama"].from_dict(config_dict)
    config.architectures = ["LlamaForCausalLM"]
    config.dtype = torch.float32
    heads = config.num_attention_heads
    kv_heads = config.num_key_value_heads or heads
    data = np.memmap(gguf, np.uint8, "r")
    state: dict[str, torch.Tensor] = {}
    for tensor in tensors:
        weight = _weight(tensor, data)
        if weight is None:
            return False
        if ".attn_q." in tensor.name:
            weight = _unpermute(weight, heads)
        elif ".attn_k." in tensor.name:
            weight = _unpermute(weight, kv_heads)
        state[str(names[tensor.name])] = torch.from_numpy(np.ascontiguousarray(weight))
    try:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except Exception as exc:  # its reader's ValueError, KeyError...: the file's fault
        raise file_error(gguf, exc) from exc
    save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(staging)
    GenerationConfig.from_model_config(config).save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    return True


def convert(gguf: Path, target: Path) -> None:
    """Dequantize the GGUF file and save model + tokenizer to ``target`` atomically.

    Raises:
        ModelFileError: the file is cut short (:func:`check_file`, before anything is
            converted) or ``transformers`` cannot read it; nothing is left behind.
    """
    check_file(gguf)
    with waiting(f"converting {gguf.name} to float32 weights (once; kept in {target})"):
        _write_converted(gguf, target)


def _write_converted(gguf: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        if not write_converted(gguf, staging):
            _write_with_transformers(gguf, staging)
        staging.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary directory
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / "config.json").is_file():  # not a concurrent winner: a real error
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _write_with_transformers(gguf: Path, staging: Path) -> None:
    """The converted copy as ``transformers`` writes it, for a file
    :func:`~verispec.models.gguf_convert.write_converted` does not cover."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model: Any = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except Exception as exc:  # the gguf reader's ValueError, struct.error, KeyError...
        raise file_error(gguf, exc) from exc
    # The weights are dequantized float32 now: drop the GGUF marker so they save plainly.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)

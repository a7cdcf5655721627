"""Tests of verispec's own GGUF conversion (verispec/models/gguf_convert.py).

What they promise: for a Llama file, the converted copy verispec writes is the one
``transformers`` writes, file for file (config, generation config, tokenizer, chat
template) and weight for weight, bit for bit, a zero's sign included; a file it does not
cover is left to ``transformers`` with nothing written; and such a file loads on the block
kernels, every product read from the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFEndian, GGUFWriter
from gguf.quants import dequantize as gguf_dequantize
from gguf_files import HALVES, LLAMA_FORMATS, llama_gguf, random_blocks, write_gguf
from safetensors.torch import load_file

from verispec import SpeculativeDecoder
from verispec.drafters import TokenRecycling
from verispec.models import FastModel
from verispec.models.accelerators.blocks import BlockLinear, kernel_status
from verispec.models.gguf_codes import DECODED, dequantize
from verispec.models.gguf_convert import _write_with_transformers, write_converted
from verispec.models.loading import load_model


@pytest.mark.parametrize("kind", DECODED)
def test_dequantize_gives_the_gguf_packages_bits_zero_signs_included(kind: str) -> None:
    """Every decoded format widens to float32 exactly as the gguf package widens it, bit
    for bit: Q4_0's and Q5_0's zeros take their scale's sign, as ``(q - 8) d`` does."""
    data = random_blocks(kind, 24, 512, seed=len(kind) + 7)
    ours = dequantize(kind, data, 512)
    theirs = gguf_dequantize(data, GGMLQuantizationType[kind]).reshape(24, 512)
    assert ours.dtype == np.float32
    assert np.array_equal(ours.view(np.int32), theirs.view(np.int32))
    if kind in ("Q4_0", "Q5_0"):  # the case the sign rule is for does occur here
        assert (np.signbit(ours) & (ours == 0)).any()


def _converted_both_ways(path: Path, tmp_path: Path) -> tuple[Path, Path]:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    assert write_converted(path, ours)
    _write_with_transformers(path, theirs)
    return ours, theirs


@pytest.mark.parametrize("tied", [True, False])
def test_the_copy_is_the_one_transformers_writes(tmp_path: Path, tied: bool) -> None:
    """A Llama file of every widening (K-quants, 5-bit, Q4_0, halves, float32 norms, a
    Q8_0 embedding, a tied or a Q4_1 head): the same files as transformers' conversion,
    the same JSON, and every weight the same bits, query and key rows in its order."""
    path = llama_gguf(tmp_path / "tiny.gguf", tied=tied)
    ours, theirs = _converted_both_ways(path, tmp_path)
    names = sorted(p.name for p in theirs.iterdir())
    assert sorted(p.name for p in ours.iterdir()) == names
    for name in names:
        if name.endswith(".json"):
            assert json.loads((ours / name).read_text()) == json.loads((theirs / name).read_text())
        elif name != "model.safetensors":
            assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
    mine, reference = (load_file(str(d / "model.safetensors")) for d in (ours, theirs))
    assert mine.keys() == reference.keys()
    assert ("lm_head.weight" in mine) is not tied
    for key, weight in reference.items():
        assert weight.dtype == torch.float32 and mine[key].shape == weight.shape, key
        assert torch.equal(mine[key].view(torch.int32), weight.view(torch.int32)), key


def test_files_it_does_not_cover_are_left_to_transformers(tmp_path: Path) -> None:
    """A tensor it has no name for, a Llama file named Mistral (transformers reads it as a
    Mistral), a big-endian file and a format the decoder does not read: ``False``, and
    nothing written."""
    extra = write_gguf(
        tmp_path / "extra.gguf",
        {"rope_freqs.weight": ("F32", np.ones(32, np.float32))},
        lambda writer: writer.add_block_count(1),
    )
    mistral = llama_gguf(tmp_path / "mistral.gguf", name="Mistral Tiny")
    big_endian = tmp_path / "big.gguf"
    writer = GGUFWriter(str(big_endian), "llama", endianess=GGUFEndian.BIG)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.ones((4, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    iq2 = write_gguf(  # a format the decoder does not read (the gguf package does)
        tmp_path / "iq2.gguf",
        {"token_embd.weight": ("IQ2_XXS", np.zeros((4, 66), np.uint8))},
        lambda writer: writer.add_block_count(1),
    )
    for path in (extra, mistral, big_endian, iq2):
        staging = tmp_path / f"{path.stem}-out"
        staging.mkdir()
        assert write_converted(path, staging) is False
        assert not any(staging.iterdir())


@pytest.mark.skipif(
    not kernel_status()[0], reason=f"block kernel unavailable: {kernel_status()[1]}"
)
def test_a_converted_llama_file_loads_with_every_product_read_from_it(tmp_path: Path) -> None:
    """``load_model`` on the file: the fast runtime, every product a block matrix read from
    the file (the target line names no dense product), the file's tokenizer, and greedy
    answers equal to transformers' own on the converted weights."""
    path = llama_gguf(tmp_path / "tiny.gguf", tied=False)
    model, tokenizer = load_model(path, cache_dir=tmp_path / "cache")
    assert isinstance(model, FastModel)
    assert "dense" not in model.runtime_note
    products = [m for m in model.transformer.modules() if isinstance(m, BlockLinear)]
    assert len(products) == 4 * 2 + 1  # wqkv, wo, w13, w2 a layer, and the head
    prompt = tokenizer("the cat sat on the mat").input_ids
    ours = SpeculativeDecoder(model, TokenRecycling(k=8)).generate(prompt, max_new_tokens=12)
    with torch.no_grad():
        theirs = model.hf_model.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None
        )
    assert list(ours.tokens) == theirs[0, len(prompt) :].tolist()


def test_the_formats_cover_every_kind_of_widening() -> None:
    """The tiny Llama's matrices hold block formats (one with signed zeros) and halves."""
    assert {"Q4_0", "Q4_K", "Q6_K", "F16", "BF16"} <= set(LLAMA_FORMATS.values())
    assert set(LLAMA_FORMATS.values()) - {"F16", "BF16"} <= set(HALVES)

"""Tests of verispec/models/loading.py: a user's model directory or GGUF file becomes a target."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from saved_models import save_tiny_model

from verispec.errors import ConfigError
from verispec.models import FastModel, HFModel
from verispec.models.gguf import CACHE_VERSION, converted_dir, embedded_gguf
from verispec.models.loading import load_model, model_source


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("loading") / "tiny")


def test_a_directory_loads_as_the_fast_runtime_with_its_tokenizer(model_dir: Path) -> None:
    """A ``save_pretrained`` directory loads on the fast runtime with its own tokenizer, and
    its greedy tokens are the transformers model's."""
    from verispec import SpeculativeDecoder

    model, tokenizer = load_model(model_dir)
    assert isinstance(model, FastModel) and model.vocab_size == len(tokenizer) == 258
    ids = tokenizer.encode("abcabc")
    expected = model.hf_model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    result = SpeculativeDecoder(model, tokenizer=tokenizer).generate(ids, max_new_tokens=12)
    assert result.tokens == expected[0, len(ids) :].tolist()


def test_runtime_and_tokenizer_choices(tmp_path: Path, model_dir: Path) -> None:
    """``runtime="hf"`` gives the adapter; a directory without tokenizer needs ``tokenizer=``,
    which may name another directory."""
    model, _ = load_model(model_dir, runtime="hf")
    assert isinstance(model, HFModel)
    bare = save_tiny_model(tmp_path / "bare", tokenizer=False)
    with pytest.raises(ConfigError, match="cannot load a tokenizer"):
        load_model(bare)
    _, tokenizer = load_model(bare, tokenizer=model_dir)
    assert len(tokenizer) == 258
    with pytest.raises(ConfigError, match="`runtime` must be one of"):
        load_model(model_dir, runtime="fastest")


def test_auto_dtype_is_decided_by_the_weights_for_a_directory_too(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dtype="auto"`` follows the one rule (:func:`~verispec.kernels.dtypes.auto_dtype`)
    for a directory as for a GGUF file and :class:`FastModel`: on a CPU taken to multiply
    bfloat16 natively, a directory of GGUF blocks stays float32 where the block kernel runs,
    and other weights take bfloat16."""
    from transformers import AutoModelForCausalLM

    from verispec.models.accelerators.blocks import kernel_status, quantize_blocks

    monkeypatch.setattr("verispec.kernels.dtypes.default_dtype", lambda device: torch.bfloat16)
    model, _ = load_model(model_dir, dtype="auto", runtime="hf")
    assert model.dtype == torch.bfloat16
    hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        for module in hf_model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(quantize_blocks(module.weight, "q4_1"))
    hf_model.save_pretrained(tmp_path / "blocks")
    model, _ = load_model(tmp_path / "blocks", dtype="auto", tokenizer=model_dir)
    expected = torch.float32 if kernel_status()[0] else torch.bfloat16
    assert model.dtype == expected
    assert FastModel(hf_model, dtype="auto").dtype == expected


def test_model_source_says_what_a_path_is(tmp_path: Path, model_dir: Path) -> None:
    """A directory with ``config.json`` and a ``.gguf`` file are models; anything else is refused
    with what is allowed."""
    assert model_source(model_dir) == ("dir", model_dir)
    gguf = tmp_path / "m.GGUF"
    gguf.write_bytes(b"GGUF")
    assert model_source(gguf) == ("gguf", gguf)
    (tmp_path / "empty").mkdir()
    (tmp_path / "w.bin").write_bytes(b"")
    for path, match in [
        (tmp_path / "missing", "does not exist"),
        (tmp_path / "empty", "has no config.json"),
        (tmp_path / "w.bin", "must be a GGUF file"),
    ]:
        with pytest.raises(ConfigError, match=match):
            model_source(path)


def test_a_gguf_files_cache_follows_the_file(tmp_path: Path) -> None:
    """A GGUF file's converted copy is keyed by its path, size and modification time: the same
    file maps to the same place, a modified one to another."""
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF-one")
    first = converted_dir(gguf, tmp_path / "cache")
    assert first == converted_dir(gguf, tmp_path / "cache") and first.name.startswith("gguf-model-")
    gguf.write_bytes(b"GGUF-two!")
    os.utime(gguf, ns=(1, 1))
    assert converted_dir(gguf, tmp_path / "cache") != first


def test_the_embedded_gguf_shares_the_default_models_cache(tmp_path: Path) -> None:
    """The embedded SmolLM2 file, named as a path (here through a symbolic link), maps to the
    cache ``load_default_model`` has always used: named after the model, the layout version
    and the file's size."""
    from verispec.errors import DefaultModelUnavailableError

    try:
        gguf = embedded_gguf()
    except DefaultModelUnavailableError as exc:
        pytest.skip(f"the embedded model is not installed: {exc}")
    expected = tmp_path / f"smollm2-135m-instruct-v{CACHE_VERSION}-{gguf.stat().st_size}"
    assert converted_dir(gguf, tmp_path) == expected
    link = tmp_path / "linked.gguf"
    link.symlink_to(gguf)
    assert converted_dir(link, tmp_path) == expected


def _unsupported_architecture_gguf(path: Path) -> Path:
    """A valid GGUF file (header, metadata, one tensor) of an architecture transformers
    cannot load."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "verispec-test-arch")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _bad_models(tmp_path: Path) -> dict[str, Path]:
    """Model paths that cannot be read, by what is wrong with them."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    bad = {}
    bad["random bytes"] = tmp_path / "random.gguf"
    bad["random bytes"].write_bytes(torch.randint(0, 256, (4096,)).byte().numpy().tobytes())
    bad["zero length"] = tmp_path / "empty.gguf"
    bad["zero length"].write_bytes(b"")
    bad["magic only"] = tmp_path / "magic.gguf"
    bad["magic only"].write_bytes(b"GGUF\x03\x00\x00\x00")
    from verispec.errors import DefaultModelUnavailableError

    try:
        embedded = embedded_gguf().read_bytes()[:1_000_000]
    except DefaultModelUnavailableError:
        embedded = b""
    for cut in (24, 1000, 100_000, 1_000_000) if embedded else ():
        bad[f"truncated at {cut}"] = tmp_path / f"trunc{cut}.gguf"
        bad[f"truncated at {cut}"].write_bytes(embedded[:cut])
    bad["unsupported architecture"] = _unsupported_architecture_gguf(tmp_path / "arch.gguf")
    sharded = tmp_path / "sharded"
    save_tiny_model(sharded)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(sharded).save_pretrained(sharded, max_shard_size="20KB")
    (sharded / "model.safetensors").unlink()  # the unsharded file would be read instead
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 1
    shards[-1].unlink()
    bad["missing shard"] = sharded
    partial = save_tiny_model(tmp_path / "partial")  # a checkpoint lacking one weight
    from safetensors.torch import load_file, save_file

    weights = load_file(partial / "model.safetensors")
    del weights[sorted(k for k in weights if "mlp.down_proj" in k)[0]]
    save_file(weights, partial / "model.safetensors", metadata={"format": "pt"})
    bad["weights missing"] = partial
    return bad


def _left_in(cache: Path) -> list[str]:
    """What ``cache`` holds but the CPU kernel (``kernels/``), which the CLI's ``--model tiny``
    target builds there when no earlier test of the process has built it."""
    return sorted(p.name for p in cache.iterdir() if p.name != "kernels") if cache.exists() else []


def test_unreadable_models_raise_one_named_error_and_leave_no_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Random bytes, an empty file, a bare header, the embedded GGUF cut at several offsets, a
    valid GGUF of an unknown architecture, a directory missing a weight shard and one whose
    file lacks a weight (transformers would initialise it at random) each raise
    ModelFileError naming the path, leave nothing in the cache, and make the CLI's
    `--model` and `--draft-model` exit 2 with one error line, no traceback."""
    from verispec import cli
    from verispec.errors import ModelFileError

    cache = tmp_path / "cache"
    monkeypatch.setenv("VERISPEC_CACHE", str(cache))
    for what, path in _bad_models(tmp_path / "models").items():
        with pytest.raises(ModelFileError, match=str(path.name)):
            load_model(path)
        assert _left_in(cache) == [], what
        for flag in ("--model", "--draft-model"):
            args = ["generate", "--prompt", "hi", "--max-new-tokens", "1", flag, str(path)]
            if flag == "--draft-model":
                args += ["--model", "tiny", "--method", "chain"]
            capsys.readouterr()
            assert cli.main(args) == 2, (what, flag)
            err = capsys.readouterr().err  # (the target's line first, for --draft-model)
            lines = err.strip().splitlines()
            assert "Traceback" not in err and lines[-1].startswith("verispec generate: error:")
            assert sum("error" in line for line in lines) == 1, (what, flag, lines)
            assert lines[-1].count("error:") == 1, (what, flag, lines)  # no "error: error:"
            assert path.name in lines[-1], (what, flag, lines)
        assert _left_in(cache) == [], what


def _small_gguf(path: Path) -> Path:
    """A complete GGUF file written here: metadata with a string array, and tensors in
    float32 and in Q8_0 blocks (whose bytes the check computes from the block size)."""
    import gguf
    import numpy as np
    from gguf.quants import quantize

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_token_list([f"token{i}" for i in range(50)])
    writer.add_tensor("token_embd.weight", np.ones((8, 32), dtype=np.float32))
    blocks = quantize(np.ones((4, 64), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.attn_q.weight", blocks, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _cut_points(path: Path) -> dict[str, tuple[int, str]]:
    """Where to cut the file at ``path`` -> (length kept, what the error must say), the
    places found by the gguf package's own reader."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    tokens = reader.fields["tokenizer.ggml.tokens"].offset
    second, last = reader.tensors[1], reader.tensors[-1]
    size = path.stat().st_size
    return {
        "in the magic": (2, "the header (magic, version, tensor and metadata counts) runs past "
                         "the end of the file, to byte 4;"),
        "in the header": (10, "the header (magic, version, tensor and metadata counts) runs "
                          "past the end of the file, to byte 16;"),
        "in the metadata": (tokens + 200, "metadata entry 3 of 3 (`tokenizer.ggml.tokens`) "
                            "runs past the end of the file"),
        "in a tensor's description": (second.field.offset + 30, "the description of tensor "
                                      "2 of 3 (`blk.0.attn_q.weight`) runs past the end"),
        "before the tensor data": (reader.data_offset - 2, "the data of tensor "
                                   "`token_embd.weight` runs past the end of the file, to "
                                   f"byte {reader.tensors[0].data_offset + 1024} (3 of the 3"),
        "in Q8_0 blocks": (second.data_offset + 100, "the data of tensor "
                           "`blk.0.attn_q.weight` runs past the end of the file, to byte "
                           f"{second.data_offset + second.n_bytes} (2 of the 3"),
        "one byte short": (size - 1, f"the data of tensor `{last.name}` runs past the end of "
                           f"the file, to byte {size} (1 of the 3"),
    }  # fmt: skip


_CUTS = ("in the magic", "in the header", "in the metadata", "in a tensor's description",
         "before the tensor data", "in Q8_0 blocks", "one byte short")  # fmt: skip


@pytest.mark.parametrize("where", _CUTS)
def test_a_gguf_file_cut_short_is_one_line_in_the_files_terms_before_any_work(
    where: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A GGUF file cut in its header, metadata, a tensor's description or its tensor data
    is refused before any conversion (transformers' reader is never called) and before the
    CLI loads a model: ModelFileError naming the file, its size, what is cut and the byte
    it needs (not Python's ``unpack_from`` text); one CLI line with one "error", status 2;
    nothing in the cache."""
    from verispec import cli
    from verispec.bench.commands import target
    from verispec.errors import ModelFileError
    from verispec.models import gguf as gguf_files
    from verispec.models import gguf_convert

    full = _small_gguf(tmp_path / "full.gguf")
    gguf_files.check_file(full)  # the whole file passes
    points = _cut_points(full)
    assert tuple(points) == _CUTS
    keep, says = points[where]
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(full.read_bytes()[:keep])
    cache = tmp_path / "cache"
    monkeypatch.setenv("VERISPEC_CACHE", str(cache))

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the long work started before the file was checked")

    monkeypatch.setattr(gguf_convert, "_write_converted", never)
    monkeypatch.setattr(target, "load", never)
    expected = f"cannot read the GGUF file `{cut}` ({keep} bytes): the file is cut short: {says}"
    with pytest.raises(ModelFileError) as info:
        load_model(cut)
    assert expected in str(info.value) and "unpack" not in str(info.value)
    assert str(info.value).endswith("; copy or download the file again.")
    for argv in (
        ["generate", "--prompt", "hi", "--model", str(cut)],
        ["generate", "--prompt", "hi", "--model", "tiny", "--method", "chain",
         "--draft-model", str(cut)],
        ["bench", "--model", str(cut)],
    ):  # fmt: skip
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.count("error") == 1, err
        assert err.startswith(f"verispec {argv[0]}: error: {expected}"), err
    assert not cache.exists()


def test_a_whole_gguf_file_passes_the_check_in_a_fraction_of_a_second() -> None:
    """The embedded SmolLM2 file (Q4_1, Q8_0 and float32 tensors, a 49,152-token vocabulary)
    is found whole, quickly: the check never refuses a good file."""
    import time

    from verispec.errors import DefaultModelUnavailableError
    from verispec.models.gguf import check_file

    try:
        gguf = embedded_gguf()
    except DefaultModelUnavailableError as exc:
        pytest.skip(f"the embedded model is not installed: {exc}")
    start = time.perf_counter()
    check_file(gguf)
    assert time.perf_counter() - start < 5.0


def test_a_damaged_converted_copy_is_converted_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GGUF file's cached conversion whose weights were cut short (a disk filled mid-write,
    a stray edit) is not an error for ever: it is removed, converted again once (a notice
    says so), and the model loads."""
    from verispec.models import gguf_convert

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF-not-read-here")
    converted = converted_dir(gguf, tmp_path / "cache")
    save_tiny_model(converted)
    weights = converted / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    conversions = []

    def convert(source: Path, target: Path) -> None:  # the real one reads a real GGUF file
        conversions.append(source)
        save_tiny_model(target)

    monkeypatch.setattr(gguf_convert, "convert", convert)
    model, tokenizer = load_model(gguf, cache_dir=tmp_path / "cache")
    assert isinstance(model, FastModel) and len(tokenizer) == 258
    assert conversions == [gguf]
    assert f"converting `{gguf}` again" in capsys.readouterr().err


def test_a_gguf_files_matrix_formats_are_counted_from_its_header(tmp_path: Path) -> None:
    """matrix_formats counts the file's matrices (two dimensions) by GGUF type, and leaves out
    vectors (norms)."""
    from verispec.models.gguf import matrix_formats

    assert matrix_formats(_small_gguf(tmp_path / "small.gguf")) == {"F32": 1, "Q8_0": 1}


def test_the_target_line_names_the_products_that_run_dense() -> None:
    """A model loaded from a GGUF file whose matrices are not all blocks says, on its target
    line, how many products run as dense float32 and which of the file's formats have no
    block kernel; a file whose every matrix is blocks adds nothing."""
    from torch import nn

    from verispec.models import FastModel, tiny_model
    from verispec.models.accelerators.blocks import kernel_status, quantize_blocks
    from verispec.models.invariance import RowProduct
    from verispec.models.loading import _dense_note

    hf = tiny_model("llama", vocab_size=64, seed=2, dtype=torch.float32, hidden_size=64).hf_model
    with torch.no_grad():
        for linear in hf.modules():
            if isinstance(linear, nn.Linear):
                linear.weight.copy_(quantize_blocks(linear.weight, "q4_1"))
    formats = {"Q4_1": 8, "Q8_0": 1}
    blocks = FastModel(hf, dtype=torch.float32)
    n = len([m for m in blocks.transformer.modules() if isinstance(m, nn.Linear | RowProduct)])
    everything_dense = f"; {n} of {n} products run as dense float32"
    assert _dense_note(blocks, formats) == ("" if kernel_status()[0] else everything_dense)
    dense = FastModel(hf, dtype=torch.float32, weights="dense")
    note = _dense_note(dense, {**formats, "Q6_K": 1, "F16": 2, "IQ2_XXS": 1, "TQ1_0": 3})
    assert note == everything_dense + " (the file's IQ2_XXS, TQ1_0 matrices have no block kernel)"

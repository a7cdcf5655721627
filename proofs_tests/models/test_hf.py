"""Tests of verispec/models/hf.py: the Hugging Face adapter's own parts (architectures and
attention implementations, attributes, what it refuses).

The protocol itself (tree attention, extend_from, commit, errors) is tested for both models in
test_sequence.py."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from model_references import (
    draft_trees,
    tree_reference,
)

from verispec.core.tree import DraftTree
from verispec.errors import ConfigError
from verispec.models import HFModel, tiny_llama, tiny_model

EXACT = 1e-9
V = 64

prompts = st.lists(st.integers(0, V - 1), min_size=1, max_size=8)


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@settings(max_examples=8)
@given(prompt=prompts, tree=draft_trees(V, max_nodes=10))
def test_tree_forward_equals_sequential_architectures(
    architecture: str, attention: str, prompt: list[int], tree: DraftTree
) -> None:
    """Tree forward equals sequential forward for tiny Llama, Qwen2 and Mistral, sdpa and eager."""
    model = _tiny(architecture, attention)
    model.prefill(torch.tensor(prompt))
    logits = model.forward_tree(tree)
    reference = tree_reference(model, prompt, tree)
    # transformers' eager attention takes its softmax in float32 whatever the dtype.
    tolerance = EXACT if attention == "sdpa" else 1e-5
    assert (logits - reference).abs().max().item() < tolerance


_TINY: dict[tuple[str, str], HFModel] = {}


def _tiny(architecture: str, attention: str) -> HFModel:
    key = (architecture, attention)
    if key not in _TINY:
        _TINY[key] = tiny_model(architecture, vocab_size=V, seed=1, attention=attention)
    return _TINY[key]


# -- attributes and errors ---------------------------------------------------------------


def test_attributes(llama64: HFModel) -> None:
    """vocab_size is the logits width, max_length the position limit, eos from generation_config."""
    assert llama64.vocab_size == V
    assert llama64.max_length == 256
    assert llama64.eos_token_id == 1
    assert llama64.config is llama64.hf_model.config
    capped = HFModel(llama64.hf_model, max_length=32)
    assert capped.max_length == 32


def test_rejects_unsupported_models() -> None:
    """A module without the decoder parts, or with an unsupported attention, is refused."""
    with pytest.raises(ConfigError, match="decoder-only"):
        HFModel(torch.nn.Linear(2, 2))
    model = tiny_llama(vocab_size=V).hf_model
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(ConfigError, match="sdpa"):
        HFModel(model)


@pytest.mark.filterwarnings("ignore:verispec tree attention falls back")
def test_verispec_attention_implementation() -> None:
    """With transformers switched to the "verispec" attention function (sdpa fallback on CPU,
    Triton tree attention on CUDA), tree forward still equals sequential forward."""
    from verispec.kernels.hf_attention import enable

    model = tiny_llama(vocab_size=V, seed=4)
    enable(model.hf_model)
    model = HFModel(model.hf_model)
    tree = DraftTree.from_parents([4, 5, 6, 7, 8], [-1, -1, 0, 1, 1])
    prompt = [9, 10, 11]
    model.prefill(torch.tensor(prompt))
    logits = model.forward_tree(tree)
    model.hf_model.set_attn_implementation("sdpa")
    assert (logits - tree_reference(model, prompt, tree)).abs().max().item() < EXACT

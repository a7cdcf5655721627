"""Tests of verispec/models/hf.py: tree attention, incremental growth, commit by gather, errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from model_references import (
    causal_logits,
    draft_trees,
    sequential_logits,
    sequential_run,
    tree_reference,
)

from verispec.core.tree import DraftTree
from verispec.errors import ConfigError, ContextLengthError, TreeStructureError
from verispec.models import HFModel, tiny_llama, tiny_model

EXACT = 1e-9
V = 64

prompts = st.lists(st.integers(0, V - 1), min_size=1, max_size=8)


@settings(max_examples=40)
@given(prompt=prompts, tree=draft_trees(V))
def test_tree_forward_equals_sequential(
    llama64: HFModel, prompt: list[int], tree: DraftTree
) -> None:
    """Every row of one forward_tree equals the logits of feeding its path one token at a time."""
    llama64.prefill(torch.tensor(prompt))
    logits = llama64.forward_tree(tree)
    assert logits.shape == (tree.num_nodes + 1, V)
    reference = tree_reference(llama64, prompt, tree)
    assert (logits - reference).abs().max().item() < EXACT


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


@settings(max_examples=30)
@given(
    prompt=prompts,
    tree=draft_trees(V, max_nodes=14),
    cuts=st.lists(st.integers(1, 14), max_size=3),
    regrow=st.booleans(),
)
def test_extend_from_equals_whole_tree(
    llama64: HFModel, prompt: list[int], tree: DraftTree, cuts: list[int], regrow: bool
) -> None:
    """Growing a tree in pieces with extend_from gives the rows of one whole-tree pass."""
    llama64.prefill(torch.tensor(prompt))
    whole = llama64.forward_tree(tree)
    llama64.prefill(torch.tensor(prompt))
    bounds = sorted({c for c in cuts if c < tree.num_nodes})
    first = bounds[0] if bounds else tree.num_nodes
    grown = llama64.forward_tree(tree.truncated(first))  # rows: root, nodes 0..first-1
    scored = first
    for bound in [*bounds[1:], tree.num_nodes]:
        # Regrowing from a smaller prefix drops the extra node and feeds it again.
        start = scored - 1 if regrow and scored > 1 else scored
        if start == 0:
            continue
        new_rows = llama64.forward_tree(tree.truncated(bound), extend_from=start)
        assert new_rows.shape == (bound - start, V)
        grown = torch.cat([grown[: 1 + start], new_rows])
        scored = bound
    assert grown.shape == whole.shape
    assert (grown - whole).abs().max().item() < EXACT


def test_commit_side_branch_equals_sequential_cache(llama64: HFModel) -> None:
    """After accepting a side branch, the KV cache equals that of sequential decoding, entry by
    entry, and the next logits match."""
    prompt = [5, 9, 11, 3]
    # root -> a(0) b(1) c(2); b -> d(3) e(4); e -> f(5); a -> g(6)
    tree = DraftTree.from_parents([10, 20, 30, 40, 50, 60, 63], [-1, -1, -1, 1, 1, 4, 0])
    llama64.prefill(torch.tensor(prompt))
    llama64.forward_tree(tree)
    llama64.commit([1, 4, 5], extra_token=33)
    committed = [*prompt, 20, 50, 60]
    assert llama64.num_committed == len(committed) + 1
    assert llama64.pending_tokens == [33]
    _, cache = sequential_run(llama64, committed)
    ours = llama64.kv_cache()
    assert len(ours) == len(cache.layers)
    for (keys, values), layer in zip(ours, cache.layers, strict=True):
        assert keys.shape == layer.keys.shape
        assert (keys - layer.keys).abs().max().item() < EXACT
        assert (values - layer.values).abs().max().item() < EXACT
    next_tree = DraftTree.from_parents([1, 2, 3], [-1, 0, -1])
    logits = llama64.forward_tree(next_tree)
    reference = tree_reference(llama64, [*committed, 33], next_tree)
    assert (logits - reference).abs().max().item() < EXACT


@settings(max_examples=25)
@given(
    prompt=prompts,
    trees=st.lists(draft_trees(V, max_nodes=8), min_size=1, max_size=4),
    data=st.data(),
)
def test_random_commits_track_sequential_decoding(
    llama64: HFModel, prompt: list[int], trees: list[DraftTree], data: st.DataObject
) -> None:
    """Over several steps accepting random paths, the root logits always equal sequential
    decoding of everything committed so far."""
    llama64.prefill(torch.tensor(prompt))
    committed = list(prompt)
    for tree in trees:
        logits = llama64.forward_tree(tree)
        reference = causal_logits(llama64, committed)[-1]
        assert (logits[0] - reference).abs().max().item() < EXACT
        path = tree.path_to(data.draw(st.integers(0, tree.num_nodes - 1))) if len(tree) else []
        path = path[: data.draw(st.integers(0, len(path)))]
        extra = data.draw(st.integers(0, V - 1))
        llama64.commit(path, extra)
        committed += [int(tree.tokens[i]) for i in path] + [extra]
        assert llama64.num_committed == len(committed)
    final = llama64.forward_tree(DraftTree.empty())
    assert (final[0] - causal_logits(llama64, committed)[-1]).abs().max().item() < EXACT


def test_pending_tokens_of_a_draft_model(llama64: HFModel) -> None:
    """Extra tokens committed without a scored tree stay pending; the next pass feeds them all
    and matches sequential decoding."""
    prompt = [7, 8, 9]
    llama64.prefill(torch.tensor(prompt))
    llama64.commit([], extra_token=40)
    llama64.commit([], extra_token=41)
    assert llama64.pending_tokens == [9, 40, 41]
    committed = [*prompt, 40, 41]
    assert llama64.num_committed == len(committed)
    tree = DraftTree.from_parents([4, 5, 6], [-1, -1, 1])
    logits = llama64.forward_tree(tree)
    assert (logits - tree_reference(llama64, committed, tree)).abs().max().item() < EXACT
    llama64.commit([1, 2], extra_token=42)
    assert llama64.pending_tokens == [42]
    root = llama64.forward_tree(DraftTree.empty())[0]
    expected = sequential_logits(llama64, [*committed, 5, 6, 42])[-1]
    assert (root - expected).abs().max().item() < EXACT


def test_grown_path_then_commit(llama64: HFModel) -> None:
    """A draft model growing its tree node by node, then committing a path that ends on the
    last grown node, matches sequential decoding."""
    prompt = [3, 1, 4]
    tokens, parents = [11, 12, 13, 14], [-1, -1, 1, 2]
    llama64.prefill(torch.tensor(prompt))
    llama64.forward_tree(DraftTree.empty())
    for k in range(len(tokens)):
        tree = DraftTree.from_parents(tokens[: k + 1], parents[: k + 1])
        rows = llama64.forward_tree(tree, extend_from=k) if k else llama64.forward_tree(tree)
        expected = tree_reference(llama64, prompt, tree)[-1]
        assert (rows[-1] - expected).abs().max().item() < EXACT
    llama64.commit([1, 2, 3], extra_token=20)
    committed = [*prompt, 12, 13, 14, 20]
    root = llama64.forward_tree(DraftTree.empty())[0]
    assert (root - sequential_logits(llama64, committed)[-1]).abs().max().item() < EXACT


def test_rescoring_in_the_same_step_drops_the_first_tree(llama64: HFModel) -> None:
    """A second forward_tree(extend_from=0) before commit replaces the first tree."""
    llama64.prefill(torch.tensor([1, 2, 3]))
    llama64.forward_tree(DraftTree.from_parents([4, 5], [-1, 0]))
    tree = DraftTree.from_parents([6, 7, 8], [-1, -1, 0])
    logits = llama64.forward_tree(tree)
    assert (logits - tree_reference(llama64, [1, 2, 3], tree)).abs().max().item() < EXACT


def test_single_token_prompt_and_empty_tree(llama64: HFModel) -> None:
    """A one-token prompt has an empty cache and the root alone is scored."""
    llama64.prefill(torch.tensor([17]))
    assert llama64.num_committed == 1
    logits = llama64.forward_tree(DraftTree.empty())
    assert logits.shape == (1, V)
    assert (logits[0] - sequential_logits(llama64, [17])[-1]).abs().max().item() < EXACT


def test_cache_grows_past_its_first_allocation() -> None:
    """Decoding past the first buffer allocation keeps logits exact (the buffer is regrown)."""
    model = tiny_llama(vocab_size=V, seed=3, max_length=600)
    ids = [int(t) for t in torch.randint(0, V, (300,), generator=torch.Generator().manual_seed(0))]
    model.prefill(torch.tensor(ids[:250]))
    committed = ids[:250]
    for token in ids[250:]:
        model.forward_tree(DraftTree.empty())
        model.commit([], token)
        committed.append(token)
    root = model.forward_tree(DraftTree.empty())[0]
    assert (root - causal_logits(model, committed)[-1]).abs().max().item() < EXACT


# -- attributes and errors ---------------------------------------------------------------


def test_attributes(llama64: HFModel) -> None:
    """vocab_size is the logits width, max_length the position limit, eos from generation_config."""
    assert llama64.vocab_size == V
    assert llama64.max_length == 256
    assert llama64.eos_token_id == 1
    assert llama64.config is llama64.hf_model.config
    capped = HFModel(llama64.hf_model, max_length=32)
    assert capped.max_length == 32


def test_tree_token_out_of_range(llama64: HFModel) -> None:
    """A tree token >= vocab_size raises TreeStructureError."""
    llama64.prefill(torch.tensor([1, 2]))
    with pytest.raises(TreeStructureError, match=r"\[0, 64\)"):
        llama64.forward_tree(DraftTree.from_parents([3, V], [-1, 0]))


def test_prompt_token_out_of_range(llama64: HFModel) -> None:
    """A prompt token outside the vocabulary raises ConfigError."""
    with pytest.raises(ConfigError):
        llama64.prefill(torch.tensor([1, V + 5]))


def test_prompt_longer_than_context(llama64: HFModel) -> None:
    """A prompt longer than max_length raises ContextLengthError."""
    with pytest.raises(ContextLengthError, match="context holds 256"):
        llama64.prefill(torch.zeros(257, dtype=torch.long))


def test_tree_exceeding_context() -> None:
    """Committed tokens plus tree nodes beyond max_length raise ContextLengthError."""
    model = HFModel(tiny_llama(vocab_size=V).hf_model, max_length=10)
    model.prefill(torch.arange(8))
    model.forward_tree(DraftTree.from_parents([1, 2], [-1, 0]))  # 8 + 2 = 10 fits
    with pytest.raises(ContextLengthError, match="max_nodes"):
        model.forward_tree(DraftTree.from_parents([1, 2, 3], [-1, 0, 1]))


def test_forward_tree_before_prefill() -> None:
    """forward_tree and commit before prefill raise ConfigError naming prefill."""
    model = tiny_llama(vocab_size=V)
    with pytest.raises(ConfigError, match="prefill"):
        model.forward_tree(DraftTree.empty())
    with pytest.raises(ConfigError, match="prefill"):
        model.commit([], 3)


def test_bad_extension_and_bad_paths(llama64: HFModel) -> None:
    """extend_from without a scored tree, with a changed prefix, and non-path commits are
    rejected."""
    tree = DraftTree.from_parents([4, 5, 6], [-1, -1, 0])
    llama64.prefill(torch.tensor([1, 2]))
    with pytest.raises(ConfigError, match="extend_from"):
        llama64.forward_tree(tree, extend_from=1)
    llama64.forward_tree(tree.truncated(2))
    with pytest.raises(ConfigError, match="extend_from"):
        llama64.forward_tree(tree, extend_from=3)
    with pytest.raises(TreeStructureError, match="differ"):
        llama64.forward_tree(DraftTree.from_parents([4, 9, 6], [-1, -1, 0]), extend_from=2)
    with pytest.raises(TreeStructureError, match="root-to-node path"):
        llama64.commit([0, 1], 0)
    with pytest.raises(TreeStructureError, match="nodes of the last scored tree"):
        llama64.commit([7], 0)


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

"""Tests of verispec/models/_sequence.py over both models that implement it.

The ``LanguageModel`` protocol (tree attention, growing a tree with ``extend_from``,
commit by gather, pending tokens, the errors) is written once and run by
:class:`~verispec.models.HFModel` and :class:`~verispec.models.FastModel`: every test
runs for both, each against its own sequential reference (``model_references``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from model_references import (
    Model,
    causal_logits,
    draft_trees,
    sequential_logits,
    sequential_run,
    tree_reference,
)

from verispec.core.tree import DraftTree
from verispec.errors import ConfigError, ContextLengthError, TreeStructureError
from verispec.models import FastModel, HFModel, tiny_llama

EXACT = 1e-9
V = 64
KINDS = ("hf", "fast")

prompts = st.lists(st.integers(0, V - 1), min_size=1, max_size=8)


def make(kind: str, *, seed: int = 0, max_length: int | None = None, **kwargs: Any) -> Model:
    """A tiny float64 Llama (V = 64, 2 layers) as an HFModel or on the fast runtime."""
    hf_model = tiny_llama(vocab_size=V, seed=seed, max_length=max(max_length or 256, 256)).hf_model
    if kind == "hf":
        return HFModel(hf_model, max_length=max_length, **kwargs)
    return FastModel(hf_model, max_length=max_length, **kwargs)


@pytest.fixture(scope="module", params=KINDS)
def model64(request: pytest.FixtureRequest) -> Model:
    """Tiny float64 Llama, V = 64, 2 layers, as each kind of model."""
    return make(request.param)


@settings(max_examples=40)
@given(prompt=prompts, tree=draft_trees(V))
def test_tree_forward_equals_sequential(model64: Model, prompt: list[int], tree: DraftTree) -> None:
    """Every row of one forward_tree equals the logits of feeding its path one token at a time."""
    model64.prefill(torch.tensor(prompt))
    logits = model64.forward_tree(tree)
    assert logits.shape == (tree.num_nodes + 1, V)
    reference = tree_reference(model64, prompt, tree)
    assert (logits - reference).abs().max().item() < EXACT


@settings(max_examples=30)
@given(
    prompt=prompts,
    tree=draft_trees(V, max_nodes=14),
    cuts=st.lists(st.integers(1, 14), max_size=3),
    regrow=st.booleans(),
)
def test_extend_from_equals_whole_tree(
    model64: Model, prompt: list[int], tree: DraftTree, cuts: list[int], regrow: bool
) -> None:
    """Growing a tree in pieces with extend_from gives the rows of one whole-tree pass."""
    model64.prefill(torch.tensor(prompt))
    whole = model64.forward_tree(tree)
    model64.prefill(torch.tensor(prompt))
    bounds = sorted({c for c in cuts if c < tree.num_nodes})
    first = bounds[0] if bounds else tree.num_nodes
    grown = model64.forward_tree(tree.truncated(first))  # rows: root, nodes 0..first-1
    scored = first
    for bound in [*bounds[1:], tree.num_nodes]:
        # Regrowing from a smaller prefix drops the extra node and feeds it again.
        start = scored - 1 if regrow and scored > 1 else scored
        if start == 0:
            continue
        new_rows = model64.forward_tree(tree.truncated(bound), extend_from=start)
        assert new_rows.shape == (bound - start, V)
        grown = torch.cat([grown[: 1 + start], new_rows])
        scored = bound
    assert grown.shape == whole.shape
    assert (grown - whole).abs().max().item() < EXACT


def test_commit_side_branch_equals_sequential_cache(model64: Model) -> None:
    """After accepting a side branch, the KV cache equals that of sequential decoding, entry by
    entry, and the next logits match."""
    prompt = [5, 9, 11, 3]
    # root -> a(0) b(1) c(2); b -> d(3) e(4); e -> f(5); a -> g(6)
    tree = DraftTree.from_parents([10, 20, 30, 40, 50, 60, 63], [-1, -1, -1, 1, 1, 4, 0])
    model64.prefill(torch.tensor(prompt))
    model64.forward_tree(tree)
    model64.commit([1, 4, 5], extra_token=33)
    committed = [*prompt, 20, 50, 60]
    assert model64.num_committed == len(committed) + 1
    assert model64.pending_tokens == [33]
    _, cache = sequential_run(model64, committed)
    ours = model64.kv_cache()
    assert len(ours) == len(cache)
    for (keys, values), (ref_keys, ref_values) in zip(ours, cache, strict=True):
        assert keys.shape == ref_keys.shape
        assert (keys - ref_keys).abs().max().item() < EXACT
        assert (values - ref_values).abs().max().item() < EXACT
    next_tree = DraftTree.from_parents([1, 2, 3], [-1, 0, -1])
    logits = model64.forward_tree(next_tree)
    reference = tree_reference(model64, [*committed, 33], next_tree)
    assert (logits - reference).abs().max().item() < EXACT


@settings(max_examples=25)
@given(
    prompt=prompts,
    trees=st.lists(draft_trees(V, max_nodes=8), min_size=1, max_size=4),
    data=st.data(),
)
def test_random_commits_track_sequential_decoding(
    model64: Model, prompt: list[int], trees: list[DraftTree], data: st.DataObject
) -> None:
    """Over several steps accepting random paths, the root logits always equal sequential
    decoding of everything committed so far."""
    model64.prefill(torch.tensor(prompt))
    committed = list(prompt)
    for tree in trees:
        logits = model64.forward_tree(tree)
        reference = causal_logits(model64, committed)[-1]
        assert (logits[0] - reference).abs().max().item() < EXACT
        path = tree.path_to(data.draw(st.integers(0, tree.num_nodes - 1))) if len(tree) else []
        path = path[: data.draw(st.integers(0, len(path)))]
        extra = data.draw(st.integers(0, V - 1))
        model64.commit(path, extra)
        committed += [int(tree.tokens[i]) for i in path] + [extra]
        assert model64.num_committed == len(committed)
    final = model64.forward_tree(DraftTree.empty())
    assert (final[0] - causal_logits(model64, committed)[-1]).abs().max().item() < EXACT


def test_pending_tokens_of_a_draft_model(model64: Model) -> None:
    """Extra tokens committed without a scored tree stay pending; the next pass feeds them all
    and matches sequential decoding."""
    prompt = [7, 8, 9]
    model64.prefill(torch.tensor(prompt))
    model64.commit([], extra_token=40)
    model64.commit([], extra_token=41)
    assert model64.pending_tokens == [9, 40, 41]
    committed = [*prompt, 40, 41]
    assert model64.num_committed == len(committed)
    tree = DraftTree.from_parents([4, 5, 6], [-1, -1, 1])
    logits = model64.forward_tree(tree)
    assert (logits - tree_reference(model64, committed, tree)).abs().max().item() < EXACT
    model64.commit([1, 2], extra_token=42)
    assert model64.pending_tokens == [42]
    root = model64.forward_tree(DraftTree.empty())[0]
    expected = sequential_logits(model64, [*committed, 5, 6, 42])[-1]
    assert (root - expected).abs().max().item() < EXACT


def test_grown_path_then_commit(model64: Model) -> None:
    """A draft model growing its tree node by node, then committing a path that ends on the
    last grown node, matches sequential decoding."""
    prompt = [3, 1, 4]
    tokens, parents = [11, 12, 13, 14], [-1, -1, 1, 2]
    model64.prefill(torch.tensor(prompt))
    model64.forward_tree(DraftTree.empty())
    for k in range(len(tokens)):
        tree = DraftTree.from_parents(tokens[: k + 1], parents[: k + 1])
        rows = model64.forward_tree(tree, extend_from=k) if k else model64.forward_tree(tree)
        expected = tree_reference(model64, prompt, tree)[-1]
        assert (rows[-1] - expected).abs().max().item() < EXACT
    model64.commit([1, 2, 3], extra_token=20)
    committed = [*prompt, 12, 13, 14, 20]
    root = model64.forward_tree(DraftTree.empty())[0]
    assert (root - sequential_logits(model64, committed)[-1]).abs().max().item() < EXACT


def test_rescoring_in_the_same_step_drops_the_first_tree(model64: Model) -> None:
    """A second forward_tree(extend_from=0) before commit replaces the first tree."""
    model64.prefill(torch.tensor([1, 2, 3]))
    model64.forward_tree(DraftTree.from_parents([4, 5], [-1, 0]))
    tree = DraftTree.from_parents([6, 7, 8], [-1, -1, 0])
    logits = model64.forward_tree(tree)
    assert (logits - tree_reference(model64, [1, 2, 3], tree)).abs().max().item() < EXACT


def test_single_token_prompt_and_empty_tree(model64: Model) -> None:
    """A one-token prompt has an empty cache and the root alone is scored."""
    model64.prefill(torch.tensor([17]))
    assert model64.num_committed == 1
    logits = model64.forward_tree(DraftTree.empty())
    assert logits.shape == (1, V)
    assert (logits[0] - sequential_logits(model64, [17])[-1]).abs().max().item() < EXACT


@pytest.mark.parametrize("kind", KINDS)
def test_cache_grows_past_its_first_allocation(kind: str) -> None:
    """Decoding past the first buffer allocation keeps logits exact (the buffer is regrown)."""
    first = {"hf": 256, "fast": 1024}[kind]  # each model's first allocation, in entries
    model = make(kind, seed=3, max_length=first + 200)
    total = first + 50
    ids = [
        int(t) for t in torch.randint(0, V, (total,), generator=torch.Generator().manual_seed(0))
    ]
    model.prefill(torch.tensor(ids[: first - 6]))
    committed = ids[: first - 6]
    for token in ids[first - 6 :]:
        model.forward_tree(DraftTree.empty())
        model.commit([], token)
        committed.append(token)
    root = model.forward_tree(DraftTree.empty())[0]
    assert (root - causal_logits(model, committed)[-1]).abs().max().item() < EXACT


def test_tree_token_out_of_range(model64: Model) -> None:
    """A tree token >= vocab_size raises TreeStructureError."""
    model64.prefill(torch.tensor([1, 2]))
    with pytest.raises(TreeStructureError, match=r"\[0, 64\)"):
        model64.forward_tree(DraftTree.from_parents([3, V], [-1, 0]))


def test_prompt_token_out_of_range(model64: Model) -> None:
    """A prompt token outside the vocabulary raises ConfigError."""
    with pytest.raises(ConfigError):
        model64.prefill(torch.tensor([1, V + 5]))


def test_prompt_longer_than_context(model64: Model) -> None:
    """A prompt longer than max_length raises ContextLengthError."""
    with pytest.raises(ContextLengthError, match="context holds 256"):
        model64.prefill(torch.zeros(257, dtype=torch.long))


@pytest.mark.parametrize("kind", KINDS)
def test_tree_exceeding_context(kind: str) -> None:
    """Committed tokens plus tree nodes beyond max_length raise ContextLengthError."""
    model = make(kind, max_length=10)
    model.prefill(torch.arange(8))
    model.forward_tree(DraftTree.from_parents([1, 2], [-1, 0]))  # 8 + 2 = 10 fits
    with pytest.raises(ContextLengthError, match="max_nodes"):
        model.forward_tree(DraftTree.from_parents([1, 2, 3], [-1, 0, 1]))


@pytest.mark.parametrize("kind", KINDS)
def test_forward_tree_before_prefill(kind: str) -> None:
    """forward_tree and commit before prefill raise ConfigError naming prefill."""
    model = make(kind)
    with pytest.raises(ConfigError, match="prefill"):
        model.forward_tree(DraftTree.empty())
    with pytest.raises(ConfigError, match="prefill"):
        model.commit([], 3)


def test_bad_extension_and_bad_paths(model64: Model) -> None:
    """extend_from without a scored tree, with a changed prefix, and non-path commits are
    rejected."""
    tree = DraftTree.from_parents([4, 5, 6], [-1, -1, 0])
    model64.prefill(torch.tensor([1, 2]))
    with pytest.raises(ConfigError, match="extend_from"):
        model64.forward_tree(tree, extend_from=1)
    model64.forward_tree(tree.truncated(2))
    with pytest.raises(ConfigError, match="extend_from"):
        model64.forward_tree(tree, extend_from=3)
    with pytest.raises(TreeStructureError, match="differ"):
        model64.forward_tree(DraftTree.from_parents([4, 9, 6], [-1, -1, 0]), extend_from=2)
    with pytest.raises(TreeStructureError, match="root-to-node path"):
        model64.commit([0, 1], 0)
    with pytest.raises(TreeStructureError, match="nodes of the last scored tree"):
        model64.commit([7], 0)

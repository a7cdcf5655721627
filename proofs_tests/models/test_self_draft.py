"""Tests of verispec/models/self_draft.py: a layer subset of the target as its draft model."""

from __future__ import annotations

import pytest
import torch
from model_references import tree_reference

from verispec.core.tree import DraftTree
from verispec.errors import ConfigError, IncompatibleModelsError
from verispec.models import HFModel, check_compatible, self_draft, tiny_llama
from verispec.models.self_draft import parse_layers, recommended_layers

EXACT = 1e-9
V = 64


@pytest.fixture(scope="module")
def target() -> HFModel:
    return tiny_llama(vocab_size=V, num_layers=4, seed=2)


def _tree() -> DraftTree:
    return DraftTree.from_parents([3, 4, 5, 6, 7], [-1, -1, 0, 0, 2])


def _logits(model: HFModel, prompt: list[int], tree: DraftTree) -> torch.Tensor:
    model.prefill(torch.tensor(prompt))
    return model.forward_tree(tree)


def test_all_layers_equal_the_target(target: HFModel) -> None:
    """A self-draft over every layer returns exactly the target's logits."""
    draft = self_draft(target, target.num_layers)
    prompt = [1, 2, 3, 4]
    assert torch.equal(_logits(draft, prompt, _tree()), _logits(target, prompt, _tree()))
    listed = self_draft(target, [0, 1, 2, 3])
    assert torch.equal(_logits(listed, prompt, _tree()), _logits(target, prompt, _tree()))


def test_fewer_layers_share_storage_and_differ(target: HFModel) -> None:
    """A two-layer self-draft shares the target's parameter storage, keeps its own cache, and
    scores trees like a sequential run of its layers."""
    draft = target.self_draft(2)
    assert draft.layer_indices == (0, 1)
    assert draft.hf_model is target.hf_model
    for name, param in draft.hf_model.named_parameters():
        assert param.data_ptr() == dict(target.hf_model.named_parameters())[name].data_ptr()
    prompt = [5, 6, 7]
    draft_logits = _logits(draft, prompt, _tree())
    target_logits = _logits(target, prompt, _tree())
    assert draft_logits.shape == target_logits.shape
    assert not torch.allclose(draft_logits, target_logits)
    # The reference: transformers' own model cut to the same two layers.
    two_layers = tiny_llama(vocab_size=V, num_layers=4, seed=2)
    two_layers.hf_model.model.layers = two_layers.hf_model.model.layers[:2]
    two_layers.hf_model.config.num_hidden_layers = 2
    reference = tree_reference(two_layers, prompt, _tree())
    assert (draft_logits - reference).abs().max().item() < EXACT
    # separate caches: the draft's state did not move the target's
    assert target.num_committed == 3 and draft.num_committed == 3
    draft.commit([0, 2], 9)
    assert draft.num_committed == 6 and target.num_committed == 3


def test_chosen_layer_list_runs(target: HFModel) -> None:
    """A self-draft over a non-prefix list of layers ([0, 3]) runs and tracks its own cache."""
    draft = self_draft(target, [0, 3])
    logits = _logits(draft, [1, 2], _tree())
    assert logits.shape == (6, V) and torch.isfinite(logits).all()
    draft.commit([1], 8)
    assert draft.forward_tree(DraftTree.empty()).shape == (1, V)
    assert len(draft.kv_cache()) == 2


@pytest.mark.parametrize(
    ("layers", "match"),
    [
        (0, "between 1 and"),
        (5, "between 1 and"),
        ([], "at least one"),
        ([0, 4], r"in \[0, 4\)"),
        ([-1], r"in \[0, 4\)"),
        ([2, 1], "strictly increasing"),
        ([1, 1], "strictly increasing"),
        (True, "int or a sequence"),
    ],
)
def test_bad_layer_subsets(target: HFModel, layers: object, match: str) -> None:
    """Empty, out-of-range, unordered or repeated layer subsets raise ConfigError."""
    with pytest.raises(ConfigError, match=match):
        self_draft(target, layers)  # type: ignore[arg-type]


def test_check_compatible(target: HFModel) -> None:
    """Models with the same logits width pass; different vocabularies raise
    IncompatibleModelsError."""
    check_compatible(target, target.self_draft(1))
    other = tiny_llama(vocab_size=V + 1)
    with pytest.raises(IncompatibleModelsError, match="vocabulary"):
        check_compatible(target, other)


@pytest.mark.parametrize("method", ["chain", "dyspec"])
def test_self_draft_in_the_loop_is_greedy_exact(target: HFModel, method: str) -> None:
    """A one-layer self-draft driving Chain or DySpec, verified greedily, reproduces
    transformers' greedy generate, and the draft's cache stays in step with the target's."""
    from verispec import SpeculativeDecoder
    from verispec.drafters import Chain, DySpec
    from verispec.verifiers import Greedy

    draft = self_draft(target, 1)
    drafter = Chain(draft, k=3) if method == "chain" else DySpec(draft, budget=8)
    decoder = SpeculativeDecoder(target, drafter, Greedy())
    generator = torch.Generator().manual_seed(7)
    target.hf_model.generation_config.eos_token_id = None
    for _ in range(4):
        prompt = torch.randint(0, V, (5,), generator=generator).tolist()
        ids = torch.tensor([prompt])
        expected = target.hf_model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False,
            pad_token_id=0,
        )[0, 5:].tolist()  # fmt: skip
        result = decoder.generate(prompt, max_new_tokens=20, eos_token_ids=[])
        assert result.tokens == expected[: len(result.tokens)]
        assert len(result.tokens) == 20
        assert draft.num_committed == target.num_committed


@pytest.mark.parametrize(
    ("text", "want"),
    [("6", 6), ("0-12+19-29", (*range(13), *range(19, 30))), ("0-3+29", (0, 1, 2, 3, 29))],
)
def test_parse_layers(text: str, want: object) -> None:
    """A layer choice parses as a count or as inclusive ranges joined by '+'."""
    assert parse_layers(text) == want


@pytest.mark.parametrize("text", ["", "a", "0-", "3-x", "1,2", "-2", "5-2"])
def test_parse_layers_rejects(text: str) -> None:
    """Text that is neither a count nor upward ranges is refused with the allowed forms named."""
    with pytest.raises(ValueError, match="0-12"):
        parse_layers(text)


def test_recommended_layers_skip_a_middle_block() -> None:
    """The default drops layers 13-18 of SmolLM2's 30 and keeps both ends of any depth."""
    assert recommended_layers(30) == (*range(13), *range(19, 30))
    for n in range(3, 64):
        kept = recommended_layers(n)
        assert kept[0] == 0 and kept[-1] == n - 1 and 0 < len(kept) < n
        assert list(kept) == sorted(set(kept))
    assert recommended_layers(1) == (0,)


def test_self_draft_defaults_to_recommended_layers(target: HFModel) -> None:
    """Without `layers`, the self-draft runs the recommended layers."""
    assert self_draft(target).layer_indices == recommended_layers(target.num_layers)

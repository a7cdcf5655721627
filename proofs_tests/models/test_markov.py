"""The toy Markov LanguageModel: explicit tables, and the whole protocol, checked strictly."""

from __future__ import annotations

import math

import pytest
import torch

from verispec.core.sampling import SamplingParams
from verispec.core.tree import DraftTree
from verispec.core.types import LanguageModel
from verispec.errors import ConfigError, ContextLengthError, TreeStructureError
from verispec.models.markov import MarkovModel


@pytest.fixture(params=[1, 2], ids=["order1", "order2"])
def model(request: pytest.FixtureRequest) -> MarkovModel:
    generator = torch.Generator().manual_seed(request.param)
    return MarkovModel.random(3, generator, order=request.param, max_length=32)


def _tree() -> DraftTree:
    # root -> a(0) -> c(2); root -> b(1) -> d(3), e(4)
    return DraftTree.from_parents([2, 0, 1, 1, 2], [-1, -1, 0, 1, 1])


def test_is_a_language_model(model: MarkovModel) -> None:
    """MarkovModel satisfies the runtime-checkable LanguageModel protocol."""
    assert isinstance(model, LanguageModel)
    assert model.vocab_size == 3


def test_tree_rows_are_the_table_rows_of_each_path(model: MarkovModel) -> None:
    """Row 0 is the table row after the prompt, row i + 1 the row after prompt + path(i)."""
    model.prefill(torch.tensor([1, 2, 0]))
    tree = _tree()
    logits = model.forward_tree(tree)
    assert logits.shape == (tree.num_nodes + 1, 3)
    assert torch.equal(logits[0], model.next_logits([1, 2, 0]))
    for node in range(tree.num_nodes):
        context = [1, 2, 0, *tree.path_tokens(node)]
        assert torch.equal(logits[node + 1], model.next_logits(context))


def test_order_two_reads_the_last_two_tokens_and_pads_with_zero() -> None:
    """An order-2 chain reads logits[a, b] after ...a, b and logits[0, b] after a lone b."""
    logits = torch.randn(3, 3, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    model = MarkovModel(logits)
    assert torch.equal(model.next_logits([2, 1, 0]), logits[1, 0])
    assert torch.equal(model.next_logits([2]), logits[0, 2])


def test_extend_from_feeds_only_new_nodes_and_matches_a_full_pass(model: MarkovModel) -> None:
    """Growing a tree with extend_from returns exactly the new rows of a full pass."""
    tree = _tree()
    model.prefill(torch.tensor([2, 1]))
    full = model.forward_tree(tree)
    model.prefill(torch.tensor([2, 1]))
    fed_before = model.tokens_fed
    root = model.forward_tree(DraftTree.empty())
    first = model.forward_tree(tree.truncated(2))
    rest = model.forward_tree(tree, extend_from=2)
    assert torch.equal(root[0], full[0])
    assert torch.equal(first, full[:3])
    assert torch.equal(rest, full[3:])
    # the pending root once, then nodes 0, 1, then nodes 2..4: no token fed twice
    assert model.tokens_fed - fed_before == 1 + 2 + 3
    assert model.call_log[-2:] == [(0, 2), (2, 3)]


def test_extend_from_must_grow_the_tree_scored_this_step(model: MarkovModel) -> None:
    """extend_from without an earlier tree, beyond it, or over different nodes is refused."""
    model.prefill(torch.tensor([0]))
    with pytest.raises(ConfigError):
        model.forward_tree(_tree(), extend_from=1)
    model.forward_tree(_tree().truncated(2))
    with pytest.raises(ConfigError):
        model.forward_tree(_tree(), extend_from=3)
    other = DraftTree.from_parents([1, 0, 1], [-1, -1, 0])
    with pytest.raises(TreeStructureError):
        model.forward_tree(other, extend_from=2)
    with pytest.raises(ConfigError, match=r"`extend_from` must be an integer in \[0, 5\]"):
        model.forward_tree(_tree(), extend_from=6)


def test_commit_caches_the_path_and_makes_the_extra_token_pending(model: MarkovModel) -> None:
    """After commit the committed tokens are prompt + accepted path + extra, extra pending."""
    model.prefill(torch.tensor([1, 0]))
    model.forward_tree(_tree())
    model.commit([1, 3], extra_token=2)
    assert model.committed == [1, 0, 0, 1, 2]
    assert model.pending == (2,)
    assert model.num_committed == 5
    logits = model.forward_tree(DraftTree.empty())
    assert torch.equal(logits[0], model.next_logits([1, 0, 0, 1, 2]))


def test_commit_without_a_scored_tree_keeps_tokens_pending(model: MarkovModel) -> None:
    """A step with no forward leaves the old pending tokens unfed, then the extra token."""
    model.prefill(torch.tensor([1, 0]))
    model.commit([], extra_token=2)
    assert model.pending == (0, 2)
    fed = model.tokens_fed
    model.forward_tree(DraftTree.empty())
    assert model.tokens_fed - fed == 2


def test_commit_rejects_a_non_path_or_unknown_nodes(model: MarkovModel) -> None:
    """accepted must be a root-to-node path of the last scored tree."""
    model.prefill(torch.tensor([1]))
    model.forward_tree(_tree())
    with pytest.raises(TreeStructureError):
        model.commit([0, 3], extra_token=0)  # 3's parent is 1, not 0
    with pytest.raises(TreeStructureError):
        model.commit([1, 7], extra_token=0)
    with pytest.raises(TreeStructureError):
        model.commit([1], extra_token=3)  # outside the vocabulary


def test_context_length_is_enforced() -> None:
    """A tree that does not fit the window raises ContextLengthError."""
    model = MarkovModel.random(3, torch.Generator().manual_seed(0), max_length=4)
    model.prefill(torch.tensor([0, 1]))
    with pytest.raises(ContextLengthError):
        model.forward_tree(_tree())
    with pytest.raises(ContextLengthError):
        model.prefill(torch.tensor([0, 1, 2, 0, 1]))


def test_sequence_probs_is_the_enumerated_joint_law() -> None:
    """sequence_probs sums to 1 and equals the product of processed conditionals."""
    model = MarkovModel.random(3, torch.Generator().manual_seed(3), order=2)
    sampling = SamplingParams(temperature=0.6)
    law = model.sequence_probs([1, 2], 3, sampling)
    assert law.shape == (3, 3, 3)
    assert math.isclose(float(law.sum()), 1.0, abs_tol=1e-12)
    expected = 1.0
    context = [1, 2]
    for token in (0, 2, 1):
        expected *= float(torch.softmax(model.next_logits(context) / 0.6, -1)[token])
        context.append(token)
    assert math.isclose(float(law[0, 2, 1]), expected, rel_tol=1e-12)


def test_from_probs_keeps_zero_probability_transitions() -> None:
    """from_probs turns zeros into -inf logits: those tokens never follow."""
    probs = torch.tensor([[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    model = MarkovModel.from_probs(probs)
    assert model.next_logits([1])[0] == -math.inf
    assert torch.allclose(torch.softmax(model.next_logits([2]), -1), probs[2].double())


@pytest.mark.parametrize(
    "logits",
    [
        torch.zeros(3, 4),  # not square
        torch.zeros(3),  # 1-D
        torch.full((2, 2), math.nan),
        torch.tensor([[0.0, 0.0], [-math.inf, -math.inf]]),  # a row with no support
    ],
)
def test_bad_tables_are_refused(logits: torch.Tensor) -> None:
    """Malformed tables raise ConfigError."""
    with pytest.raises(ConfigError):
        MarkovModel(logits)


def test_calls_before_prefill_are_refused() -> None:
    """forward_tree needs a sequence."""
    model = MarkovModel.random(2, torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError):
        model.forward_tree(DraftTree.empty())

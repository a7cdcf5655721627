"""Chain: k sequential draft samples, IID law with one child per level."""

from __future__ import annotations

import pytest
import torch
from drafter_states import decode_state

from verispec import SpeculativeDecoder
from verispec.core import DETERMINISTIC, IID
from verispec.drafters.chain import Chain
from verispec.errors import ConfigError, IncompatibleModelsError
from verispec.models.markov import MarkovModel
from verispec.verifiers import Greedy


@pytest.fixture
def draft() -> MarkovModel:
    return MarkovModel.random(5, torch.Generator().manual_seed(1), order=2, scale=2.0)


def test_chain_is_k_nodes_with_iid_laws_of_the_parent_context(draft: MarkovModel) -> None:
    """Node i's parent is node i-1 and the law of its row is IID(p) with p the processed
    draft distribution after the prompt and the chain so far."""
    state = decode_state([3, 1], temperature=0.8)
    drafter = Chain(draft, k=4)
    drafter.begin(state)
    tree = drafter.propose(state)
    assert tree.parents.tolist() == [-1, 0, 1, 2]
    tokens = tree.tokens.tolist()
    for row in range(4):
        law = tree.laws[row]
        assert isinstance(law, IID)
        context = [3, 1, *tokens[:row]]
        expected = state.sampling.probs(draft.next_logits(context), torch.float64)
        assert torch.allclose(law.draft_probs, expected, atol=0, rtol=1e-12)
        assert float(law.draft_probs[tokens[row]]) > 0
    assert tree.laws[4] is None


def test_one_draft_call_per_node_but_the_last(draft: MarkovModel) -> None:
    """The draft is called k times: the root, then each node but the leaf, one node each."""
    state = decode_state([0], temperature=1.0)
    drafter = Chain(draft, k=3)
    drafter.begin(state)
    before = len(draft.call_log)
    drafter.propose(state)
    assert draft.call_log[before:] == [(0, 0), (0, 1), (1, 1)]


def test_greedy_chain_is_the_draft_argmax_and_deterministic(draft: MarkovModel) -> None:
    """At temperature 0 each node is the draft's argmax and the law is DETERMINISTIC."""
    state = decode_state([2, 4], temperature=0.0)
    drafter = Chain(draft, k=5)
    drafter.begin(state)
    tree = drafter.propose(state)
    context = [2, 4]
    for row in range(5):
        token = int(draft.next_logits(context).argmax())
        assert int(tree.tokens[row]) == token
        assert tree.laws[row] is DETERMINISTIC
        context.append(token)


def test_first_draw_follows_the_draft_distribution(draft: MarkovModel) -> None:
    """The first chain token is distributed as the processed draft distribution
    (chi-square, 2000 draws, alpha = 1e-3)."""
    from scipy.stats import chisquare

    drafter = Chain(draft, k=1)
    state = decode_state([1, 2], temperature=1.0, seed=7)
    counts = torch.zeros(5)
    drafter.begin(state)
    for _ in range(2000):
        tree = drafter.propose(state)
        counts[int(tree.tokens[0])] += 1
        draft.prefill(torch.tensor([1, 2]))  # restart: the same context every draw
    probs = torch.softmax(draft.next_logits([1, 2]), -1)
    assert chisquare(counts.numpy(), (probs * 2000).numpy()).pvalue > 1e-3


def test_draft_cache_stays_in_step_with_the_target(draft: MarkovModel) -> None:
    """After a generation the draft has committed exactly the target's tokens."""
    target = MarkovModel.random(5, torch.Generator().manual_seed(2), scale=2.0)
    drafter = Chain(draft, k=3)
    decoder = SpeculativeDecoder(target, drafter, Greedy())
    result = decoder.generate([1, 2, 3], max_new_tokens=12, temperature=0.0)
    assert draft.committed == target.committed
    assert draft.committed[3:][: len(result.tokens)] == result.tokens


def test_respects_the_room_left(draft: MarkovModel) -> None:
    """The chain is cut to state.max_nodes; with no room the tree is empty."""
    state = decode_state([0], temperature=1.0)
    drafter = Chain(draft, k=6)
    drafter.begin(state)
    state.max_nodes = 2
    assert drafter.propose(state).num_nodes == 2
    draft.commit([], 1)
    state.max_nodes = 0
    calls = len(draft.call_log)
    assert drafter.propose(state).num_nodes == 0
    assert len(draft.call_log) == calls  # no draft call for an empty tree


@pytest.mark.parametrize("k", [0, -1, 2.5, True])
def test_bad_chain_length(draft: MarkovModel, k: object) -> None:
    """k must be an integer >= 1."""
    with pytest.raises(ConfigError):
        Chain(draft, k=k)  # type: ignore[arg-type]


def test_vocab_mismatch_is_refused(draft: MarkovModel) -> None:
    """A draft with another vocabulary size cannot be paired with the target."""
    target = MarkovModel.random(4, torch.Generator().manual_seed(0))
    with pytest.raises(IncompatibleModelsError):
        SpeculativeDecoder(target, Chain(draft, k=2), Greedy())


def test_not_a_model_is_refused() -> None:
    """The draft must be a LanguageModel."""
    with pytest.raises(ConfigError):
        Chain(object(), k=2)  # type: ignore[arg-type]

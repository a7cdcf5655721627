"""Tests of verispec/drafters/prompt_lookup.py: matching, the incremental index, tree merging."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from verispec import SpeculativeDecoder
from verispec.core import DecodeState, GenerationParams, SamplingParams
from verispec.drafters.prompt_lookup import NgramIndex, PromptLookup
from verispec.errors import ConfigError
from verispec.verifiers import Greedy


def _state(tokens: list[int], max_nodes: int = 1 << 30) -> DecodeState:
    return DecodeState(
        tokens=list(tokens),
        prompt_length=len(tokens),
        sampling=SamplingParams(),
        generator=torch.Generator().manual_seed(0),
        max_nodes=max_nodes,
    )


def _brute_matches(tokens: list[int], lo: int, hi: int, limit: int) -> list[tuple[int, int]]:
    found: list[tuple[int, int]] = []
    length = len(tokens)
    for n in range(min(hi, length), lo - 1, -1):
        suffix = tokens[length - n :]
        for p in range(length - 1, n - 1, -1):
            if tokens[p - n : p] == suffix and p not in [q for q, _ in found]:
                found.append((p, n))
    return found[:limit]


@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=40),
    st.lists(st.integers(1, 5), max_size=8),
    st.integers(1, 2),
    st.integers(0, 2),
    st.integers(1, 6),
)
def test_incremental_index_matches_brute_force(
    tokens: list[int], chunks: list[int], lo: int, extra: int, limit: int
) -> None:
    """Index built step by step finds exactly the brute-force occurrences, best first."""
    drafter = PromptLookup(min_ngram=lo, max_ngram=lo + extra, max_matches=limit)
    cut = [len(tokens)]
    for c in chunks:
        cut.append(cut[-1] + c)
    seq = tokens + [(7 * i) % 4 for i in range(cut[-1] - len(tokens))]
    drafter.begin(_state(seq[: cut[0]]))
    for end in cut:
        prefix = seq[:end]
        assert drafter.matches(prefix) == _brute_matches(prefix, lo, lo + extra, limit)


def test_longest_match_first_then_most_recent() -> None:
    """Occurrences of the longer suffix come first; within one length, the most recent first."""
    #         0  1  2  3  4  5  6  7  8  9 10 11 12
    tokens = [5, 1, 2, 7, 1, 2, 8, 9, 2, 6, 5, 1, 2]
    drafter = PromptLookup(min_ngram=1, max_ngram=3, max_matches=8)
    # suffix (5,1,2) occurs ending at 3; (1,2) also at 6; (2,) also at 9
    assert drafter.matches(tokens) == [(3, 3), (6, 2), (9, 1)]
    assert PromptLookup(min_ngram=2, max_ngram=2).matches(tokens) == [(6, 2), (3, 2)]
    assert PromptLookup(tree=False).matches(tokens) == [(3, 3)]


def test_no_match_gives_the_empty_tree() -> None:
    """A context whose last token never occurred before gets only the root."""
    drafter = PromptLookup(max_tokens=10)
    state = _state([1, 2, 3, 4])
    drafter.begin(state)
    assert drafter.propose(state).num_nodes == 0


def test_continuations_merge_into_a_trie() -> None:
    """Occurrences with a common continuation prefix share nodes; the trie splits where they
    diverge, and each node's share is the fraction of occurrence weight through it."""
    # suffix (9,) is followed by: 1 2 3 (pos 1), 1 2 4 (pos 6), 5 6 (pos 11)
    tokens = [9, 1, 2, 3, 0, 9, 1, 2, 4, 0, 9, 5, 6, 0, 9]
    drafter = PromptLookup(max_tokens=10, min_ngram=1, max_ngram=1, max_matches=3)
    cand = drafter.candidates(tokens, max_depth=3)
    paths = {tuple(tokens_of(cand, i)): cand.share[i].item() for i in range(cand.num_nodes)}
    assert paths == {
        (5,): pytest.approx(1 / 3),
        (5, 6): pytest.approx(1 / 3),
        (5, 6, 0): pytest.approx(1 / 3),
        (1,): pytest.approx(2 / 3),
        (1, 2): pytest.approx(2 / 3),
        (1, 2, 4): pytest.approx(1 / 3),
        (1, 2, 3): pytest.approx(1 / 3),
    }


def tokens_of(cand, node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(int(cand.tokens[node]))
        node = int(cand.parents[node])
    return out[::-1]


def test_tree_takes_the_most_valuable_nodes_and_stays_connected() -> None:
    """The proposed tree is the top max_tokens trie nodes by acceptance**depth * share,
    parents before children, siblings distinct and in value order."""
    tokens = [9, 1, 2, 3, 0, 9, 1, 2, 4, 0, 9, 5, 6, 0, 9]
    drafter = PromptLookup(max_tokens=4, min_ngram=1, max_ngram=1, acceptance=0.5)
    state = _state(tokens)
    drafter.begin(state)
    tree = drafter.propose(state)
    # values: (1)=1/3, (5)=1/6, (1,2)=1/6, (5,6)=1/12, (1,2,3)=(1,2,4)=1/24 ...
    # the tie (5) vs (1,2) goes to (5): its occurrence (position 11) is the most recent.
    got = [tree.path_tokens(i) for i in range(tree.num_nodes)]
    assert got == [[1], [5], [1, 2], [5, 6]]
    for kids in tree.children:
        toks = [int(tree.tokens[c]) for c in kids]
        assert len(toks) == len(set(toks))


def test_chain_variant_sends_one_continuation() -> None:
    """tree=False sends the best occurrence's continuation as a chain of max_tokens."""
    tokens = [9, 1, 2, 3, 0, 9, 1, 2, 4, 0, 9, 5, 6, 0, 9]
    drafter = PromptLookup(max_tokens=3, min_ngram=1, max_ngram=1, tree=False)
    state = _state(tokens)
    drafter.begin(state)
    tree = drafter.propose(state)
    assert tree.tokens.tolist() == [5, 6, 0]
    assert tree.parents.tolist() == [-1, 0, 1]


def test_budget_respects_max_nodes() -> None:
    """The tree never exceeds max_tokens nor the engine's room (state.max_nodes)."""
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1]
    drafter = PromptLookup(max_tokens=10)
    drafter.begin(_state(tokens))
    assert drafter.propose(_state(tokens)).num_nodes == 10
    assert drafter.propose(_state(tokens, max_nodes=4)).num_nodes == 4
    assert drafter.propose(_state(tokens, max_nodes=0)).num_nodes == 0


def test_new_sequence_rebuilds_the_index() -> None:
    """begin() drops the previous context, and a non-extending context is re-indexed."""
    drafter = PromptLookup(min_ngram=1, max_ngram=1)
    drafter.begin(_state([1, 2, 1]))
    assert drafter.matches([1, 2, 1]) == [(1, 1)]
    drafter.begin(_state([3, 4, 3]))
    assert drafter.matches([3, 4, 3]) == [(1, 1)]
    assert drafter.matches([5, 6, 7, 5]) == [(1, 1)]  # not an extension: rebuilt


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_tokens": 0}, "`max_tokens` must be an integer >= 1"),
        ({"min_ngram": 0}, "`min_ngram`"),
        ({"min_ngram": 3, "max_ngram": 2}, "`max_ngram` must be >= `min_ngram`"),
        ({"max_matches": 0}, "`max_matches`"),
        ({"acceptance": 1.0}, "`acceptance` must be in"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict, match: str) -> None:
    """Out-of-range settings raise ConfigError naming the argument."""
    with pytest.raises(ConfigError, match=match):
        PromptLookup(**kwargs)


def test_ngram_index_sync_only_adds_new_positions() -> None:
    """Extending the sequence appends positions; old ones are kept in increasing order."""
    index = NgramIndex(1, 2)
    index.sync([1, 2, 1])
    assert index.positions((1,)) == [1]
    index.sync([1, 2, 1, 2, 1, 3])
    assert index.positions((1,)) == [1, 3, 5]
    assert index.positions((1, 2)) == [2, 4]
    assert index.positions((2, 1)) == [3, 5]


# -- end to end on the tiny model ---------------------------------------------------------


def _repetitive_prompts(count: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(7)
    prompts = []
    for _ in range(count):
        piece = torch.randint(
            vocab, (int(torch.randint(2, 6, (1,), generator=generator)),), generator=generator
        ).tolist()
        noise = torch.randint(vocab, (3,), generator=generator).tolist()
        prompts.append(piece * 3 + noise + piece)
    return prompts


@pytest.mark.parametrize("tree", [True, False])
def test_greedy_token_identical_on_tiny_llama(tiny, greedy_reference, tree: bool) -> None:
    """PLD (tree and chain) + Greedy produces exactly plain greedy's tokens on 12 prompts.
    A fixed size (10 tokens), so that it drafts on any machine: the size the device picks
    (``max="auto"``) follows measured times, and on this tiny model, whose forward costs
    about as much as the drafter's own work, it may send nothing (its exactness: test_gate)."""
    decoder = SpeculativeDecoder(tiny, PromptLookup(max_tokens=10, tree=tree), Greedy())
    config = GenerationParams(max_new_tokens=40, eos_token_ids=())
    accepted = 0
    for prompt in _repetitive_prompts(12, tiny.vocab_size):
        result = decoder.generate(prompt, config)
        assert result.tokens == greedy_reference(prompt, 40)
        accepted += sum(s.accepted for s in result.steps)
    assert accepted > 0

"""Tests of verispec/drafters/suffix.py: the continuation trie, values, trees, the corpus,
calibration and greedy exactness."""

from __future__ import annotations

import math

import pytest
import torch
from drafter_states import decode_state
from greedy_runs import remembered_greedy_run
from hypothesis import given
from hypothesis import strategies as st

from verispec import SpeculativeDecoder
from verispec.core import DraftTree, StepOutcome, Verdict
from verispec.core.tree import Deterministic
from verispec.drafters.suffix import SuffixDrafter, continuation_score
from verispec.drafters.suffix_corpus import SuffixCorpus
from verispec.errors import ConfigError
from verispec.verifiers import Greedy


def _longest_repeat(tokens: list[int]) -> int:
    """Length of the longest suffix of ``tokens`` that also ends earlier (brute force)."""
    end = len(tokens)
    for n in range(end - 1, 0, -1):
        if any(tokens[p - n : p] == tokens[end - n :] for p in range(n, end)):
            return n
    return 0


def _follow_counts(texts: list[list[int]], pattern: list[int]) -> dict[int, int]:
    """How often each token follows ``pattern`` in ``texts`` (brute force)."""
    n = len(pattern)
    counts: dict[int, int] = {}
    for text in texts:
        for p in range(n, len(text)):
            if text[p - n : p] == pattern:
                counts[text[p]] = counts.get(text[p], 0) + 1
    return counts


def _paths(tree: DraftTree) -> list[tuple[int, ...]]:
    return [tuple(tree.path_tokens(i)) for i in range(tree.num_nodes)]


@given(st.lists(st.integers(0, 3), min_size=2, max_size=40), st.integers(1, 4))
def test_candidates_are_the_continuation_trie_of_the_longest_match(
    tokens: list[int], depth_cap: int
) -> None:
    """With room for every node, the context candidates are exactly the trie of
    continuations of the longest repeated suffix x, to depth min(depth_cap, ceil(2 L)):
    each path p occurs after x, every continuation of x is there, and each node's cell is
    its calibration cell for the brute-force score count(x p) / (total after x p[:-1] + 1)."""
    drafter = SuffixDrafter(depth_factor=2.0)
    cands = drafter.candidates(tokens, width=10_000, depth_cap=depth_cap)
    matched = _longest_repeat(tokens)
    x = tokens[len(tokens) - matched :]
    limit = min(depth_cap, math.ceil(2 * matched)) if matched else 0
    want: set[tuple[int, ...]] = set()
    frontier: list[tuple[int, ...]] = [()]
    for _ in range(limit):
        frontier = [(*p, t) for p in frontier for t in _follow_counts([tokens], x + list(p))]
        want |= set(frontier)
    got: list[tuple[int, ...]] = []
    for i in range(cands.num_nodes):
        parent = int(cands.parents[i])
        path = (*got[parent], int(cands.tokens[i])) if parent >= 0 else (int(cands.tokens[i]),)
        got.append(path)
        follow = _follow_counts([tokens], x + list(path[:-1]))
        score = continuation_score(follow[path[-1]], sum(follow.values()))
        row = [r for r, edge in enumerate((0.0, 0.3, 0.45, 0.6, 0.75, 0.9)) if score >= edge][-1]
        cell = drafter.calibrations[0].cell(row, matched + len(path) - 1)
        assert int(cands.cells[i, 0]) == cell and int(cands.cells[i, 1]) == -1
    assert sorted(got) == sorted(want)


@given(
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=3),
    st.lists(st.integers(0, 3), min_size=1, max_size=12),
)
def test_corpus_candidates_continue_the_longest_suffix_found_in_the_corpus(
    docs: list[list[int]], context: list[int]
) -> None:
    """The corpus column proposes, at depth 1, exactly the tokens that follow the longest
    suffix of the context found in the corpus documents."""
    corpus = SuffixCorpus()
    for doc in docs:
        corpus.add(doc)
    drafter = SuffixDrafter(corpus=corpus)
    cands = drafter.candidates(context, width=10_000, depth_cap=1)
    matched = max(
        n for n in range(len(context) + 1)
        if n == 0 or any(_follow_counts([d], context[len(context) - n :]) or
                         d[len(d) - n :] == context[len(context) - n :] for d in docs)
    )  # fmt: skip
    follow = _follow_counts(docs, context[len(context) - matched :]) if matched else {}
    from_corpus = {
        int(cands.tokens[i]) for i in range(cands.num_nodes) if int(cands.cells[i, 1]) >= 0
    }
    assert from_corpus == set(follow)


@pytest.mark.parametrize("budget", [1, 3, 6, 20])
def test_tree_is_the_most_valuable_connected_set(budget: int) -> None:
    """The proposed tree is the `budget` most valuable nodes of the full candidate trie
    (values fall along every path, so the set is connected); parents come first, siblings
    are distinct, every node is a Deterministic candidate."""
    context = [1, 2, 3, 1, 2, 4, 1, 2, 3, 5, 1, 2, 3, 1, 2]
    drafter = SuffixDrafter(budget=budget)
    state = decode_state(context)
    drafter.begin(state)
    full = drafter.candidates(context, width=10_000, depth_cap=drafter.max_depth)
    tree = drafter.propose(state)
    best = sorted(full.values.tolist(), reverse=True)[:budget]
    assert tree.num_nodes == min(budget, full.num_nodes)
    assert sorted(drafter.last_values.tolist(), reverse=True) == pytest.approx(best, rel=1e-12)
    values = drafter.last_values.tolist()
    for i, parent in enumerate(tree.parents.tolist()):
        assert parent < i and (parent < 0 or values[i] < values[parent])
    for kids in tree.children:
        assert len({int(tree.tokens[c]) for c in kids}) == len(kids)
    assert all(law is None or isinstance(law, Deterministic) for law in tree.laws)


def test_depth_adapts_to_the_match_length() -> None:
    """A match of length L drafts at most ceil(depth_factor * L) deep (depth_factor 1 here):
    a 1-token match gives one level, a 5-token match a chain of five."""
    long_context = [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 0, 7, 8, 9, 10, 11]  # L = 5
    short_context = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0, 3]  # L = 1
    for context, deepest in ((long_context, 5), (short_context, 1)):
        drafter = SuffixDrafter(budget=16, depth_factor=1.0)
        state = decode_state(context)
        drafter.begin(state)
        assert int(drafter.propose(state).depth.max()) == deepest


def test_tree_depends_only_on_the_drafters_state() -> None:
    """Proposals from the same state with different generators are the same tree, and two
    drafters fed the same history propose the same tree."""
    context = [1, 2, 3, 1, 2, 4, 1, 2]
    trees = []
    for seed in (1, 999):
        drafter = SuffixDrafter(budget=8)
        drafter.remember([9, 1, 2, 3, 3])
        drafter.begin(decode_state(context))
        trees.append(drafter.propose(decode_state(context, seed=seed)))
        trees.append(drafter.propose(decode_state(context, seed=seed + 1)))
    for tree in trees[1:]:
        assert torch.equal(tree.tokens, trees[0].tokens)
        assert torch.equal(tree.parents, trees[0].parents)


def test_corpus_is_shared_and_remembered_across_generations() -> None:
    """An answer remembered by one drafter is retrieved by another sharing the corpus,
    for a context that never contained it; reset() empties the shared corpus."""
    corpus = SuffixCorpus()
    writer, reader = SuffixDrafter(corpus=corpus), SuffixDrafter(corpus=corpus)
    writer.remember([40, 41, 42, 43, 44])
    state = decode_state([5, 6, 40, 41])
    reader.begin(state)
    assert _paths(reader.propose(state))[:3] == [(42,), (42, 43), (42, 43, 44)]
    writer.reset()
    assert corpus.num_tokens == 0
    assert reader.propose(state).num_nodes == 0


def test_a_context_that_is_not_an_extension_is_reindexed_and_corpus_changes_rematch() -> None:
    """sync() rebuilds the context automaton for a context that does not extend the indexed
    one, and a document remembered mid-generation is matched at the next proposal."""
    drafter = SuffixDrafter()
    drafter.sync([1, 2, 3, 1, 2])
    assert drafter.context.repeated_suffix()[1] == 2
    drafter.sync([5, 6, 5])
    assert drafter.context.num_tokens == 3 and drafter.context.repeated_suffix()[1] == 1
    state = decode_state([7, 8, 9])
    drafter.begin(state)
    assert drafter.propose(state).num_nodes == 0
    drafter.remember([8, 9, 10, 11])
    assert _paths(drafter.propose(state))[:2] == [(10,), (10, 11)]


def test_observe_indexes_committed_tokens_and_calibrates_tried_nodes() -> None:
    """After a step the context automaton has the committed tokens (a new match appears),
    and only nodes whose parent was accepted count as tries."""
    drafter = SuffixDrafter(budget=4, decay=1.0)
    context = [1, 2, 3, 4, 9, 1, 2]
    state = decode_state(context)
    drafter.begin(state)
    tree = drafter.propose(state)
    assert _paths(tree) == [(3,), (3, 4), (3, 4, 9), (3, 4, 9, 1)]
    verdict = Verdict((0,), 7)  # 3 accepted, 4 rejected: 7 committed after it
    state.tokens.extend(verdict.committed_tokens(tree))
    drafter.observe(StepOutcome(tree, torch.zeros(5, 10), verdict, state))
    calibration = drafter.calibrations[0]
    assert float(calibration.tries.sum()) == 2 and float(calibration.hits.sum()) == 1
    assert drafter.context.num_tokens == len(state.tokens)
    assert drafter.context.repeated_suffix()[1] == 0  # ... 3 7: never seen before


def test_budget_and_room_limit_the_tree() -> None:
    """The tree never exceeds the budget nor the engine's room; budget 0 drafts nothing."""
    context = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
    for budget, room, want in ((4, 100, 4), (4, 2, 2), (0, 100, 0)):
        drafter = SuffixDrafter(budget=budget)
        state = decode_state(context)
        state.max_nodes = room
        drafter.begin(state)
        assert drafter.propose(state).num_nodes == want


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"budget": -1}, "`budget` must be an integer >= 0"),
        ({"max_depth": 0}, "`max_depth`"),
        ({"min_match": 0}, "`min_match`"),
        ({"depth_factor": 0.0}, "`depth_factor` must be a number > 0 or None"),
        ({"decay": 1.5}, "`decay`"),
        ({"corpus": [1, 2]}, "`corpus` must be a SuffixCorpus"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict, match: str) -> None:
    """Out-of-range settings raise ConfigError naming the argument."""
    with pytest.raises(ConfigError, match=match):
        SuffixDrafter(**kwargs)


# -- exactness end to end ------------------------------------------------------------------


def _prompts(count: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(5)
    out = []
    for _ in range(count):
        piece = torch.randint(vocab, (5,), generator=generator).tolist()
        out.append(piece + torch.randint(vocab, (4,), generator=generator).tolist() + piece[:2])
    return out


def test_greedy_token_identical_on_tiny_llama(tiny, greedy_reference) -> None:
    """SuffixDrafter + Greedy produces exactly plain greedy's tokens for 10 prompts, each
    answer remembered in the corpus for the next, and drafts are accepted."""
    drafter = SuffixDrafter(budget=8)
    accepted = remembered_greedy_run(tiny, drafter, _prompts(10, tiny.vocab_size), greedy_reference)
    assert accepted > 0


@pytest.fixture(scope="module")
def smollm2(single_thread: None, default_model: tuple):  # type: ignore[no-untyped-def]
    return default_model


@pytest.mark.slow
@pytest.mark.parametrize("name", ["suffix", "dtr-suffix"])
def test_greedy_token_identical_on_smollm2(smollm2, name: str) -> None:
    """On SmolLM2, the suffix drafter and DTR fused with it generate exactly plain greedy's
    32 tokens for two chat prompts, the second asking to repeat the first answer (retrieved
    from the context and the corpus it was remembered in), and drafts are accepted.

    DTR gets a fixed budget of 8 nodes: ``budget="auto"`` gates drafting on the wall clock
    (:mod:`verispec.drafters.gate`), so on a loaded machine it may send no tree at all and
    the test would prove nothing (its exactness: test_gate)."""
    from verispec.drafters.dynamic_token_recycling import DynamicTokenRecycling

    model, tokenizer = smollm2
    drafter = SuffixDrafter() if name == "suffix" else DynamicTokenRecycling(8, suffix=True)
    decoder = SpeculativeDecoder(model, drafter, Greedy())
    plain = SpeculativeDecoder(model, None, Greedy())
    messages = [{"role": "user", "content": "Name three uses of a paperclip."}]
    accepted = 0
    for _ in range(2):
        ids = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                 tokenize=True, return_dict=False))  # fmt: skip
        result = decoder.generate(ids, max_new_tokens=32)
        assert result.tokens == plain.generate(ids, max_new_tokens=32).tokens
        drafter.remember(result.tokens)
        accepted += sum(step.accepted for step in result.steps)
        answer = tokenizer.decode(result.tokens, skip_special_tokens=True)
        messages = [{"role": "user", "content": f"Repeat exactly: {answer}"}]
    assert accepted > 0

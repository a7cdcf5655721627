"""Tests of verispec/drafters/suffix_automaton.py against brute-force substring searches."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from verispec.drafters.suffix_automaton import SuffixAutomaton

_docs = st.lists(st.lists(st.integers(0, 3), max_size=30), min_size=1, max_size=4)


def _count(docs: list[list[int]], pattern: list[int]) -> int:
    """Occurrences of ``pattern`` in the documents (brute force)."""
    n = len(pattern)
    return sum(doc[i : i + n] == pattern for doc in docs for i in range(len(doc) - n + 1))


def _build(docs: list[list[int]], count_walk: int | None = None) -> SuffixAutomaton:
    automaton = SuffixAutomaton(count_walk)
    for doc in docs:
        automaton.start_document()
        automaton.extend(doc)
    return automaton


def _walk(automaton: SuffixAutomaton, pattern: list[int]) -> int | None:
    state = 0
    for token in pattern:
        state = automaton.next[state].get(token)  # type: ignore[assignment]
        if state is None:
            return None
    return state


@given(_docs, st.lists(st.integers(0, 4), min_size=1, max_size=6))
def test_accepts_exactly_the_substrings_with_their_counts(
    docs: list[list[int]], probe: list[int]
) -> None:
    """Every substring of every document is a path from the root whose state counts its
    occurrences; a string that occurs nowhere is not a path."""
    automaton = _build(docs)
    for doc in docs:
        for i in range(len(doc)):
            for j in range(i + 1, min(len(doc), i + 8) + 1):
                state = _walk(automaton, doc[i:j])
                assert state is not None
                assert automaton.occ[state] == _count(docs, doc[i:j])
    state = _walk(automaton, probe)
    assert (state is not None) == (_count(docs, probe) > 0)


@given(_docs, st.lists(st.integers(0, 3), max_size=20))
def test_match_is_the_longest_suffix_found_anywhere(
    docs: list[list[int]], query: list[int]
) -> None:
    """match() returns the length of the longest suffix of the query that occurs in some
    document, and a state whose strings end where that suffix ends."""
    automaton = _build(docs)
    state, length = automaton.match(query)
    longest = max(
        (n for n in range(len(query) + 1) if n == 0 or _count(docs, query[len(query) - n :])),
        default=0,
    )
    assert length == longest
    if length:
        assert _walk(automaton, query[len(query) - length :]) == state


@given(st.lists(st.integers(0, 2), min_size=1, max_size=40))
def test_repeated_suffix_is_the_longest_suffix_seen_before(text: list[int]) -> None:
    """After each appended token, repeated_suffix() is the longest suffix of the text that
    also ends at an earlier position (so it has a continuation), and the automaton only
    grew by appends: no rescan."""
    automaton = SuffixAutomaton()
    for end in range(1, len(text) + 1):
        automaton.append(text[end - 1])
        seen = text[:end]
        _, length = automaton.repeated_suffix()
        want = 0
        for n in range(end - 1, 0, -1):
            suffix = seen[end - n :]
            if any(seen[p - n : p] == suffix for p in range(n, end)):
                want = n
                break
        assert length == want
    assert automaton.num_tokens == len(text)
    assert automaton.num_states <= max(2 * len(text) - 1, 2)


@given(_docs)
def test_continuation_counts_are_the_counts_of_each_next_token(docs: list[list[int]]) -> None:
    """For every substring x, the transitions of x's state are the tokens seen after x and
    their states' counts are how often x is followed by each."""
    automaton = _build(docs)
    for doc in docs:
        for i in range(len(doc)):
            for j in range(i + 1, min(len(doc), i + 5) + 1):
                x = doc[i:j]
                state = _walk(automaton, x)
                assert state is not None
                seen = {t: _count(docs, [*x, t]) for t in range(4)}
                got = {t: automaton.occ[s] for t, s in automaton.next[state].items()}
                assert got == {t: n for t, n in seen.items() if n}


def test_a_bounded_count_walk_only_undercounts_far_up_the_suffix_links() -> None:
    """With count_walk=2, a periodic text (one suffix link per distinct count) keeps exact
    counts for the longest repeated suffix and its continuation, and undercounts the
    shortest strings, far up the suffix-link path."""
    text = [0, 1] * 12
    exact, bounded = _build([text]), _build([text], count_walk=2)
    state, length = bounded.repeated_suffix()
    assert length == 22 and bounded.occ[state] == exact.occ[exact.repeated_suffix()[0]] == 2
    after = bounded.next[state][0]
    assert bounded.occ[after] == _count([text], [*text[-22:], 0]) == 1
    short = _walk(bounded, [0])
    assert short is not None and bounded.occ[short] < _count([text], [0]) == 12


def test_memory_is_reported_and_grows_with_the_text() -> None:
    """memory_bytes() is positive and grows as tokens are appended."""
    automaton = SuffixAutomaton()
    before = automaton.memory_bytes()
    automaton.extend(range(1000))
    assert automaton.memory_bytes() > before + 1000 * 100

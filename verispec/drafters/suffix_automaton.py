"""An online suffix automaton over token sequences, with occurrence counts.

The suffix automaton (Blumer et al., 1985) of a text is the smallest automaton that
accepts its suffixes; each state stands for a class of substrings that end at the same
set of positions (their *endpos*). It is built online: appending a token costs
amortised O(1) automaton work (new states and redirected transitions), and the text is
never rescanned. Several documents share one automaton (the *generalised* automaton):
:meth:`SuffixAutomaton.start_document` restarts from the root, so no substring spans
two documents.

verispec also keeps, per state, the number of positions where its strings occur
(``occ = |endpos|``), so a drafter can score continuations by frequency. Each appended
token adds one end position to every state on the suffix-link path of its state; the
walk visits one state per distinct occurrence count among the text's repeated suffixes
(a handful in natural text, up to the repeat length in a periodic one). That walk is
the only part of an append that is not amortised O(1), so it is bounded by
``count_walk`` (default 64; on Spec-Bench's 136k question tokens the walk averages 2.5
states and never exceeds 10, so counts are exact there; past the bound, the states
further up the suffix-link path, shorter strings, may undercount; the first ones, the
longest repeated suffix a drafter expands, are counted). ``count_walk=None`` counts
exactly.

Notation: a state ``v`` has ``length[v]`` (its longest string), ``link[v]`` (the state
of the longest suffix with a different endpos), ``next[v]`` (token -> state) and
``occ[v]``. State 0 is the root (the empty string).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

__all__ = ["COUNT_WALK", "SuffixAutomaton"]

COUNT_WALK = 64


class SuffixAutomaton:
    """Generalised suffix automaton of token documents, built online.

    Args:
        count_walk: most states whose count one appended token updates (``None``: all,
            exact counts).
    """

    def __init__(self, count_walk: int | None = COUNT_WALK) -> None:
        self.count_walk = count_walk
        self.length: list[int] = [0]
        self.link: list[int] = [-1]
        self.next: list[dict[int, int]] = [{}]
        self.occ: list[int] = [0]
        self.last = 0  # state of the current document's whole text so far
        self.num_tokens = 0

    @property
    def num_states(self) -> int:
        return len(self.length)

    def start_document(self) -> None:
        """The next appended token starts a new document."""
        self.last = 0

    def extend(self, tokens: Iterable[int]) -> None:
        """Append ``tokens`` to the current document."""
        for token in tokens:
            self.append(token)

    def _new_state(self, length: int, link: int, nxt: dict[int, int], occ: int) -> int:
        self.length.append(length)
        self.link.append(link)
        self.next.append(nxt)
        self.occ.append(occ)
        return len(self.length) - 1

    def _split(self, p: int, q: int, token: int) -> int:
        """Clone ``q`` at length ``length[p] + 1`` and redirect ``p``'s path to the clone."""
        length, link, nxt = self.length, self.link, self.next
        clone = self._new_state(length[p] + 1, link[q], dict(nxt[q]), self.occ[q])
        while p != -1 and nxt[p].get(token) == q:
            nxt[p][token] = clone
            p = link[p]
        link[q] = clone
        return clone

    def append(self, token: int) -> None:
        """Append one token to the current document (amortised O(1) automaton work)."""
        length, link, nxt = self.length, self.link, self.next
        last = self.last
        self.num_tokens += 1
        q = nxt[last].get(token)
        if q is not None:  # generalised case: this prefix already occurs in another document
            if length[q] != length[last] + 1:
                q = self._split(last, q, token)
            self.last = q
            self._count(q)
            return
        cur = self._new_state(length[last] + 1, 0, {}, 0)
        p = last
        while p != -1 and token not in nxt[p]:
            nxt[p][token] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][token]
            link[cur] = q if length[p] + 1 == length[q] else self._split(p, q, token)
        self.last = cur
        self._count(cur)

    def _count(self, state: int) -> None:
        """One more end position for ``state`` and every state on its suffix-link path."""
        occ, link = self.occ, self.link
        budget = self.count_walk if self.count_walk is not None else -1
        while state > 0 and budget != 0:
            occ[state] += 1
            state = link[state]
            budget -= 1

    # -- queries ----------------------------------------------------------------------

    def step(self, state: int, matched: int, token: int) -> tuple[int, int]:
        """Extend a match by ``token``: the state and length of the longest suffix of
        (matched string + ``token``) that occurs in the text (amortised O(1))."""
        link, nxt = self.link, self.next
        while state > 0 and token not in nxt[state]:
            state = link[state]
            matched = self.length[state]
        target = nxt[state].get(token)
        if target is None:
            return 0, 0
        return target, matched + 1

    def match(self, tokens: Iterable[int]) -> tuple[int, int]:
        """State and length of the longest suffix of ``tokens`` that occurs in the text."""
        state = matched = 0
        for token in tokens:
            state, matched = self.step(state, matched, token)
        return state, matched

    def repeated_suffix(self) -> tuple[int, int]:
        """State and length of the longest suffix of the current document that also ends
        at an earlier position (so it has a continuation); ``(0, 0)`` when none."""
        if self.last == 0:
            return 0, 0
        state = self.link[self.last]
        return state, self.length[state]

    def memory_bytes(self) -> int:
        """Bytes held: the four per-state lists, the transition dicts and their entries."""
        size = sys.getsizeof
        total = sum(size(x) for x in (self.length, self.link, self.next, self.occ))
        total += sum(size(d) for d in self.next)
        entries = sum(len(d) for d in self.next)
        # int objects: per state length/link/occ, per transition key and value (small ints
        # are shared by CPython, so this over-counts them; the report is an upper bound)
        return total + 28 * (3 * self.num_states + 2 * entries)

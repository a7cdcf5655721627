"""Suffix drafting: the continuations of the context's longest suffix match, as a tree.

Two model-free methods retrieve drafts from the text seen so far by suffix matching:

* SAM Decoding (Hu et al., 2024, "SAM Decoding: Speculative Decoding via Suffix
  Automaton", arXiv:2411.10666) keeps a suffix automaton over the generated text and one
  over a static corpus, finds the longest suffix of the context in each in amortised
  O(1) per token, and drafts the continuation of one earlier occurrence as a chain (with
  Token Recycling or a draft model as fallback).
* SuffixDecoding (Oliaro et al., 2024, "SuffixDecoding: A Model-Free Approach to Speeding
  Up Large Language Model Inference", arXiv:2411.04975) keeps suffix trees over the
  prompt and over earlier *outputs*, shared across requests, and grows a speculation tree
  from the match greedily by empirical continuation frequency, with a size that scales
  with the match length.

This drafter takes SAM Decoding's structure and SuffixDecoding's tree. Two suffix
automata (:mod:`verispec.drafters.suffix_automaton`): one over the current context
(prompt and committed tokens, extended in ``observe``), one over a
:class:`~verispec.drafters.suffix_corpus.SuffixCorpus` that outlives requests. From the
longest suffix match in each (length ``L``), the automaton's transitions *are* the trie
of continuations: a state's outgoing tokens are the tokens seen after its strings, its
``occ`` how often. A child ``c`` of a trie node ``x`` gets the score
``count(x c) / (sum_c' count(x c') + 1)`` (the +1 keeps a lone occurrence below
certainty).

Where it departs from both papers (verispec's design):

* **Values, calibrated.** A node's value is its parent's times an acceptance rate looked
  up in a :class:`~verispec.drafters.candidates.Calibration` by score bucket and by the
  length of the context it is predicted from (``L`` plus its depth minus one: a node deep
  below a short match is predicted from a longer string), learnt online from which nodes
  the verifier accepted, one table per source (context, corpus). Values fall along every
  path, so a best-first walk of the automaton from the match yields the most valuable
  connected tree of ``budget`` nodes (SuffixDecoding's greedy expansion, with calibrated
  rather than raw frequencies); the two sources' trees are merged by token path.
* **Depth adapts through the values.** SuffixDecoding caps the tree at ``alpha * L``
  tokens. Here the rate of a node depends on the matched length it is predicted from, so
  a short match's tree is shallow unless the calibration has seen such continuations
  accepted; a hard cap ``ceil(depth_factor * L)`` is available but off by default: on
  recorded SmolLM2 answers (Spec-Bench, 5 per category, replayed offline) MAT rises
  monotonically as the cap is lifted (factor 2: 1.94, 4: 2.01, 8: 2.03, none: 2.04).
* **Fusion.** :class:`~verispec.drafters.dynamic_token_recycling.DynamicTokenRecycling`
  (``suffix=True``) adds these candidates to its recycled tree with their own values,
  instead of the papers' choice between one source and the other.
* **Only the longest match** of each source is expanded (SAM Decoding's rule), not
  shorter ones; its state already gathers every occurrence of the matched string.

Exactness: the children of every node are fixed candidates (the ``Deterministic`` law)
and the tree is a function of the drafter's state (automata, corpus, calibration), which
changes only in ``begin``, ``observe``, ``remember`` and ``reset``, never with the
step's random draws; so every verifier keeps its output law.

Shape glossary: N tree nodes, M candidate nodes.
"""

from __future__ import annotations

import heapq
import itertools
import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence

import attrs
import torch

from verispec.core.tree import DraftTree
from verispec.core.types import BaseDrafter, DecodeState, StepOutcome
from verispec.core.validate import integer, number, option, or_none
from verispec.drafters.candidates import (
    Calibration,
    CalibrationOptions,
    Candidates,
    fuse,
    subtree,
    tried_and_hit,
)
from verispec.drafters.suffix_automaton import SuffixAutomaton
from verispec.drafters.suffix_corpus import SuffixCorpus
from verispec.errors import ConfigError

__all__ = ["SOURCES", "SuffixDrafter", "SuffixOptions", "continuation_score"]

SOURCES = ("context", "corpus")  # candidate columns, in this order
# Calibration cells: buckets by the matched length a node is predicted from (1, 2, 3, 4-5,
# 6-8, 9-12, 13-20, 21+), rows by its continuation score (below 0.3, 0.3-0.45, ...).
_LENGTH_EDGES = (1.5, 2.5, 3.5, 5.5, 8.5, 12.5, 20.5)
_LENGTH_PRIOR = (0.1, 0.3, 0.5, 0.7, 0.8, 0.85, 0.85, 0.9)  # measured: see docs/methods/suffix
_SCORE_ROWS = (0.0, 0.3, 0.45, 0.6, 0.75, 0.9)


def continuation_score(count: int, total: int) -> float:
    """Score of a continuation seen ``count`` times among ``total`` continuations."""
    return count / (total + 1)


def _score_row(score: float) -> int:
    return bisect_right(_SCORE_ROWS, score) - 1


@attrs.frozen(kw_only=True)
class SuffixOptions(CalibrationOptions):
    """SuffixDrafter's scalar parameters, checked (the one description of them)."""

    budget: int = option(16, integer, 0, help="most draft nodes per step")
    max_depth: int = option(16, integer, 1, help="deepest node considered")
    depth_factor: float | None = option(
        None,
        or_none(number),
        strict=True,
        finite=False,
        help="cap: depth <= depth_factor x match length",
    )
    min_match: int = option(1, integer, 1, help="shortest suffix match used")


_DEFAULT = SuffixOptions()  # the defaults of SuffixDrafter's arguments


class SuffixDrafter(BaseDrafter):
    """Suffix-automaton drafter over the context and a shared corpus.

    Args:
        budget: most nodes sent per step.
        corpus: earlier outputs and documents (default: a private, empty corpus; share
            one :class:`SuffixCorpus` between drafters to pool what they remember).
        max_depth: deepest node considered.
        depth_factor: a match of length ``L`` drafts at most ``ceil(depth_factor * L)``
            tokens deep (``None``: no cap but ``max_depth``).
        min_match: shortest suffix match used.
        prior_strength, decay: the calibration's pseudo-count and per-step forgetting.

    Raises:
        ConfigError: an argument out of range.
    """

    def __init__(
        self,
        budget: int = _DEFAULT.budget,
        *,
        corpus: SuffixCorpus | None = None,
        max_depth: int = _DEFAULT.max_depth,
        depth_factor: float | None = _DEFAULT.depth_factor,
        min_match: int = _DEFAULT.min_match,
        prior_strength: float = _DEFAULT.prior_strength,
        decay: float = _DEFAULT.decay,
    ) -> None:
        self.options = SuffixOptions(
            budget=budget,
            max_depth=max_depth,
            depth_factor=depth_factor,
            min_match=min_match,
            prior_strength=prior_strength,
            decay=decay,
        )
        if corpus is not None and not isinstance(corpus, SuffixCorpus):
            raise ConfigError(f"`corpus` must be a SuffixCorpus or None; got {corpus!r}.")
        self.budget, self.max_depth, self.min_match = budget, max_depth, min_match
        self.depth_factor = None if depth_factor is None else float(depth_factor)
        self.corpus = corpus if corpus is not None else SuffixCorpus()
        prior = torch.tensor(_LENGTH_PRIOR)
        self.calibrations = tuple(
            Calibration(_LENGTH_EDGES, prior, len(_SCORE_ROWS), prior_strength, decay)
            for _ in SOURCES
        )
        self.context = SuffixAutomaton()
        self._tail: int | None = None  # the last indexed token
        self._corpus_match = (0, 0)  # (state, length) in the corpus automaton
        self._corpus_version = -1
        self._last: tuple[DraftTree, torch.Tensor] | None = None
        self.last_values = torch.empty(0, dtype=torch.float64)

    # -- state ------------------------------------------------------------------------

    @property
    def state_bytes(self) -> int:
        """Bytes of the context automaton (the corpus reports its own)."""
        return self.context.memory_bytes()

    def sync(self, tokens: Sequence[int]) -> None:
        """Index the tokens of ``tokens`` not indexed yet (rebuild if it is not an extension
        of what was indexed) and advance the corpus match."""
        done = self.context.num_tokens
        if done > len(tokens) or (done and tokens[done - 1] != self._tail):
            self.context = SuffixAutomaton()
            self._corpus_version = -1
            done = 0
        corpus = self.corpus.automaton
        if self._corpus_version != self.corpus.version:  # the corpus changed: match anew
            self._corpus_match = corpus.match(tokens[:done])
            self._corpus_version = self.corpus.version
        state, matched = self._corpus_match
        for token in tokens[done:]:
            self.context.append(token)
            state, matched = corpus.step(state, matched, token)
        self._corpus_match = (state, matched)
        if tokens:
            self._tail = tokens[-1]

    def remember(self, tokens: Iterable[int]) -> None:
        """Add a document (e.g. a finished answer) to the corpus."""
        self.corpus.add(tokens)

    def reset(self) -> None:
        """Forget the context, the calibration and the corpus (shared: for every user)."""
        self.context = SuffixAutomaton()
        self._tail = None
        self.corpus.clear()
        for calibration in self.calibrations:
            calibration.reset()
        self._last = None

    # -- candidates -------------------------------------------------------------------

    def candidates(self, tokens: Sequence[int], width: int, depth_cap: int) -> Candidates:
        """The continuations of both sources' longest matches, merged, with values.

        Args:
            tokens: the committed context; its last token is the root.
            width: most nodes taken from each source (the best by value).
            depth_cap: deepest node taken.

        Returns:
            Candidates with one cell column per source of :data:`SOURCES`.
        """
        self.sync(tokens)
        out = Candidates.empty(len(SOURCES))
        matches = (
            (self.context, *self.context.repeated_suffix()),
            (self.corpus.automaton, *self._corpus_match),
        )
        for column, (automaton, state, matched) in enumerate(matches):
            if matched >= self.min_match and width > 0:
                found = self._grow(automaton, state, matched, column, width, depth_cap)
                out = fuse(out, found) if out.num_nodes else found
        return out

    def _grow(
        self,
        automaton: SuffixAutomaton,
        state: int,
        matched: int,
        column: int,
        width: int,
        depth_cap: int,
    ) -> Candidates:
        """Best-first walk of the automaton from a match: the ``width`` most valuable nodes."""
        calibration = self.calibrations[column]
        rates = calibration.rates().tolist()
        depth_limit = depth_cap
        if self.depth_factor is not None:
            depth_limit = min(depth_cap, math.ceil(self.depth_factor * matched))
        nxt, occ = automaton.next, automaton.occ
        heap: list[tuple[float, int, int, int, int, int, int]] = []
        order = itertools.count()
        toks: list[int] = []
        parents: list[int] = []
        values: list[float] = []
        depths: list[int] = []
        cells: list[list[int]] = []

        def push_children(node: int, from_state: int, value: float, depth: int) -> None:
            counts = [(occ[s], token, s) for token, s in nxt[from_state].items()]
            total = sum(c[0] for c in counts)
            if len(counts) > width:
                counts = heapq.nlargest(width, counts)
            length = matched + depth  # the string this child is predicted from
            for count, token, s in counts:
                cell = calibration.cell(_score_row(continuation_score(count, total)), length)
                item = (-value * rates[cell], next(order), token, s, node, depth + 1, cell)
                heapq.heappush(heap, item)

        push_children(-1, state, 1.0, 0)
        while heap and len(toks) < width:
            neg_value, _, token, s, parent, depth, cell = heapq.heappop(heap)
            toks.append(token)
            parents.append(parent)
            values.append(-neg_value)
            depths.append(depth)
            cell_row = [-1] * len(SOURCES)
            cell_row[column] = cell
            cells.append(cell_row)
            if depth < depth_limit:
                push_children(len(toks) - 1, s, -neg_value, depth)
        return Candidates.from_lists(toks, parents, values, depths, cells, len(SOURCES))

    def calibrate(self, cells: torch.Tensor, tried: torch.Tensor, hit: torch.Tensor) -> None:
        """Count tries and hits of a verified tree's nodes (cells: int64, Shape: (N, 2))."""
        for column, calibration in enumerate(self.calibrations):
            calibration.update(cells[:, column], tried, hit)

    # -- Drafter protocol -------------------------------------------------------------

    def begin(self, state: DecodeState) -> None:
        """Index the prompt (a new automaton) and match it against the corpus."""
        self.context = SuffixAutomaton()
        self._tail = None
        self._corpus_version = -1
        self._last = None
        self.sync(state.tokens)

    def propose(self, state: DecodeState) -> DraftTree:
        """The ``budget`` most valuable continuation nodes, as a deterministic tree."""
        budget = min(self.budget, state.max_nodes)
        if budget <= 0:
            return DraftTree.empty()
        cands = self.candidates(state.tokens, budget, self.max_depth)
        if cands.num_nodes == 0:
            return DraftTree.empty()
        order = torch.argsort(cands.values, descending=True, stable=True)[:budget]
        tree, kept = subtree(cands, order)
        self.last_values = kept.values
        self._last = (tree, kept.cells)
        return tree

    def observe(self, outcome: StepOutcome) -> None:
        """Index the committed tokens; calibrate on which nodes were accepted."""
        self.sync(outcome.state.tokens)
        if self._last is not None and self._last[0] is outcome.tree:
            tried, hit = tried_and_hit(outcome.tree, outcome.verdict)
            self.calibrate(self._last[1], tried, hit)
        self._last = None

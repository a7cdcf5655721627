"""Prompt lookup: n-gram drafting from the context, as a tree of deterministic candidates.

Prompt lookup decoding (PLD; Saxena 2023, ``apoorvumang/prompt-lookup-decoding``; in
transformers as ``prompt_lookup_num_tokens``, in vLLM as the n-gram speculator) drafts
by copying: find an earlier occurrence of the context's last ``n`` tokens and propose
the tokens that followed it. Those implementations propose one chain from one
occurrence. Here every earlier occurrence found (up to ``max_matches``, most recent
first) contributes its continuation, the continuations are merged into a trie, and the
``max_tokens`` most valuable trie nodes are sent as one tree.

Matching (``n`` from ``max_ngram`` down to ``min_ngram``): occurrences of the last
``max_ngram`` tokens are taken first, then, while fewer than ``max_matches`` were found,
occurrences of shorter suffixes (a position found with a longer suffix is not counted
again). An occurrence found with an ``n``-token suffix has weight ``4 ** (n - max_ngram)``:
longer matches predict better.

Node value (not in the PLD reference, which has no tree): the *share* of a trie node is
the weight of the occurrences whose continuation passes through it over the weight of
all occurrences, and its value is ``acceptance ** depth * share``, an estimate of the
probability that its whole path is accepted when each copied token is right with
probability ``acceptance`` and the occurrences vote on where the text goes. Values
never grow down a path, so the top ``max_tokens`` nodes by value (ties: the node of the
more recent occurrence, then the shallower) form a connected tree; siblings are in
value order. The chain variant (``tree=False``) sends only the continuation of the best
occurrence — the longest match, the most recent one — like transformers, which takes
the *earliest* occurrence instead.

The index is incremental: a dict from each n-gram (``min_ngram <= n <= max_ngram``) to
the positions that follow its occurrences, extended with the newly committed tokens
after every step; a lookup is ``max_ngram - min_ngram + 1`` dict reads.

Shape glossary: N tree nodes, M trie nodes.
"""

from __future__ import annotations

import attrs
import torch

from verispec.core.tree import DraftTree
from verispec.core.types import DecodeState, StepOutcome
from verispec.core.validate import integer, integer_or_auto, interval, option
from verispec.drafters.budget import LatencyTable
from verispec.drafters.candidates import tried_and_hit_lists
from verispec.drafters.gate import DeviceSized
from verispec.errors import ConfigError

__all__ = ["LookupCandidates", "NgramIndex", "PromptLookup", "PromptLookupOptions"]

_AUTO_MOST = 32  # max_tokens="auto": most nodes a step may send
_PRIOR_TRIES = 4.0  # ... pseudo-tries of the acceptance prior (the `acceptance` option)
_DECAY = 0.999  # ... per-step forgetting of the tried / accepted counts


class NgramIndex:
    """Positions that follow each n-gram of a growing token sequence.

    ``positions(key)`` lists, in increasing order, every ``p`` with
    ``tokens[p - n:p] == key`` and ``p < len(tokens)`` (a continuation token exists).
    """

    def __init__(self, min_ngram: int, max_ngram: int) -> None:
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.tokens: list[int] = []
        self._index: dict[tuple[int, ...], list[int]] = {}

    def reset(self) -> None:
        self.tokens = []
        self._index = {}

    def sync(self, tokens: list[int]) -> None:
        """Catch up with ``tokens``; rebuilds when they do not extend what was indexed."""
        old = len(self.tokens)
        if len(tokens) < old or (old and tokens[old - 1] != self.tokens[-1]):
            self.reset()
            old = 0
        if len(tokens) == old:
            return
        self.tokens.extend(tokens[old:])
        seq = self.tokens
        index = self._index
        lo, hi = self.min_ngram, self.max_ngram
        for p in range(max(old, 1), len(seq)):  # positions that just gained a continuation
            for n in range(lo, min(hi, p) + 1):
                key = tuple(seq[p - n : p])
                found = index.get(key)
                if found is None:
                    index[key] = [p]
                else:
                    found.append(p)

    def positions(self, key: tuple[int, ...]) -> list[int]:
        return self._index.get(key, [])


@attrs.frozen(eq=False)
class LookupCandidates:
    """The trie of merged continuations, with each node's vote share.

    Attributes:
        tokens: int64, Shape: (M,). Nodes in insertion order (parents first).
        parents: int64, Shape: (M,). ``-1`` for children of the root.
        depth: int64, Shape: (M,). 1 for children of the root.
        share: float64, Shape: (M,). Weight of the occurrences through the node over the
            weight of all occurrences; never larger than the parent's share.
        rank: int64, Shape: (M,). Rank of the best occurrence through the node
            (0 = longest match, most recent).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depth: torch.Tensor
    share: torch.Tensor
    rank: torch.Tensor

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.numel())


@attrs.frozen
class PromptLookupOptions:
    """PromptLookup's parameters, checked (the one description of them)."""

    max_tokens: int | str = option(
        "auto", integer_or_auto, 1, spec="max",
        help="most draft nodes per step, or auto (latency table and gate)",
    )  # fmt: skip
    min_ngram: int = option(1, integer, 1, help="shortest suffix matched")
    max_ngram: int = option(3, integer, 1, help="longest suffix matched")
    max_matches: int = option(8, integer, 1, help="earlier occurrences merged per step")
    tree: bool = option(True, kind="bool", help="a tree of continuations (false: one chain)")
    acceptance: float = option(
        0.5, interval, 0, 1, help="assumed acceptance (auto: its prior), splits depth/branches"
    )

    def __attrs_post_init__(self) -> None:
        if self.max_ngram < self.min_ngram:
            raise ConfigError(
                f"`max_ngram` must be >= `min_ngram`; got max_ngram={self.max_ngram}, "
                f"min_ngram={self.min_ngram}."
            )


_DEFAULT = PromptLookupOptions()  # the defaults of PromptLookup's arguments


class PromptLookup(DeviceSized):
    """Prompt-lookup drafter that proposes a tree of the context's continuations.

    Args:
        max_tokens: most nodes sent per step (transformers' ``prompt_lookup_num_tokens``),
            or ``"auto"`` (the default): as many of the most valuable nodes (up to 32) as
            the target's latency table pays for, with the per-token acceptance learned
            from the accepted nodes, and no tree while drafting does not pay
            (:mod:`verispec.drafters.gate`); where no node pays, a drafting step sends
            the most valuable one unpaid, so that the acceptance keeps learning.
        min_ngram, max_ngram: suffix lengths matched, longest first (transformers:
            ``max_matching_ngram_size=2``, down to 1).
        max_matches: most earlier occurrences merged per step.
        tree: ``False`` sends one chain (the best occurrence's continuation).
        acceptance: the per-token acceptance assumed by the node value, in (0, 1); it
            only sets how the budget is split between depth and branches (with ``"auto"``:
            the prior of the learned acceptance).
        latency: the target's :class:`~verispec.drafters.budget.LatencyTable` for
            ``"auto"``; by default :class:`verispec.SpeculativeDecoder` binds it.

    Raises:
        ConfigError: an argument out of range.
    """

    def __init__(
        self,
        max_tokens: int | str = _DEFAULT.max_tokens,
        min_ngram: int = _DEFAULT.min_ngram,
        max_ngram: int = _DEFAULT.max_ngram,
        *,
        max_matches: int = _DEFAULT.max_matches,
        tree: bool = _DEFAULT.tree,
        acceptance: float = _DEFAULT.acceptance,
        latency: LatencyTable | None = None,
    ) -> None:
        self.options = PromptLookupOptions(
            max_tokens, min_ngram, max_ngram, max_matches, tree, acceptance
        )
        self.max_tokens, self.min_ngram, self.max_ngram = max_tokens, min_ngram, max_ngram
        self.max_matches = max_matches
        self.tree = bool(tree)
        self.acceptance = float(acceptance)
        self.index = NgramIndex(self.min_ngram, self.max_ngram)
        self._size_by_device(max_tokens == "auto", latency)
        self._tried, self._hits = _PRIOR_TRIES, _PRIOR_TRIES * self.acceptance  # "auto"
        self._last: DraftTree | None = None

    # -- matching ---------------------------------------------------------------------

    def matches(self, tokens: list[int]) -> list[tuple[int, int]]:
        """Earlier occurrences of the context's suffix, best first.

        Returns:
            ``(position, n)`` pairs: the continuation starts at ``tokens[position]`` and the
            occurrence matched the last ``n`` tokens; sorted by ``n`` descending, then most
            recent first; at most ``max_matches`` (one, with ``tree=False``).
        """
        self.index.sync(tokens)
        length = len(tokens)
        limit = self.max_matches if self.tree else 1
        found: list[tuple[int, int]] = []
        seen: set[int] = set()
        for n in range(min(self.max_ngram, length), self.min_ngram - 1, -1):
            positions = self.index.positions(tuple(tokens[length - n :]))
            for p in reversed(positions):
                if p not in seen:
                    seen.add(p)
                    found.append((p, n))
                    if len(found) == limit:
                        return found
        return found

    def candidates(self, tokens: list[int], max_depth: int | None = None) -> LookupCandidates:
        """Merge the continuations of :meth:`matches` into a trie (see the module notes).

        Args:
            tokens: the committed context; its last token is the root.
            max_depth: longest continuation taken (default ``max_tokens``).
        """
        toks, parents, depths, share, ranks = self.candidate_lists(tokens, max_depth)
        return LookupCandidates(
            tokens=torch.tensor(toks, dtype=torch.long),
            parents=torch.tensor(parents, dtype=torch.long),
            depth=torch.tensor(depths, dtype=torch.long),
            share=torch.tensor(share, dtype=torch.float64),
            rank=torch.tensor(ranks, dtype=torch.long),
        )

    def candidate_lists(
        self, tokens: list[int], max_depth: int | None = None
    ) -> tuple[list[int], list[int], list[int], list[float], list[int]]:
        """:meth:`candidates` as Python lists: tokens, parents, depths, shares, ranks."""
        depth_cap = self.most_nodes if max_depth is None else max_depth
        found = self.matches(tokens)
        node_of: dict[tuple[int, int], int] = {}
        toks: list[int] = []
        parents: list[int] = []
        depths: list[int] = []
        weights: list[float] = []
        ranks: list[int] = []
        total = 0.0
        for rank, (p, n) in enumerate(found):
            weight = 4.0 ** (n - self.max_ngram)
            total += weight
            parent = -1
            for d, token in enumerate(tokens[p : p + depth_cap]):
                key = (parent, token)
                node = node_of.get(key)
                if node is None:
                    node = len(toks)
                    node_of[key] = node
                    toks.append(token)
                    parents.append(parent)
                    depths.append(d + 1)
                    weights.append(0.0)
                    ranks.append(rank)
                weights[node] += weight
                parent = node
        share = [w / total for w in weights] if total else []
        return toks, parents, depths, share, ranks

    # -- Drafter protocol -------------------------------------------------------------

    @property
    def most_nodes(self) -> int:
        """Most nodes a step may send: ``max_tokens``, or 32 with ``"auto"``."""
        return _AUTO_MOST if self.max_tokens == "auto" else int(self.max_tokens)

    def begin(self, state: DecodeState) -> None:
        """Index the prompt (a new sequence: the previous index is dropped)."""
        self.index.reset()
        self.index.sync(state.tokens)
        self._last = None
        if self.gate is not None:
            self.gate.reset()

    def propose(self, state: DecodeState) -> DraftTree:
        """The ``max_tokens`` most valuable continuation nodes, as a deterministic tree
        (``"auto"``: as many as pay, or the empty tree while drafting does not pay)."""
        if not self.sized_by_device:
            return self._propose(state)
        self._last = None
        tree = self._gated_propose("PromptLookup(max_tokens='auto')", lambda: self._propose(state))
        self._last = tree if tree.num_nodes else None
        return tree

    def _propose(self, state: DecodeState) -> DraftTree:
        budget = min(self.most_nodes, state.max_nodes)
        if budget <= 0:
            return DraftTree.empty()
        tokens, parents, depth, share, rank = self.candidate_lists(state.tokens)
        if not tokens:
            return DraftTree.empty()
        alpha = self._hits / self._tried if self.sized_by_device else self.acceptance
        if self.tree:
            value = [alpha**d * s for d, s in zip(depth, share, strict=True)]  # never up a path
            best = sorted(range(len(tokens)), key=lambda i: (-value[i], rank[i], depth[i]))
        else:
            best = list(range(len(tokens)))  # one occurrence: a chain
            value = [alpha**d for d in depth]
        best = best[:budget]
        if self.sized_by_device:  # at least one node: the acceptance learns from sent ones
            values = [value[i] for i in best]
            best = best[: self._learning_budget(values, len(state.tokens))]
        # the nodes `best` (a connected set, parents first) as a tree
        new_index = {node: i for i, node in enumerate(best)}
        return DraftTree.from_parents(
            [tokens[i] for i in best], [new_index.get(parents[i], -1) for i in best]
        )

    def observe(self, outcome: StepOutcome) -> None:
        """Index the newly committed tokens (``"auto"``: and learn the acceptance)."""
        self._gated_observe(outcome, lambda: self._learn(outcome))

    def _learn(self, outcome: StepOutcome) -> None:
        self.index.sync(outcome.state.tokens)  # (a skipped sync is caught up by the next)
        if self._last is not None and self._last is outcome.tree:  # learn the acceptance
            tried, hit = tried_and_hit_lists(outcome.tree, outcome.verdict)
            self._tried = _DECAY * self._tried + sum(tried)
            self._hits = _DECAY * self._hits + sum(hit)
        self._last = None

    def reset(self) -> None:
        """Forget the indexed context (and, with ``"auto"``, the learned acceptance)."""
        self.index.reset()
        self._tried, self._hits = _PRIOR_TRIES, _PRIOR_TRIES * self.acceptance
        self._last = None
        if self.gate is not None:
            self.gate.reset()

"""Plumbing shared by the drafters that grow their trees from a draft model.

A draft-model drafter keeps the draft's KV cache in step with the target:

* ``begin`` prefills the draft with the prompt (its last token pending: the root);
* ``propose`` scores the root with ``forward_tree(DraftTree.empty())``, then grows the
  tree with ``forward_tree(tree, extend_from=k)`` so that each call feeds only the new
  nodes (one call per level for the level-wise methods);
* ``observe`` commits the verdict with ``draft.commit(accepted, extra_token)``.

Accepted nodes that the draft never fed (the leaves of the last level: their tokens
were drawn from their parent's distribution, so they were never scored) are fed by one
extra ``forward_tree(..., extend_from=k)`` call in ``observe`` before the commit, so the
draft's last scored tree always contains the accepted path. That call happens only in
steps whose accepted path reaches such a node.

This module also holds the level-wise loop of SpecInfer and RSD-C and the choice of
generator; the draws themselves (processed draft distribution, i.i.d. draws, draws without
replacement, top choices) are in :mod:`verispec.drafters._draws`, re-exported here.

Notation: N tree nodes, V vocabulary, K candidates per row.
"""

from __future__ import annotations

import abc
import array
from typing import ClassVar

import attrs
import torch

from verispec.core.tree import DETERMINISTIC, DraftTree, ProposalLaw
from verispec.core.types import (
    BaseDrafter,
    DecodeState,
    LanguageModel,
    StepOutcome,
    random_seed,
)
from verispec.core.validate import integer, option, or_none
from verispec.drafters._draws import (
    processed_probs,
    race_keys,
    sample_one,
    top_indices,
)
from verispec.errors import ConfigError

__all__ = [
    "DraftModelDrafter",
    "LevelwiseOptions",
    "LevelwiseDrafter",
    "draft_generator",
    "processed_probs",
    "race_keys",
    "sample_one",
]


def branching_factors(name: str, value: object) -> tuple[int, ...]:
    """A non-empty tuple of ints >= 1, or a :class:`ConfigError`."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    if not isinstance(value, tuple | list) or not value:
        raise ConfigError(f"`{name}` must be a non-empty sequence of integers >= 1; got {value!r}.")
    return tuple(integer(f"{name}[{i}]", b, 1) for i, b in enumerate(value))


def draft_generator(state: DecodeState, device: torch.device) -> torch.Generator:
    """The generator for draws on ``device``.

    On the CPU this is ``state.generator`` itself. Elsewhere a generator on ``device``
    is seeded from one draw of ``state.generator``, so every draw still derives from the
    decode's seed alone and no probabilities leave the device.
    """
    if device.type == "cpu":
        return state.generator
    return torch.Generator(device=device).manual_seed(random_seed(state.generator))


class DraftModelDrafter(BaseDrafter):
    """Base class: owns the draft model and its cache; subclasses implement ``propose``.

    Args:
        draft: a :class:`~verispec.core.types.LanguageModel` sharing the target's
            vocabulary (the decoder checks ``draft.vocab_size`` against the target's).
    """

    needs_draft_model: ClassVar[bool] = True
    draft: LanguageModel

    def __init__(self, draft: LanguageModel) -> None:
        for attr in ("prefill", "forward_tree", "commit", "vocab_size"):
            if not hasattr(draft, attr):
                raise ConfigError(
                    f"`draft` must be a LanguageModel (it has no `{attr}`); "
                    f"got {type(draft).__name__}."
                )
        self.draft = draft
        self._scored = 0  # nodes of this step's tree that the draft has fed
        self._tokens: list[int] = []  # this step's tree so far
        self._parents: list[int] = []

    # -- the Drafter protocol ---------------------------------------------------------

    def begin(self, state: DecodeState) -> None:
        self.draft.prefill(torch.tensor(state.tokens, dtype=torch.long))

    def observe(self, outcome: StepOutcome) -> None:
        tree, verdict = outcome.tree, outcome.verdict
        accepted = list(verdict.accepted)
        unfed = [a for a in accepted if a >= self._scored]
        if unfed:
            # feed the accepted nodes the draft never scored (a suffix of the path)
            first = unfed[0]
            remap = {a: self._scored + j for j, a in enumerate(unfed)}
            tokens = self._tokens[: self._scored] + [int(tree.tokens[a]) for a in unfed]
            parents = self._parents[: self._scored] + [
                remap.get(int(tree.parents[a]), int(tree.parents[a])) for a in unfed
            ]
            assert int(tree.parents[first]) < self._scored, "unfed nodes form a path suffix"
            self.draft.forward_tree(
                DraftTree.from_parents(tokens, parents), extend_from=self._scored
            )
            accepted = [remap.get(a, a) for a in accepted]
        self.draft.commit(accepted, verdict.extra_token)
        self._scored = 0
        self._tokens, self._parents = [], []

    # -- helpers for subclasses -------------------------------------------------------

    def node_limit(self, state: DecodeState, budget: int) -> int:
        """The most nodes this step may hold: the budget, the target's and the draft's room."""
        draft_room = int(self.draft.max_length) - int(self.draft.num_committed)
        return max(0, min(budget, state.max_nodes, draft_room))

    def start_levels(
        self, state: DecodeState, budget: int
    ) -> tuple[int, torch.Tensor, torch.Generator] | None:
        """Start a level-by-level step of at most ``budget`` nodes: ``(node limit, the root's
        logits Shape: (1, V), the draft's generator)``, or ``None`` when the step has no
        room for a node."""
        limit = self.node_limit(state, budget)
        if limit == 0:
            return None
        level_logits = self.score_root()[None]  # (1, V)
        return limit, level_logits, draft_generator(state, level_logits.device)

    def score_root(self) -> torch.Tensor:
        """Start the step: feed the draft's pending tokens. Returns the root's logits, (V,)."""
        self._scored = 0
        self._tokens, self._parents = [], []
        return self.draft.forward_tree(DraftTree.empty())[0]

    def masked(self, state: DecodeState, rows: list[int], logits: torch.Tensor) -> torch.Tensor:
        """``logits`` of ``rows`` (0 the root, i + 1 node i; Shape: (R, V)) with the tokens
        the generation's constraint forbids after each row set to -inf (``state.allowed``),
        so no node is spent on them; unchanged without a constraint, and a row with no
        allowed token is left as it is (its node is dead: the target rejects it)."""
        if state.allowed is None:
            return logits
        paths = []
        for row in rows:
            path, node = [], row - 1
            while node >= 0:
                path.append(self._tokens[node])
                node = self._parents[node]
            paths.append(path[::-1])
        allowed = state.allowed(paths).to(logits.device)
        allowed |= ~allowed.any(-1, keepdim=True)
        return logits.masked_fill(~allowed[:, : logits.shape[-1]], float("-inf"))

    def add_nodes(self, tokens: list[int], parents: list[int]) -> None:
        """Append nodes to this step's tree (parents index earlier nodes, -1 the root)."""
        self._tokens.extend(tokens)
        self._parents.extend(parents)

    def score_new_nodes(self) -> torch.Tensor:
        """Feed every node added since the last call. Returns their logits, Shape: (n, V)."""
        # the draft reads tokens and parents only: no laws (from_parents costs 4x more)
        n = len(self._tokens)
        nodes = self._node_tensor()  # (2, n)
        tree = DraftTree(nodes[0], nodes[1], (None,) * (n + 1))
        start = self._scored
        logits = self.draft.forward_tree(tree, extend_from=start)
        self._scored = tree.num_nodes
        return logits[1:] if start == 0 else logits

    def build(self, laws: dict[int, ProposalLaw]) -> DraftTree:
        """This step's tree; ``laws`` maps a row (0 the root, i + 1 node i) to its law.

        Rows without children get ``None`` whatever ``laws`` says.
        """
        parent_rows = {parent + 1 for parent in self._parents}
        rows = [
            laws.get(row) if row in parent_rows else None for row in range(len(self._tokens) + 1)
        ]
        nodes = self._node_tensor()
        return DraftTree(nodes[0], nodes[1], rows)

    def _node_tensor(self) -> torch.Tensor:
        """This step's tokens and parents, int64, Shape: (2, n) (5x cheaper than
        ``torch.tensor`` of the lists on a CPU)."""
        if not self._tokens:
            return torch.empty((2, 0), dtype=torch.int64)
        nodes = array.array("q", self._tokens)
        nodes.extend(self._parents)
        return torch.frombuffer(nodes, dtype=torch.int64).view(2, -1)


@attrs.frozen(kw_only=True)
class LevelwiseOptions:
    """The parameters of the level-by-level drafters (SpecInfer, RSD-C), checked."""

    branching: tuple[int, ...] | int = option(
        (2, 2, 2),
        branching_factors,
        kind="ints",
        help="children per node at each level, e.g. 4.2.2",
    )
    budget: int | None = option(None, or_none(integer), 1, help="cap on the tree size (nodes)")


_LEVELWISE = LevelwiseOptions()  # the defaults of SpecInferTree's and RSDConstant's arguments


class LevelwiseDrafter(DraftModelDrafter, abc.ABC):
    """A tree with constant branching factors, grown one level per draft call.

    The shared loop of SpecInfer (i.i.d. children) and RSD-C (children without
    replacement): the root gets ``b_1`` children and every node of level ``l - 1`` gets
    ``b_l``, drawn by :meth:`draw_children` from the processed draft distribution at the
    node. Nodes are stored level by level; within a level, children of earlier parents
    first, siblings in draw order. At temperature 0 the children are the draft's ``b``
    top choices, in rank order, with the ``DETERMINISTIC`` law. Draft calls per step:
    ``L``, batching each level.

    Args:
        draft: the draft model (same vocabulary as the target).
        branching: children per node at each level, e.g. ``(4, 2, 2)`` (4 + 8 + 16 nodes).
        budget: optional cap on the number of nodes; the tree is cut in level order.
    """

    def __init__(
        self,
        draft: LanguageModel,
        *,
        branching: tuple[int, ...] | int = _LEVELWISE.branching,
        budget: int | None = _LEVELWISE.budget,
    ) -> None:
        super().__init__(draft)
        self.branching = branching_factors("branching", branching)
        self.options = LevelwiseOptions(branching=self.branching, budget=budget)
        full = 0
        width = 1
        for b in self.branching:
            width *= b
            full += width
        self.budget = full if budget is None else min(full, budget)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(branching={self.branching}, budget={self.budget})"

    @abc.abstractmethod
    def draw_children(
        self, probs: torch.Tensor, b: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``b`` children of each row of ``probs`` (float, Shape: (R, V)).

        Returns ``(tokens, valid)``, Shape: (R, b); ``valid`` (or None: all valid) marks
        the draws to keep.
        """

    @abc.abstractmethod
    def children_law(self, probs: torch.Tensor) -> ProposalLaw:
        """The proposal law of children drawn from ``probs`` (Shape: (V,))."""

    def propose(self, state: DecodeState) -> DraftTree:
        started = self.start_levels(state, self.budget)
        if started is None:
            return DraftTree.empty()
        limit, level_logits, generator = started
        sampling = state.sampling
        level_rows = [0]  # rows (0 the root, i + 1 node i) whose children come next
        laws: dict[int, ProposalLaw] = {}
        count = 0
        for depth, b in enumerate(self.branching):
            if depth > 0:
                level_logits = self.score_new_nodes()  # (R, V), R = len(level_rows)
            b_eff = min(b, level_logits.shape[-1])
            next_rows: list[int] = []
            start = 0
            while start < len(level_rows) and count < limit:
                # only the rows the budget lets have children (not in the papers: the
                # others' children would be cut, and their distributions cost a softmax)
                wanted = -(-(limit - count) // b_eff)  # ceil: rows with b children each
                stop = min(len(level_rows), start + wanted)
                logits = self.masked(state, level_rows[start:stop], level_logits[start:stop])
                valid: torch.Tensor | None = None
                if sampling.is_greedy:  # the draft's top choices; no distribution needed
                    probs = logits
                    draws = top_indices(logits, b_eff)  # (R', b)
                    if state.allowed is not None:  # not the tokens the constraint forbids
                        valid = logits.gather(-1, draws) > -torch.inf
                else:
                    probs = processed_probs(logits, sampling)  # (R', V)
                    draws, valid = self.draw_children(probs, b_eff, generator)
                draws_list = draws.tolist()
                valid_list = valid.tolist() if valid is not None else None
                for r, row in enumerate(level_rows[start:stop]):
                    if count >= limit:
                        break
                    children = draws_list[r]
                    if valid_list is not None:
                        children = [t for t, ok in zip(children, valid_list[r], strict=True) if ok]
                    children = children[: limit - count]
                    laws[row] = DETERMINISTIC if sampling.is_greedy else self.children_law(probs[r])
                    self.add_nodes(children, [row - 1] * len(children))
                    next_rows.extend(range(count + 1, count + 1 + len(children)))
                    count += len(children)
                start = stop
            if count >= limit or depth == len(self.branching) - 1:
                break
            level_rows = next_rows
        return self.build(laws)

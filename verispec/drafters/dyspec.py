"""DySpec: dynamic draft trees grown greedily by estimated acceptance.

Xiong et al., "DySpec: Faster Speculative Decoding with Dynamic Token Tree Structure"
(ICLR 2025 submission). A *slot* ``(v, parent, R)`` is a place where the next child of
``parent`` can be drawn from ``R``, the parent's draft distribution with the children
drawn so far removed and renormalised. ``v`` is the paper's estimated acceptance rate of
the node the slot will produce: the product of the draft probabilities of its ancestors
times one minus the draft mass of its earlier siblings (eq. 2 with each token's
acceptance estimated by its draft probability: the chance that verification reaches the
slot). It is known before the token is drawn, so whether a draw is kept never depends on
which token it is. The root's slot is ``(1, root, p_root)``.

**Algorithm 1 (fixed size, ``budget=m``).** Keep a max-heap of slots. Pop the best
slot, draw ``y ~ R``, add node ``y`` under ``parent``, push the *sibling* slot
``(v (1 - R[y]), parent, norm(R with y zeroed))`` and the *child* slot
``(v R[y], y, p_y)``; stop at ``m`` nodes. Popped values never increase, so the tree is
the set of reachable slots with the ``m`` largest values.

**Algorithm 2 (threshold, ``threshold=t``), corrected.** Expand level by level every
slot with ``v > t`` (the paper's loop reads ``v < t``, an erratum). One draft call per
level, batching the level's nodes.

Draws: the successive draws from one parent's residuals are sequential draws without
replacement from its draft distribution ``p``. We take them, in order, from the
Gumbel-top-k order of that parent's row (one batched ``topk`` per draft call), which
has exactly that law; the law of every node's children is ``WithoutReplacement(p)``
in stored order, because nodes are stored in the order they are drawn (a parent's
later children are always drawn after its earlier ones, however the heap interleaves
parents). At temperature 0 the draws are the draft's top choices (in rank order),
slot values use the draft's plain softmax, and the law is ``DETERMINISTIC``.

**Exact order of draft calls in Algorithm 1** (not in the paper, which needs the draft
distribution of a node when it pushes the node's child slot): the child slot is pushed
with its value ``v R[y]`` at once, and the node's distribution is computed lazily, when
that child slot is first popped. If the popped slot's parent has not been fed, every
node added since the last draft call is fed in one ``forward_tree(tree, extend_from=k)``
call (the draft protocol feeds a suffix of the node list), and the draw order of every
newly fed row is computed in one batched ``topk``. So the draft is called at most once
per pop and, in practice, about once per tree level.

**Tree size per device (``budget="auto"``; not in the paper, which fixes ``m``).** With
the target's latency table ``T`` (:mod:`verispec.drafters.budget`) and slot values
``v_1 >= v_2 >= ...`` in pop order, a step of ``n`` nodes is worth ``r(n) = (1 + v_1 +
... + v_n) / T(n)`` expected tokens per second (``v`` is the paper's acceptance
estimate, the objective Algorithm 1 maximises). Algorithm 1 stops, before popping node
``n + 1``, as soon as no continuation can beat stopping: for every ``k`` up to
``max_budget - n``, ``(1 + v_1 + ... + v_n + k v_{n+1}) / T(n + k) <= r(n)``, where
``v_{n+1}`` is the best value in the heap (an upper bound on every later value). The
rule never stops before :func:`~verispec.drafters.budget.choose_budget`'s ``argmax_n
r(n)`` of the sequence it would have grown, and stops exactly there when ``T`` is convex
(``r`` is then quasi-concave). Cutting at that argmax after growing would instead keep
or drop node ``i`` on values drawn *after* it, which depend on its token: at
temperature > 0 the kept draws would no longer follow the declared law. Deciding before
each pop keeps every draw's existence independent of its token, so the verification
stays exact; it also saves the draft calls a grown-then-cut tree would waste.

Optimality (the paper's appendix D): child and sibling slots never have more value than
the slot that made them, so the greedy tree holds the ``m`` largest reachable values and
maximises ``F(T) = sum of v over the nodes`` among all trees of ``m`` nodes.
``proofs_tests/drafters/test_dyspec.py`` checks this by enumeration for the
expected-value (temperature-0) variant. It does *not* maximise the sum of the nodes' own
acceptance estimates ``v R[y]``; the same enumeration finds counterexamples.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

import attrs
import torch

from verispec.core.tree import DETERMINISTIC, DraftTree, ProposalLaw, WithoutReplacement
from verispec.core.types import DecodeState, LanguageModel
from verispec.core.validate import integer, integer_or_auto, interval, option, or_none
from verispec.drafters._draft_model import (
    DraftModelDrafter,
    draft_generator,
    processed_probs,
    race_keys,
)
from verispec.drafters.budget import LatencyBound, LatencyTable
from verispec.errors import ConfigError

__all__ = ["DySpec", "DySpecOptions"]


def _stops_at(n: int, total: float, next_value: float, seconds: list[float]) -> bool:
    """Whether ``budget="auto"`` stops at ``n`` nodes (see the module notes).

    Args:
        n: nodes drawn so far.
        total: the sum of their slot values.
        next_value: the best value left in the heap (no later node is worth more).
        seconds: ``T(0), ..., T(M)``, the target's step time for each size up to the cap.

    Returns:
        True when no ``k`` in ``1..M - n`` has ``(1 + total + k next_value) / T(n + k)``
        above ``(1 + total) / T(n)``.
    """
    rate = (1.0 + total) / seconds[n]
    return all(
        (1.0 + total + k * next_value) / seconds[n + k] <= rate for k in range(1, len(seconds) - n)
    )


_SIZE = 16  # Algorithm 1's m when neither budget nor threshold is given
_THRESHOLD_CAP = 128  # Algorithm 2's cap when no budget is given


@attrs.frozen(kw_only=True)
class DySpecOptions:
    """DySpec's parameters, checked (the one description of them)."""

    budget: int | str | None = option(
        None,
        or_none(integer_or_auto),
        1,
        help=f"tree size m ({_SIZE} when no threshold is given; with one, a cap, "
        f"{_THRESHOLD_CAP} if unset), or auto (latency table)",
    )
    threshold: float | None = option(
        None,
        or_none(interval),
        0,
        1,
        note=" (slot values are probabilities: t >= 1 expands nothing and t <= 0 never stops)",
        help="expand every slot with value > t",
    )
    max_depth: int | None = option(None, or_none(integer), 1, help="cap on the tree depth")
    max_budget: int = option(64, integer, 1, help="most nodes `budget=auto` may grow")

    def __attrs_post_init__(self) -> None:
        if self.budget == "auto" and self.threshold is not None:
            raise ConfigError(
                "`budget='auto'` applies to Algorithm 1 only; got a `threshold` too. "
                "Give an integer `budget` as the threshold variant's cap, or drop `threshold`."
            )

    @property
    def max_nodes(self) -> int:
        """The most nodes a step may hold: ``budget``, ``max_budget`` with ``"auto"``; when
        ``budget`` is unset, 16 (Algorithm 1) or, with a threshold, a cap of 128."""
        if self.budget == "auto":
            return self.max_budget
        if self.budget is not None:
            return int(self.budget)
        return _SIZE if self.threshold is None else _THRESHOLD_CAP


_DEFAULT = DySpecOptions()  # the defaults of DySpec's arguments


class DySpec(DraftModelDrafter, LatencyBound):
    """DySpec draft trees: fixed size (Algorithm 1) or threshold (Algorithm 2, corrected).

    Args:
        draft: the draft model (same vocabulary as the target).
        budget: the tree size ``m`` of Algorithm 1 (default 16); with ``threshold``, a cap
            on the size (default 128 then). ``"auto"``: Algorithm 1 stops where the target's
            latency table says expected tokens per second peak (see the module notes).
        threshold: ``t`` in (0, 1): use Algorithm 2, expanding every slot with ``v > t``.
        max_depth: optional cap on the depth of the tree.
        latency: the *target's* :class:`~verispec.drafters.budget.LatencyTable` for
            ``budget="auto"``; by default :class:`verispec.SpeculativeDecoder` binds it
            (``bind_target``: ``verispec.drafters.budget.latency_for(model)``).
        max_budget: most nodes ``"auto"`` may grow.

    Attributes:
        node_values: after ``propose``, each node's estimated acceptance rate: the value
            ``v`` of the slot it was drawn from (node order; for Algorithm 1 that is pop
            order, and the values never increase).
        next_slot_value: after Algorithm 1, the best value left in the heap (0 if none).
        max_budget: the most nodes a step may hold: ``budget``, or the cap of ``"auto"``.

    Raises:
        ConfigError: an argument out of range, a ``latency`` that is not a latency table,
            or ``"auto"`` with a threshold (Algorithm 2 grows level by level, not in value
            order, so no prefix rule applies); at ``propose``, ``"auto"`` with no latency
            table given or bound.
    """

    def __init__(
        self,
        draft: LanguageModel,
        *,
        budget: int | str | None = _DEFAULT.budget,
        threshold: float | None = _DEFAULT.threshold,
        max_depth: int | None = _DEFAULT.max_depth,
        latency: LatencyTable | None = None,
        max_budget: int = _DEFAULT.max_budget,
    ) -> None:
        super().__init__(draft)
        self.options = DySpecOptions(
            budget=budget, threshold=threshold, max_depth=max_depth, max_budget=max_budget
        )
        self._size_by_device(budget == "auto", latency)
        self.threshold = None if threshold is None else float(threshold)
        self.max_budget = self.options.max_nodes  # the most nodes a step may hold
        self.budget: int | str = "auto" if self.sized_by_device else self.max_budget
        self._seconds: list[float] = []  # T(0..M) for the last cap M and context, with "auto"
        self._seconds_for: tuple[int, int] = (-1, -1)  # (M, context) of _seconds
        self._context = 0  # committed tokens at this step (T grows with it)
        self.max_depth = max_depth
        self.node_values: list[float] = []
        self.next_slot_value = 0.0
        # how a row's draw order is made: Gumbel keys (replaceable in tests)
        self._keys: Callable[[torch.Tensor, torch.Generator], torch.Tensor] = race_keys

    def __repr__(self) -> str:
        if self.sized_by_device:
            return f"DySpec(budget='auto', max_budget={self.max_budget})"
        if self.threshold is None:
            return f"DySpec(budget={self.budget})"
        return f"DySpec(threshold={self.threshold}, budget={self.budget})"

    # -- shared -----------------------------------------------------------------------

    def _start(self, state: DecodeState, limit: int) -> None:
        self._state = state
        self._sampling = state.sampling
        self._limit = limit
        self._orders: dict[int, tuple[list[int], list[float]]] = {}  # row -> draws, their p
        self._laws: dict[int, ProposalLaw] = {}
        self._depth: list[int] = []  # depth of each node
        self.node_values, self.next_slot_value = [], 0.0
        logits = self.score_root()[None]  # (1, V)
        self._generator = draft_generator(state, logits.device)
        self._add_orders([0], logits)

    def _add_orders(self, rows: list[int], logits: torch.Tensor) -> None:
        """Draw orders (without replacement) of ``rows``, whose logits are (len(rows), V)."""
        logits = self.masked(self._state, rows, logits)
        probs = processed_probs(logits, self._sampling)  # (R, V)
        greedy = self._sampling.is_greedy
        k = min(self._limit, probs.shape[-1])
        keys = probs if greedy else self._keys(probs, self._generator)
        top = torch.topk(keys, k, dim=-1)
        draws = top.indices  # (R, K)
        draw_probs = probs.gather(-1, draws)  # (R, K)
        valid = (top.values > -torch.inf) & (draw_probs > 0)
        for r, (row, row_draws, row_probs, row_valid) in enumerate(
            zip(rows, draws.tolist(), draw_probs.tolist(), valid.tolist(), strict=True)
        ):
            n = sum(row_valid)  # valid entries form a prefix (sorted keys)
            self._orders[row] = (row_draws[:n], row_probs[:n])
            self._laws[row] = DETERMINISTIC if greedy else WithoutReplacement(probs[r])

    def _feed_pending_nodes(self) -> None:
        """Feed every node added since the last draft call; compute their draw orders."""
        first = self._scored
        logits = self.score_new_nodes()  # (n, V)
        self._add_orders(list(range(first + 1, first + 1 + logits.shape[0])), logits)

    def _add_node(self, token: int, parent_row: int, value: float) -> int:
        """Append a node; returns its row."""
        depth = 1 if parent_row == 0 else self._depth[parent_row - 1] + 1
        self.add_nodes([token], [parent_row - 1])
        self._depth.append(depth)
        self.node_values.append(value)
        return len(self._depth)

    def _can_have_children(self, row: int) -> bool:
        return self.max_depth is None or self._depth[row - 1] < self.max_depth

    def _finish(self) -> DraftTree:
        return self.build(self._laws)

    # -- the Drafter protocol ---------------------------------------------------------

    def propose(self, state: DecodeState) -> DraftTree:
        limit = self.node_limit(state, self.max_budget)
        self._context = len(state.tokens)
        self.node_values, self.next_slot_value = [], 0.0
        seconds = self._latency_grid(limit)
        if limit == 0 or (seconds and _stops_at(0, 0.0, 1.0, seconds)):
            return DraftTree.empty()  # with "auto": not even the root's slot (v = 1) pays
        self._start(state, limit)
        if self.threshold is None:
            self._grow_fixed_size()
        else:
            self._grow_threshold(self.threshold)
        return self._finish()

    def _grow_fixed_size(self) -> None:
        """Algorithm 1: pop the best slot, draw, push sibling and child slots; m nodes."""
        tie = itertools.count()  # FIFO among equal values
        # heap entries: (-v, tie, parent row, children drawn so far, parent's value w,
        # residual mass 1 - (mass of earlier siblings)); v = w * residual mass
        heap: list[tuple[float, int, int, int, float, float]] = [(-1.0, next(tie), 0, 0, 1.0, 1.0)]
        seconds = self._latency_grid(self._limit)
        count, total = 0, 0.0
        while heap and count < self._limit:
            if seconds and _stops_at(count, total, -heap[0][0], seconds):
                break  # budget="auto": decided before the draw, see the module notes
            neg_v, _, row, drawn, w, mass_left = heapq.heappop(heap)
            v = -neg_v
            if row not in self._orders:
                self._feed_pending_nodes()
            draws, probs = self._orders[row]
            if drawn >= len(draws):
                continue  # the residual has no mass left: the slot's value is 0
            token, p = draws[drawn], probs[drawn]
            child_value = w * p  # = v * R[y]
            new_row = self._add_node(token, row, v)
            count += 1
            total += v
            mass_left = max(mass_left - p, 0.0)
            sibling_value = w * mass_left  # = v * (1 - R[y])
            if sibling_value > 0 and drawn + 1 < len(draws):
                entry = (-sibling_value, next(tie), row, drawn + 1, w, mass_left)
                heapq.heappush(heap, entry)
            if child_value > 0 and self._can_have_children(new_row):
                heapq.heappush(heap, (-child_value, next(tie), new_row, 0, child_value, 1.0))
        self.next_slot_value = -heap[0][0] if heap else 0.0

    def _latency_grid(self, limit: int) -> list[float]:
        """``T(0), ..., T(limit)`` at this step's context; empty without ``"auto"``.

        Read again when the context has grown by 64 tokens (attention's share grows with it).
        """
        if not self.sized_by_device:
            return []
        wanted = (limit, self._context // 64)
        if self._seconds_for != wanted:
            table = self._latency_table("DySpec(budget='auto')")
            times = table.at(torch.arange(limit + 1), context=64 * wanted[1])
            self._seconds, self._seconds_for = times.tolist(), wanted
        return self._seconds

    def _grow_threshold(self, threshold: float) -> None:
        """Algorithm 2 (corrected): per level, expand every slot with ``v > t``."""
        level = [(0, 1.0)]  # (row, w): rows whose children are drawn at this level
        count = 0
        while level and count < self._limit:
            if any(row not in self._orders for row, _ in level):
                self._feed_pending_nodes()  # one draft call for the whole level
            next_level: list[tuple[int, float]] = []
            for row, w in level:
                draws, probs = self._orders[row]
                v, drawn, mass_left = w, 0, 1.0
                while v > threshold and drawn < len(draws) and count < self._limit:
                    token, p = draws[drawn], probs[drawn]
                    child_value = w * p
                    new_row = self._add_node(token, row, v)
                    count += 1
                    if child_value > threshold and self._can_have_children(new_row):
                        next_level.append((new_row, child_value))
                    drawn += 1
                    mass_left = max(mass_left - p, 0.0)
                    v = w * mass_left
            level = next_level

"""Drafting only while it pays: each drafted step's speed against plain decoding's.

A step that sends ``n`` nodes costs the target ``T(n)`` (the latency table,
:mod:`verispec.drafters.budget`) and the drafter ``D``, its own time proposing and
learning, and commits ``1 + a`` tokens when ``a`` nodes are accepted. Plain decoding
commits one token for ``T(0)``. So the step's *gain* over plain decoding is

    g = (1 + a) * T(0) / (T(n) + D),

measured, not predicted: the accepted count is the verifier's, ``D`` the drafter's clock,
``T(n)`` the step's own seconds (from the end of ``propose`` to the start of ``observe``:
forward, verification, commit) and ``T(0)`` a running mean of the plain steps measured the
same way (the table's values until there are some), so both see the same machine load.
:class:`DraftGate` keeps a running mean of ``g`` over drafted steps. While the mean is
below 1 the drafter sits out a stretch of steps, proposing the empty tree (each is then a
plain decoding step: ``T(0)`` and no drafting), and the stretch doubles after every losing
probe, up to ``max_skip`` steps; a probe that brings the mean back to 1 or above ends the
backing off, unless the drafter sent the probe only to keep learning
(:meth:`DraftGate.unpaid`). On text where drafting fails (random tokens, shuffled words) a
drafter is then within a probe every ``max_skip`` steps of plain decoding; on text where it
pays it drafts every step. While backing off, the drafter does not learn (Token Recycling's rows,
for instance) from the plain steps (:meth:`DraftGate.learning`).

The gate also keeps the drafter's own seconds on the steps that sent nodes
(:meth:`DraftGate.overhead`, a median of the latest ones), which the budget rule adds to
``T(n)`` (:func:`~verispec.drafters.budget.choose_budget`): the rule then sends only what
the gain will count as paid.

What is proposed never changes what is generated (the verifier keeps the output exact),
only how fast.

Not in the Token Recycling, DySpec or prompt-lookup papers: verispec's rule for its
device-sized defaults (docs/methods/dynamic_token_recycling.rst, "Budget").
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable

from verispec.core.tree import DraftTree
from verispec.core.types import StepOutcome
from verispec.drafters.budget import LatencyBound, LatencyTable, choose_budget
from verispec.errors import ConfigError

__all__ = ["DeviceSized", "DraftGate"]

OVERHEAD_STEPS = 15
"""The drafter's own seconds on a step that sends nodes (:meth:`DraftGate.overhead`) are
the median of this many latest such steps: a stall in one of them moves it little."""

UNPAID_SKIPS = 4
"""After unpaid probes (:meth:`DraftGate.unpaid`) the stretch of plain steps may grow to this
many times ``max_skip``: such a probe is sent only to learn, at a loss the drafter's own
valuation predicts."""


class DraftGate:
    """Whether to draft this step, from the measured gain of the drafted steps before it.

    Args:
        latency: the target's latency table (``T(n)`` at the step's context).
        max_skip: the longest stretch of plain steps between two probes.
        smoothing: weight of the newest step in the running mean of the gain, in (0, 1].
        clock: seconds, for the drafter's own time (``time.perf_counter``; tests pass a
            fake one).

    Use: call :meth:`drafting` at the start of ``propose`` (``False``: propose the empty
    tree), bracket the drafter's work with :meth:`clock_in` / :meth:`clock_out`, and call
    :meth:`record` at the end of ``observe`` with the step's tree size and accepted count.
    """

    def __init__(
        self,
        latency: LatencyTable,
        *,
        max_skip: int = 16,
        smoothing: float = 0.3,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if max_skip < 0:
            raise ConfigError(f"`max_skip` must be >= 0; got {max_skip}.")
        if not 0.0 < smoothing <= 1.0:
            raise ConfigError(f"`smoothing` must be in (0, 1]; got {smoothing}.")
        self.latency = latency
        self.max_skip = max_skip
        self.smoothing = smoothing
        self.clock = clock
        self.gain: float | None = None  # running mean of g over drafted steps
        self.plain_s: float | None = None  # running mean of the measured plain steps
        self.skip = 0  # length of the current stretch of plain steps
        self._left = 0  # plain steps left in it
        self._spent = 0.0  # the drafter's seconds in this step
        self._since: float | None = None
        self._out: float | None = None  # when the drafter last handed over (propose's end)
        self._step_s: float | None = None  # the step's own seconds, measured
        self._drafted = False  # whether this step drafted (record counts it)
        self._unpaid = False  # whether it sent only what its valuation does not pay for
        self._overheads: deque[float] = deque(maxlen=OVERHEAD_STEPS)  # drafter's s, sent
        self._overhead = 0.0  # their median (overhead()), kept as they change

    def reset(self) -> None:
        """Forget the measured gain and the backing off: the next step drafts, and the gain
        is measured afresh (a new sequence, for a drafter whose trees depend on it)."""
        self.gain, self.skip = None, 0
        self._overheads.clear()
        self._overhead = 0.0
        self.restart()

    def restart(self) -> None:
        """A new sequence, the mean gain and the backing off carried over (for a drafter
        whose valuation does not depend on the prompt, as Token Recycling's slot rates do
        not): its first step drafts, a probe of the new text, and if that loses the drafter
        sits out as long as it last did, instead of probing again after 1, 2, 4 and 8
        plain steps. The plain step's seconds are measured again (the context starts
        short)."""
        self.plain_s, self._left = None, 0
        self._spent, self._since, self._out, self._step_s = 0.0, None, None, None
        self._drafted = self._unpaid = False

    def unpaid(self) -> None:
        """This step sends nodes the drafter's own valuation says do not pay, only so that
        it keeps learning (Token Recycling's one node when its budget rule chose none, so
        that its slot rates can rise again): whatever the step gains, it does not end the
        backing off, and the stretches between such probes double up to
        :data:`UNPAID_SKIPS` times ``max_skip``. A step a valuation pays for still ends
        it; a lucky run of unpaid ones would otherwise restart drafting every step on text
        where it loses."""
        self._unpaid = True

    def overhead(self) -> float:
        """The drafter's own seconds (proposing and learning) on a step that sends nodes:
        the median over the latest :data:`OVERHEAD_STEPS` such steps, 0 before the first.
        A plain decoding step does not pay it, so the budget rule adds it to ``T(n)`` for
        every ``n >`` 0 (:func:`~verispec.drafters.budget.choose_budget`), as the gain does;
        a rule that left it out would send nodes that the gain then measures as a loss."""
        return self._overhead

    def drafting(self) -> bool:
        """Whether this step drafts (call once, at the start of ``propose``)."""
        self._spent, self._since, self._step_s = 0.0, None, None
        self._drafted, self._unpaid = self._left == 0, False
        if not self._drafted:
            self._left -= 1
            self._out = self.clock()  # the plain step starts now: observe measures it
        return self._drafted

    def learning(self) -> bool:
        """Whether the drafter should learn from this step: the drafted steps only.
        Learning from a step's logits costs a noticeable part of a plain CPU step
        (docs/benchmarks.rst); while backing off, that is paid for nothing the next probe needs
        (its root's row was written when that token was last scored; a prompt-lookup index
        catches up when it is next read)."""
        return self._drafted

    def clock_in(self) -> None:
        """The drafter starts working (``propose``, then ``observe``); the first call after
        ``propose`` handed over also measures the step itself (forward, verification,
        commit)."""
        self._since = self.clock()
        if self._out is not None:
            self._step_s, self._out = self._since - self._out, None

    def clock_out(self) -> None:
        if self._since is not None:
            self._out = self.clock()
            self._spent += self._out - self._since
            self._since = None

    def step_gain(self, nodes: int, accepted: int, context: int) -> float:
        """``g`` of a step that sent ``nodes`` and had ``accepted`` accepted, with the
        drafter's time so far in this step. The step's and the plain step's seconds are the
        measured ones where known (the same machine load for both), else the table's."""
        times = self.latency.upto_list(nodes, context)
        step = self._step_s if self._step_s is not None else float(times[nodes])
        if nodes == 0:  # a plain step that paid for drafting: a loss by construction
            return step / (step + self._spent)
        plain = self.plain_s if self.plain_s is not None else float(times[0])
        return (1 + accepted) * plain / (step + self._spent)

    def record(self, nodes: int, accepted: int, context: int) -> None:
        """After a step: update the mean gain (drafted steps) or the plain step's measured
        seconds (the others), and the backing off."""
        self.clock_out()
        self._out = None
        if nodes == 0 and self._step_s is not None:  # a plain step, measured
            # a running mean of plain steps, each sample at most twice the mean so far (a
            # one-off stall must not make every drafted step look like a gain)
            sample = self._step_s if self.plain_s is None else min(self._step_s, 2 * self.plain_s)
            self.plain_s = (
                sample
                if self.plain_s is None
                else self.plain_s + self.smoothing * (sample - self.plain_s)
            )
        if not self._drafted:
            return
        if nodes:  # the median is taken here, once, not at every budget the drafter asks
            self._overheads.append(self._spent)
            self._overhead = statistics.median(self._overheads)
        g = self.step_gain(nodes, accepted, context)
        self.gain = g if self.gain is None else self.gain + self.smoothing * (g - self.gain)
        if self.gain >= 1.0 and not self._unpaid:
            self.skip = 0
        else:  # a losing probe: sit out twice as long (at least one step) before the next;
            # an unpaid one only explores, and may space the probes out four times as far
            cap = UNPAID_SKIPS * self.max_skip if self._unpaid else self.max_skip
            self.skip = min(cap, max(1, 2 * self.skip))
            self._left = self.skip


class DeviceSized(LatencyBound):
    """What a drafter sized by the device (``"auto"``) holds: the target's latency table
    (:class:`~verispec.drafters.budget.LatencyBound`: given at construction or bound by
    ``bind_target``) and a :class:`DraftGate` on it."""

    gate: DraftGate | None = None

    def _size_by_device(self, auto: bool, latency: LatencyTable | None) -> None:
        self.gate = None
        super()._size_by_device(auto, latency)

    @property
    def latency(self) -> LatencyTable | None:
        """The target's latency table (``None``: not given or bound yet); setting it
        makes or updates the gate."""
        return self._latency

    @latency.setter
    def latency(self, table: LatencyTable | None) -> None:
        self._latency = table
        if table is None or not self.sized_by_device:
            self.gate = None
        elif self.gate is None:
            self.gate = DraftGate(table)
        else:
            self.gate.latency = table

    def _budget(self, values: list[float], context: int) -> int:
        """How many of the nodes valued ``values`` (largest first) to send after
        ``context`` committed tokens: :func:`~verispec.drafters.budget.choose_budget` on
        the latency table, with the drafter's own seconds per drafted step
        (:meth:`DraftGate.overhead`)."""
        gate = self._gate("this drafter")
        return choose_budget(values, gate.latency, context=context, overhead=gate.overhead())

    def _learning_budget(self, values: list[float], context: int) -> int:
        """:meth:`_budget`, but at least one node when there is one: a drafter whose
        valuation learns only from the nodes it sends (Token Recycling's slot rates, prompt
        lookup's acceptance) would otherwise keep a rate once below what pays there for
        good. Such a node is sent unpaid (:meth:`DraftGate.unpaid`): it never ends the
        gate's backing off."""
        n = self._budget(values, context)
        if n == 0 and values:
            self._gate("this drafter").unpaid()
            n = 1
        return n

    def _gated_propose(self, what: str, make: Callable[[], DraftTree]) -> DraftTree:
        """``propose`` of a drafter sized by the device: the empty tree while the gate backs
        off, else ``make()``, its time counted as the drafter's."""
        gate = self._gate(what)
        if not gate.drafting():
            return DraftTree.empty()
        gate.clock_in()
        tree = make()
        gate.clock_out()
        return tree

    def _gated_observe(self, outcome: StepOutcome, learn: Callable[[], None]) -> None:
        """``observe``: ``learn()`` (every step without a gate; with one, on the steps
        :meth:`DraftGate.learning` names, its time counted), then the gate's record."""
        gate = self.gate
        if gate is None:
            learn()
            return
        gate.clock_in()
        if gate.learning():
            learn()
        verdict = outcome.verdict
        gate.record(outcome.tree.num_nodes, len(verdict.accepted), len(outcome.state.tokens))

    def _gate(self, what: str) -> DraftGate:
        """The gate; a clear error where no latency table was given or bound."""
        if self.gate is None:
            self._latency_table(what)  # raises where no table was given or bound
            raise ConfigError(f"{what} is not sized by the device: it has no draft gate.")
        return self.gate

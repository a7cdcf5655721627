"""Tests of verispec/drafters/gate.py and of the drafters sized by the device.

``tr``, ``pld`` and ``dtr`` draft, by default, as many nodes as the target's latency table
pays for, and stop drafting while it does not pay (issue 25: no default slower than plain
decoding). Their speed is measured by the benchmark; here: the gain's formula, the backing
off, the sizing rule at its extremes (a flat table keeps every valued node, a steep one
none), the slots' learned rates, the decoder binding the table, and exactness.
"""

from __future__ import annotations

import pytest
import torch

from verispec import SpeculativeDecoder
from verispec.core import DecodeState, GenerationParams, SamplingParams, StepOutcome
from verispec.core.types import Verdict
from verispec.drafters import Autoregressive, PromptLookup, TokenRecycling
from verispec.drafters.budget import LatencyTable
from verispec.drafters.dynamic_token_recycling import DynamicTokenRecycling
from verispec.drafters.gate import OVERHEAD_STEPS, UNPAID_SKIPS, DraftGate
from verispec.errors import ConfigError
from verispec.verifiers import Greedy

FLAT = LatencyTable([0, 100], [1.0, 1.0])  # every tree costs one plain step: all pay
STEEP = LatencyTable([0, 1, 100], [1.0, 10.0, 1000.0])  # one node costs ten steps: none pays


class FakeClock:
    """Seconds that move only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _state(tokens: list[int]) -> DecodeState:
    return DecodeState(
        tokens=list(tokens),
        prompt_length=1,
        sampling=SamplingParams(),
        generator=torch.Generator().manual_seed(0),
    )


def _step(gate: DraftGate, clock: FakeClock, *, nodes: int, accepted: int, spent: float) -> bool:
    """One engine step as a drafter runs it: ask, draft for ``spent`` seconds, record."""
    drafted = gate.drafting()
    if drafted:
        gate.clock_in()
        clock.now += spent
        gate.clock_out()
    gate.record(nodes if drafted else 0, accepted if drafted else 0, context=10)
    return drafted


# -- the gate --------------------------------------------------------------------------


def test_the_gain_is_tokens_per_second_over_plain_decodings() -> None:
    """g = (1 + accepted) T(0) / (T(n) + the drafter's seconds), at the step's context."""
    table = LatencyTable([0, 4], [0.010, 0.030])
    clock = FakeClock()
    gate = DraftGate(table, clock=clock)
    assert gate.drafting()
    gate.clock_in()
    clock.now += 0.002
    gate.clock_out()
    # T(2) = 0.020 by interpolation
    assert gate.step_gain(2, 1, context=5) == pytest.approx(2 * 0.010 / (0.020 + 0.002))
    gate.record(2, 1, context=5)
    assert gate.gain == pytest.approx(2 * 0.010 / 0.022)


def test_the_gain_uses_the_measured_step_and_plain_step_seconds() -> None:
    """The step's own seconds (from propose's end to observe's start) replace T(n), and
    the plain steps measured the same way replace T(0), once there are some."""
    table = LatencyTable([0, 4], [0.010, 0.030])
    clock = FakeClock()
    gate = DraftGate(table, smoothing=1.0, clock=clock)

    def step(spent: float, seconds: float, nodes: int, accepted: int) -> bool:
        drafted = gate.drafting()
        if drafted:
            gate.clock_in()
            clock.now += spent
            gate.clock_out()
        clock.now += seconds  # the target's forward, verification, commit
        gate.clock_in()  # observe starts
        gate.clock_out()
        gate.record(nodes, accepted, context=5)
        return drafted

    assert step(0.001, 0.050, nodes=4, accepted=0)  # measured 50 ms, not the table's 30
    assert gate.gain == pytest.approx(0.010 / 0.051)
    assert not step(0.0, 0.020, nodes=0, accepted=0)  # backing off: a plain step, 20 ms
    assert gate.plain_s == pytest.approx(0.020)
    assert step(0.001, 0.030, nodes=4, accepted=2)  # the probe
    assert gate.gain == pytest.approx(3 * 0.020 / 0.031)


def test_the_overhead_is_the_median_drafters_seconds_of_steps_that_sent_nodes() -> None:
    """The drafter's seconds on steps that sent nodes, median of the last OVERHEAD_STEPS (a
    stall in one moves it little); steps that sent none do not count; reset forgets it."""
    clock = FakeClock()
    gate = DraftGate(FLAT, clock=clock)
    assert gate.overhead() == 0.0
    for spent in (0.001, 0.002, 0.5, 0.003):  # one stalled step
        _step(gate, clock, nodes=2, accepted=2, spent=spent)
    _step(gate, clock, nodes=0, accepted=0, spent=0.9)  # sent nothing: not an overhead
    assert gate.overhead() == pytest.approx(0.0025)
    for _ in range(OVERHEAD_STEPS):
        _step(gate, clock, nodes=1, accepted=1, spent=0.004)
    assert gate.overhead() == pytest.approx(0.004)  # only the latest steps
    gate.reset()
    assert gate.overhead() == 0.0


def test_a_drafter_sized_by_the_device_charges_its_overhead_to_its_budget() -> None:
    """tr with template="auto" keeps the valued nodes the table pays for with its measured
    overhead added: on T = 10 / 12 / 14 ms its first node (prior rate 0.4) pays alone
    (1.4 / 12 > 1 / 10) and not at an overhead of 4 ms (1.4 / 16 < 1 / 10)."""
    table = LatencyTable([0, 1, 2, 100], [0.010, 0.012, 0.014, 0.210])
    drafter = TokenRecycling(template="auto", latency=table)
    values = [0.4]
    assert drafter._budget(values, context=10) == 1
    gate = drafter.gate
    assert gate is not None
    clock = FakeClock()
    gate.clock = clock
    for _ in range(3):  # steps that sent a node, the drafter working 4 ms in each
        assert _step(gate, clock, nodes=1, accepted=1, spent=0.004)
    assert gate.overhead() == pytest.approx(0.004)
    assert drafter._budget(values, context=10) == 0


def test_losing_steps_back_off_doubling_and_a_winning_probe_ends_it() -> None:
    """While the mean gain is below 1, drafting stops for 1, 2, 4, ... steps (at most
    max_skip) between probes; a probe that lifts the mean to 1 drafts every step again."""
    clock = FakeClock()
    gate = DraftGate(STEEP, max_skip=4, smoothing=1.0, clock=clock)
    pattern = [_step(gate, clock, nodes=1, accepted=0, spent=0.0) for _ in range(16)]
    # drafted, skip 1, drafted, skip 2, drafted, skip 4, drafted, skip 4 (the cap), ...
    assert pattern == [True, False, True, False, False, True] + [False] * 4 + [True] + [
        False
    ] * 4 + [True]
    gate.latency = FLAT  # drafting now pays: the next probe ends the backing off
    while not _step(gate, clock, nodes=3, accepted=2, spent=0.0):
        pass
    assert gate.skip == 0
    assert all(_step(gate, clock, nodes=3, accepted=2, spent=0.0) for _ in range(5))


def test_drafting_that_never_pays_costs_a_probe_every_max_skip_steps() -> None:
    """On text where nothing is accepted, a drafter ends up plain decoding: over 200 steps
    it drafts only at the probes (the first few, then one every ``max_skip + 1`` steps)."""
    clock = FakeClock()
    gate = DraftGate(FLAT, max_skip=16, clock=clock)
    # flat T, but the drafter's own time makes a zero-acceptance step lose
    drafted = sum(_step(gate, clock, nodes=4, accepted=0, spent=0.5) for _ in range(200))
    assert drafted <= 5 + 200 // 17


def test_an_unpaid_probe_never_ends_the_backing_off() -> None:
    """Probes the drafter marks unpaid (sent only to keep learning) do not end the backing
    off even when every one wins, and the stretches between them double up to
    UNPAID_SKIPS x max_skip; the same winning probes, paid for, end it at once."""
    clock = FakeClock()
    gate = DraftGate(FLAT, max_skip=4, smoothing=1.0, clock=clock)

    def probe(unpaid: bool) -> bool:
        drafted = gate.drafting()
        if drafted and unpaid:
            gate.unpaid()
        gate.record(1 if drafted else 0, 1 if drafted else 0, context=10)
        return drafted

    gate.skip = gate._left = 4  # backing off
    gate.gain = 0.5
    # every probe wins (gain 2), and the stretches still double from 4 up to the cap
    cap, stretches = UNPAID_SKIPS * 4, [4]
    while stretches[-1] < cap:
        stretches.append(min(cap, 2 * stretches[-1]))
    stretches.append(cap)  # and stay there
    expected = [step for n in stretches for step in [False] * n + [True]]
    pattern = [probe(unpaid=True) for _ in expected]
    assert len(stretches) >= 3 and pattern == expected
    assert gate.gain is not None and gate.gain >= 1 and gate.skip == cap
    while not probe(unpaid=False):
        pass
    assert gate.skip == 0 and all(probe(unpaid=False) for _ in range(5))


def test_restart_keeps_the_backing_off_and_probes_first() -> None:
    """restart (a new sequence for Token Recycling): the first step drafts; if it loses,
    the drafter sits out max_skip steps at once, where after reset the doubling starts
    again from one step. The plain step's measured seconds are forgotten by both."""
    clock = FakeClock()
    gate = DraftGate(STEEP, max_skip=4, smoothing=1.0, clock=clock)
    for _ in range(12):
        _step(gate, clock, nodes=1, accepted=0, spent=0.0)
    assert gate.skip == 4
    gate.plain_s = 0.5
    gate.restart()
    assert gate.plain_s is None and gate.skip == 4 and gate.gain is not None
    pattern = [_step(gate, clock, nodes=1, accepted=0, spent=0.0) for _ in range(6)]
    assert pattern == [True] + [False] * 4 + [True]
    gate.plain_s = 0.5
    gate.reset()
    assert gate.plain_s is None and gate.gain is None and gate.skip == 0
    pattern = [_step(gate, clock, nodes=1, accepted=0, spent=0.0) for _ in range(6)]
    assert pattern == [True, False, True, False, False, True]


def test_reset_forgets_the_gain_and_the_backing_off() -> None:
    clock = FakeClock()
    gate = DraftGate(STEEP, clock=clock)
    _step(gate, clock, nodes=1, accepted=0, spent=0.0)
    assert gate.gain is not None and not gate.drafting()
    gate.reset()
    assert gate.gain is None and gate.skip == 0 and gate.drafting()


@pytest.mark.parametrize(
    ("kwargs", "match"), [({"max_skip": -1}, "max_skip"), ({"smoothing": 0.0}, "smoothing")]
)
def test_bad_gate_arguments_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        DraftGate(FLAT, **kwargs)


# -- Token Recycling, template="auto" ------------------------------------------------


def _recycling(latency: LatencyTable | None, vocab: int = 12, **kw) -> TokenRecycling:
    drafter = TokenRecycling(vocab_size=vocab, latency=latency, **kw)
    assert drafter.adjacency is not None
    generator = torch.Generator().manual_seed(1)
    for row in range(vocab):  # every row known: distinct ids
        drafter.adjacency[row] = torch.randperm(vocab, generator=generator)[:8].int()
    return drafter


def test_auto_with_a_flat_table_keeps_the_whole_template() -> None:
    """Where every tree costs one step, every node has positive value and pays: the tree is
    the published 80-node template's, as ``template="2.2.2"`` expands it."""
    auto = _recycling(FLAT)
    published = _recycling(None, template="2.2.2")
    a, b = auto.propose(_state([3])), published.propose(_state([3]))
    assert a.num_nodes == 80
    assert a.tokens.tolist() == b.tokens.tolist() and a.parents.tolist() == b.parents.tolist()


def test_auto_with_a_steep_table_probes_with_one_node_then_backs_off() -> None:
    """Where no node pays, a drafting step still sends the most valuable node (so the
    slots' rates can learn), and the gate then backs off: plain steps until the next probe."""
    drafter = _recycling(STEEP)
    clock = FakeClock()
    assert drafter.gate is not None
    drafter.gate.clock = clock
    tree = drafter.propose(_state([3]))
    assert tree.num_nodes == 1 and tree.parents.tolist() == [-1]
    clock.now += 10.0  # the step costs T(1) = 10 plain steps; nothing is accepted
    logits = torch.zeros(2, 12)
    drafter.observe(StepOutcome(tree, logits, Verdict((), 5), _state([3, 5])))
    assert drafter.propose(_state([3, 5])).num_nodes == 0  # backing off


def test_auto_marks_its_forced_node_unpaid_and_carries_the_gate_to_the_next_prompt() -> None:
    """Where no node pays, the node a drafting step still sends is unpaid: even accepted,
    it does not end the backing off. A new prompt (begin) keeps the gate's backing off:
    its first step probes, and the steps after a losing probe are plain."""
    drafter = _recycling(STEEP)
    clock = FakeClock()
    gate = drafter.gate
    assert gate is not None
    gate.clock = clock
    gate.skip = gate._left = 0
    tree = drafter.propose(_state([3]))
    assert tree.num_nodes == 1 and gate._unpaid
    # T(1) = 10 plain steps, but the step measured at one: the accepted node wins (gain 2)
    gate.plain_s = 1.0
    clock.now += 1.0
    accepted = int(tree.tokens[0])
    logits = torch.zeros(2, 12)
    logits[0, accepted] = 1.0
    drafter.observe(StepOutcome(tree, logits, Verdict((0,), 7), _state([3, accepted, 7])))
    assert gate.gain is not None and gate.gain > 1 and gate.skip == 1  # still backing off
    assert drafter.propose(_state([3, accepted, 7])).num_nodes == 0
    skip = gate.skip
    drafter.begin(_state([4]))
    assert gate.skip == skip and gate.gain is not None
    assert drafter.propose(_state([4])).num_nodes == 1  # the new prompt's probe


def test_auto_keeps_the_most_valuable_nodes_as_a_connected_tree() -> None:
    """With a table where a few nodes pay, the tree is the nodes of highest value (the
    product of their slots' rates down the path), every parent kept."""
    table = LatencyTable([0, 1, 2, 3, 4, 80], [1.0, 1.05, 1.2, 1.5, 2.0, 50.0])
    drafter = _recycling(table)
    tree = drafter.propose(_state([3]))
    assert 1 <= tree.num_nodes < 80
    assert all(p < i for i, p in enumerate(tree.parents.tolist()))  # parents first
    slots = drafter._last[1]  # type: ignore[index]
    assert slots[0] == 0  # the most valuable node: the root's first candidate


def test_auto_learns_the_slots_acceptance_rates() -> None:
    """After a step whose slot-0 child was accepted and slot-1 child was not, slot 0's rate
    rises and slot 1's falls."""
    drafter = _recycling(FLAT)
    before = (drafter._slot_hits / drafter._slot_tried).clone()
    tree = drafter.propose(_state([3]))
    first_two = tree.parents.tolist()[:2]
    assert first_two == [-1, -1]  # slots 0 and 1 of the root
    logits = torch.zeros(tree.num_nodes + 1, 12)
    drafter.observe(StepOutcome(tree, logits, Verdict((0,), 5), _state([3, tree.tokens[0], 5])))
    after = drafter._slot_hits / drafter._slot_tried
    assert after[0] > before[0] and after[1] < before[1]


def test_auto_without_a_table_is_refused_when_it_drafts() -> None:
    drafter = TokenRecycling(vocab_size=12)
    with pytest.raises(ConfigError, match="latency table"):
        drafter.propose(_state([3]))


def test_the_80_alias_is_the_published_template() -> None:
    assert TokenRecycling("80").template.paths == TokenRecycling("2.2.2").template.paths


# -- prompt lookup, max_tokens="auto" -------------------------------------------------


def test_lookup_auto_sends_all_valued_nodes_on_a_flat_table_and_one_unpaid_on_a_steep_one() -> None:
    """On a flat table every valued node pays; on a steep one none does, and the drafting
    step sends the most valuable node unpaid, so that the acceptance it learns from sent
    nodes can rise again (it did not, and stayed below what pays, on chat prompts)."""
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
    flat, steep = PromptLookup(latency=FLAT), PromptLookup(latency=STEEP)
    fixed = PromptLookup(max_tokens=32)
    for drafter in (flat, steep, fixed):
        drafter.begin(_state(tokens))
    assert (
        flat.propose(_state(tokens)).tokens.tolist()
        == fixed.propose(_state(tokens)).tokens.tolist()
    )
    assert flat.propose(_state(tokens)).num_nodes > 0
    assert steep.gate is not None
    tree = steep.propose(_state(tokens))
    assert tree.tokens.tolist() == fixed.propose(_state(tokens)).tokens.tolist()[:1]
    assert steep.gate._unpaid


def test_lookup_auto_learns_from_its_unpaid_node() -> None:
    """An accepted unpaid node raises the learned acceptance (hits over tries)."""
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
    drafter = PromptLookup(latency=STEEP)
    drafter.begin(_state(tokens))
    before = drafter._hits / drafter._tried
    tree = drafter.propose(_state(tokens))
    assert tree.num_nodes == 1
    accepted = int(tree.tokens[0])
    logits = torch.zeros(2, 12)
    logits[0, accepted] = 1.0
    after_state = _state([*tokens, accepted, 7])
    drafter.observe(StepOutcome(tree, logits, Verdict((0,), 7), after_state))
    assert drafter._hits / drafter._tried > before


# -- the decoder binds the table; exactness ------------------------------------------


@pytest.mark.parametrize(
    "make",
    [TokenRecycling, PromptLookup, DynamicTokenRecycling],
    ids=["tr", "pld", "dtr"],
)
def test_the_decoder_binds_the_latency_table_and_output_stays_greedy(tiny, make) -> None:
    """``SpeculativeDecoder`` gives a default (``"auto"``) drafter the target's latency
    table, and the output is plain greedy decoding's, token for token."""
    drafter = make()
    assert drafter.latency is None
    decoder = SpeculativeDecoder(tiny, drafter, Greedy())
    assert drafter.latency is not None and drafter.gate is not None
    reference = SpeculativeDecoder(tiny, Autoregressive(), Greedy())
    config = GenerationParams(max_new_tokens=24)
    for prompt in ([1, 2, 3, 1, 2], [5, 9, 5, 9, 5, 9, 5]):
        assert (
            decoder.generate(prompt, config=config).tokens
            == reference.generate(prompt, config=config).tokens
        )


def test_dtr_auto_gates_its_drafting(tiny) -> None:
    """``dtr``'s default holds a gate, and a steep table makes it send empty trees."""
    drafter = DynamicTokenRecycling(latency=STEEP, vocab_size=64)
    assert drafter.gate is not None
    state = _state([1, 2, 3])
    drafter.begin(state)
    assert drafter.propose(state).num_nodes == 0


def test_an_explicit_tree_size_has_no_gate() -> None:
    assert TokenRecycling("8").gate is None and TokenRecycling("8").latency is None
    assert PromptLookup(max_tokens=10).gate is None
    assert DynamicTokenRecycling(budget=16).gate is None


def test_dyspec_class_and_spec_share_the_default_budget() -> None:
    """``DySpec(draft)`` builds Algorithm 1 with 16 nodes, as ``dyspec`` does (issue 24:
    the default was written only in the spec factory, and the class refused)."""
    from verispec.drafters import DySpec
    from verispec.models.markov import MarkovModel
    from verispec.specs import drafter as build

    draft = MarkovModel(torch.zeros(16, 16))
    assert DySpec(draft).max_budget == 16 and DySpec(draft).budget == 16
    assert build("dyspec", target=draft, draft_model=draft).budget == 16


def test_a_drafted_step_that_sends_no_node_is_a_loss() -> None:
    """Drafting that ends in the empty tree only cost the drafter's time: its gain is below
    1 whatever the plain steps measured before (an outlier among them included)."""
    clock = FakeClock()
    gate = DraftGate(FLAT, smoothing=1.0, clock=clock)
    gate.plain_s = 10.0  # a stalled plain step, measured earlier
    assert gate.drafting()
    gate.clock_in()
    clock.now += 0.001
    gate.clock_out()
    clock.now += 0.010
    gate.clock_in()
    gate.record(0, 0, context=5)
    assert gate.gain == pytest.approx(0.010 / 0.011)
    assert gate.plain_s == pytest.approx(0.010)  # the stall is replaced by the measurement
    assert not gate.drafting()


def test_while_backing_off_only_the_drafted_steps_learn() -> None:
    """Drafted steps learn; the plain steps of a stretch between probes do not."""
    clock = FakeClock()
    gate = DraftGate(STEEP, max_skip=8, smoothing=1.0, clock=clock)
    seen = []
    for _ in range(20):
        drafted = gate.drafting()
        seen.append((drafted, gate.learning()))
        gate.record(1 if drafted else 0, 0, context=10)
    # stretches of 1, 2, 4, 8 plain steps between drafted ones
    assert [d for d, _ in seen[:16]] == [True, False, True, False, False, True] + [False] * 4 + [
        True
    ] + [False] * 5
    assert all(learn == drafted for drafted, learn in seen)


def test_auto_values_the_template_again_only_after_the_rates_change() -> None:
    """The nodes' ranking is kept between steps and recomputed once a drafted step has
    changed the slots' rates."""
    table = LatencyTable([0, 1, 2, 3, 4, 80], [1.0, 1.05, 1.2, 1.5, 2.0, 50.0])
    drafter = _recycling(table)
    assert drafter.gate is not None
    drafter.gate.max_skip = 0  # the gate never backs off here: every propose drafts
    size = drafter.propose(_state([3])).num_nodes
    kept = drafter._valued
    assert size > 0 and kept is not None
    assert drafter.propose(_state([3])).num_nodes == size and drafter._valued is kept
    drafter._slot_hits.zero_()  # no slot accepted any more, not yet observed
    tree = drafter.propose(_state([3]))
    assert tree.num_nodes == size  # the kept ranking
    logits = torch.zeros(tree.num_nodes + 1, 12)
    drafter.observe(StepOutcome(tree, logits, Verdict((), 5), _state([3, 5])))  # none accepted
    assert drafter.propose(_state([3])).num_nodes == 1  # valued again: only the probe's node


def test_lookup_reads_tokens_committed_while_it_did_not_learn() -> None:
    """While the gate backs off, prompt lookup's index is not brought up to date; the probe
    that follows still finds a match only the unlearnt tokens hold (the index catches up
    when read)."""
    drafter = PromptLookup(latency=FLAT)
    drafter.begin(_state([1, 2, 3]))
    assert drafter.gate is not None and drafter.gate.gain is None  # its first step drafts
    tokens = [1, 2, 3, 7, 8, 9, 5, 6, 7]  # steps the drafter did not learn from
    tree = drafter.propose(_state(tokens))
    assert tree.tokens.tolist()[:2] == [8, 9]  # the continuation of the earlier 7


# -- the gate on a model (benchmarks/gate_model.py) ------------------------------------


def test_the_gate_model_stays_near_plain_decoding_and_keeps_a_large_gain() -> None:
    """On the model of ``benchmarks/gate_model.py`` (the real gate, a fake clock): with
    nothing accepted, drafting every step would run at 0.74x plain decoding and the gate
    stays within 3 % of it; with 80 % accepted it keeps at least 95 % of the 1.33x."""
    import sys
    from pathlib import Path

    sys.path.append(str(Path(__file__).parents[2] / "benchmarks"))
    from gate_model import gated_speed

    kw = {"max_skip": 16, "smoothing": 0.3, "steps": 4000, "seed": 0}
    plain, step, drafter = 0.0104, 0.0131, 0.0010
    assert gated_speed(0.0, plain, step, drafter, **kw) >= 0.97
    always = 1.8 * plain / (step + drafter)
    assert gated_speed(0.8, plain, step, drafter, **kw) >= 0.95 * always

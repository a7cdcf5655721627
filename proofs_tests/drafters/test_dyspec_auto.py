"""DySpec with ``budget="auto"``: the stopping rule, the trees it gives, the bench factory."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import pytest
import torch
from drafter_states import decode_state
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.stats import chi2

from verispec import SpeculativeDecoder
from verispec.core.tree import DraftTree
from verispec.core.types import DecodeState
from verispec.drafters.budget import LatencyTable, choose_budget
from verispec.drafters.dyspec import DySpec, _stops_at
from verispec.errors import ConfigError
from verispec.models.hf import HFModel
from verispec.models.markov import MarkovModel
from verispec.verifiers import Greedy
from verispec.verifiers.recursive import RecursiveRejection

PROMPT = [1, 0]
# T(1) = T(2) = 2.75: one node never pays (2 / 2.75 < 1), two pay iff v_2 > 0.75, a third
# never does. Not convex, so the best prefix of a grown tree depends on later values.
STEP = LatencyTable([0, 1, 2, 3], [1.0, 2.75, 2.75, 20.0])


def _linear(slope: float) -> LatencyTable:
    return LatencyTable([0, 64], [1.0, 1.0 + 64 * slope])


def _online_size(values: Sequence[float], table: LatencyTable) -> int:
    """Where the rule stops on this value sequence, its length being the cap M."""
    seconds = table.at(torch.arange(len(values) + 1)).tolist()
    for n in range(len(values)):
        if _stops_at(n, sum(values[:n]), values[n], seconds):
            return n
    return len(values)


def _rate(values: Sequence[float], table: LatencyTable, n: int) -> float:
    return (1.0 + sum(values[:n])) / float(table.at(n))


@st.composite
def _values_and_table(draw: st.DrawFn, convex: bool) -> tuple[list[float], LatencyTable]:
    steps = draw(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40))
    values = [1.0]  # the root slot's value, then non-increasing
    for factor in steps:
        values.append(values[-1] * factor)
    sizes = [0, *sorted(draw(st.sets(st.integers(1, 48), min_size=1, max_size=6)))]
    low = 0.0 if convex else -0.05  # measured tables may dip (noise)
    count = len(sizes) - 1
    slopes = draw(st.lists(st.floats(low, 2.0), min_size=count, max_size=count))
    if convex:
        slopes.sort()
    seconds = [draw(st.floats(0.05, 2.0))]
    for i, slope in enumerate(slopes):
        seconds.append(max(seconds[-1] + slope * (sizes[i + 1] - sizes[i]), 0.01))
    return values, LatencyTable(sizes, seconds)


@settings(max_examples=300, deadline=None)
@given(_values_and_table(convex=False))
@example(  # a 1-ulp tie: Python's sum and torch's cumsum round the last value differently
    ([1.0, 0.8733096869872843, 1.939137044242943e-16], LatencyTable((0, 1), (1.0, 1.0)))
)
def test_rule_never_stops_before_the_best_prefix(case: tuple[list[float], LatencyTable]) -> None:
    """For non-increasing values and any latency table, the size where the rule stops is at
    least choose_budget's argmax of (1 + v_1 + ... + v_n) / T(n) over the whole sequence, or
    has the same rate up to float rounding (the two sum the values in different orders, so a
    value below one ulp of the running sum can tip a tie either way)."""
    values, table = case
    online, best = _online_size(values, table), choose_budget(values, table)
    assert online >= best or _rate(values, table, online) >= _rate(values, table, best) * (
        1 - 1e-12
    )


@settings(max_examples=300, deadline=None)
@given(_values_and_table(convex=True))
def test_rule_stops_at_the_best_prefix_when_latency_is_convex(
    case: tuple[list[float], LatencyTable],
) -> None:
    """With a convex latency table the rule stops at a size of maximal expected tokens per
    second, the rate of choose_budget's choice (equal up to rounding)."""
    values, table = case
    n = _online_size(values, table)
    best = _rate(values, table, choose_budget(values, table))
    assert _rate(values, table, n) >= best * (1 - 1e-9)


def _row_hash_keys(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Deterministic Gumbel keys: the noise of a row depends only on the row's values."""
    rows = []
    for row in probs:
        seed = int.from_bytes(hashlib.sha256(row.numpy().tobytes()).digest()[:7], "little")
        noise = torch.empty_like(row).exponential_(generator=torch.Generator().manual_seed(seed))
        rows.append(row.log() - noise.log())
    return torch.stack(rows)


def _propose(drafter: DySpec, state: DecodeState) -> DraftTree:
    drafter._keys = _row_hash_keys
    drafter.begin(state)
    return drafter.propose(state)


def _fed_by_propose(drafter: DySpec, state: DecodeState) -> tuple[DraftTree, int]:
    """The proposal and how many tokens the draft was fed to make it (the root included)."""
    draft = drafter.draft
    assert isinstance(draft, MarkovModel)
    drafter._keys = _row_hash_keys
    drafter.begin(state)
    before = draft.tokens_fed
    tree = drafter.propose(state)
    return tree, draft.tokens_fed - before


def _same_tree(a: DraftTree, b: DraftTree) -> bool:
    return (
        torch.equal(a.tokens, b.tokens)
        and torch.equal(a.parents, b.parents)
        and [type(x) for x in a.laws] == [type(x) for x in b.laws]
    )


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("table", [_linear(0.02), _linear(0.1), _linear(0.4), STEP])
def test_auto_tree_is_algorithm_1_stopped_by_the_rule(
    temperature: float, table: LatencyTable
) -> None:
    """With the same draws, the auto tree is Algorithm 1's tree with budget n (same nodes,
    order and laws), n being where the rule stops on Algorithm 1's values at the cap
    (choose_budget's n for the convex linear tables), and the draft fed only its nodes."""
    draft = MarkovModel.random(6, torch.Generator().manual_seed(2), order=2, scale=1.0)
    for seed in range(4):
        full = DySpec(draft, budget=24)
        _propose(full, decode_state(PROMPT, temperature, seed))
        auto = DySpec(draft, budget="auto", latency=table, max_budget=24)
        tree, fed = _fed_by_propose(auto, decode_state(PROMPT, temperature, seed))
        n = tree.num_nodes
        assert n == _online_size(full.node_values, table)
        if table is not STEP:
            assert n == choose_budget(full.node_values, table)
        assert auto.node_values == full.node_values[:n]
        assert fed <= 1 + n  # the root's pending token and at most the tree's nodes
        if n:
            fixed = DySpec(draft, budget=n)
            assert _same_tree(_propose(fixed, decode_state(PROMPT, temperature, seed)), tree)


def test_linear_tables_shrink_the_tree_as_nodes_get_dearer() -> None:
    """The dearer a node (steeper T), the smaller the auto tree; one node per step always
    pays at T(1) < 2 T(0), and none does at T(1) >= 2 T(0) (v_1 = 1): then the draft is
    not even called."""
    draft = MarkovModel.random(6, torch.Generator().manual_seed(2), order=2, scale=1.0)
    sizes = []
    for slope in (0.005, 0.05, 0.2, 0.6, 0.99, 1.0):
        tree = _propose(
            DySpec(draft, budget="auto", latency=_linear(slope)), decode_state(PROMPT, 1.0)
        )
        sizes.append(tree.num_nodes)
    assert sizes == sorted(sizes, reverse=True)
    assert sizes[0] > 16 and sizes[-2] >= 1 and sizes[-1] == 0
    state = decode_state(PROMPT, 1.0)
    drafter = DySpec(draft, budget="auto", latency=_linear(1.0))
    drafter.begin(state)
    calls = len(draft.call_log)
    assert drafter.propose(state).num_nodes == 0
    assert len(draft.call_log) == calls  # an empty step costs the draft nothing


class _CutAfterGrowth(DySpec):
    """The tempting wrong design: grow ``max_budget`` nodes, keep choose_budget's prefix."""

    def __init__(self, draft: MarkovModel, table: LatencyTable, max_budget: int) -> None:
        super().__init__(draft, budget=max_budget)
        self.table = table

    def propose(self, state: DecodeState) -> DraftTree:
        tree = super().propose(state)
        return tree.truncated(choose_budget(self.node_values, self.table))


def _root_children_pvalue(drafter: DySpec, probs: torch.Tensor, proposals: int) -> float:
    """Pooled chi-square p-value of: the i-th root child, given the earlier ones and that an
    i-th exists, follows the root's draft with the earlier ones removed."""
    draft = drafter.draft
    assert isinstance(draft, MarkovModel)
    state = decode_state([0], 1.0, seed=8)
    drafter.begin(state)
    root = probs[0].tolist()
    groups: dict[tuple[int, ...], dict[int, int]] = {}
    for _ in range(proposals):
        tree = drafter.propose(state)
        kids = [int(tree.tokens[c]) for c in tree.children[0]]
        for i, kid in enumerate(kids):
            cell = groups.setdefault(tuple(kids[:i]), {})
            cell[kid] = cell.get(kid, 0) + 1
        draft.commit([], 0)
        draft.prefill(torch.tensor([0]))
    stat, dof = 0.0, 0
    for history, cell in groups.items():
        total, left = sum(cell.values()), 1.0 - sum(root[h] for h in history)
        expected = {t: root[t] / left * total for t in range(3) if t not in history}
        if len(expected) > 1 and min(expected.values()) >= 5:
            stat += sum((cell.get(t, 0) - e) ** 2 / e for t, e in expected.items())
            dof += len(expected) - 1
    assert dof >= 1
    return float(chi2.sf(stat, dof))


def test_kept_draws_follow_the_declared_law() -> None:
    """Stopping before each pop keeps the root's children sequential draws without
    replacement (pooled chi-square, 1,500 proposals, p > 1e-3), where cutting a grown tree
    at its best prefix keeps the first child only when its token is rare (p < 1e-9)."""
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.7, 0.2, 0.1]], dtype=torch.float64)
    auto = DySpec(MarkovModel.from_probs(probs), budget="auto", latency=STEP, max_budget=3)
    assert _root_children_pvalue(auto, probs, 1500) > 1e-3
    cut = _CutAfterGrowth(MarkovModel.from_probs(probs), STEP, 3)
    assert _root_children_pvalue(cut, probs, 1500) < 1e-9


def _assert_draft_cache_matches_a_fresh_prefill(
    draft: HFModel, tokens: list[int], committed: int
) -> None:
    """The draft holds ``committed`` tokens, and its KV entries for ``tokens[:-1]`` equal
    those of the same view prefilled with ``tokens`` (the generation may have been cut
    short of the last step's commit)."""
    assert draft.num_committed == committed
    fresh = HFModel(draft.hf_model, max_length=draft.max_length, layers=draft.layer_indices)
    fresh.prefill(tokens)
    for (keys, values), (keys_ref, values_ref) in zip(
        draft.kv_cache(), fresh.kv_cache(), strict=True
    ):
        length = keys_ref.shape[2]
        assert length == len(tokens) - 1 and keys.shape[2] >= length
        torch.testing.assert_close(keys[:, :, :length], keys_ref, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(values[:, :, :length], values_ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    "table", [_linear(0.15), _linear(0.4), STEP], ids=["linear-0.15", "linear-0.4", "step"]
)
def test_tiny_llama_greedy_identity_and_draft_cache(
    table: LatencyTable, tiny: HFModel, greedy_reference
) -> None:
    """DySpec(budget='auto') with a self-draft of the tiny Llama and tables that force small
    trees: at temperature 0 it reproduces plain greedy decoding (2 prompts, 24 tokens,
    Greedy and recursive verifiers), and after every generation, at temperatures 0 and 1,
    the draft's KV cache equals a fresh prefill of the committed tokens."""
    sizes: set[int] = set()
    accepted = 0
    for prompt in ([3, 17, 5], [60, 2, 2, 9, 31]):
        for verifier, temperature in (
            (Greedy(), 0.0),
            (RecursiveRejection(torch.float64), 0.0),
            (RecursiveRejection(torch.float64), 1.0),
        ):
            draft = tiny.self_draft(1)
            drafter = DySpec(draft, budget="auto", latency=table, max_budget=16)
            result = SpeculativeDecoder(tiny, drafter, verifier).generate(
                prompt, max_new_tokens=24, eos_token_ids=(), temperature=temperature, seed=3
            )
            if temperature == 0.0:
                assert result.tokens == greedy_reference(prompt, 24)
            committed = len(prompt) + sum(step.committed for step in result.steps)
            _assert_draft_cache_matches_a_fresh_prefill(draft, prompt + result.tokens, committed)
            sizes |= {step.tree_size for step in result.steps}
            accepted += sum(step.accepted for step in result.steps)
    assert max(sizes) <= 16 and (len(sizes) >= 2 or table is STEP) and accepted > 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"budget": "auto", "latency": STEP, "threshold": 0.1}, "Algorithm 1 only"),
        ({"budget": "auto", "latency": STEP, "max_budget": 0}, "max_budget"),
        ({"budget": "big"}, "or 'auto'"),
        ({"budget": "auto", "latency": [1.0, 2.0]}, "latency table"),
    ],
)
def test_bad_auto_parameters(kwargs: dict, match: str) -> None:
    """'auto' needs a max_budget >= 1 and excludes a threshold, ``latency`` must be a
    LatencyTable, and any other string budget is refused."""
    draft = MarkovModel.random(3, torch.Generator().manual_seed(0))
    with pytest.raises(ConfigError, match=match):
        DySpec(draft, **kwargs)


def test_auto_without_a_table_is_bound_by_the_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """'auto' without a table proposes nothing before one is bound (a clear error), and
    the decoder binds the target's (``bind_target``), as it does Dynamic Token Recycling's;
    a table given with a fixed budget is not read."""
    draft = MarkovModel.random(3, torch.Generator().manual_seed(0))
    drafter = DySpec(draft, budget="auto")
    state = decode_state(PROMPT, 1.0)
    drafter.begin(state)
    with pytest.raises(ConfigError, match="latency table"):
        drafter.propose(state)
    bound: list[object] = []
    monkeypatch.setattr(
        "verispec.drafters.budget.latency_for", lambda target: bound.append(target) or STEP
    )
    target = MarkovModel.random(3, torch.Generator().manual_seed(1))
    SpeculativeDecoder(target, drafter)
    assert bound == [target] and drafter.latency is STEP
    fixed = DySpec(draft, budget=4, latency=STEP)
    assert not fixed.sized_by_device and repr(fixed) == "DySpec(budget=4)"
    assert fixed._latency_grid(4) == []


def test_auto_respects_the_room_left() -> None:
    """The cap is also the room the decode state leaves (max_nodes)."""
    draft = MarkovModel.random(6, torch.Generator().manual_seed(2), order=2)
    state = decode_state(PROMPT, 1.0)
    state.max_nodes = 3
    drafter = DySpec(draft, budget="auto", latency=_linear(0.001))
    drafter.begin(state)
    assert drafter.propose(state).num_nodes == 3
    assert repr(drafter) == "DySpec(budget='auto', max_budget=64)"


def test_bench_spec_builds_auto_with_the_targets_table(
    tmp_path, monkeypatch: pytest.MonkeyPatch, single_thread: None
) -> None:
    """`dyspec:budget=auto:max_budget=8` measures (and caches) the target's latency table and
    hands it to DySpec; `budget=0` and `budget=lots` are refused when parsed."""
    from verispec.bench.methods import METHODS
    from verispec.bench.runner import BenchContext
    from verispec.drafters.budget import device_key
    from verispec.models.tiny import tiny_llama
    from verispec.specs import parse_method

    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    spec = parse_method("dyspec:budget=auto:max_budget=8:draft_layers=1", METHODS)
    target = tiny_llama(vocab_size=64, num_layers=2, seed=0, max_length=128)
    runner = METHODS["dyspec"].build(BenchContext(target, None), spec.params)
    drafter = runner.drafter
    assert isinstance(drafter, DySpec)
    assert drafter.budget == "auto" and drafter.max_budget == 8
    assert drafter.latency is not None and drafter.latency.key == device_key(target)
    assert len(list((tmp_path / "latency").glob("*.json"))) == 1
    for bad in ("0", "lots"):
        with pytest.raises(ConfigError, match=r"`dyspec:budget` must be an integer >= 1 or .auto."):
            parse_method(f"dyspec:budget={bad}", METHODS)
    assert math.isfinite(float(drafter.latency.at(8)))

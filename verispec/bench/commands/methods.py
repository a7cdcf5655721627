"""``verispec methods``: list the method specs and their parameters."""

from __future__ import annotations

import argparse

__all__ = ["add_cli_args", "main"]

HELP = "list the method specs and their parameters"
DESCRIPTION = None


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """``verispec methods`` takes no arguments."""


def main(args: argparse.Namespace) -> int:
    """Print each method, whether it can run here, and its parameters."""
    from verispec.bench.methods import METHODS

    for entry in METHODS.values():
        reason = entry.availability()
        status = "" if reason is None else f"  [not available: {reason}]"
        print(f"{entry.name:<14}{entry.summary}{status}")
        for param in entry.params:
            print(f"{'':<16}{param.describe()}")
    return 0

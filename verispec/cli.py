"""The ``verispec`` command line: ``bench``, ``generate``, ``report`` and ``methods``.

``verispec bench`` is the benchmark of record: every requested method and the
peers users would pick instead (transformers' ``generate``, its prompt lookup and
early-exit assisted generation) on the same model and prompts, interleaved
prompt by prompt, with one table at the end. ``verispec report`` prints the same
tables from ``bench --json`` files and writes the Markdown, JSON and plots again,
merging the shards of a run split with ``--categories``. ``verispec generate``
answers one prompt with one method and prints its statistics. ``verispec methods``
lists the method specs and their parameters.

This module is only the dispatcher: each subcommand is a module of
:mod:`verispec.bench.commands` with ``add_cli_args(parser)`` and ``main(args)``; the
parser is built from them, and the chosen one's ``main`` runs.

Errors a user can fix (an unknown method, a malformed questions file,
``--limit 0``, ``--device cuda`` without CUDA, an output directory that cannot be
written...) print one line on stderr and exit with status 2 before the model
loads; no traceback. Report files are written atomically, and only after the run
succeeds; ``bench`` also appends every finished answer to a records file as it
goes (``--records``, by default beside ``--json``), from which ``--resume``
continues a run that was killed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from verispec.bench.commands import bench, generate, methods, report
from verispec.bench.commands.bench import DEFAULT_LIMIT, DEFAULT_METHODS

__all__ = ["COMMANDS", "DEFAULT_LIMIT", "DEFAULT_METHODS", "build_parser", "main"]

# name -> the module with HELP, DESCRIPTION, add_cli_args(parser) and main(args)
COMMANDS: dict[str, ModuleType] = {
    "bench": bench,
    "generate": generate,
    "report": report,
    "methods": methods,
}


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors on one line (status 2), like verispec's own errors."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``verispec`` parser: one subparser per entry of :data:`COMMANDS`."""
    parser = _Parser(
        prog="verispec",
        description="Lossless speculative decoding with draft trees.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name, command in COMMANDS.items():
        subparser = subparsers.add_parser(name, help=command.HELP, description=command.DESCRIPTION)
        command.add_cli_args(subparser)
    return parser


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 success, 2 usage error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # a usage error (one line already printed); --help exits 0
        if exc.code in (0, None):
            raise
        return 2
    args.argv = argv  # `bench` records its command line in the report
    from verispec.core.notices import set_notices
    from verispec.errors import VerispecError

    set_notices(not getattr(args, "no_progress", False))
    try:
        return int(COMMANDS[args.command].main(args))
    except (VerispecError, OSError) as exc:  # OSError: files, permissions, a full disk
        print(f"verispec {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"verispec {args.command}: interrupted; nothing written.", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

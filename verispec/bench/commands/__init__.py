"""The subcommands of the ``verispec`` command line, each a module with ``HELP``,
``DESCRIPTION``, ``add_cli_args(parser)`` and ``main(args) -> int`` (as vLLM's are):
:mod:`~verispec.bench.commands.bench`, :mod:`~verispec.bench.commands.generate`,
:mod:`~verispec.bench.commands.report` and :mod:`~verispec.bench.commands.methods`.
``verispec/cli.py`` builds the parser from them and dispatches.

What two commands share: :mod:`~verispec.bench.commands.flags` (the generation flags,
made from :class:`~verispec.core.types.GenerationParams`'s fields),
:mod:`~verispec.bench.commands.target` (the model flags, checked and loaded) and
:mod:`~verispec.bench.commands.outputs` (the report files).
"""

"""The ``verispec`` command line: ``bench``, ``report``, ``generate`` and ``methods``.

``verispec bench`` is the benchmark of record: every requested method and the
peers users would pick instead (transformers' ``generate``, its prompt lookup and
early-exit assisted generation) on the same model and prompts, interleaved
prompt by prompt, with one table at the end. ``verispec report`` prints the same
tables from ``bench --json`` files and writes the Markdown, JSON and plots again,
merging the shards of a run split with ``--categories``. ``verispec generate``
answers one prompt with one method and prints its statistics. ``verispec methods``
lists the method specs and their parameters.

Errors a user can fix (an unknown method, a malformed questions file,
``--limit 0``...) print one line and exit with status 2 before the model loads;
output files are written atomically, and only after the run succeeds.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["DEFAULT_LIMIT", "DEFAULT_METHODS", "build_parser", "main"]

DEFAULT_METHODS = "ar,hf,tr:template=8,tr:template=16,tr:template=32,tr:template=80,pld,dtr"
DEFAULT_LIMIT = 1  # questions per category: the default run stays under ~10 min on 2 cores
_DTYPES = ("float32", "bfloat16", "float16")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1; got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer; got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0; got {value}")
    return value


def _model_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument(
        "--model",
        choices=("smollm2", "tiny"),
        default="smollm2",
        help="smollm2: the embedded SmolLM2-135M-Instruct (default); tiny: a random "
        "4-layer Llama with a byte tokenizer, to check the pipeline in seconds",
    )
    group.add_argument("--dtype", choices=_DTYPES, default="float32", help="(default float32)")
    group.add_argument(
        "--device",
        default="auto",
        metavar="DEVICE",
        help="cpu, cuda, cuda:1... (default: cuda if available)",
    )
    group.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        metavar="N",
        help="CPU threads for torch (default: torch's own choice)",
    )


def _generation_options(parser: argparse.ArgumentParser, max_new: int) -> None:
    group = parser.add_argument_group("generation")
    group.add_argument(
        "--max-new-tokens",
        type=_positive_int,
        default=max_new,
        metavar="N",
        help=f"most new tokens per answer (default {max_new})",
    )
    group.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        metavar="T",
        help="0 = greedy (default); > 0 samples",
    )
    group.add_argument(
        "--seed", type=int, default=0, metavar="S", help="seed of every random draw (default 0)"
    )
    group.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="apply the tokenizer's chat template (default: on)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="verispec",
        description="Lossless speculative decoding with draft trees.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    bench = commands.add_parser(
        "bench",
        help="benchmark methods against plain decoding and transformers' generate",
        description="Run every method on the same prompts (interleaved prompt by prompt, "
        "warm-up excluded) and print tokens/s, mean accepted tokens per step (MAT), "
        "speedups over `hf` and `ar`, token identity with greedy, peak memory and the "
        "draft/target/verify time split. Method specs look like `tr:template=16:k=8`; "
        "see `verispec methods`.",
    )
    bench.add_argument(
        "--methods",
        action="append",
        metavar="SPECS",
        help=f"comma-separated method specs, or `all` (default: {DEFAULT_METHODS})",
    )
    bench.add_argument(
        "--questions",
        metavar="PATH",
        help="a Spec-Bench-format JSONL file (question_id, category, turns); "
        "default: the 30 prompts verispec ships",
    )
    bench.add_argument(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help=f"questions per category, in file order (default {DEFAULT_LIMIT})",
    )
    bench.add_argument(
        "--categories", metavar="A,B", help="only these categories (comma-separated)"
    )
    bench.add_argument(
        "--turns",
        type=_positive_int,
        metavar="N",
        help="at most N turns per conversation (default: all; MT-Bench questions have 2)",
    )
    bench.add_argument(
        "--warmup",
        type=_non_negative_int,
        default=1,
        metavar="N",
        help="warm-up answers per method, not measured (default 1)",
    )
    bench.add_argument(
        "--carry-corpus",
        action="store_true",
        help="cross-request setting: add each answer to its method's suffix corpus once "
        "produced, so later questions can retrieve from it (default: independent answers)",
    )
    _report_outputs(bench)
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    _generation_options(bench, 128)
    _model_options(bench)

    generate = commands.add_parser(
        "generate",
        help="answer one prompt with one method and print its statistics",
        description="Answer one prompt and print the answer, then tokens/s, steps, mean "
        "accepted tokens per step (MAT) and the draft/target/verify time split.",
    )
    generate.add_argument("--method", default="tr", metavar="SPEC", help="(default tr)")
    generate.add_argument("--prompt", required=True, help="the user prompt")
    _generation_options(generate, 128)
    _model_options(generate)

    report = commands.add_parser(
        "report",
        help="re-render or merge `verispec bench --json` reports",
        description="Print the tables of one or more JSON reports written by `verispec bench "
        "--json` and write the Markdown, JSON and plots again. Several files are merged: "
        "they must be shards of one run over disjoint categories (`--categories`), with the "
        "same methods and generation settings; figures are recomputed exactly from the "
        "shards' sums.",
    )
    report.add_argument("files", nargs="+", metavar="FILE.json", help="bench JSON reports")
    _report_outputs(report, json_help="write the (merged) report as JSON")

    commands.add_parser("methods", help="list the method specs and their parameters")
    return parser


def _report_outputs(
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


# -- shared helpers -------------------------------------------------------------------


def _load(args: argparse.Namespace) -> tuple[Any, Any]:
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.model == "tiny":
        from verispec.bench.smoke import load_smoke_model

        return load_smoke_model(dtype=dtype, device=device)
    from verispec.models.default import load_default_model

    return load_default_model(dtype=dtype, device=device)


_OUTPUTS = ("json", "markdown", "plot", "mat_plot")


def _check_outputs(args: argparse.Namespace) -> dict[str, Any]:
    """The output paths given, each checked writable now (before any long work)."""
    from verispec.bench.output import check_writable
    from verispec.errors import ConfigError

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


def _show_report(report: Any, per_category: bool) -> None:
    from verispec.bench.report import render_category_table, render_table

    print()
    print(render_table(report))
    if per_category:
        print()
        print(render_category_table(report))
    if report.reference is not None:
        print(f"\nidentical: answers token-identical to `{report.reference}` (greedy).")


def _write_outputs(
    outputs: dict[str, Any], report: Any, machine: Any = None, command: Any = None
) -> None:
    """Write every requested file, each atomically (``None``: the report's own)."""
    from verispec.bench.output import write_atomic, write_json, write_text
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


def _check_temperature(value: float) -> None:
    from verispec.errors import ConfigError

    if not value >= 0:  # also catches NaN
        raise ConfigError(f"`--temperature` must be >= 0; got {value}.")


# -- commands -------------------------------------------------------------------------


def _cmd_methods(args: argparse.Namespace) -> int:
    from verispec.bench.methods import METHODS

    for entry in METHODS.values():
        reason = entry.availability()
        status = "" if reason is None else f"  [not available: {reason}]"
        native = entry.native_defaults() if reason is None else {}
        print(f"{entry.name:<14}{entry.summary}{status}")
        for param in entry.params:
            print(f"{'':<16}{param.describe(native.get(param.name))}")
    return 0


def _bench_specs(args: argparse.Namespace) -> list[Any]:
    from verispec.bench.methods import METHODS
    from verispec.bench.registry import parse_methods
    from verispec.bench.runner import check_available

    texts = args.methods or [DEFAULT_METHODS]
    if [t.strip() for t in texts] == ["all"]:
        specs = []
        for name, entry in METHODS.items():
            reason = entry.availability()
            if reason is None:
                specs.extend(parse_methods(name, METHODS))
            else:
                print(f"verispec: skipping `{name}`: {reason}", file=sys.stderr)
        return specs
    specs = parse_methods(texts, METHODS)
    check_available(specs)
    return specs


def _cmd_bench(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from verispec.bench.output import machine_info
    from verispec.bench.prompts import load_questions, select_questions, shipped_questions
    from verispec.bench.report import summarise
    from verispec.bench.runner import BenchConfig, make_context, run_bench
    from verispec.errors import ConfigError

    # 1. everything a user can get wrong, before the model loads
    specs = _bench_specs(args)
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"`--limit` must be >= 1 (questions per category); got {args.limit}.")
    limit = args.limit if args.limit is not None else DEFAULT_LIMIT
    questions = load_questions(args.questions) if args.questions else shipped_questions()
    categories = [c.strip() for c in args.categories.split(",")] if args.categories else None
    questions = select_questions(
        questions, limit=limit, categories=categories, max_turns=args.turns
    )
    _check_temperature(args.temperature)
    config = BenchConfig(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=args.seed,
        warmup=args.warmup,
        chat=args.chat,
        carry_corpus=args.carry_corpus,
    )
    outputs = _check_outputs(args)

    # 2. load and run
    model, tokenizer = _load(args)
    context = make_context(model, tokenizer)
    answers = len(specs) * sum(len(q.turns) for q in questions)
    print(
        f"verispec bench: {len(specs)} methods x {len(questions)} questions "
        f"({answers} answers), max {config.max_new_tokens} new tokens, "
        f"temperature {config.temperature}, {context.device}, {args.dtype}",
        file=sys.stderr,
    )
    run = run_bench(context, specs, questions, config, progress=not args.no_progress)

    # 3. report, then write the files (only now that the run succeeded)
    report = summarise(run)
    machine = machine_info(context.device, args.dtype)
    command = "verispec " + shlex.join(argv)
    _show_report(report, args.per_category)
    _write_outputs(outputs, report, machine, command)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    import warnings

    from verispec.bench.merge import load_report, merge_reports

    # 1. outputs writable, every file a report, shards compatible: before writing anything
    outputs = _check_outputs(args)
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
    _show_report(report, args.per_category)
    _write_outputs(outputs, report)
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from verispec.bench.methods import METHODS
    from verispec.bench.prompts import build_prompt_ids
    from verispec.bench.registry import parse_methods
    from verispec.bench.runner import BenchConfig, build_runners, make_context
    from verispec.errors import ConfigError

    specs = parse_methods(args.method, METHODS)
    if len(specs) != 1:
        raise ConfigError(f"`--method` takes one method spec; got {len(specs)}.")
    if not args.prompt.strip():
        raise ConfigError("`--prompt` must not be empty.")
    _check_temperature(args.temperature)
    config = BenchConfig(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed
    )
    from verispec.bench.runner import check_available

    check_available(specs)
    model, tokenizer = _load(args)
    context = make_context(model, tokenizer)
    runner = build_runners(context, specs)[specs[0].label]
    ids = build_prompt_ids(tokenizer, [{"role": "user", "content": args.prompt}], chat=args.chat)
    result = runner.run(ids, config.generation(context.eos_token_ids))
    print(result.text)
    print()
    print(_generate_stats(specs[0].label, result, len(ids)))
    return 0


def _generate_stats(label: str, result: Any, prompt_tokens: int) -> str:
    n = len(result.tokens)
    rate = n / result.seconds if result.seconds > 0 else 0.0
    mat = result.committed / result.steps if result.steps else 0.0
    lines = [
        f"method: {label}",
        f"tokens: {n} new after a {prompt_tokens}-token prompt, in {result.seconds:.2f} s "
        f"({rate:.2f} tokens/s); finish: {result.finish_reason}",
        f"steps: {result.steps} target forwards, mean accepted tokens per step (MAT) {mat:.2f}",
    ]
    if result.tree_nodes is not None and result.steps:
        lines[-1] += f", {result.tree_nodes / result.steps:.1f} draft nodes per step"
    parts = []
    for name in ("draft", "target", "verify"):
        value = getattr(result, f"{name}_s")
        if value is not None and result.seconds > 0:
            parts.append(f"{name} {value:.2f} s ({100 * value / result.seconds:.0f}%)")
    if parts:
        lines.append("time: " + ", ".join(parts))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 success, 2 usage error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    from verispec.errors import VerispecError

    try:
        if args.command == "methods":
            return _cmd_methods(args)
        if args.command == "bench":
            return _cmd_bench(args, argv)
        if args.command == "report":
            return _cmd_report(args)
        return _cmd_generate(args)
    except (VerispecError, FileNotFoundError) as exc:
        print(f"verispec {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"verispec {args.command}: interrupted; nothing written.", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

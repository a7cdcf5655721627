"""``verispec bench``: the benchmark of record, from the command line.

Every requested method and the peers users would pick instead (transformers'
``generate``, its prompt lookup, llama.cpp) on the same model and prompts, interleaved
prompt by prompt, with one table at the end. :func:`main` runs in three steps:

1. check everything a user can get wrong (methods, questions, flags, output paths, the
   records file, the model's path), before the model loads;
2. load the model and run, appending every finished answer to the records file
   (``--records``, by default beside ``--json``), from which ``--resume`` continues;
3. print the tables, then write the report files, only now that the run succeeded.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any

from verispec.bench.commands import target
from verispec.bench.commands.flags import (
    BENCH_THREADS,
    add_generation_options,
    bench_config,
    int_arg,
)
from verispec.bench.commands.outputs import (
    add_output_options,
    check_outputs,
    show_report,
    write_outputs,
)
from verispec.bench.methods import METHODS, check_available
from verispec.bench.prompts import Question
from verispec.bench.records import RecordLog
from verispec.bench.runner import BenchConfig, BenchContext, MethodRunner
from verispec.errors import ConfigError
from verispec.specs import MethodSpec

__all__ = ["DEFAULT_LIMIT", "DEFAULT_METHODS", "add_cli_args", "main"]

HELP = "benchmark methods against plain decoding and transformers' generate"
DESCRIPTION = (
    "Run every method on the same prompts (interleaved prompt by prompt, "
    "warm-up excluded) and print tokens/s, mean accepted tokens per step (MAT), "
    "speedups over `hf` and `ar`, token identity with greedy, peak memory and the "
    "draft/target/verify time split. Method specs look like `tr:template=16:k=8`; "
    "see `verispec methods`."
)
# The default run: 8 methods x 8 answers (the shipped prompts, one per category) took 4.4 min
# on the 2-core CPU this is built on, one thread, nothing else running; the llama-cpp peers are
# skipped (with a message) where llama-cpp-python is not installed.
DEFAULT_METHODS = "ar,hf,hf-pld,pld,tr,dtr,llama-cpp,llama-cpp-pld"
DEFAULT_LIMIT = 1  # questions per category


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Declare ``verispec bench``'s flags on ``parser``."""
    parser.add_argument(
        "--methods",
        action="append",
        metavar="SPECS",
        help=f"comma-separated method specs, or `all` (default: {DEFAULT_METHODS})",
    )
    parser.add_argument(
        "--questions",
        metavar="PATH",
        help="a Spec-Bench-format JSONL file (question_id, category, turns); "
        "default: the 30 prompts verispec ships",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help=f"questions per category, in file order (default {DEFAULT_LIMIT})",
    )
    parser.add_argument(
        "--categories", metavar="A,B", help="only these categories (comma-separated)"
    )
    parser.add_argument(
        "--turns",
        type=int_arg(1),
        metavar="N",
        help="at most N turns per conversation (default: all; MT-Bench questions have 2)",
    )
    parser.add_argument(
        "--warmup",
        type=int_arg(0),
        default=1,
        metavar="N",
        help="warm-up answers per method, not measured (default 1)",
    )
    parser.add_argument(
        "--repeats",
        type=int_arg(1),
        default=1,
        metavar="N",
        help="time every answer in N passes over the whole benchmark (every method reset "
        "before each) and keep each answer's fastest pass: a machine that stalls adds time "
        "to one pass, never takes it away (default 1)",
    )
    parser.add_argument(
        "--carry-corpus",
        action="store_true",
        help="cross-request setting: add each answer to its method's suffix corpus once "
        "produced, so later questions can retrieve from it (default: independent answers)",
    )
    add_output_options(parser)
    parser.add_argument(
        "--records",
        metavar="PATH",
        help="append every finished answer to this JSON Lines file as it is produced "
        "(default: beside --json, e.g. out.records.jsonl)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the answers already in the records file (of an interrupted run with "
        "the same settings) and generate only the others",
    )
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar, and no notices of long waits (conversion, latency tables, "
        "compilation)",
    )
    add_generation_options(parser)
    target.add_model_options(parser, threads=BENCH_THREADS)
    target.add_kernel_option(parser)


def main(args: argparse.Namespace) -> int:
    """Run ``verispec bench``; returns the exit status (130: interrupted, answers kept).

    ``args.argv``, when the dispatcher sets it, is the command line recorded in the report.
    """
    import torch

    from verispec.bench.loop import run_bench
    from verispec.bench.prompts import load_questions, select_questions, shipped_questions
    from verispec.bench.records import machine_info
    from verispec.bench.report import summarise

    # 1. everything a user can get wrong, before the model loads
    specs, skipped = _specs(args)
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"`--limit` must be >= 1 (questions per category); got {args.limit}.")
    limit = args.limit if args.limit is not None else DEFAULT_LIMIT
    questions = load_questions(args.questions) if args.questions else shipped_questions()
    categories = [c.strip() for c in args.categories.split(",")] if args.categories else None
    questions = select_questions(
        questions, limit=limit, categories=categories, max_turns=args.turns
    )
    config = bench_config(
        args, warmup=args.warmup, carry_corpus=args.carry_corpus, repeats=args.repeats
    )
    device = target.device(args.device)
    outputs = check_outputs(args)
    kernels = target.kernel_scope(args)
    log = _records(args, config, specs, questions, device)
    target.check_model_source(args)
    for note in skipped:  # every argument is good: now say what will not run
        print(note, file=sys.stderr)

    # 2. load and run
    model, tokenizer = target.load(args, specs)
    context = target.context(args, model, tokenizer, config.verifier)
    with kernels:  # one scope for building the runners and running them
        specs, runners = _runners(context, specs)
        answers = len(specs) * sum(len(q.turns) for q in questions)
        passes = f", each the fastest of {config.repeats} passes" if config.repeats > 1 else ""
        print(
            f"verispec bench: {len(specs)} methods x {len(questions)} questions "
            f"({answers} answers{passes}), max {config.max_new_tokens} new tokens, "
            f"temperature {config.temperature}, {context.device}, "
            f"{str(model.dtype).replace('torch.', '')}, {torch.get_num_threads()} thread(s)",
            file=sys.stderr,
        )
        if log is not None and log.finished:
            print(
                f"verispec bench: resuming: {len(log.finished)} answers kept from {log.path}",
                file=sys.stderr,
            )
        try:
            with target.frozen_heap():
                run = run_bench(
                    context,
                    specs,
                    questions,
                    config,
                    progress=not args.no_progress,
                    runners=runners,
                    on_record=log.append if log is not None else None,
                    finished=log.finished if log is not None else None,
                )
        except KeyboardInterrupt:
            if log is not None and log.total:
                print(
                    f"verispec bench: interrupted; {log.total} answers kept in {log.path}: "
                    "run the same command with --resume to continue.",
                    file=sys.stderr,
                )
                return 130
            raise
        finally:
            if log is not None:
                log.close()

    # 3. report, then write the files (only now that the run succeeded)
    report = summarise(run)
    machine = machine_info(context.device, model.dtype, getattr(model, "runtime_note", None))
    machine.update(_peer_notes(context, specs))
    setup = _untimed_setup(model, runners)
    if setup:
        machine["untimed_setup_s"] = setup
        print(
            "untimed set-up (compiling, not in any answer's time): "
            + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in setup.items()),
            file=sys.stderr,
        )
    # `--resume` changes how the answers were obtained, not what they are
    argv = getattr(args, "argv", None) or sys.argv[1:]
    command = "verispec " + shlex.join(a for a in argv if a != "--resume")
    show_report(report, args.per_category)
    write_outputs(outputs, report, machine, command)
    return 0


def _specs(args: argparse.Namespace) -> tuple[list[MethodSpec], list[str]]:
    """The methods to run, and a note for each optional peer skipped (printed by the
    caller once every other argument has been checked, so an error comes first)."""
    from verispec.specs import parse_methods

    texts = args.methods or [DEFAULT_METHODS]
    if [t.strip() for t in texts] == ["all"]:
        specs: list[MethodSpec] = []
        notes = []
        for name, entry in METHODS.items():
            reason = entry.availability()
            if reason is None:
                specs.extend(parse_methods(name, METHODS))
            else:
                notes.append(f"verispec: skipping `{name}`: {reason}")
        return specs, notes
    specs = parse_methods(texts, METHODS)
    specs, notes = _skip_optional(specs, lambda spec: METHODS[spec.name].availability())
    check_available(specs)
    return specs, notes


def _skip_optional(
    specs: list[MethodSpec], reason_of: Callable[[MethodSpec], str | None]
) -> tuple[list[MethodSpec], list[str]]:
    """``specs`` without the optional peers (``MethodEntry.extra``) that cannot run here,
    and a note naming each one skipped; ``reason_of(spec)`` says why one cannot (or
    ``None``)."""
    kept, notes = [], []
    for spec in specs:
        reason = reason_of(spec) if METHODS[spec.name].extra is not None else None
        if reason is None:
            kept.append(spec)
        else:
            notes.append(f"verispec: skipping `{spec.label}`: {reason}")
    if not kept:
        raise ConfigError("no method left to run: every one requested was skipped.")
    return kept, notes


def _runners(
    context: BenchContext, specs: list[MethodSpec]
) -> tuple[list[MethodSpec], dict[str, MethodRunner]]:
    """A runner per spec; an optional peer that cannot run with this model is skipped."""
    runners: dict[str, MethodRunner] = {}

    def build(spec: MethodSpec) -> str | None:
        try:
            runners[spec.label] = METHODS[spec.name].build(context, spec.params)
        except ConfigError as exc:
            if METHODS[spec.name].extra is None:
                raise
            return str(exc)
        return None

    kept, notes = _skip_optional(specs, build)
    for note in notes:
        print(note, file=sys.stderr)
    for spec in kept:  # the verispec methods and required peers, built in order
        if spec.label not in runners:
            runners[spec.label] = METHODS[spec.name].build(context, spec.params)
    return kept, {spec.label: runners[spec.label] for spec in kept}


def _peer_notes(context: BenchContext, specs: Sequence[MethodSpec]) -> dict[str, str]:
    """What a reader of the table must know about the peers that ran (llama.cpp's weights)."""
    if not any(spec.name.startswith("llama-cpp") for spec in specs):
        return {}
    from importlib.metadata import version
    from pathlib import Path

    note = (
        f"llama-cpp-python {version('llama_cpp_python')} runs {Path(str(context.gguf)).name} "
        "with the file's own quantized weights, the other methods its dequantized weights: "
        "llama-cpp outputs are not expected to be identical"
    )
    print(f"verispec: note: {note}", file=sys.stderr)
    return {"llama_cpp": note}


def _untimed_setup(model: Any, runners: dict[str, MethodRunner]) -> dict[str, float]:
    """Seconds spent compiling or capturing, untimed: the target's own, then each method's."""
    setup = {}
    if getattr(model, "setup_s", 0.0):
        setup[f"target ({model.runtime})"] = round(float(model.setup_s), 1)
    for label, runner in runners.items():
        seconds = float(getattr(runner, "setup_s", 0.0))
        if seconds:
            setup[label] = round(seconds, 1)
    return setup


def _records(
    args: argparse.Namespace,
    config: BenchConfig,
    specs: list[MethodSpec],
    questions: list[Question],
    device: str,
) -> RecordLog | None:
    """The run's records file (checked writable, earlier answers loaded), or None."""
    from verispec.bench.records import check_writable, default_records_path, records_header

    path = args.records or (default_records_path(args.json) if args.json else None)
    if path is None:
        if args.resume:
            raise ConfigError(
                "`--resume` needs the records of the interrupted run: give --records PATH "
                "or the same --json PATH."
            )
        return None
    path = check_writable(path, "--records")
    setup = {
        "model": args.model,
        "dtype": args.dtype,
        "device": device,
        "runtime": args.runtime,
        "compile": args.compile,
        "weights": args.weights,
        "arithmetic": args.arithmetic,
    }
    return RecordLog(path, records_header(config, specs, questions, setup), resume=args.resume)

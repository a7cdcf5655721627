"""The generation flags of ``verispec bench`` and ``verispec generate``, made from the fields.

Each flag in :data:`FLAGS` is a field of :class:`~verispec.core.types.GenerationParams`:
its name is the field's (``top_k`` → ``--top-k``), its default is the field's default,
and its argparse type checks the range of the field's own check (the validator of
:class:`~verispec.core.sampling.SamplingParams` for the sampling fields), phrased as
:func:`verispec.core.validate.bounds` phrases ranges. Only the metavar and the line of
help are written here. A field that is not a flag is listed in :data:`NOT_FLAGS`, with
the reason, so a new field of ``GenerationParams`` is a decision (a test checks it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable
from typing import Any, Literal

import attrs

from verispec.core.sampling import SamplingParams
from verispec.core.types import SEED_LIMIT, GenerationParams, check_seed
from verispec.core.validate import bounds, in_bounds, integer, interval, number
from verispec.errors import ConfigError

__all__ = [
    "BENCH_THREADS",
    "FLAGS",
    "NOT_FLAGS",
    "STRUCTURE_ALLOWED",
    "Flag",
    "add_generation_options",
    "add_processing_options",
    "add_threads_option",
    "bench_config",
    "check_structure",
    "int_arg",
    "number_arg",
    "processing",
]


def int_arg(low: int, below: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer ``>= low`` (and ``< below``, ``<= high``), phrased as
    :func:`verispec.core.validate.bounds` phrases ranges."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer; got {text!r}") from None
        if not in_bounds(value, low, high, below):
            allowed = bounds(low, high=high, below=below)
            raise argparse.ArgumentTypeError(f"must be {allowed}; got {value}")
        return value

    return parse


BENCH_THREADS = 1
"""CPU threads a benchmark measures on unless ``--threads`` says otherwise: ``verispec
bench``'s and every script's under ``benchmarks/`` (the figures of record are
single-threaded)."""

# at most one torch thread per CPU core of this machine: more only make the threads wait
_threads = int_arg(1, high=os.cpu_count() or 1)


def _thread_counts(text: str) -> list[int]:
    """``1,2``: thread counts, each checked as ``--threads`` checks one."""
    return [_threads(part) for part in text.split(",")]


def add_threads_option(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    threads: int | None = BENCH_THREADS,
    *,
    counts: bool = False,
) -> None:
    """``--threads``: torch's CPU threads, at most one per core, by default ``threads``
    (``None``: torch's own choice); ``counts=True`` for a script that measures several
    counts in turn (``--threads 1,2``: a list, by default ``[threads]``)."""
    default = f"default: {threads}" if threads else "default: torch's own choice, all cores"
    if counts:
        assert threads is not None, "a list of thread counts has a default count"
        parser.add_argument(
            "--threads",
            type=_thread_counts,
            default=[threads],
            metavar="N[,N...]",
            help=f"CPU thread counts for torch, each measured in turn ({default})",
        )
        return
    parser.add_argument(
        "--threads",
        type=_threads,
        default=threads,
        metavar="N",
        help=f"CPU threads for torch ({default})",
    )


Closed = Literal["neither", "low", "high", "both"]


def number_arg(low: float, high: float, closed: Closed) -> Callable[[str], float]:
    """An argparse type: a number in an interval, checked by
    :func:`verispec.core.validate.interval` (its message, without the argument's name)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number; got {text!r}") from None
        try:
            return interval("value", value, low, high, closed=closed)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc).split("` ", 1)[1].rstrip(".")) from None

    return parse


Check = tuple[Callable[..., object], tuple[Any, ...], dict[str, Any]]


@attrs.frozen
class Flag:
    """The command-line face of one ``GenerationParams`` field.

    Attributes:
        metavar: the value's name in ``--help``.
        help: one line of help; ``{default}`` is replaced by the field's default.
        group: ``"generation"`` or ``"processing"``, the ``--help`` section.
        check: the range the flag accepts, when not the field's own check.
    """

    metavar: str
    help: str
    group: Literal["generation", "processing"] = "generation"
    check: Check | None = None


FLAGS: dict[str, Flag] = {
    "max_new_tokens": Flag("N", "most new tokens per answer (default {default})"),
    "temperature": Flag("T", "0 = greedy; > 0 samples (default {default:g})"),
    "top_k": Flag("K", "sample from the K most likely tokens, 0: all (default {default})"),
    "top_p": Flag(
        "P", "sample from the smallest set of tokens with mass >= P, 1: all (default {default:g})"
    ),
    "min_p": Flag(
        "P", "drop tokens below P times the most likely one, 0: none (default {default:g})"
    ),
    "seed": Flag(
        "S",
        f"seed of every random draw, {bounds(0, below=SEED_LIMIT)} (default {{default}}); "
        "with the default verifier, methods whose drafts are fixed candidates (ar, pld, tr, "
        "dtr) give the same text for the same seed",
    ),
    "repetition_penalty": Flag(
        "X",
        "transformers' repetition penalty, 1: none (default {default:g})",
        "processing",
        # 0 passes argparse and is refused by GenerationParams, whose message names the field
        check=(number, (0.0,), {}),
    ),
    "no_repeat_ngram_size": Flag(
        "N", "never repeat an n-gram of this size, 0: off (default {default})", "processing"
    ),
}

NOT_FLAGS: dict[str, str] = {
    "eos_token_ids": "the tokenizer's end-of-sequence tokens",
    "stop_strings": "not on the command line",
    "min_new_tokens": "not on the command line",
    "bad_words_ids": "token ids, not on the command line",
    "suppress_tokens": "token ids, not on the command line",
    "logits_processor": "Python callables",
    "json_schema": "--json-schema PATH: a file, read by `processing`",
    "regex": "--regex R, declared with --json-schema and --grammar (at most one)",
    "grammar": "--grammar PATH: a file, read by `processing`",
}


def _field(name: str) -> Any:
    return attrs.fields_dict(GenerationParams)[name]


def _check(name: str) -> Check:
    """The check of ``GenerationParams``'s field ``name`` (SamplingParams' for its fields)."""
    validator = _field(name).validator
    if validator is None:
        validator = attrs.fields_dict(SamplingParams)[name].validator
    return validator.check  # type: ignore[no-any-return]


def _arg_type(check: Check) -> Callable[[str], Any]:
    """The argparse type accepting what ``check`` accepts (its range, not its note)."""
    function, args, kwargs = check
    if function is integer:
        return int_arg(args[0], below=kwargs.get("below"), high=kwargs.get("high"))
    if function is check_seed:
        return int_arg(0, below=SEED_LIMIT)
    if function is interval:
        return number_arg(args[0], args[1], kwargs.get("closed", "neither"))
    if function is number:
        low = args[0] if args else 0.0
        return number_arg(low, math.inf, "neither" if kwargs.get("strict") else "low")
    raise TypeError(f"no argparse type for the check {function.__name__}")  # pragma: no cover


def _add_flags(group: Any, kind: str) -> None:
    for name, flag in FLAGS.items():
        if flag.group != kind:
            continue
        default = _field(name).default
        group.add_argument(
            "--" + name.replace("_", "-"),
            type=_arg_type(flag.check or _check(name)),
            default=default,
            metavar=flag.metavar,
            help=flag.help.format(default=default),
        )


def add_generation_options(parser: argparse.ArgumentParser) -> None:
    """The ``generation`` flags: :data:`FLAGS`' own, ``--verifier`` and ``--chat``."""
    group = parser.add_argument_group("generation")
    _add_flags(group, "generation")
    group.add_argument(
        "--verifier",
        choices=("default", "recursive"),
        default="default",
        help="acceptance rule at T > 0: default (seeded identity for fixed-candidate "
        "trees, recursive rejection for draft-model trees) or recursive (recursive "
        "rejection for every tree)",
    )
    group.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="apply the tokenizer's chat template (default: on)",
    )


def add_processing_options(parser: argparse.ArgumentParser) -> None:
    """The logits-processing flags and the structured-output ones (at most one)."""
    group = parser.add_argument_group(
        "logits processing and structured output (applied to every tree node)"
    )
    _add_flags(group, "processing")
    exclusive = group.add_mutually_exclusive_group()
    exclusive.add_argument(
        "--json-schema", metavar="PATH", help="the answer follows this JSON schema (a file)"
    )
    exclusive.add_argument("--regex", metavar="R", help="the answer matches this regex")
    exclusive.add_argument(
        "--grammar", metavar="PATH", help="the answer follows this Lark grammar (a file)"
    )


# what each structured-output flag takes, for its errors
STRUCTURE_ALLOWED = {
    "--json-schema": "a file holding a JSON schema (an object, or true or false) of the "
    "keywords and formats llguidance supports",
    "--regex": "a regex in the syntax of Rust's regex crate, without look-around or backreferences",
    "--grammar": "a file holding a Lark grammar (llguidance's dialect) with a `start` rule",
}


def processing(args: argparse.Namespace) -> dict[str, Any]:
    """The GenerationParams fields of the processing options (files read here), the
    structured output checked to compile, as far as it can be without the model's
    tokenizer, before the model loads (:func:`check_structure`)."""

    def read(option: str, path: str | None) -> str | None:
        if path is None:
            return None
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as error:
            raise ConfigError(f"`{option}` {path!r} cannot be read: {error.strerror}.") from None
        except UnicodeDecodeError as error:
            raise ConfigError(
                f"`{option}` {path!r} cannot be read: not UTF-8 text (byte {error.start}); "
                f"it must be {STRUCTURE_ALLOWED[option]}."
            ) from None
        check_structure(option, path, text)
        return text

    if args.regex is not None:
        check_structure("--regex", args.regex, args.regex)
    settings = {name: getattr(args, name) for name, f in FLAGS.items() if f.group == "processing"}
    return {
        **settings,
        "json_schema": read("--json-schema", args.json_schema),
        "regex": args.regex,
        "grammar": read("--grammar", args.grammar),
    }


def check_structure(option: str, given: str, text: str) -> None:
    """``text``, the constraint of ``option`` (``--json-schema``, ``--regex`` or
    ``--grammar``, ``given`` as the file or regex given), compiles as far as it can be
    checked without the model's tokenizer: JSON that is a schema llguidance follows, a
    regex it compiles, a Lark grammar it parses (in milliseconds; a special token the
    tokenizer lacks is found when the answer starts).

    Raises:
        ConfigError: naming the option, what was given, what is wrong and what is allowed.
    """
    from verispec.processors.grammar import grammar_error, grammar_text

    allowed = STRUCTURE_ALLOWED[option]
    if not text or (option != "--regex" and not text.strip()):  # (a regex may be a space)
        raise ConfigError(f"`{option}` {given!r} is empty; it must be {allowed}.")
    if option == "--json-schema":
        try:
            schema = json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigError(
                f"`{option}` {given!r} is not JSON ({error}); it must be {allowed}."
            ) from None
        if not isinstance(schema, dict | bool):
            kind = {list: "an array", str: "a string", type(None): "null"}.get(
                type(schema), "a number"
            )
            raise ConfigError(f"`{option}` {given!r} holds {kind}; it must be {allowed}.")
        grammar = grammar_text(json_schema=text)
    elif option == "--regex":
        grammar = grammar_text(regex=text)
    else:
        grammar = grammar_text(grammar=text)
    reason = grammar_error(grammar)
    if reason is not None:
        if option == "--regex":  # its place is in llguidance's grammar around the regex
            reason = reason.rpartition("regex parse error: ")[2]
        raise ConfigError(f"`{option}` {given!r} does not compile: {reason}; it must be {allowed}.")


def bench_config(args: argparse.Namespace, **extra: Any) -> Any:
    """The generation settings of the command line, checked (ConfigError names the option)."""
    from verispec.bench.runner import BenchConfig

    generation = [name for name, flag in FLAGS.items() if flag.group == "generation"]
    try:
        return BenchConfig(
            **{name: getattr(args, name) for name in generation},
            chat=args.chat,
            verifier=args.verifier,
            **extra,
        )
    except ConfigError as exc:  # name the option, not the field
        text = str(exc)
        for field in generation:
            text = text.replace(f"`{field}`", f"`--{field.replace('_', '-')}`")
        raise ConfigError(text) from None

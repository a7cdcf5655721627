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
``--limit 0``, ``--device cuda`` without CUDA, an output directory that cannot be
written...) print one line on stderr and exit with status 2 before the model
loads; no traceback. Report files are written atomically, and only after the run
succeeds; ``bench`` also appends every finished answer to a records file as it
goes (``--records``, by default beside ``--json``), from which ``--resume``
continues a run that was killed.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any

from verispec.core.types import SEED_LIMIT
from verispec.core.validate import bounds, in_bounds, interval
from verispec.errors import ConfigError
from verispec.kernels.backend import KERNEL_CHOICES
from verispec.models.default import DTYPES, RUNTIMES
from verispec.models.runtime import WEIGHTS

__all__ = ["DEFAULT_LIMIT", "DEFAULT_METHODS", "build_parser", "main"]

# The default run: 8 methods x 8 answers (the shipped prompts, one per category) took 4.4 min
# on the 2-core CPU this is built on, one thread, nothing else running; the llama-cpp peers are
# skipped (with a message) where llama-cpp-python is not installed.
DEFAULT_METHODS = "ar,hf,hf-pld,pld,tr,dtr,llama-cpp,llama-cpp-pld"
DEFAULT_LIMIT = 1  # questions per category
DEFAULT_BENCH_THREADS = 1  # the benchmark's figures of record are single-threaded


def _int_arg(low: int, below: int | None = None, high: int | None = None) -> Callable[[str], int]:
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


_positive_int, _non_negative_int, _seed = _int_arg(1), _int_arg(0), _int_arg(0, SEED_LIMIT)
# at most one torch thread per CPU core of this machine: more only make the threads wait
_threads = _int_arg(1, high=os.cpu_count() or 1)


def _number(low: float, high: float, closed: Any) -> Callable[[str], float]:
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


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors on one line (status 2), like verispec's own errors."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _model_options(parser: argparse.ArgumentParser, threads: int | None = None) -> None:
    group = parser.add_argument_group("model")
    _model_source_options(group)
    group.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float32",
        help="weight dtype (default float32); auto: bfloat16 where the CPU multiplies it "
        "natively (AVX-512 BF16, AMX) or on CUDA, float32 elsewhere",
    )
    group.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default="auto",
        help="what runs the target: fast = verispec's own Llama-family forward (prepacked "
        "weights, static KV cache); hf = the Hugging Face adapter (the reference); auto "
        "(default) = fast where it covers the model",
    )
    group.add_argument(
        "--weights",
        choices=WEIGHTS,
        default="auto",
        help="how the fast runtime's CPU products read float32 weights: auto (default) = "
        "GGUF Q4_1/Q8_0 blocks where the weights are exactly such blocks (the embedded "
        "SmolLM2: the same model at a sixth of the bytes), else dense; blocks = that or an "
        "error; dense = float32 matrices (oneDNN); q4_1 = round to 4-bit blocks first (a "
        "different model, as llama.cpp's Q4_1 files)",
    )
    group.add_argument(
        "--compile",
        action="store_true",
        help="compile the fast runtime's forward once per tree-size bucket (torch.compile; "
        "minutes on a small CPU, cached on disk; done before any timing and reported)",
    )

    group.add_argument(
        "--device",
        default="auto",
        metavar="DEVICE",
        help="cpu, cuda, cuda:1... (default: cuda if available)",
    )
    group.add_argument(
        "--threads",
        type=_threads,
        default=threads,
        metavar="N",
        help=f"CPU threads for torch (default: {threads})"
        if threads
        else "CPU threads for torch (default: torch's own choice, all cores)",
    )


_BUILTIN_MODELS = ("smollm2", "tiny")


def _model_source_options(group: Any) -> None:
    """``--model``, ``--tokenizer`` and ``--draft-model``."""
    group.add_argument(
        "--model",
        default="smollm2",
        metavar="MODEL",
        help="smollm2: the embedded SmolLM2-135M-Instruct (default); tiny: a random "
        "4-layer Llama with a byte tokenizer, to check the pipeline in seconds; or a local "
        "transformers model directory (save_pretrained) or a .gguf file",
    )
    group.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="the tokenizer's directory, when --model's directory has none (a GGUF file "
        "carries its own)",
    )
    group.add_argument(
        "--draft-model",
        metavar="PATH",
        help="a model directory or .gguf file for the draft-model methods (chain, "
        "specinfer, dyspec, rsdc, rsds) instead of the target's self-draft; it must share "
        "the target's vocabulary",
    )


def _check_model_source(args: argparse.Namespace) -> None:
    """``--model``, ``--tokenizer`` and ``--draft-model`` name what exists (before loading)."""
    from verispec.errors import ConfigError
    from verispec.models.loading import model_source

    if args.model not in _BUILTIN_MODELS:
        model_source(args.model)
    elif args.tokenizer is not None:
        raise ConfigError(
            f"`--tokenizer` goes with a model directory or GGUF file; `--model {args.model}` "
            "has its own tokenizer."
        )
    if args.draft_model is not None:
        model_source(args.draft_model)


def _load_model_source(
    args: argparse.Namespace, dtype: Any, device: str, keep_source: bool
) -> tuple[Any, Any]:
    """The target and its tokenizer from ``--model`` (and ``--tokenizer``), on ``--runtime``."""
    options = {
        "dtype": dtype,
        "device": device,
        "runtime": args.runtime,
        "compile": args.compile,
        "keep_source": keep_source,
        "weights": args.weights,
    }
    if args.model == "tiny":
        from verispec.models.tiny import load_smoke_model

        return load_smoke_model(**options)
    if args.model == "smollm2":
        from verispec.models.default import load_default_model

        return load_default_model(**options)
    from verispec.models.loading import load_model

    return load_model(args.model, tokenizer=args.tokenizer, **options)


def _load_draft_model(args: argparse.Namespace, target: Any, tokenizer: Any) -> Any:
    """``--draft-model``, loaded like the target and checked against its vocabulary."""
    if args.draft_model is None:
        return None
    from verispec.errors import IncompatibleModelsError
    from verispec.models.loading import load_model
    from verispec.models.self_draft import check_compatible

    draft, draft_tokenizer = load_model(
        args.draft_model, dtype=target.dtype, device=target.device, runtime=args.runtime
    )
    check_compatible(target, draft)
    vocab = getattr(tokenizer, "get_vocab", None)
    draft_vocab = getattr(draft_tokenizer, "get_vocab", None)
    if vocab is not None and draft_vocab is not None and vocab() != draft_vocab():
        raise IncompatibleModelsError(
            f"the draft model's tokenizer (`{args.draft_model}`) maps tokens to ids "
            "differently from the target's; a draft must use the target's tokenizer."
        )
    print(f"verispec: draft model: {args.draft_model} ({draft.runtime_note})", file=sys.stderr)
    return draft


def _gguf_of(args: argparse.Namespace) -> str | None:
    """The GGUF file the target comes from (for the llama-cpp peers), if any."""
    if args.model == "smollm2":
        from verispec.models.gguf import embedded_gguf

        return str(embedded_gguf())
    if args.model not in _BUILTIN_MODELS and args.model.lower().endswith(".gguf"):
        return args.model
    return None


def _kernel_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kernels",
        choices=KERNEL_CHOICES,
        default="auto",
        help="implementation of tree attention, verification, Token Recycling's updates and "
        "KV compaction: auto = the Triton kernels on CUDA, PyTorch elsewhere (default); "
        "triton = always the kernels (needs CUDA); torch = always PyTorch",
    )


def _kernel_scope(args: argparse.Namespace) -> Any:
    """``use_backend(args.kernels)``, after checking the kernels can run on ``--device``."""
    import torch

    from verispec.kernels.backend import require_triton, use_backend

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    require_triton(args.kernels, "--kernels triton", device)
    return use_backend(args.kernels)


def _defaults() -> dict[str, Any]:
    """GenerationConfig's defaults: the flags' defaults are read from them, not retyped."""
    import attrs

    from verispec.core.types import GenerationConfig

    return {field.name: field.default for field in attrs.fields(GenerationConfig)}


def _generation_options(parser: argparse.ArgumentParser, max_new: int) -> None:
    default = _defaults()
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
        type=_number(0.0, math.inf, "low"),
        default=default["temperature"],
        metavar="T",
        help=f"0 = greedy; > 0 samples (default {default['temperature']:g})",
    )
    group.add_argument(
        "--top-k",
        type=_non_negative_int,
        default=default["top_k"],
        metavar="K",
        help=f"sample from the K most likely tokens, 0: all (default {default['top_k']})",
    )
    group.add_argument(
        "--top-p",
        type=_number(0.0, 1.0, "high"),
        default=default["top_p"],
        metavar="P",
        help="sample from the smallest set of tokens with mass >= P, 1: all "
        f"(default {default['top_p']:g})",
    )
    group.add_argument(
        "--min-p",
        type=_number(0.0, 1.0, "low"),
        default=default["min_p"],
        metavar="P",
        help=f"drop tokens below P times the most likely one, 0: none (default "
        f"{default['min_p']:g})",
    )
    group.add_argument(
        "--seed",
        type=_seed,
        default=default["seed"],
        metavar="S",
        help=f"seed of every random draw, {bounds(0, below=SEED_LIMIT)} (default "
        f"{default['seed']}); with the default verifier, methods whose drafts are fixed "
        "candidates (ar, pld, tr, dtr) give the same text for the same seed",
    )
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


def _processing_options(parser: argparse.ArgumentParser) -> None:
    default = _defaults()
    group = parser.add_argument_group(
        "logits processing and structured output (applied to every tree node)"
    )
    group.add_argument(
        "--repetition-penalty",
        type=_number(0.0, math.inf, "low"),
        default=default["repetition_penalty"],
        metavar="X",
        help=f"transformers' repetition penalty, 1: none (default "
        f"{default['repetition_penalty']:g})",
    )
    group.add_argument(
        "--no-repeat-ngram-size",
        type=_non_negative_int,
        default=default["no_repeat_ngram_size"],
        metavar="N",
        help="never repeat an n-gram of this size, 0: off (default "
        f"{default['no_repeat_ngram_size']})",
    )
    exclusive = group.add_mutually_exclusive_group()
    exclusive.add_argument(
        "--json-schema", metavar="PATH", help="the answer follows this JSON schema (a file)"
    )
    exclusive.add_argument("--regex", metavar="R", help="the answer matches this regex")
    exclusive.add_argument(
        "--grammar", metavar="PATH", help="the answer follows this Lark grammar (a file)"
    )


def _processing(args: argparse.Namespace) -> dict[str, Any]:
    """The GenerationConfig fields of the processing options (files read here)."""
    from verispec.errors import ConfigError

    def read(option: str, path: str | None) -> str | None:
        if path is None:
            return None
        try:
            with open(path, encoding="utf-8") as handle:
                return handle.read()
        except OSError as error:
            raise ConfigError(f"`{option}` {path!r} cannot be read: {error.strerror}.") from None

    return {
        "repetition_penalty": args.repetition_penalty,
        "no_repeat_ngram_size": args.no_repeat_ngram_size,
        "json_schema": read("--json-schema", args.json_schema),
        "regex": args.regex,
        "grammar": read("--grammar", args.grammar),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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
    bench.add_argument(
        "--records",
        metavar="PATH",
        help="append every finished answer to this JSON Lines file as it is produced "
        "(default: beside --json, e.g. out.records.jsonl)",
    )
    bench.add_argument(
        "--resume",
        action="store_true",
        help="keep the answers already in the records file (of an interrupted run with "
        "the same settings) and generate only the others",
    )
    bench.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar, and no notices of long waits (conversion, latency tables, "
        "compilation)",
    )
    _generation_options(bench, 128)
    _model_options(bench, threads=DEFAULT_BENCH_THREADS)
    _kernel_option(bench)

    generate = commands.add_parser(
        "generate",
        help="answer one prompt with one method and print its statistics",
        description="Answer one prompt and print the answer, then tokens/s, steps, mean "
        "accepted tokens per step (MAT) and the draft/target/verify time split.",
    )
    generate.add_argument("--method", default="tr", metavar="SPEC", help="(default tr)")
    generate.add_argument("--prompt", required=True, help="the user prompt")
    generate.add_argument(
        "--no-progress",
        action="store_true",
        help="no notices of long waits (conversion, latency tables, compilation)",
    )
    _generation_options(generate, 128)
    _processing_options(generate)
    generate.add_argument(
        "--json",
        metavar="PATH",
        help="also write the answer and its per-request figures (vLLM's spec-decode metric "
        "names where they match) to this JSON file",
    )
    _model_options(generate)
    _kernel_option(generate)

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


def _device(text: str) -> str:
    """The device ``--device`` names, checked to exist here (``auto``: cuda if available)."""
    import torch

    from verispec.errors import ConfigError

    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"`--device` must be auto, cpu, cuda, cuda:N or mps; got {text!r}.")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(
                f"`--device {text}` needs CUDA, which this torch ({torch.__version__}) "
                "cannot use here; use --device cpu."
            )
        if device.index is not None and device.index >= count:
            raise ConfigError(
                f"`--device` must name one of the {count} CUDA device(s) (cuda:0.."
                f"cuda:{count - 1}); got {text!r}."
            )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(
            "`--device mps` needs Apple's Metal backend, which is not available here."
        )
    return text


def _load(args: argparse.Namespace, specs: Sequence[Any]) -> tuple[Any, Any]:
    """The target and its tokenizer; the runtime keeps the transformers model only when
    one of ``specs`` runs it (the ``hf`` peers), else its weights are freed."""
    import torch

    from verispec.bench.methods import METHODS

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = _device(args.device)
    from verispec.models.runtime import default_dtype

    dtype = default_dtype(device) if args.dtype == "auto" else getattr(torch, args.dtype)
    keep_source = any(METHODS[spec.name].runs_source for spec in specs)
    model, tokenizer = _load_model_source(args, dtype, device, keep_source)
    print(
        f"verispec: target: {model.runtime_note}; {torch.get_num_threads()} CPU thread(s)",
        file=sys.stderr,
    )
    warm_up = getattr(model, "warm_up", None)
    if warm_up is not None and getattr(model, "runtime", "eager").split("+")[0] != "eager":
        print(
            f"verispec: building the {model.runtime} forward for every bucket...", file=sys.stderr
        )
        print(f"verispec: built in {warm_up():.1f} s (not timed)", file=sys.stderr)
    return model, tokenizer


def _context(
    args: argparse.Namespace, model: Any, tokenizer: Any, verifier: str = "default"
) -> Any:
    """The benchmark context: the target, the verifier choice, ``--draft-model``, the GGUF file."""
    from verispec.bench.runner import make_context

    draft = _load_draft_model(args, model, tokenizer)
    return make_context(model, tokenizer, verifier, draft_model=draft, gguf=_gguf_of(args))


_OUTPUTS = ("json", "markdown", "plot", "mat_plot")


def _check_outputs(args: argparse.Namespace) -> dict[str, Any]:
    """The output paths given, each checked writable now (before any long work)."""
    from verispec.bench.records import check_writable
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
        from verispec.bench.report import identical_note

        print(f"\nidentical: answers {identical_note(report)}")


def _write_outputs(
    outputs: dict[str, Any], report: Any, machine: Any = None, command: Any = None
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


def _bench_config(args: argparse.Namespace, **extra: Any) -> Any:
    """The generation settings of the command line, checked (ConfigError names the option)."""
    from verispec.bench.runner import BenchConfig
    from verispec.errors import ConfigError

    try:
        return BenchConfig(
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            seed=args.seed,
            chat=args.chat,
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
            verifier=args.verifier,
            **extra,
        )
    except ConfigError as exc:  # name the option, not the field
        text = str(exc)
        for field in ("max_new_tokens", "temperature", "seed", "top_k", "top_p", "min_p"):
            text = text.replace(f"`{field}`", f"`--{field.replace('_', '-')}`")
        raise ConfigError(text) from None


# -- commands -------------------------------------------------------------------------


def _cmd_methods(args: argparse.Namespace) -> int:
    from verispec.bench.methods import METHODS

    for entry in METHODS.values():
        reason = entry.availability()
        status = "" if reason is None else f"  [not available: {reason}]"
        print(f"{entry.name:<14}{entry.summary}{status}")
        for param in entry.params:
            print(f"{'':<16}{param.describe()}")
    return 0


def _bench_specs(args: argparse.Namespace) -> tuple[list[Any], list[str]]:
    """The methods to run, and a note for each optional peer skipped (printed by the
    caller once every other argument has been checked, so an error comes first)."""
    from verispec.bench.methods import METHODS
    from verispec.bench.runner import check_available
    from verispec.specs import parse_methods

    texts = args.methods or [DEFAULT_METHODS]
    if [t.strip() for t in texts] == ["all"]:
        specs, notes = [], []
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


def _skip_optional(specs: list[Any], reason_of: Any) -> tuple[list[Any], list[str]]:
    """``specs`` without the optional peers (``MethodEntry.extra``) that cannot run here,
    and a note naming each one skipped; ``reason_of(spec)`` says why one cannot (or
    ``None``)."""
    from verispec.bench.methods import METHODS

    kept, notes = [], []
    for spec in specs:
        reason = reason_of(spec) if METHODS[spec.name].extra is not None else None
        if reason is None:
            kept.append(spec)
        else:
            notes.append(f"verispec: skipping `{spec.label}`: {reason}")
    if not kept:
        from verispec.errors import ConfigError

        raise ConfigError("no method left to run: every one requested was skipped.")
    return kept, notes


def _bench_runners(context: Any, specs: list[Any]) -> tuple[list[Any], dict[str, Any]]:
    """A runner per spec; an optional peer that cannot run with this model is skipped."""
    from verispec.bench.methods import METHODS
    from verispec.errors import ConfigError

    runners: dict[str, Any] = {}

    def build(spec: Any) -> str | None:
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


def _cmd_bench(args: argparse.Namespace, argv: Sequence[str]) -> int:
    import torch

    from verispec.bench.prompts import load_questions, select_questions, shipped_questions
    from verispec.bench.records import machine_info
    from verispec.bench.report import summarise
    from verispec.bench.runner import run_bench
    from verispec.errors import ConfigError

    # 1. everything a user can get wrong, before the model loads
    specs, skipped = _bench_specs(args)
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"`--limit` must be >= 1 (questions per category); got {args.limit}.")
    limit = args.limit if args.limit is not None else DEFAULT_LIMIT
    questions = load_questions(args.questions) if args.questions else shipped_questions()
    categories = [c.strip() for c in args.categories.split(",")] if args.categories else None
    questions = select_questions(
        questions, limit=limit, categories=categories, max_turns=args.turns
    )
    config = _bench_config(args, warmup=args.warmup, carry_corpus=args.carry_corpus)
    device = _device(args.device)
    outputs = _check_outputs(args)
    kernels = _kernel_scope(args)
    log = _records(args, config, specs, questions, device)
    _check_model_source(args)
    for note in skipped:  # every argument is good: now say what will not run
        print(note, file=sys.stderr)

    # 2. load and run
    model, tokenizer = _load(args, specs)
    context = _context(args, model, tokenizer, config.verifier)
    with kernels:  # one scope for building the runners and running them
        specs, runners = _bench_runners(context, specs)
        answers = len(specs) * sum(len(q.turns) for q in questions)
        print(
            f"verispec bench: {len(specs)} methods x {len(questions)} questions "
            f"({answers} answers), max {config.max_new_tokens} new tokens, "
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
    command = "verispec " + shlex.join(a for a in argv if a != "--resume")
    _show_report(report, args.per_category)
    _write_outputs(outputs, report, machine, command)
    return 0


def _peer_notes(context: Any, specs: list[Any]) -> dict[str, str]:
    """What a reader of the table must know about the peers that ran (llama.cpp's weights)."""
    if not any(spec.name.startswith("llama-cpp") for spec in specs):
        return {}
    from importlib.metadata import version
    from pathlib import Path

    note = (
        f"llama-cpp-python {version('llama_cpp_python')} runs {Path(context.gguf).name} with the "
        "file's own quantized weights, the other methods its dequantized weights: llama-cpp "
        "outputs are not expected to be identical"
    )
    print(f"verispec: note: {note}", file=sys.stderr)
    return {"llama_cpp": note}


def _untimed_setup(model: Any, runners: dict[str, Any]) -> dict[str, float]:
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
    args: argparse.Namespace, config: Any, specs: list[Any], questions: list[Any], device: str
) -> Any:
    """The run's records file (checked writable, earlier answers loaded), or None."""
    from verispec.bench.records import (
        RecordLog,
        check_writable,
        default_records_path,
        records_header,
    )
    from verispec.errors import ConfigError

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
    }
    return RecordLog(path, records_header(config, specs, questions, setup), resume=args.resume)


def _cmd_report(args: argparse.Namespace) -> int:
    import warnings

    from verispec.bench.report import load_report, merge_reports

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
    import attrs

    from verispec.bench.methods import METHODS
    from verispec.bench.prompts import build_prompt_ids
    from verispec.bench.runner import build_runners, check_available
    from verispec.core.types import GenerationConfig
    from verispec.errors import ConfigError
    from verispec.specs import parse_methods

    specs = parse_methods(args.method, METHODS)
    if len(specs) != 1:
        raise ConfigError(f"`--method` takes one method spec; got {len(specs)}.")
    if not args.prompt.strip():
        raise ConfigError("`--prompt` must not be empty.")
    config = _bench_config(args)
    processing = _processing(args)
    GenerationConfig(**processing)  # bad settings fail before the model loads
    _device(args.device)
    check_available(specs)
    kernels = _kernel_scope(args)
    _check_model_source(args)
    model, tokenizer = _load(args, specs)
    context = _context(args, model, tokenizer, config.verifier)
    ids = build_prompt_ids(tokenizer, [{"role": "user", "content": args.prompt}], chat=args.chat)
    with kernels:
        runner = build_runners(context, specs)[specs[0].label]
        generation = attrs.evolve(config.generation(context.eos_token_ids), **processing)
        result = runner.run(ids, generation)
    print(result.text)
    print()
    print(_generate_stats(specs[0].label, result, len(ids)))
    if args.json:
        import json

        engine_result = getattr(runner, "last_result", None)
        record = {
            "method": specs[0].label,
            "text": result.text,
            "tokens": list(result.tokens),
            "prompt_tokens": len(ids),
            "finish_reason": result.finish_reason,
            "seconds": result.seconds,
            "spec_decode": engine_result.spec_decode_metrics() if engine_result else None,
        }
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=2)
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
    from verispec.core.notices import set_notices
    from verispec.errors import VerispecError

    set_notices(not getattr(args, "no_progress", False))
    try:
        if args.command == "methods":
            return _cmd_methods(args)
        if args.command == "bench":
            return _cmd_bench(args, argv)
        if args.command == "report":
            return _cmd_report(args)
        return _cmd_generate(args)
    except (VerispecError, OSError) as exc:  # OSError: files, permissions, a full disk
        print(f"verispec {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"verispec {args.command}: interrupted; nothing written.", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

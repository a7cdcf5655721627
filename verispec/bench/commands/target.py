"""The model a command runs: the ``model`` flags and ``--kernels``, checked, then loaded.

``verispec bench`` and ``verispec generate`` share them: :func:`add_model_options` and
:func:`add_kernel_option` declare the flags; :func:`device`, :func:`check_model_source`
and :func:`kernel_scope` check them before anything loads (an error a user can fix is a
:class:`~verispec.errors.ConfigError`); :func:`load` loads the target and :func:`context`
the benchmark context around it (``--draft-model`` included).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from verispec.bench.commands.flags import add_threads_option
from verispec.bench.runner import BenchContext
from verispec.errors import ConfigError
from verispec.kernels.backend import KERNEL_CHOICES
from verispec.models.accelerators.blocks import ARITHMETICS
from verispec.models.default import DTYPES, RUNTIMES
from verispec.models.runtime import WEIGHTS

__all__ = [
    "add_kernel_option",
    "add_model_options",
    "check_model_source",
    "context",
    "device",
    "frozen_heap",
    "gguf_of",
    "kernel_scope",
    "load",
]

BUILTIN_MODELS = ("smollm2", "tiny")


def add_model_options(parser: argparse.ArgumentParser, threads: int | None = None) -> None:
    """The ``model`` group; ``threads`` is ``--threads``' default (None: torch's own)."""
    group = parser.add_argument_group("model")
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
    group.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float32",
        help="weight dtype (default float32); auto: float32 where the weights are a GGUF "
        "file's blocks the CPU kernel reads (the embedded model), else bfloat16 where the "
        "CPU multiplies it natively (AVX-512 BF16, AMX) or on CUDA, float32 elsewhere",
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
        "GGUF Q4_1/Q4_0/Q8_0 blocks where the weights are exactly such blocks (the embedded "
        "SmolLM2: the same model at a sixth of the bytes), else dense; blocks = that or an "
        "error; dense = float32 matrices (oneDNN); q4_1 = round to 4-bit blocks first (a "
        "different model, as llama.cpp's Q4_1 files)",
    )
    group.add_argument(
        "--arithmetic",
        choices=ARITHMETICS,
        default="exact",
        help="how the fast runtime's CPU block products multiply: exact (default) = float32 "
        "products of the widened weights, the model unchanged; int8 = the weights' codes "
        "times 8-bit codes of the activations in integer instructions, as llama.cpp does "
        "(a different model; every method's answers equal its own ar's)",
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
    add_threads_option(group, threads)


def add_kernel_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kernels",
        choices=KERNEL_CHOICES,
        default="auto",
        help="implementation of tree attention, verification, Token Recycling's updates and "
        "KV compaction: auto = the Triton kernels on CUDA, PyTorch elsewhere (default); "
        "triton = always the kernels (needs CUDA); torch = always PyTorch",
    )


# -- checks, before anything loads -----------------------------------------------------


def device(text: str) -> str:
    """The device ``--device`` names, checked to exist here (``auto``: cuda if available)."""
    import torch

    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        found = torch.device(text)
    except (RuntimeError, ValueError):
        found = None
    if found is None or found.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"`--device` must be auto, cpu, cuda, cuda:N or mps; got {text!r}.")
    if found.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(
                f"`--device {text}` needs CUDA, which this torch ({torch.__version__}) "
                "cannot use here; use --device cpu."
            )
        if found.index is not None and found.index >= count:
            raise ConfigError(
                f"`--device` must name one of the {count} CUDA device(s) (cuda:0.."
                f"cuda:{count - 1}); got {text!r}."
            )
    if found.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(
            "`--device mps` needs Apple's Metal backend, which is not available here."
        )
    return text


def check_model_source(args: argparse.Namespace) -> None:
    """``--model``, ``--tokenizer`` and ``--draft-model`` name what exists, and a GGUF file
    not converted yet holds what it declares (before loading)."""
    from verispec.models.loading import check_model

    if args.model not in BUILTIN_MODELS:
        check_model(args.model)
    elif args.tokenizer is not None:
        raise ConfigError(
            f"`--tokenizer` goes with a model directory or GGUF file; `--model {args.model}` "
            "has its own tokenizer."
        )
    if args.draft_model is not None:
        check_model(args.draft_model)
    check_arithmetic(args)


def check_arithmetic(args: argparse.Namespace) -> None:
    """``--arithmetic int8`` with options it can run on (the fast runtime, float32 or auto,
    block weights, a CPU), before anything loads."""
    if args.arithmetic != "int8":
        return
    clashes = [
        f"{flag} {value}"
        for flag, value, allowed in (
            ("--runtime", args.runtime, ("auto", "fast")),
            ("--dtype", args.dtype, ("float32", "auto")),
            ("--weights", args.weights, ("auto", "blocks", "q4_1")),
        )
        if value not in allowed
    ]
    if args.device not in ("auto", "cpu"):
        clashes.append(f"--device {args.device}")
    if clashes:
        raise ConfigError(
            f"`--arithmetic int8` runs on the fast runtime's CPU kernels in float32 with block "
            f"weights; got {', '.join(clashes)}."
        )


def kernel_scope(args: argparse.Namespace) -> AbstractContextManager[Any]:
    """``use_backend(args.kernels)``, after checking the kernels can run on ``--device``."""
    import torch

    from verispec.kernels.backend import require_triton, use_backend

    where = args.device
    if where == "auto":
        where = "cuda" if torch.cuda.is_available() else "cpu"
    require_triton(args.kernels, "--kernels triton", where)
    return use_backend(args.kernels)  # type: ignore[no-any-return]


# -- loading ---------------------------------------------------------------------------


def load(args: argparse.Namespace, specs: Sequence[Any]) -> tuple[Any, Any]:
    """The target and its tokenizer; the runtime keeps the transformers model only when
    one of ``specs`` runs it (the ``hf`` peers), else its weights are freed."""
    import torch

    from verispec.bench.methods import METHODS

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    where = device(args.device)
    dtype = "auto" if args.dtype == "auto" else getattr(torch, args.dtype)  # models decide
    keep_source = any(METHODS[spec.name].runs_source for spec in specs)
    model, tokenizer = _load_model_source(args, dtype, where, keep_source)
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


def _load_model_source(
    args: argparse.Namespace, dtype: Any, where: str, keep_source: bool
) -> tuple[Any, Any]:
    """The target and its tokenizer from ``--model`` (and ``--tokenizer``), on ``--runtime``."""
    options = {
        "dtype": dtype,
        "device": where,
        "runtime": args.runtime,
        "compile": args.compile,
        "keep_source": keep_source,
        "weights": args.weights,
        "arithmetic": args.arithmetic,
    }
    if args.model == "tiny":
        from verispec.models.tiny import load_smoke_model

        return load_smoke_model(**options)
    if args.model == "smollm2":
        from verispec.models.default import load_default_model

        return load_default_model(**options)
    from verispec.models.loading import load_model

    return load_model(args.model, tokenizer=args.tokenizer, **options)


def context(
    args: argparse.Namespace, model: Any, tokenizer: Any, verifier: str = "default"
) -> BenchContext:
    """The benchmark context: the target, the verifier choice, ``--draft-model``, the GGUF file."""
    from verispec.bench.runner import make_context

    draft = _load_draft_model(args, model, tokenizer)
    return make_context(model, tokenizer, verifier, draft_model=draft, gguf=gguf_of(args))


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


def gguf_of(args: argparse.Namespace) -> str | None:
    """The GGUF file the target comes from (for the llama-cpp peers), if any."""
    if args.model == "smollm2":
        from verispec.models.gguf import embedded_gguf

        return str(embedded_gguf())
    if args.model not in BUILTIN_MODELS and args.model.lower().endswith(".gguf"):
        return args.model
    return None


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """While a command decodes: every object alive on entry (the models, drafters, peers,
    tokenizer) out of the cyclic garbage collector's view (:func:`gc.freeze`), given back on
    exit (:func:`gc.unfreeze`). Loading leaves hundreds of thousands of objects that live as
    long as the command (torch's, transformers', the tokenizer's), and every full collection
    would walk them all in the middle of some method's step (docs/benchmarks.rst, "How it
    measures", has the cost). What decoding allocates is collected as before.
    A process that already holds frozen objects manages them itself: nothing is done then."""
    if gc.get_freeze_count():
        yield
        return
    gc.collect()  # what loading left as garbage is freed first, not frozen
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()

"""The benchmark's methods: verispec's drafters, run in its engine, and the peers users
would pick (the table is in docs/benchmarks.rst, "Method specs"; ``verispec methods``
prints it).

The drafters and their parameters are :data:`verispec.specs.DRAFTERS` (each read from
the drafter's options class); a :class:`BenchMethod` adds how the benchmark runs a
method: a drafter in :class:`~verispec.bench.runner.EngineRunner`, a peer in its own
runner. Only the peers' parameters are declared here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from verispec.bench import runner
from verispec.bench.runner import (
    BenchContext,
    EngineRunner,
    HFRunner,
    LlamaCppRunner,
    MethodRunner,
)
from verispec.errors import ConfigError
from verispec.specs import DRAFTERS, MethodEntry, MethodSpec, Param

__all__ = ["METHODS", "BenchMethod", "build_runners", "check_available"]


@attrs.frozen(kw_only=True)
class BenchMethod(MethodEntry):
    """A :class:`~verispec.specs.MethodEntry` the benchmark can run.

    Attributes:
        build: ``build(context, params) -> runner``, called once the model is loaded;
            ``params`` holds every parameter, defaults filled in.
        extra: the pip extra of an optional peer (``"llamacpp"``): the benchmark skips
            such a method, saying why, where it cannot run.
        runs_source: the method runs the transformers model itself (the ``hf`` peers),
            so the fast runtime must keep it (``keep_source``).
    """

    build: Callable[[Any, dict[str, Any]], Any]
    extra: str | None = None
    runs_source: bool = False


def _in_engine(entry: MethodEntry) -> BenchMethod:
    """A verispec drafter, run in verispec's engine (a draft-model method with the
    context's ``draft_model``, else a self-draft)."""
    make = entry.drafter
    assert make is not None

    def build(context: BenchContext, params: dict[str, Any]) -> EngineRunner:
        draft = context.draft_model if entry.uses_draft_model else None
        return EngineRunner(context, make(context.target, params, draft))

    return BenchMethod(**attrs.asdict(entry, recurse=False), build=build)


def _peer(
    name: str, summary: str, params: tuple[Param, ...], build: Any, **more: Any
) -> BenchMethod:
    """A peer: a method with its own runner (``build``), no verispec drafter."""
    return BenchMethod(name=name, summary=summary, params=params, build=build, **more)


def _early_exit_available() -> str | None:
    import transformers

    if not hasattr(transformers.GenerationConfig(), "assistant_early_exit"):
        return (
            f"transformers {transformers.__version__} has no `assistant_early_exit` "
            "(added in 4.47)."
        )
    return None


def _hf_assist_ee(context: BenchContext, params: dict[str, Any]) -> HFRunner:
    reason = _early_exit_available()
    if reason is not None:
        raise ConfigError(f"method `hf-assist-ee` is not available: {reason}")
    layers = getattr(getattr(context.hf_model, "config", None), "num_hidden_layers", None)
    if layers is not None and params["layers"] >= layers:
        raise ConfigError(
            f"`hf-assist-ee:layers` must be below the model's {layers} layers; "
            f"got {params['layers']}."
        )
    extra: dict[str, Any] = {"assistant_early_exit": params["layers"]}
    if params["tokens"] is not None:
        extra.update(
            num_assistant_tokens=params["tokens"], num_assistant_tokens_schedule="constant"
        )
    return HFRunner(context, extra, drafts="forwards")


def _lookup_params(tokens: str, ngram: str) -> tuple[Param, ...]:
    """A prompt-lookup peer's parameters; the help names the peer's own keyword."""
    return (Param("tokens", int, 10, tokens, 1), Param("ngram", int, 2, ngram, 1))


def _llama_cpp_available() -> str | None:
    return runner.llama_cpp_available()  # looked up when called: tests replace it


def _hf(extra: Callable[[dict[str, Any]], dict[str, Any]] | None = None, **options: Any) -> Any:
    """A ``generate`` peer: keyword arguments from the spec's parameters, runner options."""
    return lambda context, params: HFRunner(context, extra(params) if extra else {}, **options)


def _entries() -> list[BenchMethod]:
    drafters = [_in_engine(entry) for entry in DRAFTERS.values()]
    return [
        drafters[0],  # ar
        _peer(
            "hf", "transformers generate (greedy at T=0), same model", (), _hf(), runs_source=True
        ),
        _peer(
            "hf-static",
            "transformers generate with its static cache and torch.compile (its fastest "
            "greedy path; compile time untimed and reported)",
            (),
            _hf(static_cache=True),
            runs_source=True,
        ),
        _peer(
            "hf-pld",
            "transformers generate with prompt lookup decoding",
            _lookup_params("prompt_lookup_num_tokens", "max_matching_ngram_size"),
            _hf(
                lambda p: {
                    "prompt_lookup_num_tokens": p["tokens"],
                    "max_matching_ngram_size": p["ngram"],
                },
                drafts="opaque",
            ),
            runs_source=True,
        ),
        _peer(
            "hf-assist-ee",
            "transformers generate, assistant_early_exit self-speculation",
            (
                Param("layers", int, 8, "assistant_early_exit: layers the draft runs", 1),
                Param("tokens", int, None, "num_assistant_tokens (constant schedule)", 1),
            ),
            _hf_assist_ee,
            availability=_early_exit_available,
            runs_source=True,
        ),
        *drafters[1:],
        _peer(
            "llama-cpp",
            "llama.cpp (llama-cpp-python) on the same GGUF file (its own quantized weights), "
            "same prompt ids and threads",
            (),
            lambda context, params: LlamaCppRunner(context),
            availability=_llama_cpp_available,
            extra="llamacpp",
        ),
        _peer(
            "llama-cpp-pld",
            "llama.cpp with its prompt-lookup drafting (LlamaPromptLookupDecoding)",
            _lookup_params("num_pred_tokens", "max_ngram_size"),
            lambda context, p: LlamaCppRunner(context, prompt_lookup=(p["ngram"], p["tokens"])),
            availability=_llama_cpp_available,
            extra="llamacpp",
        ),
    ]


METHODS: dict[str, BenchMethod] = {entry.name: entry for entry in _entries()}


def check_available(specs: Sequence[MethodSpec]) -> None:
    """Raise :class:`ConfigError` listing every method that cannot run here."""
    reasons = {spec.label: METHODS[spec.name].availability() for spec in specs}
    problems = [f"`{label}`: {reason}" for label, reason in reasons.items() if reason]
    if problems:
        raise ConfigError("method(s) not available in this installation: " + "; ".join(problems))


def build_runners(context: BenchContext, specs: Sequence[MethodSpec]) -> dict[str, MethodRunner]:
    """One runner per spec, keyed by the spec's label."""
    check_available(specs)
    return {spec.label: METHODS[spec.name].build(context, spec.params) for spec in specs}

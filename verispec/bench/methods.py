"""The benchmark's methods: every drafter in the library and the peers users would pick.

Each entry maps a spec name to typed parameters and a factory (see
:mod:`verispec.bench.registry`). The parameters of verispec's drafters are their
options (``TokenRecyclingOptions``, ``DySpecOptions``...: type, check, default, help,
written once in the drafter's module); only what the benchmark adds is declared here
(Token Recycling's named templates, the suffix corpus cap, the self-draft's layers) and
the peers' parameters. Drafter classes are looked up when a method is checked or
built, so a method whose module is missing reports "not available" instead of
breaking the others.

========================  =======================================================
``ar``                    verispec's engine with no drafter (one token per forward)
``hf``                    transformers ``generate``, greedy (or sampling at T > 0)
``hf-static``             ``generate`` with its static cache and ``torch.compile``
``hf-pld``                ``generate(prompt_lookup_num_tokens=...)``
``hf-assist-ee``          ``generate(assistant_early_exit=...)`` self-speculation
``tr``                    :class:`~verispec.drafters.TokenRecycling`
``dtr``                   Dynamic Token Recycling (tree sized per device);
                          ``dtr:suffix=true`` fuses suffix-match candidates into it
``pld``                   prompt lookup with tree-shaped candidates
``suffix``                suffix-automaton drafting over the context and a corpus
``chain``                 chain speculative decoding with a draft model
``specinfer``             SpecInfer tree of i.i.d. draft samples
``dyspec``                DySpec greedy dynamic tree
``rsdc``, ``rsds``        Recursive Speculative Decoding, constant branching / beam
``llama-cpp``             llama.cpp (llama-cpp-python) on the target's GGUF file
``llama-cpp-pld``         llama.cpp with its prompt-lookup drafting
========================  =======================================================

Draft-model methods draft with a *self-draft view* of the target: the decoder layers
``draft_layers`` names (default :func:`verispec.models.recommended_layers`),
sharing its weights (:meth:`verispec.models.FastModel.self_draft`), or with a separate
draft model (``BenchContext.draft_model``, the CLI's ``--draft-model``).

Each of verispec's own methods has a drafter factory (``MethodEntry.drafter``), the one
:func:`verispec.drafter` calls: the spec mini-language is parsed in one place
(:mod:`verispec.bench.registry`) for the CLI and for Python.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from verispec.bench.registry import (
    MethodEntry,
    Param,
    option_defaults,
    option_names,
    option_params,
)
from verispec.bench.runner import BenchContext, EngineRunner, HFRunner, MethodRunner
from verispec.drafters._draft_model import LevelwiseOptions
from verispec.drafters.chain import ChainOptions
from verispec.drafters.dynamic_token_recycling import DynamicTokenRecyclingOptions
from verispec.drafters.dyspec import DySpecOptions
from verispec.drafters.prompt_lookup import PromptLookupOptions
from verispec.drafters.rsd_beam import RSDStochasticBeamOptions
from verispec.drafters.suffix import SuffixOptions
from verispec.drafters.token_recycling import TokenRecyclingOptions
from verispec.errors import ConfigError

__all__ = ["METHODS", "availability", "drafter_class"]


def drafter_class(module: str, name: str) -> Any:
    """``verispec.drafters.<module>.<name>``, imported now.

    Raises:
        ConfigError: the module or the class does not exist in this installation.
    """
    full = f"verispec.drafters.{module}"
    try:
        mod = importlib.import_module(full)
    except ModuleNotFoundError as exc:
        if exc.name is not None and full.startswith(exc.name):
            raise ConfigError(f"module `{full}` is not installed.") from None
        raise
    try:
        return getattr(mod, name)
    except AttributeError:
        raise ConfigError(f"module `{full}` has no class `{name}`.") from None


def _class_available(module: str, name: str) -> Callable[[], str | None]:
    def check() -> str | None:
        try:
            drafter_class(module, name)
        except ConfigError as exc:
            return str(exc)
        return None

    return check


def _kwargs(params: dict[str, Any], rename: dict[str, str] | None = None) -> dict[str, Any]:
    """Constructor keywords: ``None`` values (the drafter's own default) left out."""
    rename = rename or {}
    return {rename.get(k, k): v for k, v in params.items() if v is not None}


# -- verispec's own methods -----------------------------------------------------------
#
# Each builds a drafter from (target, params, draft_model): the same function serves the
# benchmark (wrapped in an EngineRunner) and Python users (:func:`verispec.drafter`).


def _needs_target(name: str, target: Any, why: str) -> None:
    if target is None:
        raise ConfigError(f"method `{name}` needs `target=` (the model to draft for: {why}).")


def _no_draft_model(name: str, draft_model: Any) -> None:
    if draft_model is not None:
        raise ConfigError(
            f"method `{name}` drafts without a draft model; `draft_model` is for chain, "
            "specinfer, dyspec, rsdc and rsds."
        )


def _drafter_ar(target: Any, params: dict[str, Any], draft_model: Any = None) -> Any:
    _no_draft_model("ar", draft_model)
    return None


_TR_TEMPLATES = ("2.2.2", "80", "8", "16", "32")


def _drafter_tr(target: Any, params: dict[str, Any], draft_model: Any = None) -> Any:
    _no_draft_model("tr", draft_model)
    _needs_target("tr", target, "its vocabulary size")
    cls = drafter_class("token_recycling", "TokenRecycling")
    template = "2.2.2" if params["template"] == "80" else params["template"]
    return cls(
        template=template,
        k=params["k"],
        prune_unknown=params["prune"],
        vocab_size=target.vocab_size,
    )


def _model_free(module: str, name: str, rename: dict[str, str] | None = None) -> Callable:
    def make(target: Any, params: dict[str, Any], draft_model: Any = None) -> Any:
        _no_draft_model(name, draft_model)
        cls = drafter_class(module, name)
        return cls(**_kwargs(params, rename))

    return make


def _drafter_dtr(target: Any, params: dict[str, Any], draft_model: Any = None) -> Any:
    _no_draft_model("dtr", draft_model)
    _needs_target("dtr", target, "its vocabulary size and, for budget=auto, its latency")
    cls = drafter_class("dynamic_token_recycling", "DynamicTokenRecycling")
    kwargs = _kwargs(params)
    if kwargs.get("suffix"):
        kwargs["suffix_drafter"] = drafter_class("suffix", "SuffixDrafter")(
            corpus=_corpus(kwargs.pop("corpus_tokens", None))
        )
    kwargs.pop("corpus_tokens", None)
    if kwargs.get("budget") == "auto":
        from verispec.drafters.budget import latency_for

        kwargs["latency"] = latency_for(target)  # measured once per device, cached
    return cls(vocab_size=target.vocab_size, **kwargs)


def _corpus(max_tokens: int | None) -> Any:
    """A fresh corpus for one drafter (``None``: the default cap)."""
    cls = drafter_class("suffix_corpus", "SuffixCorpus")
    return cls() if max_tokens is None else cls(max_tokens)


def _drafter_suffix(target: Any, params: dict[str, Any], draft_model: Any = None) -> Any:
    _no_draft_model("suffix", draft_model)
    kwargs = _kwargs(params)
    corpus = _corpus(kwargs.pop("corpus_tokens", None))
    return drafter_class("suffix", "SuffixDrafter")(corpus=corpus, **kwargs)


_CORPUS_TOKENS = Param(
    "corpus_tokens", int, None, "cap on the suffix corpus (oldest answers evicted)", 1
)


def _self_draft(target: Any, text: str | None) -> Any:
    from verispec.models.self_draft import parse_layers, recommended_layers

    make = getattr(target, "self_draft", None)
    num_layers = getattr(target, "num_layers", None)
    if make is None or num_layers is None:
        raise ConfigError(
            "draft-model methods need a target with `self_draft(layers)` (FastModel or HFModel) "
            "or a `draft_model`."
        )
    if text is None:
        return _warmed(make(recommended_layers(num_layers)))
    layers = parse_layers(text)
    count = layers if isinstance(layers, int) else len(layers)
    if count >= num_layers:
        raise ConfigError(
            f"`draft_layers` must name fewer layers than the target's {num_layers}; "
            f"got {count} layers."
        )
    try:
        draft = make(layers)
    except ConfigError as exc:
        raise ConfigError(f"`draft_layers`: {exc}") from None
    return _warmed(draft)


def _warmed(draft: Any) -> Any:
    """The draft with its compiled or captured forward built now, not in a timed answer."""
    warm_up = getattr(draft, "warm_up", None)
    if warm_up is not None:
        warm_up()  # counted in the target's setup_s, which the benchmark reports
    return draft


def _draft(name: str, target: Any, layers: str | None, draft_model: Any) -> Any:
    """The draft model: ``draft_model`` if given (checked against the target), else a
    self-draft of ``target`` running ``layers``."""
    if draft_model is None:
        _needs_target(name, target, "its self-draft, or pass `draft_model=`")
        return _self_draft(target, layers)
    if layers is not None:
        raise ConfigError(
            f"`{name}:draft_layers` chooses the target's self-draft; got "
            f"draft_layers={layers} and a separate draft model. Give one or the other."
        )
    if target is not None:
        from verispec.models.self_draft import check_compatible

        check_compatible(target, draft_model)
    return draft_model


def _draft_model(module: str, name: str, method: str) -> Callable:
    def make(target: Any, params: dict[str, Any], draft_model: Any = None) -> Any:
        cls = drafter_class(module, name)
        rest = dict(params)
        draft = _draft(method, target, rest.pop("draft_layers"), draft_model)
        return cls(draft, **_kwargs(rest))

    return make


def _drafter_dyspec(target: Any, params: dict[str, Any], draft_model: Any = None) -> Any:
    params = dict(params)
    if params["budget"] is None and params["threshold"] is None:
        params["budget"] = 16
    if params["budget"] == "auto" and params["threshold"] is None:
        from verispec.drafters.budget import latency_for

        _needs_target("dyspec", target, "its latency, for budget=auto")
        params["latency"] = latency_for(target)  # the target's, cached per device
    return _draft_model("dyspec", "DySpec", "dyspec")(target, params, draft_model)


def _engine(
    make_drafter: Callable, *, drafts_with_model: bool = False
) -> Callable[[BenchContext, dict[str, Any]], MethodRunner]:
    """The benchmark factory of a verispec method: its drafter in verispec's engine. The
    context's separate draft model goes to the draft-model methods only."""

    def build(context: BenchContext, params: dict[str, Any]) -> MethodRunner:
        draft = context.draft_model if drafts_with_model else None
        return EngineRunner(context, make_drafter(context.target, params, draft))

    return build


# -- transformers' generate -----------------------------------------------------------


def _build_hf(context: BenchContext, params: dict[str, Any]) -> MethodRunner:
    return HFRunner(context, {}, drafts="none")


def _build_hf_static(context: BenchContext, params: dict[str, Any]) -> MethodRunner:
    return HFRunner(context, {}, drafts="none", static_cache=True)


def _build_hf_pld(context: BenchContext, params: dict[str, Any]) -> MethodRunner:
    extra = {
        "prompt_lookup_num_tokens": params["tokens"],
        "max_matching_ngram_size": params["ngram"],
    }
    return HFRunner(context, extra, drafts="opaque")


def _early_exit_available() -> str | None:
    try:
        from transformers import GenerationConfig
    except ImportError:
        return "transformers is not installed."
    if not hasattr(GenerationConfig(), "assistant_early_exit"):
        import transformers

        return (
            f"transformers {transformers.__version__} has no `assistant_early_exit` "
            "(added in 4.47)."
        )
    return None


def _build_hf_assist_ee(context: BenchContext, params: dict[str, Any]) -> MethodRunner:
    reason = _early_exit_available()
    if reason is not None:
        raise ConfigError(f"method `hf-assist-ee` is not available: {reason}")
    if context.hf_model is not None:
        layers = getattr(context.hf_model.config, "num_hidden_layers", None)
        if layers is not None and params["layers"] >= layers:
            raise ConfigError(
                f"`hf-assist-ee:layers` must be below the model's {layers} layers; "
                f"got {params['layers']}."
            )
    extra: dict[str, Any] = {"assistant_early_exit": params["layers"]}
    if params["tokens"] is not None:
        extra["num_assistant_tokens"] = params["tokens"]
        extra["num_assistant_tokens_schedule"] = "constant"
    return HFRunner(context, extra, drafts="forwards")


# -- llama.cpp (optional extra) -------------------------------------------------------


def _llama_cpp_available() -> str | None:
    from verispec.bench.llama_cpp import llama_cpp_available

    return llama_cpp_available()


def _build_llama_cpp(context: BenchContext, params: dict[str, Any]) -> MethodRunner:
    from verispec.bench.llama_cpp import LlamaCppRunner

    return LlamaCppRunner(context)


def _build_llama_cpp_pld(context: BenchContext, params: dict[str, Any]) -> MethodRunner:
    from verispec.bench.llama_cpp import LlamaCppRunner

    return LlamaCppRunner(context, prompt_lookup=(params["ngram"], params["tokens"]))


# -- the registry ---------------------------------------------------------------------


def _layers(text: str) -> str:
    """Validate a layer choice; it stays text so the method's label shows it as written."""
    from verispec.models.self_draft import parse_layers

    try:
        parse_layers(text)
    except ValueError:
        raise ValueError("an integer n (the first n layers) or ranges like 0-12+19-29") from None
    return text.strip()


_DRAFT_LAYERS = Param(
    "draft_layers",
    str,
    None,
    "self-draft layers: n (the first n) or ranges 0-12+19-29; default: all but a middle "
    "block (0-12+19-29 on SmolLM2)",
    convert=_layers,
    shown_kind="int|ranges",
)
_TEMPLATE = Param("template", str, "2.2.2", "tree template (80 = 2.2.2)", choices=_TR_TEMPLATES)
_DRAFT_NOTE = "draft: a self-draft running `draft_layers` of the target's layers, or --draft-model"
_PLD = _model_free("prompt_lookup", "PromptLookup", rename=option_names(PromptLookupOptions))
_CHAIN = _draft_model("chain", "Chain", "chain")
_SPECINFER = _draft_model("specinfer", "SpecInferTree", "specinfer")
_RSDC = _draft_model("rsd_constant", "RSDConstant", "rsdc")
_RSDS = _draft_model("rsd_beam", "RSDStochasticBeam", "rsds")


def _drafter(
    name: str,
    summary: str,
    make: Callable,
    where: tuple[str, str],
    options: type,
    names: tuple[str | Param, ...],
    *,
    before: tuple[Param, ...] = (),
    with_model: bool = False,
) -> MethodEntry:
    """The entry of one of verispec's drafters: its parameters are its options' fields
    ``names`` (a :class:`Param` in ``names`` is the benchmark's own: the corpus cap);
    draft-model drafters (``with_model``) also take ``draft_layers``."""
    params = [_DRAFT_LAYERS] if with_model else list(before)
    for item in names:
        params += [item] if isinstance(item, Param) else option_params(options, (item,))
    corpus = _CORPUS_TOKENS in names

    def defaults() -> dict[str, Any]:
        found = option_defaults(options)
        if corpus:
            found["corpus_tokens"] = drafter_class("suffix_corpus", "DEFAULT_CORPUS_TOKENS")
        return found

    return MethodEntry(
        name,
        summary,
        tuple(params),
        _engine(make, drafts_with_model=with_model),
        _class_available(*where),
        defaults,
        drafter=make,
    )


def _entries() -> list[MethodEntry]:
    return [
        MethodEntry(
            "ar",
            "verispec's engine, no drafter: one token per target forward",
            (),
            _engine(_drafter_ar),
            drafter=_drafter_ar,
        ),
        MethodEntry("hf", "transformers generate (greedy at T=0), same model", (), _build_hf),
        MethodEntry(
            "hf-static",
            "transformers generate with its static cache and torch.compile (its fastest "
            "greedy path; compile time untimed and reported)",
            (),
            _build_hf_static,
        ),
        MethodEntry(
            "hf-pld",
            "transformers generate with prompt lookup decoding",
            (
                Param("tokens", int, 10, "prompt_lookup_num_tokens", 1),
                Param("ngram", int, 2, "max_matching_ngram_size", 1),
            ),
            _build_hf_pld,
        ),
        MethodEntry(
            "hf-assist-ee",
            "transformers generate, assistant_early_exit self-speculation",
            (
                Param("layers", int, 8, "assistant_early_exit: layers the draft runs", 1),
                Param("tokens", int, None, "num_assistant_tokens (constant schedule)", 1),
            ),
            _build_hf_assist_ee,
            _early_exit_available,
        ),
        _drafter(
            "tr",
            "Token Recycling (adjacency matrix + static tree template)",
            _drafter_tr,
            ("token_recycling", "TokenRecycling"),
            TokenRecyclingOptions,
            ("k", "prune"),
            before=(_TEMPLATE,),
        ),
        _drafter(
            "dtr",
            "Dynamic Token Recycling: calibrated dynamic tree, budget per device, PLD/suffix",
            _drafter_dtr,
            ("dynamic_token_recycling", "DynamicTokenRecycling"),
            DynamicTokenRecyclingOptions,
            ("budget", "k", "fusion", "suffix", _CORPUS_TOKENS, "max_budget", "max_depth", "decay"),
        ),
        _drafter(
            "pld",
            "prompt lookup: n-gram matches in the context, as a tree of candidates",
            _PLD,
            ("prompt_lookup", "PromptLookup"),
            PromptLookupOptions,
            ("max", "min_ngram", "max_ngram", "max_matches", "tree", "acceptance"),
        ),
        _drafter(
            "suffix",
            "suffix automaton over the context and a corpus of earlier answers, as a tree",
            _drafter_suffix,
            ("suffix", "SuffixDrafter"),
            SuffixOptions,
            ("budget", "max_depth", "depth_factor", "min_match", "decay", _CORPUS_TOKENS),
        ),
        _drafter(
            "chain",
            f"chain speculative decoding (Leviathan et al.); {_DRAFT_NOTE}",
            _CHAIN,
            ("chain", "Chain"),
            ChainOptions,
            ("k",),
            with_model=True,
        ),
        _drafter(
            "specinfer",
            f"SpecInfer tree of i.i.d. draft samples; {_DRAFT_NOTE}",
            _SPECINFER,
            ("specinfer", "SpecInferTree"),
            LevelwiseOptions,
            ("branching", "budget"),
            with_model=True,
        ),
        _drafter(
            "dyspec",
            f"DySpec greedy dynamic tree (Alg. 1: budget; Alg. 2: threshold); {_DRAFT_NOTE}",
            _drafter_dyspec,
            ("dyspec", "DySpec"),
            DySpecOptions,
            ("budget", "threshold", "max_depth", "max_budget"),
            with_model=True,
        ),
        _drafter(
            "rsdc",
            f"RSD-C, constant branching, draws without replacement; {_DRAFT_NOTE}",
            _RSDC,
            ("rsd_constant", "RSDConstant"),
            LevelwiseOptions,
            ("branching", "budget"),
            with_model=True,
        ),
        _drafter(
            "rsds",
            f"RSD-S, stochastic beam search; {_DRAFT_NOTE}",
            _RSDS,
            ("rsd_beam", "RSDStochasticBeam"),
            RSDStochasticBeamOptions,
            ("width", "depth", "budget"),
            with_model=True,
        ),
        MethodEntry(
            "llama-cpp",
            "llama.cpp (llama-cpp-python) on the same GGUF file (its own quantized weights), "
            "same prompt ids and threads",
            (),
            _build_llama_cpp,
            _llama_cpp_available,
            extra="llamacpp",
        ),
        MethodEntry(
            "llama-cpp-pld",
            "llama.cpp with its prompt-lookup drafting (LlamaPromptLookupDecoding)",
            (
                Param("tokens", int, 10, "num_pred_tokens", 1),
                Param("ngram", int, 2, "max_ngram_size", 1),
            ),
            _build_llama_cpp_pld,
            _llama_cpp_available,
            extra="llamacpp",
        ),
    ]


METHODS: dict[str, MethodEntry] = {entry.name: entry for entry in _entries()}


def availability(name: str) -> str | None:
    """``None`` when method ``name`` can run here, else why not."""
    return METHODS[name].availability()

"""The benchmark's methods: every drafter in the library and the peers users would pick.

Each entry maps a spec name to typed parameters and a factory (see
:mod:`verispec.bench.registry`). Drafter classes are imported lazily, when a
method is checked or built, so a method whose module is not installed reports
"not available" instead of breaking the others.

========================  =======================================================
``ar``                    verispec's engine with no drafter (one token per forward)
``hf``                    transformers ``generate``, greedy (or sampling at T > 0)
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
========================  =======================================================

Draft-model methods draft with a *self-draft view* of the target: the decoder layers
``draft_layers`` names (default :func:`verispec.models.recommended_layers`),
sharing its weights (:meth:`verispec.models.hf.HFModel.self_draft`).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from verispec.bench.registry import MethodEntry, Param
from verispec.bench.runners import BenchContext, EngineRunner, HFRunner, MethodRunner
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


def _native(module: str, name: str, rename: dict[str, str] | None = None) -> Callable:
    """The constructor defaults of ``verispec.drafters.<module>.<name>``, by parameter name."""

    def defaults() -> dict[str, Any]:
        cls = drafter_class(module, name)
        back = {v: k for k, v in (rename or {}).items()}
        found = {}
        for param in inspect.signature(cls.__init__).parameters.values():
            if param.default is not inspect.Parameter.empty:
                found[back.get(param.name, param.name)] = param.default
        return found

    return defaults


def _kwargs(params: dict[str, Any], rename: dict[str, str] | None = None) -> dict[str, Any]:
    """Constructor keywords: ``None`` values (the drafter's own default) left out."""
    rename = rename or {}
    return {rename.get(k, k): v for k, v in params.items() if v is not None}


# -- verispec's own methods -----------------------------------------------------------


def _build_ar(context: BenchContext, params: dict[str, Any]) -> MethodRunner:
    return EngineRunner(context, None)


_TR_TEMPLATES = ("2.2.2", "80", "8", "16", "32")


def _build_tr(context: BenchContext, params: dict[str, Any]) -> MethodRunner:
    cls = drafter_class("token_recycling", "TokenRecycling")
    template = "2.2.2" if params["template"] == "80" else params["template"]
    drafter = cls(
        template=template,
        k=params["k"],
        prune_unknown=params["prune"],
        vocab_size=context.target.vocab_size,
    )
    return EngineRunner(context, drafter)


def _model_free(module: str, name: str, rename: dict[str, str] | None = None) -> Callable:
    def build(context: BenchContext, params: dict[str, Any]) -> MethodRunner:
        cls = drafter_class(module, name)
        return EngineRunner(context, cls(**_kwargs(params, rename)))

    return build


def _int_or_auto(text: str) -> int | str:
    if text == "auto":
        return text
    if text.isdigit():
        return int(text)
    raise ValueError("an integer >= 0 or `auto`")


def _build_dtr(context: BenchContext, params: dict[str, Any]) -> MethodRunner:
    cls = drafter_class("dynamic_token_recycling", "DynamicTokenRecycling")
    kwargs = _kwargs(params)
    if kwargs.get("suffix"):
        kwargs["suffix_drafter"] = drafter_class("suffix", "SuffixDrafter")(
            corpus=_corpus(kwargs.pop("corpus_tokens", None))
        )
    kwargs.pop("corpus_tokens", None)
    if kwargs.get("budget") == "auto":
        from verispec.drafters.budget import latency_for

        kwargs["latency"] = latency_for(context.target)  # measured once per device, cached
    return EngineRunner(context, cls(vocab_size=context.target.vocab_size, **kwargs))


def _corpus(max_tokens: int | None) -> Any:
    """A fresh corpus for one runner (``None``: the default cap)."""
    cls = drafter_class("suffix_corpus", "SuffixCorpus")
    return cls() if max_tokens is None else cls(max_tokens)


def _build_suffix(context: BenchContext, params: dict[str, Any]) -> MethodRunner:
    kwargs = _kwargs(params)
    corpus = _corpus(kwargs.pop("corpus_tokens", None))
    return EngineRunner(context, drafter_class("suffix", "SuffixDrafter")(corpus=corpus, **kwargs))


def _with_corpus_cap(native: Callable) -> Callable:
    """``native``'s defaults plus the corpus's default cap (``corpus_tokens``)."""

    def defaults() -> dict[str, Any]:
        cap = drafter_class("suffix_corpus", "DEFAULT_CORPUS_TOKENS")
        return {**native(), "corpus_tokens": cap}

    return defaults


_CORPUS_TOKENS = Param(
    "corpus_tokens", int, None, "cap on the suffix corpus (oldest answers evicted)", 1
)


def _self_draft(context: BenchContext, text: str | None) -> Any:
    from verispec.models.self_draft import parse_layers, recommended_layers

    make = getattr(context.target, "self_draft", None)
    num_layers = getattr(context.target, "num_layers", None)
    if make is None or num_layers is None:
        raise ConfigError(
            "draft-model methods need a target with `self_draft(layers)` (verispec's HFModel)."
        )
    if text is None:
        return make(recommended_layers(num_layers))
    layers = parse_layers(text)
    count = layers if isinstance(layers, int) else len(layers)
    if count >= num_layers:
        raise ConfigError(
            f"`draft_layers` must name fewer layers than the target's {num_layers}; "
            f"got {count} layers."
        )
    try:
        return make(layers)
    except ConfigError as exc:
        raise ConfigError(f"`draft_layers`: {exc}") from None


def _draft_model(module: str, name: str) -> Callable:
    def build(context: BenchContext, params: dict[str, Any]) -> MethodRunner:
        cls = drafter_class(module, name)
        rest = dict(params)
        draft = _self_draft(context, rest.pop("draft_layers"))
        return EngineRunner(context, cls(draft, **_kwargs(rest)))

    return build


def _positive_int_or_auto(text: str) -> int | str:
    if text == "auto":
        return text
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ValueError("an integer >= 1 or `auto`")


def _build_dyspec(context: BenchContext, params: dict[str, Any]) -> MethodRunner:
    params = dict(params)
    if params["budget"] is None and params["threshold"] is None:
        params["budget"] = 16
    if params["budget"] == "auto" and params["threshold"] is None:
        from verispec.drafters.budget import latency_for

        params["latency"] = latency_for(context.target)  # the target's, cached per device
    return _draft_model("dyspec", "DySpec")(context, params)


# -- transformers' generate -----------------------------------------------------------


def _build_hf(context: BenchContext, params: dict[str, Any]) -> MethodRunner:
    return HFRunner(context, {}, drafts="none")


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
_BRANCHING = Param("branching", tuple, None, "children per node at each level, e.g. 4.2.2", 1)
_BUDGET = Param("budget", int, None, "cap on the tree size (nodes)", 1)
_DRAFT_NOTE = "draft: a self-draft running `draft_layers` of the target's layers"


def _entries() -> list[MethodEntry]:
    return [
        MethodEntry(
            "ar", "verispec's engine, no drafter: one token per target forward", (), _build_ar
        ),
        MethodEntry("hf", "transformers generate (greedy at T=0), same model", (), _build_hf),
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
        MethodEntry(
            "tr",
            "Token Recycling (adjacency matrix + static tree template)",
            (
                Param(
                    "template", str, "2.2.2", "tree template (80 = 2.2.2)", choices=_TR_TEMPLATES
                ),
                Param("k", int, 8, "candidates kept per token (K)", 1, 1024),
                Param("prune", bool, True, "leave never-observed slots out of the tree"),
            ),
            _build_tr,
            _class_available("token_recycling", "TokenRecycling"),
            _native("token_recycling", "TokenRecycling"),
        ),
        MethodEntry(
            "dtr",
            "Dynamic Token Recycling: calibrated dynamic tree, budget per device, PLD/suffix",
            (
                Param(
                    "budget",
                    str,
                    None,
                    "nodes per step, or auto (latency table)",
                    convert=_int_or_auto,
                    shown_kind="int|auto",
                ),
                Param("k", int, None, "candidates recycled per token (K)", 1, 1024),
                Param("fusion", bool, None, "add prompt-lookup candidates"),
                Param("suffix", bool, None, "add suffix-match candidates (context + corpus)"),
                _CORPUS_TOKENS,
                Param("max_budget", int, None, "most nodes `auto` may choose", 1),
                Param("max_depth", int, None, "deepest node considered", 1),
                Param("decay", float, None, "per-step forgetting of the calibration", 0, 1),
            ),
            _build_dtr,
            _class_available("dynamic_token_recycling", "DynamicTokenRecycling"),
            _with_corpus_cap(_native("dynamic_token_recycling", "DynamicTokenRecycling")),
        ),
        MethodEntry(
            "pld",
            "prompt lookup: n-gram matches in the context, as a tree of candidates",
            (
                Param("max", int, None, "most draft nodes per step (max_tokens)", 1),
                Param("min_ngram", int, None, "shortest suffix matched", 1),
                Param("max_ngram", int, None, "longest suffix matched", 1),
                Param("max_matches", int, None, "earlier occurrences merged per step", 1),
                Param("tree", bool, None, "a tree of continuations (false: one chain)"),
                Param("acceptance", float, None, "assumed acceptance, splits depth/branches", 0, 1),
            ),
            _model_free("prompt_lookup", "PromptLookup", rename={"max": "max_tokens"}),
            _class_available("prompt_lookup", "PromptLookup"),
            _native("prompt_lookup", "PromptLookup", rename={"max": "max_tokens"}),
        ),
        MethodEntry(
            "suffix",
            "suffix automaton over the context and a corpus of earlier answers, as a tree",
            (
                Param("budget", int, None, "most draft nodes per step", 0),
                Param("max_depth", int, None, "deepest node considered", 1),
                Param("depth_factor", float, None, "cap: depth <= depth_factor x match length", 0),
                Param("min_match", int, None, "shortest suffix match used", 1),
                Param("decay", float, None, "per-step forgetting of the calibration", 0, 1),
                _CORPUS_TOKENS,
            ),
            _build_suffix,
            _class_available("suffix", "SuffixDrafter"),
            _with_corpus_cap(_native("suffix", "SuffixDrafter")),
        ),
        MethodEntry(
            "chain",
            f"chain speculative decoding (Leviathan et al.); {_DRAFT_NOTE}",
            (_DRAFT_LAYERS, Param("k", int, None, "chain length (draft tokens per step)", 1)),
            _draft_model("chain", "Chain"),
            _class_available("chain", "Chain"),
            _native("chain", "Chain"),
        ),
        MethodEntry(
            "specinfer",
            f"SpecInfer tree of i.i.d. draft samples; {_DRAFT_NOTE}",
            (_DRAFT_LAYERS, _BRANCHING, _BUDGET),
            _draft_model("specinfer", "SpecInferTree"),
            _class_available("specinfer", "SpecInferTree"),
            _native("specinfer", "SpecInferTree"),
        ),
        MethodEntry(
            "dyspec",
            f"DySpec greedy dynamic tree (Alg. 1: budget; Alg. 2: threshold); {_DRAFT_NOTE}",
            (
                _DRAFT_LAYERS,
                Param(
                    "budget",
                    str,
                    None,
                    "tree size m (16 when no threshold is given), or auto (latency table)",
                    convert=_positive_int_or_auto,
                    shown_kind="int|auto",
                ),
                Param("threshold", float, None, "expand every slot with value > t", 0, 1),
                Param("max_depth", int, None, "cap on the tree depth", 1),
                Param("max_budget", int, None, "most nodes `budget=auto` may grow", 1),
            ),
            _build_dyspec,
            _class_available("dyspec", "DySpec"),
            _native("dyspec", "DySpec"),
        ),
        MethodEntry(
            "rsdc",
            f"RSD-C, constant branching, draws without replacement; {_DRAFT_NOTE}",
            (_DRAFT_LAYERS, _BRANCHING, _BUDGET),
            _draft_model("rsd_constant", "RSDConstant"),
            _class_available("rsd_constant", "RSDConstant"),
            _native("rsd_constant", "RSDConstant"),
        ),
        MethodEntry(
            "rsds",
            f"RSD-S, stochastic beam search; {_DRAFT_NOTE}",
            (
                _DRAFT_LAYERS,
                Param("width", int, None, "beam width W", 1),
                Param("depth", int, None, "tree depth L", 1),
                _BUDGET,
            ),
            _draft_model("rsd_beam", "RSDStochasticBeam"),
            _class_available("rsd_beam", "RSDStochasticBeam"),
            _native("rsd_beam", "RSDStochasticBeam"),
        ),
    ]


METHODS: dict[str, MethodEntry] = {entry.name: entry for entry in _entries()}


def availability(name: str) -> str | None:
    """``None`` when method ``name`` can run here, else why not."""
    return METHODS[name].availability()

"""verispec's drafters as methods: what each spec name builds (``verispec methods`` lists them).

A drafter's parameters are its options' fields (``TokenRecyclingOptions``,
``DySpecOptions``...: type, check, default and help, written once in the drafter's
module, read by :func:`~verispec.specs.grammar.option_params`), so a spec and the class
accept the same values (``tr:template=80`` and ``TokenRecycling("80")``). Only what
configures something other than the drafter is declared here (the suffix corpus cap,
the self-draft's layers). Draft-model methods draft with a *self-draft view* of the
target (the decoder layers ``draft_layers`` names, default
:func:`verispec.models.recommended_layers`, sharing its weights), or with a separate
``draft_model``. The benchmark runs these in verispec's engine
(:mod:`verispec.bench.methods`), :func:`verispec.drafter` builds them from Python: a
spec means the same to both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verispec.drafters._draft_model import LevelwiseOptions
from verispec.drafters.chain import Chain, ChainOptions
from verispec.drafters.dynamic_token_recycling import (
    DynamicTokenRecycling,
    DynamicTokenRecyclingOptions,
)
from verispec.drafters.dyspec import DySpec, DySpecOptions
from verispec.drafters.prompt_lookup import PromptLookup, PromptLookupOptions
from verispec.drafters.rsd_beam import RSDStochasticBeam, RSDStochasticBeamOptions
from verispec.drafters.rsd_constant import RSDConstant
from verispec.drafters.specinfer import SpecInferTree
from verispec.drafters.suffix import SuffixDrafter, SuffixOptions
from verispec.drafters.suffix_corpus import DEFAULT_CORPUS_TOKENS, SuffixCorpus
from verispec.drafters.token_recycling import TokenRecycling, TokenRecyclingOptions
from verispec.errors import ConfigError
from verispec.specs.grammar import MethodEntry, Param, option_names, option_params

__all__ = ["DRAFTERS"]

Make = Callable[[Any, dict[str, Any], Any], Any]  # (target, params, draft_model) -> drafter


def _kwargs(params: dict[str, Any], options: type | None = None) -> dict[str, Any]:
    """Constructor keywords: spec names renamed, ``None`` (the drafter's default) left out."""
    names = option_names(options) if options is not None else {}
    return {names.get(k, k): v for k, v in params.items() if v is not None}


def _needs_target(name: str, target: Any, why: str) -> None:
    if target is None:
        raise ConfigError(f"method `{name}` needs `target=` (the model to draft for: {why}).")


def _model_free(name: str, make: Callable[[Any, dict[str, Any]], Any], options: Any = None) -> Make:
    """A model-free drafter's factory: ``make(target, keywords)``, the spec's parameters
    renamed to ``options``' constructor keywords."""

    def checked(target: Any, params: dict[str, Any], draft_model: Any = None) -> Any:
        if draft_model is not None:
            raise ConfigError(
                f"method `{name}` drafts without a draft model; `draft_model` is for chain, "
                "specinfer, dyspec, rsdc and rsds."
            )
        return make(target, _kwargs(params, options))

    return checked


def _tr(target: Any, kwargs: dict[str, Any]) -> Any:
    _needs_target("tr", target, "its vocabulary size")
    return TokenRecycling(**kwargs, vocab_size=target.vocab_size)


def _dtr(target: Any, kwargs: dict[str, Any]) -> Any:
    _needs_target("dtr", target, "its vocabulary size and, for budget=auto, its latency")
    corpus_tokens = kwargs.pop("corpus_tokens", DEFAULT_CORPUS_TOKENS)
    if kwargs.get("suffix"):
        kwargs["suffix_drafter"] = SuffixDrafter(corpus=SuffixCorpus(corpus_tokens))
    return DynamicTokenRecycling(vocab_size=target.vocab_size, **kwargs)


def _suffix(target: Any, kwargs: dict[str, Any]) -> Any:
    corpus = SuffixCorpus(kwargs.pop("corpus_tokens", DEFAULT_CORPUS_TOKENS))
    return SuffixDrafter(corpus=corpus, **kwargs)


def _draft(name: str, target: Any, layers: str | None, draft_model: Any) -> Any:
    """``draft_model`` (checked against the target), else a self-draft of ``target``
    running ``layers``, its compiled forward built now rather than in a timed answer."""
    from verispec.models.self_draft import check_compatible, parse_layers, recommended_layers

    if draft_model is not None:
        if layers is not None:
            raise ConfigError(
                f"`{name}:draft_layers` chooses the target's self-draft; got "
                f"draft_layers={layers} and a separate draft model. Give one or the other."
            )
        if target is not None:
            check_compatible(target, draft_model)
        return draft_model
    _needs_target(name, target, "its self-draft, or pass `draft_model=`")
    make, num_layers = getattr(target, "self_draft", None), getattr(target, "num_layers", None)
    if make is None or num_layers is None:
        raise ConfigError(
            "draft-model methods need a target with `self_draft(layers)` (FastModel or HFModel) "
            "or a `draft_model`."
        )
    chosen = recommended_layers(num_layers) if layers is None else parse_layers(layers)
    count = chosen if isinstance(chosen, int) else len(chosen)
    if count >= num_layers:
        raise ConfigError(
            f"`draft_layers` must name fewer layers than the target's {num_layers}; "
            f"got {count} layers."
        )
    try:
        draft = make(chosen)
    except ConfigError as exc:
        raise ConfigError(f"`draft_layers`: {exc}") from None
    if getattr(draft, "warm_up", None) is not None:
        draft.warm_up()  # counted in the target's setup_s, which the benchmark reports
    return draft


def _drafted(name: str, cls: type) -> Make:
    def make(target: Any, params: dict[str, Any], draft_model: Any = None) -> Any:
        kwargs = _kwargs(params)
        draft = _draft(name, target, kwargs.pop("draft_layers", None), draft_model)
        return cls(draft, **kwargs)

    return make


def _layers(text: str) -> str:
    """Validate a layer choice; it stays text so the method's label shows it as written."""
    from verispec.models.self_draft import parse_layers

    try:
        parse_layers(text)
    except ValueError:
        raise ValueError("an integer n (the first n layers) or ranges like 0-12+19-29") from None
    return text.strip()


_OWN = {  # the parameters a spec adds to the drafters' own
    "draft_layers": Param(
        "draft_layers",
        str,
        None,
        "self-draft layers: n (the first n) or ranges 0-12+19-29; default: all but a "
        "middle block (0-12+19-29 on SmolLM2)",
        convert=_layers,
        shown_kind="int|ranges",
    ),
    "corpus_tokens": Param(
        "corpus_tokens",
        int,
        DEFAULT_CORPUS_TOKENS,
        "cap on the suffix corpus (oldest answers evicted)",
        1,
    ),
}
_DRAFT_NOTE = "draft: a self-draft running `draft_layers` of the target's layers, or --draft-model"


def _drafter(name: str, make: Any, options: type, names: str, summary: str) -> MethodEntry:
    """One of verispec's drafters. Its parameters are ``names``: its options' fields, or
    the ones a spec adds (:data:`_OWN`). ``make``: the drafter class of a draft-model
    method (with ``draft_layers``), else ``make(target, keywords)``."""
    params = tuple(_OWN.get(n) or option_params(options, (n,))[0] for n in names.split())
    with_model = "draft_layers" in names
    factory = _drafted(name, make) if with_model else _model_free(name, make, options)
    return MethodEntry(name, summary, params, factory, uses_draft_model=with_model)


# fmt: off
_DRAFTERS = (  # name, drafter (a class with draft_layers, else a factory), options, parameters
    ("tr", _tr, TokenRecyclingOptions, "template k prune",
     "Token Recycling (adjacency matrix + static tree template)"),
    ("dtr", _dtr, DynamicTokenRecyclingOptions,
     "budget k fusion suffix corpus_tokens max_budget max_depth decay prior_strength",
     "Dynamic Token Recycling: calibrated dynamic tree, budget per device, PLD/suffix"),
    ("pld", lambda target, kwargs: PromptLookup(**kwargs), PromptLookupOptions,
     "max min_ngram max_ngram max_matches tree acceptance",
     "prompt lookup: n-gram matches in the context, as a tree of candidates"),
    ("suffix", _suffix, SuffixOptions,
     "budget max_depth depth_factor min_match decay prior_strength corpus_tokens",
     "suffix automaton over the context and a corpus of earlier answers, as a tree"),
    ("chain", Chain, ChainOptions, "draft_layers k",
     f"chain speculative decoding (Leviathan et al.); {_DRAFT_NOTE}"),
    ("specinfer", SpecInferTree, LevelwiseOptions, "draft_layers branching budget",
     f"SpecInfer tree of i.i.d. draft samples; {_DRAFT_NOTE}"),
    ("dyspec", DySpec, DySpecOptions, "draft_layers budget threshold max_depth max_budget",
     f"DySpec greedy dynamic tree (Alg. 1: budget; Alg. 2: threshold); {_DRAFT_NOTE}"),
    ("rsdc", RSDConstant, LevelwiseOptions, "draft_layers branching budget",
     f"RSD-C, constant branching, draws without replacement; {_DRAFT_NOTE}"),
    ("rsds", RSDStochasticBeam, RSDStochasticBeamOptions, "draft_layers width depth budget",
     f"RSD-S, stochastic beam search; {_DRAFT_NOTE}"),
)
# fmt: on


def _ar(target: Any, kwargs: dict[str, Any]) -> None:
    return None  # plain decoding: the engine with no drafter


_AR = MethodEntry(
    "ar",
    "verispec's engine, no drafter: one token per target forward",
    (),
    _model_free("ar", _ar),
)
DRAFTERS: dict[str, MethodEntry] = {
    entry.name: entry for entry in (_AR, *(_drafter(*row) for row in _DRAFTERS))
}

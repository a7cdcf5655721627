"""Tests of verispec/specs/drafters.py: a spec builds the drafter its class builds.

For every verispec method that ``verispec methods`` lists, with its defaults, with each
parameter set away from its default, and with every example the docs give, the drafter
``verispec.drafter(spec)`` builds equals the one its class builds from the same options:
same class, same resolved options (``drafter.options``), the same model drafted with and
the same suffix corpus cap. The class is called here by hand, so the spec's factory is
not checked against itself.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs
import pytest

import verispec
from verispec.bench.methods import METHODS
from verispec.drafters import (
    Chain,
    DynamicTokenRecycling,
    DySpec,
    PromptLookup,
    RSDConstant,
    RSDStochasticBeam,
    SpecInferTree,
    SuffixDrafter,
    TokenRecycling,
)
from verispec.drafters.suffix_corpus import SuffixCorpus
from verispec.models import tiny_llama
from verispec.specs import DRAFTERS, parse_spec

CLASSES: dict[str, type] = {
    "tr": TokenRecycling,
    "dtr": DynamicTokenRecycling,
    "pld": PromptLookup,
    "suffix": SuffixDrafter,
    "chain": Chain,
    "specinfer": SpecInferTree,
    "dyspec": DySpec,
    "rsdc": RSDConstant,
    "rsds": RSDStochasticBeam,
}
RENAMED = {("pld", "max"): "max_tokens", ("tr", "prune"): "prune_unknown"}  # spec -> keyword
_ROOT = Path(__file__).resolve().parents[1]
# a spec in the docs: values in lower case (``dyspec:max_budget=N`` is a placeholder)
_SPEC = re.compile(rf"(?<![\w-])((?:{'|'.join(CLASSES)})(?::[a-z_]+=[a-z0-9.+\-]+)+)(?![\w=:-])")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The target (V = 64, 4 layers) and a separate 1-layer draft model of its vocabulary;
    latency tables measured for it go to a temporary cache."""
    patch = pytest.MonkeyPatch()
    patch.setenv("VERISPEC_CACHE", str(tmp_path_factory.mktemp("cache")))
    yield tiny_llama(vocab_size=64, num_layers=4), tiny_llama(vocab_size=64, num_layers=1, seed=2)
    patch.undo()


def _other_values(param: Any) -> list[str]:
    """Values of one parameter other than its default, each one the spec accepts."""
    default, kind = param.default, param.shown_kind or param.kind.__name__
    if param.choices:
        return [c for c in param.choices if c != default]
    if kind == "int|ranges":  # draft_layers: the target has 4 layers
        return ["2", "0+3"]
    if kind == "int|auto":
        return ["5"] if default == "auto" else ["5", "auto"]
    if param.kind is bool:
        return ["false" if default else "true"]
    if param.kind is tuple:
        return ["3.2"]
    if param.kind is int:
        return ["3" if default is None else str(default + 1)]
    return ["0.5" if default is None else f"{default / 2:g}"]


def _documented() -> list[str]:
    """Every spec of a verispec drafter written in the docs and the specs' docstrings."""
    texts = [p.read_text() for p in sorted((_ROOT / "docs").rglob("*.rst"))]
    texts += [p.read_text() for p in sorted((_ROOT / "verispec" / "specs").glob("*.py"))]
    return sorted({m.group(1) for text in texts for m in _SPEC.finditer(text)})


def _specs() -> list[str]:
    specs = list(CLASSES)
    for name in CLASSES:
        for param in METHODS[name].params:
            specs += [f"{name}:{param.name}={value}" for value in _other_values(param)]
    return list(dict.fromkeys([*specs, *_documented()]))


def _by_hand(spec: str, target: Any, draft: Any) -> Any:
    """The drafter ``spec`` names, built by calling its class with the same options."""
    parsed = parse_spec(spec)
    cls, given = CLASSES[parsed.name], dict(parsed.given)
    kwargs = {RENAMED.get((parsed.name, k), k): v for k, v in given.items()}
    layers, corpus_tokens = kwargs.pop("draft_layers", None), kwargs.pop("corpus_tokens", None)
    corpus = SuffixCorpus() if corpus_tokens is None else SuffixCorpus(corpus_tokens)
    if cls in (TokenRecycling, DynamicTokenRecycling):
        kwargs["vocab_size"] = target.vocab_size
    if cls is DynamicTokenRecycling and kwargs.get("suffix"):
        kwargs["suffix_drafter"] = SuffixDrafter(corpus=corpus)
    if cls is SuffixDrafter:
        kwargs["corpus"] = corpus
    if not DRAFTERS[parsed.name].uses_draft_model:
        return cls(**kwargs)
    if layers is not None:
        from verispec.models.self_draft import parse_layers

        draft = target.self_draft(parse_layers(layers))
    return cls(draft, **kwargs)


def _resolved(drafter: Any) -> tuple[Any, ...]:
    """What makes two drafters the same: class, resolved options, the model they draft
    with (which layers of which weights) and the suffix corpus cap."""
    draft = getattr(drafter, "draft", None)
    model = None if draft is None else (id(draft.hf_model), tuple(draft.layer_indices))
    suffix = getattr(drafter, "suffix_drafter", drafter)  # DTR's suffix drafter, or the drafter
    corpus = getattr(suffix, "corpus", None)
    suffix_options = getattr(suffix, "options", None)
    cap = None if corpus is None else corpus.max_tokens
    return type(drafter), drafter.options, model, suffix_options, cap


def _outcome(build: Any) -> tuple[Any, ...]:
    """The drafter ``build()`` makes (:func:`_resolved`), or the error it raises (a spec
    the docs give, ``tr:k=4``, refuses the default template's slots like the class)."""
    try:
        return ("built", *_resolved(build()))
    except Exception as exc:
        return ("refused", type(exc), str(exc))


def test_every_listed_method_is_a_drafter_here() -> None:
    """The methods ``verispec methods`` lists that build a drafter are the classes above
    (and ``ar``, which builds none)."""
    built = {name for name, entry in METHODS.items() if entry.drafter is not None}
    assert built == {"ar", *CLASSES}
    assert verispec.drafter("ar") is None


def test_the_docs_give_examples() -> None:
    """The docs' examples are found (the pattern did not silently stop matching)."""
    found = _documented()
    assert {"tr:template=16", "dtr:budget=auto", "pld:max=10", "dyspec:budget=24"} <= set(found)


@pytest.mark.parametrize("spec", _specs())
def test_a_spec_builds_what_its_class_builds(spec: str, models: Any) -> None:
    """The spec's drafter and the class's, called with the same options, are the same
    (or both are refused with the same error)."""
    target, draft = models
    name = parse_spec(spec).name
    layers = "draft_layers" in dict(parse_spec(spec).given)
    separate = draft if DRAFTERS[name].uses_draft_model and not layers else None
    from_spec = _outcome(lambda: verispec.drafter(spec, target=target, draft_model=separate))
    assert from_spec == _outcome(lambda: _by_hand(spec, target, draft))


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_the_spec_sets_every_option_of_the_class(name: str, models: Any) -> None:
    """Each parameter of the class's options is a parameter of its spec, with the same
    default."""
    target, draft = models
    separate = draft if DRAFTERS[name].uses_draft_model else None
    made = verispec.drafter(name, target=target, draft_model=separate)
    params = {p.name: p for p in METHODS[name].params}
    for field in attrs.fields(type(made.options)):
        key = field.metadata.get("spec") or field.name
        assert key in params, f"{name}: option `{key}` cannot be set by a spec"
        assert params[key].default == field.default, f"{name}:{key}"


def test_aliases_are_the_options(models: Any) -> None:
    """An alias the options accept means one value whichever way it is given: the
    published tree by name, by size and by size as an int; index paths as lists or tuples."""
    target, _ = models
    spec = verispec.drafter("tr:template=80", target=target)
    for template in ("80", 80):
        assert TokenRecycling(template, vocab_size=64).options == spec.options
    assert TokenRecycling("2.2.2").options.template == "2.2.2"
    assert TokenRecycling([[0], [1]]).options == TokenRecycling(((0,), (1,))).options

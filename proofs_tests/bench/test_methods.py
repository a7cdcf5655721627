"""Tests of verispec/specs/grammar.py and the method entries of verispec/bench/methods.py."""

from __future__ import annotations

from typing import Any

import pytest

from verispec.bench.methods import METHODS, BenchMethod, check_available
from verispec.errors import ConfigError
from verispec.specs import Param, parse_method, parse_methods, show


def test_plain_names_parse_in_order() -> None:
    """A comma-separated list of bare names gives one spec per name, in the given order."""
    specs = parse_methods("ar, hf ,tr", METHODS)
    assert [s.name for s in specs] == ["ar", "hf", "tr"]
    assert [s.label for s in specs] == ["ar", "hf", "tr"]
    assert all(s.given == () for s in specs)


def test_parameters_are_typed_and_labelled() -> None:
    """`tr:template=16:k=4:prune=false` gives typed values and a label that reads back."""
    spec = parse_method("tr:template=16:k=4:prune=false", METHODS)
    assert spec.given == (("template", "16"), ("k", 4), ("prune", False))
    assert spec.label == "tr:template=16:k=4:prune=false"
    assert parse_method(spec.label, METHODS) == spec


def test_defaults_are_filled_in_and_given_values_win() -> None:
    """`params` holds every parameter: the registry default unless the spec set it."""
    spec = parse_method("tr:k=4", METHODS)
    assert spec.params == {"template": "auto", "k": 4, "prune": True}


def test_a_bare_key_value_item_continues_the_previous_spec() -> None:
    """In `ar,tr:template=16,k=4,hf` the item `k=4` belongs to `tr`."""
    specs = parse_methods("ar,tr:template=16,k=4,hf", METHODS)
    assert [s.label for s in specs] == ["ar", "tr:template=16:k=4", "hf"]


def test_several_lists_are_concatenated() -> None:
    """Repeated `--methods` options add up."""
    specs = parse_methods(["ar", "tr:template=8,tr:template=32"], METHODS)
    assert [s.label for s in specs] == ["ar", "tr:template=8", "tr:template=32"]


def test_tuple_parameters_parse_dotted_integers() -> None:
    """`branching=4.2.2` becomes the tuple (4, 2, 2) and shows back as 4.2.2."""
    spec = parse_method("specinfer:branching=4.2.2", METHODS)
    assert spec.params["branching"] == (4, 2, 2)
    assert spec.label == "specinfer:branching=4.2.2"


def test_model_free_drafter_specs_parse() -> None:
    """`pld:max=6:tree=false` and `dtr:budget=auto` parse to their constructors' names."""
    pld = parse_method("pld:max=6:tree=false", METHODS)
    assert pld.params["max"] == 6 and pld.params["tree"] is False
    assert parse_method("dtr:budget=auto", METHODS).params["budget"] == "auto"
    assert parse_method("dtr:budget=24", METHODS).params["budget"] == 24
    with pytest.raises(ConfigError, match="must be an integer >= 0 or `auto`"):
        parse_method("dtr:budget=lots", METHODS)


def test_suffix_specs_parse_and_build(smoke_context: Any) -> None:
    """`suffix:budget=8:corpus_tokens=500` builds a SuffixDrafter on a corpus of that cap;
    `dtr:suffix=true` builds DTR fused with a suffix drafter; the corpus cap's default is
    the corpus's own."""
    from verispec.drafters.suffix_corpus import DEFAULT_CORPUS_TOKENS

    spec = parse_method("suffix:budget=8:corpus_tokens=500", METHODS)
    drafter = METHODS["suffix"].build(smoke_context, spec.params).drafter
    assert drafter.budget == 8 and drafter.corpus.max_tokens == 500
    fused = parse_method("dtr:suffix=true", METHODS)
    assert fused.params["corpus_tokens"] == DEFAULT_CORPUS_TOKENS
    dtr = METHODS["dtr"].build(smoke_context, fused.params).drafter
    assert dtr.use_suffix and not dtr.use_prompt_lookup
    assert (
        not METHODS["dtr"]
        .build(smoke_context, parse_method("dtr", METHODS).params)
        .drafter.use_suffix
    )


def test_unset_parameters_take_the_drafters_own_defaults() -> None:
    """A parameter without a registry default takes the drafter constructor's default."""
    import inspect

    from verispec.drafters import PromptLookup

    spec = parse_method("pld", METHODS)
    signature = inspect.signature(PromptLookup.__init__)
    assert spec.params["max"] == signature.parameters["max_tokens"].default
    assert spec.params["tree"] == signature.parameters["tree"].default


def test_unknown_method_lists_the_allowed_ones() -> None:
    """An unknown name raises ConfigError naming it and every registered method."""
    with pytest.raises(ConfigError, match="unknown method `eagle`") as info:
        parse_methods("ar,eagle", METHODS)
    for name in METHODS:
        assert name in str(info.value)


def test_every_peer_is_refused_as_a_drafter() -> None:
    """Each benchmark peer (a method with no verispec drafter) is a method to the benchmark
    and an error to ``verispec.drafter``, whose message lists the drafters and says that the
    peers are not drafters (specs/ knows no peer: it is a layer below bench/)."""
    import verispec
    from verispec.specs import drafter_names

    peers = [name for name, entry in METHODS.items() if entry.drafter is None]
    assert {"hf", "hf-pld", "llama-cpp"} <= set(peers)
    for name in peers:
        assert [s.name for s in parse_methods(name, METHODS)] == [name]
        with pytest.raises(ConfigError, match=f"unknown method `{name}`") as info:
            verispec.drafter(name)
        assert "peers (transformers' generate, llama.cpp) are not drafters" in str(info.value)
        assert ", ".join(drafter_names()) in str(info.value)


def test_unknown_parameter_lists_the_allowed_ones() -> None:
    """An unknown key raises ConfigError naming the method's parameters."""
    with pytest.raises(ConfigError, match="no parameter `size`") as info:
        parse_methods("tr:size=16", METHODS)
    assert "template, k, prune" in str(info.value)


def test_a_method_without_parameters_says_so() -> None:
    """`ar:k=3` fails: `ar` takes no parameter."""
    with pytest.raises(ConfigError, match="allowed: none"):
        parse_methods("ar:k=3", METHODS)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tr:k=four", "must be an integer"),
        ("tr:k=0", r"`tr:k` must be an integer in \[1, 1024\]; got 0"),
        ("tr:k=2000", r"`tr:k` must be an integer in \[1, 1024\]; got 2000"),
        ("tr:template=7", "must be one of"),
        ("tr:prune=maybe", "true or false"),
        ("tr:k", "written `key=value`"),
        ("tr:=3", "written `key=value`"),
        ("tr:k=4:k=5", "given twice"),
        ("specinfer:branching=4.two", "integers separated by dots"),
        ("specinfer:branching=4.0.2", "must be >= 1"),
        ("dyspec:threshold=nan", "must be finite"),
        ("dyspec:threshold=1.5", r"`dyspec:threshold` must be in \(0, 1\)"),
        (":k=3", "must start with a method name"),
    ],
)
def test_malformed_values_raise_config_errors(text: str, message: str) -> None:
    """Each malformed spec raises ConfigError with a message that says what is wrong."""
    with pytest.raises(ConfigError, match=message):
        parse_methods(text, METHODS)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no method given"),
        (" , ,", "no method given"),
        ("k=4,tr", "before any method name"),
        ("ar,tr,ar", "listed twice"),
        ("tr:k=4,tr:k=4", "listed twice"),
    ],
)
def test_malformed_lists_raise_config_errors(text: str, message: str) -> None:
    """Empty lists, orphan parameters and repeated specs are rejected."""
    with pytest.raises(ConfigError, match=message):
        parse_methods(text, METHODS)


@pytest.mark.parametrize("name", list(METHODS))
def test_every_default_reads_back_from_its_shown_form(name: str) -> None:
    """For every registered parameter, parsing the default as shown gives the default."""
    entry = METHODS[name]
    for param in entry.params:
        if param.default is None:
            continue
        assert param.parse(show(param.default), name) == param.default
        assert param.describe().startswith(param.name)


def test_a_method_that_cannot_run_here_is_refused_naming_why() -> None:
    """A method whose availability gives a reason parses, and check_available refuses it,
    naming the method and the reason."""
    reason = "module `verispec.drafters.no_such_module` is not installed."
    entry = BenchMethod(name="ghost", summary="a method whose drafter is missing", params=(),
                        build=lambda c, p: None, availability=lambda: reason)  # fmt: skip
    spec = parse_method("ghost", {"ghost": entry})
    assert spec.label == "ghost"
    METHODS["ghost"] = entry
    try:
        with pytest.raises(ConfigError, match=r"`ghost`: module `verispec\.drafters"):
            check_available([spec])
    finally:
        del METHODS["ghost"]


def test_installed_core_methods_are_available() -> None:
    """`ar`, `hf`, `hf-pld` and `tr` can run in this installation."""
    for name in ("ar", "hf", "hf-pld", "tr"):
        assert METHODS[name].availability() is None, name


def test_param_bounds_apply_to_floats() -> None:
    """A float parameter with bounds rejects values outside them and accepts the edges."""
    param = Param("t", float, 0.5, "a share", 0, 1)
    assert param.parse("0", "m") == 0.0 and param.parse("1", "m") == 1.0
    with pytest.raises(ConfigError, match=r"`m:t` must be >= 0"):
        param.parse("-0.1", "m")

"""Tests of verispec/specs.py: spec strings build drafters from Python, with the CLI's parser."""

from __future__ import annotations

import pytest

import verispec
from verispec.drafters import Chain, DynamicTokenRecycling, PromptLookup, TokenRecycling
from verispec.errors import ConfigError, IncompatibleModelsError
from verispec.models import tiny_llama
from verispec.specs import drafter_names, parse_spec


@pytest.fixture(scope="module")
def target():  # type: ignore[no-untyped-def]
    return tiny_llama(vocab_size=64, num_layers=4)


def test_spec_strings_build_the_named_drafter_with_its_parameters(target) -> None:  # type: ignore[no-untyped-def]
    """``verispec.drafter`` builds the drafter a spec names, with the spec's parameters, for
    model-free and draft-model methods alike; ``ar`` builds none."""
    tr = verispec.drafter("tr:template=16:k=12", target=target)
    assert isinstance(tr, TokenRecycling) and tr.k == 12 and tr.template.num_nodes == 16
    assert isinstance(verispec.drafter("dtr", target=target), DynamicTokenRecycling)
    pld = verispec.drafter("pld:max=5")
    assert isinstance(pld, PromptLookup) and pld.max_tokens == 5
    chain = verispec.drafter("chain:k=3:draft_layers=2", target=target)
    assert isinstance(chain, Chain) and chain.draft.num_layers == 2
    assert verispec.drafter("ar") is None


def test_drafter_names_are_verispecs_own_methods() -> None:
    """Every registered verispec method is buildable by name; the peers are not listed."""
    names = drafter_names()
    assert {"ar", "tr", "dtr", "pld", "chain", "specinfer", "dyspec", "rsdc", "rsds"} <= set(names)
    assert not {"hf", "hf-pld", "llama-cpp"} & set(names)


def test_a_separate_draft_model_replaces_the_self_draft(target) -> None:  # type: ignore[no-untyped-def]
    """``draft_model=`` is the drafter's model; it must share the target's vocabulary, and
    naming self-draft layers as well is refused."""
    small = tiny_llama(vocab_size=64, num_layers=1, seed=2)
    chain = verispec.drafter("chain", target=target, draft_model=small)
    assert chain.draft is small
    with pytest.raises(IncompatibleModelsError, match="vocabulary"):
        verispec.drafter("chain", target=target, draft_model=tiny_llama(vocab_size=70))
    with pytest.raises(ConfigError, match="draft_layers"):
        verispec.drafter("chain:draft_layers=2", target=target, draft_model=small)
    with pytest.raises(ConfigError, match="drafts without a draft model"):
        verispec.drafter("tr", target=target, draft_model=small)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("nope", "unknown method `nope`"),
        ("tr:template=7", "must be one of"),
        ("tr:depth=3", "has no parameter `depth`"),
        ("tr,dtr", "must name one method; got 2"),
        ("hf", "unknown method `hf`; verispec's drafters: ar, .*peers .* are not drafters"),
        ("tr", "needs `target=`"),
        ("dyspec", "needs `target=`"),
    ],
)
def test_bad_specs_raise_a_clear_error(spec: str, match: str) -> None:
    """A bad spec, a peer, or a missing target raises ConfigError saying what is allowed."""
    with pytest.raises(ConfigError, match=match):
        verispec.drafter(spec)


def test_parse_spec_is_the_clis_parser() -> None:
    """``parse_spec`` gives the label and parameters the CLI's ``--methods`` parser gives."""
    from verispec.bench.methods import METHODS
    from verispec.specs import parse_methods

    for text in ("tr:template=16", "dtr:budget=auto", "pld:max=4:tree=false"):
        assert parse_spec(text) == parse_methods(text, METHODS)[0]

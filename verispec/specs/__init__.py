"""Method specs from Python: ``verispec.drafter("tr:template=16", target=model)``.

A *spec* names a method and its parameters in the mini-language the command line uses
(``tr:template=16:k=8``, ``dtr:budget=auto``, ``dyspec:budget=24``); ``verispec
methods`` lists every method and parameter. The grammar is
:mod:`verispec.specs.grammar`, verispec's drafters are :data:`DRAFTERS`
(:mod:`verispec.specs.drafters`); the benchmark adds its peers to the same table, so a
spec means the same thing to the CLI, to the benchmark and to Python.
"""

from __future__ import annotations

from verispec.core.types import Drafter, LanguageModel
from verispec.errors import ConfigError
from verispec.specs.drafters import DRAFTERS
from verispec.specs.grammar import (
    MethodEntry,
    MethodSpec,
    Param,
    parse_method,
    parse_methods,
    show,
)

__all__ = [
    "DRAFTERS", "MethodEntry", "MethodSpec", "Param", "drafter", "drafter_names", "parse_method",
    "parse_methods", "parse_spec", "show",
]  # fmt: skip


def parse_spec(spec: str) -> MethodSpec:
    """Parse one spec of a verispec drafter (``ar`` included) into a :class:`MethodSpec`.

    Raises:
        ConfigError: an unknown method or parameter (the message lists what is allowed;
            a benchmark peer such as ``hf`` is not a drafter, and the message says so), a
            malformed value, or more than one spec.
    """
    if not isinstance(spec, str):
        raise ConfigError(
            f"`spec` must be a method spec string like 'tr:template=16'; got {spec!r}."
        )
    head = spec.split(":", 1)[0].split(",", 1)[0].strip()
    if head and head not in DRAFTERS:
        # The benchmark's peers are defined above this layer: the message says what they
        # are without naming them (``verispec methods`` lists both kinds).
        raise ConfigError(
            f"unknown method `{head}`; verispec's drafters: {', '.join(drafter_names())}. "
            "The benchmark's peers (transformers' generate, llama.cpp) are not drafters: "
            "they run only in `verispec bench` and `verispec generate`. `verispec methods` "
            "lists both, with their parameters."
        )
    specs = parse_methods(spec, DRAFTERS)
    if len(specs) != 1:
        labels = ", ".join(s.label for s in specs)
        raise ConfigError(f"`spec` must name one method; got {len(specs)}: {labels}.")
    return specs[0]


def drafter_names() -> list[str]:
    """The names of the methods :func:`drafter` builds (verispec's own, not the peers)."""
    return list(DRAFTERS)


def drafter(
    spec: str,
    *,
    target: LanguageModel | None = None,
    draft_model: LanguageModel | None = None,
) -> Drafter | None:
    """Build the drafter that a method spec names.

    Args:
        spec: e.g. ``"tr"``, ``"tr:template=16"``, ``"dtr:budget=auto"``, ``"pld:max=10"``,
            ``"dyspec:budget=24"``. ``"ar"`` builds no drafter (``None``: plain decoding).
        target: the model the drafter drafts for. Token Recycling needs its vocabulary
            size, and the draft-model methods (``chain``, ``specinfer``, ``dyspec``,
            ``rsdc``, ``rsds``) build their default draft from it: a self-draft running
            ``draft_layers`` of its layers. A size of ``auto`` reads its measured latency
            when the decoder binds the drafter to it (``bind_target``).
        draft_model: a separate draft model (a :class:`~verispec.core.types.LanguageModel`
            with the target's vocabulary, e.g. ``verispec.models.make_target(small_hf)``)
            for the draft-model methods, instead of the self-draft.

    Returns:
        A fresh drafter, or ``None`` for ``ar``. Pass it to
        :class:`~verispec.SpeculativeDecoder` or :func:`verispec.speculative`.

    Raises:
        ConfigError: a bad spec, a peer method (``hf``, ``llama-cpp``...: not drafters),
            a method not installed, or a missing ``target``.
        IncompatibleModelsError: ``draft_model``'s vocabulary differs from ``target``'s.
    """
    parsed = parse_spec(spec)
    entry = DRAFTERS[parsed.name]
    reason = entry.availability()
    if reason is not None:
        raise ConfigError(f"method `{parsed.label}` is not available: {reason}")
    assert entry.drafter is not None  # every entry of DRAFTERS builds a drafter
    made: Drafter | None = entry.drafter(target, parsed.params, draft_model)
    return made

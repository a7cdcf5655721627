"""Method specs from Python: ``verispec.drafter("tr:template=16", target=model)``.

A *spec* names a method and its parameters in the mini-language the command line uses
(``tr:template=16:k=8``, ``dtr:budget=auto``, ``dyspec:budget=24``); ``verispec
methods`` lists every method and parameter. This module is a thin public face over the
one parser (:func:`verispec.bench.registry.parse_method`) and the method table
(:data:`verispec.bench.methods.METHODS`): a spec means the same thing to the CLI, to
the benchmark and to Python.
"""

from __future__ import annotations

from typing import Any

from verispec.core.types import Drafter, LanguageModel
from verispec.errors import ConfigError

__all__ = ["drafter", "drafter_names", "parse_spec"]


def parse_spec(spec: str) -> Any:
    """Parse one method spec into a :class:`~verispec.bench.registry.MethodSpec`.

    Raises:
        ConfigError: an unknown method or parameter (the message lists what is allowed),
            a malformed value, or more than one spec.
    """
    from verispec.bench.methods import METHODS
    from verispec.bench.registry import parse_methods

    if not isinstance(spec, str):
        raise ConfigError(
            f"`spec` must be a method spec string like 'tr:template=16'; got {spec!r}."
        )
    specs = parse_methods(spec, METHODS)
    if len(specs) != 1:
        labels = ", ".join(s.label for s in specs)
        raise ConfigError(f"`spec` must name one method; got {len(specs)}: {labels}.")
    return specs[0]


def drafter_names() -> list[str]:
    """The names of the methods :func:`drafter` builds (verispec's own, not the peers)."""
    from verispec.bench.methods import METHODS

    return [name for name, entry in METHODS.items() if entry.drafter is not None]


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
            size, ``budget=auto`` its measured latency, and the draft-model methods
            (``chain``, ``specinfer``, ``dyspec``, ``rsdc``, ``rsds``) build their default
            draft from it: a self-draft running ``draft_layers`` of its layers.
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
    from verispec.bench.methods import METHODS

    parsed = parse_spec(spec)
    entry = METHODS[parsed.name]
    if entry.drafter is None:
        raise ConfigError(
            f"`{parsed.name}` is a benchmark peer, not a verispec drafter; drafters: "
            f"{', '.join(drafter_names())}."
        )
    reason = entry.availability()
    if reason is not None:
        raise ConfigError(f"method `{parsed.label}` is not available: {reason}")
    made: Drafter | None = entry.drafter(target, parsed.params, draft_model)
    return made

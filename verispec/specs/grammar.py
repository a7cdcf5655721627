"""Method specs: ``name:key=value`` strings parsed into validated, typed parameters.

A method is named by a *spec*: its name, optionally followed by parameters, e.g.
``tr:template=16:k=8``. A list of specs is separated by commas; a ``key=value`` item with
no name continues the previous spec, so ``ar,hf,tr:template=16,k=4,pld:max=10`` reads as
``ar``, ``hf``, ``tr:template=16:k=4`` and ``pld:max=10``.

Each method is one :class:`MethodEntry`: verispec's drafters are in
:mod:`verispec.specs.drafters`, the benchmark adds its peers
(:mod:`verispec.bench.methods`). A drafter's parameters are not declared here:
:func:`option_params` reads them from the drafter's options class (fields made with
:func:`verispec.core.validate.option`), whose checks, defaults and help they use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from verispec.core.validate import check_option
from verispec.errors import ConfigError

__all__ = ["MethodEntry", "MethodSpec", "Param", "option_params", "parse_method", "parse_methods"]

_BOOLS = {"1": True, "true": True, "yes": True, "on": True}
_BOOLS |= {"0": False, "false": False, "no": False, "off": False}
_WANT = {
    bool: "true or false",
    tuple: "integers separated by dots (e.g. 4.2.2)",
    int: "an integer",
    float: "a number",
}


@attrs.frozen
class Param:
    """One typed parameter of a method.

    Attributes:
        name: the key in the spec (``template`` in ``tr:template=16``).
        kind: ``int``, ``float``, ``str``, ``bool`` or ``tuple`` (of integers, written with
            dots: ``branching=4.2.2``; the bounds apply to each integer).
        default: the value when the spec gives none; ``None``: the drafter's own.
        help: one line for ``verispec methods``.
        minimum, maximum: inclusive bounds of numbers; ``choices``: the allowed strings.
        convert: turns a ``str`` value into the parameter's, or raises ``ValueError``
            saying what is allowed (e.g. "an integer or auto").
        shown_kind: the type as ``verispec methods`` shows it, where ``kind`` says too little.
        option: the drafter's options field the parameter sets; its check validates the
            value and its range is shown.
    """

    name: str
    kind: type
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    convert: Callable[[str], Any] | None = None
    shown_kind: str | None = None
    option: Any = None

    def parse(self, text: str, method: str) -> Any:
        """The typed value of ``text``; raises :class:`ConfigError` naming ``method``."""
        where = f"`{method}:{self.name}`"
        value: Any = text
        try:
            if self.kind is bool:
                return _BOOLS[text.strip().lower()]
            if self.kind is tuple:
                value = tuple(int(part) for part in text.replace("x", ".").split("."))
            elif self.kind in (int, float):
                value = self.kind(text)
        except (KeyError, ValueError):
            raise ConfigError(f"{where} must be {_WANT[self.kind]}; got {text!r}.") from None
        if self.kind is float and not math.isfinite(value):
            raise ConfigError(f"{where} must be finite; got {text!r}.")
        if self.kind is str:
            if self.choices is not None and value not in self.choices:
                raise ConfigError(
                    f"{where} must be one of {', '.join(self.choices)}; got {text!r}."
                )
            if not value:
                raise ConfigError(f"{where} must not be empty.")
            try:
                value = self.convert(value) if self.convert is not None else value
            except ValueError as exc:
                raise ConfigError(f"{where} must be {exc}; got {text!r}.") from None
        if self.option is not None and self.kind is not tuple:
            check_option(self.option, where.strip("`"), value)
            return value
        numbers = value if self.kind is tuple else (value,) if self.kind is not str else ()
        for item in numbers:
            if self.minimum is not None and item < self.minimum:
                raise ConfigError(f"{where} must be >= {self.minimum:g}; got {text}.")
            if self.maximum is not None and item > self.maximum:
                raise ConfigError(f"{where} must be <= {self.maximum:g}; got {text}.")
        return value

    def describe(self) -> str:
        """One line for ``verispec methods``: name, type, bounds, default and help."""
        kind = self.shown_kind or ("ints a.b.c" if self.kind is tuple else self.kind.__name__)
        kind = "|".join(self.choices) if self.choices else kind
        low, high = self.minimum, self.maximum
        if self.option is not None and self.option.metadata["range"]:
            bounds = " " + self.option.metadata["range"]
        elif low is not None and high is not None:
            bounds = f" in [{low:g}, {high:g}]"
        else:
            bounds = f" >= {low:g}" if low is not None else ""
            bounds += f" <= {high:g}" if high is not None else ""
        default = "unset" if self.default is None else show(self.default)
        return f"{self.name} ({kind}{bounds}, default {default}): {self.help}"


@attrs.frozen
class MethodEntry:
    """One method.

    Attributes:
        name: the spec name (``tr``); ``summary``: one line for ``verispec methods``.
        params: the parameters the spec may set.
        drafter: for verispec's own methods, ``drafter(target, params, draft_model)``
            builds the drafter (``None`` for ``ar``); ``params`` holds every parameter,
            defaults filled in. ``None`` for the benchmark's peers.
        availability: ``None`` when the method can run in this installation, else why
            not (a transformers feature missing, an optional extra not installed).
        uses_draft_model: the drafter drafts with a draft model (``draft_model``, else a
            self-draft of the target).
    """

    name: str
    summary: str
    params: tuple[Param, ...]
    drafter: Callable[[Any, dict[str, Any], Any], Any] | None = None
    availability: Callable[[], str | None] = attrs.field(default=lambda: None)
    uses_draft_model: bool = False

    def param(self, key: str) -> Param:
        for param in self.params:
            if param.name == key:
                return param
        allowed = ", ".join(p.name for p in self.params) or "none"
        raise ConfigError(
            f"method `{self.name}` has no parameter `{key}`; allowed: {allowed}. "
            "Run `verispec methods` to list every method and its parameters."
        )


@attrs.frozen
class MethodSpec:
    """A parsed spec: the method's name, the parameters it set (typed, in the order
    given) and every parameter's default."""

    name: str
    given: tuple[tuple[str, Any], ...] = ()
    defaults: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        """The spec as tables show it: ``tr:template=16``."""
        return ":".join([self.name, *(f"{k}={show(v)}" for k, v in self.given)])

    @property
    def params(self) -> dict[str, Any]:
        """Every parameter, defaults filled in and the given values on top."""
        return {**dict(self.defaults), **dict(self.given)}

    def __str__(self) -> str:
        return self.label


def show(value: Any) -> str:
    """A parameter's value as a spec writes it: ``true``, ``4.2.2``, ``16``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ".".join(str(v) for v in value)
    return str(value)


def parse_method(
    text: str, registry: Mapping[str, MethodEntry], extra: Sequence[str] = ()
) -> MethodSpec:
    """Parse one spec ``name[:key=value...]`` (``extra`` holds more ``key=value`` items)."""
    head, *rest = [part.strip() for part in text.strip().split(":")]
    if not head:
        raise ConfigError(f"a method spec must start with a method name; got {text!r}.")
    if head not in registry:
        raise ConfigError(
            f"unknown method `{head}`; allowed: {', '.join(registry)}. "
            "Run `verispec methods` for their parameters."
        )
    entry = registry[head]
    given: dict[str, Any] = {}
    for item in [*rest, *extra]:
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key:
            raise ConfigError(
                f"method `{head}`: parameters are written `key=value`; got {item!r} in {text!r}."
            )
        param = entry.param(key)
        if key in given:
            raise ConfigError(f"method `{head}`: parameter `{key}` is given twice.")
        given[key] = param.parse(value, head)
    defaults = tuple((p.name, p.default) for p in entry.params)
    return MethodSpec(name=head, given=tuple(given.items()), defaults=defaults)


def parse_methods(
    texts: str | Sequence[str], registry: Mapping[str, MethodEntry]
) -> list[MethodSpec]:
    """Parse comma-separated lists of specs.

    Raises:
        ConfigError: an unknown method or parameter (the message lists what is allowed),
            a malformed value, an empty list, or the same spec twice.
    """
    groups: list[tuple[str, list[str]]] = []
    for text in [texts] if isinstance(texts, str) else texts:
        for item in filter(None, (raw.strip() for raw in text.split(","))):
            key, sep, _ = item.partition("=")
            if not (sep and ":" not in key):
                groups.append((item, []))
            elif groups:  # `k=4` continues the previous spec: `tr:template=16,k=4`
                groups[-1][1].append(item)
            else:
                raise ConfigError(
                    f"parameter {item!r} comes before any method name; write `name:key=value`."
                )
    if not groups:
        raise ConfigError(f"no method given; allowed: {', '.join(registry)}.")
    specs = [parse_method(head, registry, extra) for head, extra in groups]
    labels = [spec.label for spec in specs]
    for i, label in enumerate(labels):
        if label in labels[:i]:
            raise ConfigError(f"method `{label}` is listed twice.")
    return specs


def _auto_or_int(shown: str) -> Callable[[str], int | str]:
    def convert(text: str) -> int | str:
        try:
            return text if text == "auto" else int(text)
        except ValueError:
            raise ValueError(f"an integer {shown} or `auto`") from None

    return convert


def option_params(options: type, names: Sequence[str]) -> tuple[Param, ...]:
    """The parameters ``names`` (spec names) of a drafter's options class, in that order,
    each with the field's default, help and check."""
    fields = {f.metadata.get("spec") or f.name: f for f in attrs.fields(options)}
    params = []
    for name in names:
        field = fields[name]
        kind, help = field.metadata["kind"], field.metadata["help"]
        if kind == "ints":  # each integer bounded when parsed, the whole by the drafter
            params.append(Param(name, tuple, field.default, help, 1, option=field))
        elif kind == "int|auto":
            convert = _auto_or_int(field.metadata["range"])
            params.append(
                Param(
                    name, str, field.default, help, convert=convert, shown_kind=kind, option=field
                )
            )
        else:
            kinds = {"int": int, "float": float, "bool": bool, "str": str}
            choices = field.metadata.get("choices")
            params.append(
                Param(name, kinds[kind], field.default, help, choices=choices, option=field)
            )
    return tuple(params)


def option_names(options: type) -> dict[str, str]:
    """Spec name -> constructor keyword, where they differ (``max`` -> ``max_tokens``)."""
    return {f.metadata["spec"]: f.name for f in attrs.fields(options) if f.metadata.get("spec")}

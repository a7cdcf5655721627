"""Method specs: ``name:key=value`` strings parsed into validated, typed parameters.

A benchmark method is named by a *spec*: the method's name, optionally followed
by parameters, e.g. ``tr:template=16:k=8``. A list of specs is separated by
commas; a comma-separated ``key=value`` item with no name continues the
previous spec, so ``--methods ar,hf,tr:template=16,k=4,pld:max=10`` reads as
``ar``, ``hf``, ``tr:template=16:k=4`` and ``pld:max=10``.

Each method is one :class:`MethodEntry`: its name, a one-line summary, its
parameters (:class:`Param`: a type, a default, bounds or choices) and a factory
that builds a runner once the model is loaded. The entries themselves live in
:mod:`verispec.bench.methods`. A drafter's parameters are not declared here: they are
read from the drafter's options (:func:`option_params`, fields made with
:func:`verispec.core.validate.option`), whose checks, defaults and help they use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from verispec.core.validate import check_option
from verispec.errors import ConfigError

__all__ = [
    "MethodEntry",
    "MethodSpec",
    "Param",
    "option_defaults",
    "option_names",
    "option_params",
    "parse_method",
    "parse_methods",
]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@attrs.frozen
class Param:
    """One typed parameter of a method.

    Attributes:
        name: the key in the spec (``template`` in ``tr:template=16``).
        kind: ``int``, ``float``, ``str``, ``bool`` or ``tuple`` (of integers, written
            with dots: ``branching=4.2.2``; bounds apply to each integer).
        default: the value when the spec does not give one; ``None`` means "the
            drafter's own default" (the keyword is then not passed).
        help: one line for ``verispec methods``.
        minimum, maximum: inclusive bounds for numbers.
        choices: the allowed values for strings (``None``: any).
        convert: for ``str`` parameters, a function that turns the text into the value
            or raises ``ValueError`` with the reason (e.g. "an integer or auto").
        shown_kind: the type as ``verispec methods`` shows it, when ``kind`` says too little.
        option: the drafter's options field this parameter sets: its check validates the
            typed value, and its allowed range is shown (instead of ``minimum``/``maximum``).
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
        value: Any
        if self.kind is bool:
            lowered = text.strip().lower()
            if lowered not in _TRUE | _FALSE:
                raise ConfigError(f"{where} must be true or false; got {text!r}.")
            return lowered in _TRUE
        if self.kind is tuple:
            try:
                items = tuple(int(part) for part in text.replace("x", ".").split("."))
            except ValueError:
                raise ConfigError(
                    f"{where} must be integers separated by dots (e.g. 4.2.2); got {text!r}."
                ) from None
            for item in items:
                self._check_bounds(item, where, text)
            return items
        if self.kind is int:
            try:
                value = int(text)
            except ValueError:
                raise ConfigError(f"{where} must be an integer; got {text!r}.") from None
        elif self.kind is float:
            try:
                value = float(text)
            except ValueError:
                raise ConfigError(f"{where} must be a number; got {text!r}.") from None
            if not math.isfinite(value):
                raise ConfigError(f"{where} must be finite; got {text!r}.")
        else:
            value = text
            if self.choices is not None and value not in self.choices:
                raise ConfigError(
                    f"{where} must be one of {', '.join(self.choices)}; got {text!r}."
                )
            if not value:
                raise ConfigError(f"{where} must not be empty.")
            if self.convert is not None:
                try:
                    value = self.convert(value)
                except ValueError as exc:
                    raise ConfigError(f"{where} must be {exc}; got {text!r}.") from None
            if self.option is None:
                return value
        if self.option is not None:
            check_option(self.option, where.strip("`"), value)
            return value
        self._check_bounds(value, where, text)
        return value

    def _check_bounds(self, value: float, where: str, text: str) -> None:
        if self.minimum is not None and value < self.minimum:
            raise ConfigError(f"{where} must be >= {self.minimum:g}; got {text}.")
        if self.maximum is not None and value > self.maximum:
            raise ConfigError(f"{where} must be <= {self.maximum:g}; got {text}.")

    def describe(self, native: Any = None) -> str:
        """One line: name, type, bounds, default (``native``: the drafter's own default)."""
        kind = self.shown_kind or ("ints a.b.c" if self.kind is tuple else self.kind.__name__)
        if self.choices:
            kind = "|".join(self.choices)
        bounds = ""
        if self.option is not None and self.option.metadata["range"]:
            bounds = " " + self.option.metadata["range"]
        elif self.minimum is not None and self.maximum is not None:
            bounds = f" in [{self.minimum:g}, {self.maximum:g}]"
        elif self.minimum is not None:
            bounds = f" >= {self.minimum:g}"
        elif self.maximum is not None:
            bounds = f" <= {self.maximum:g}"
        shown = self.default if self.default is not None else native
        default = "unset" if shown is None else _show(shown)
        return f"{self.name} ({kind}{bounds}, default {default}): {self.help}"


@attrs.frozen
class MethodEntry:
    """One benchmark method.

    Attributes:
        name: the spec name (``tr``).
        summary: one line for ``verispec methods``.
        params: the parameters the spec may set.
        build: ``build(context, params) -> runner``; ``params`` holds every parameter,
            defaults filled in. Called after the model is loaded.
        availability: returns ``None`` when the method can run in this installation,
            otherwise the reason it cannot (a drafter module not installed, a
            transformers feature missing). Must not load the model.
        native_defaults: the drafter's own defaults of the parameters whose registry
            default is ``None`` (read from its constructor); ``{}`` when unknown.
        drafter: for verispec's own methods, ``drafter(target, params, draft_model)``
            builds the method's drafter (``None`` for ``ar``); ``None`` for the peers
            (transformers, llama.cpp), which are not drafters.
        extra: the pip extra that provides an optional peer (``"llamacpp"``); the
            benchmark skips such a method, saying why, where it cannot run (not installed,
            or no GGUF file), instead of failing.
    """

    name: str
    summary: str
    params: tuple[Param, ...]
    build: Callable[[Any, dict[str, Any]], Any]
    availability: Callable[[], str | None] = attrs.field(default=lambda: None)
    native_defaults: Callable[[], dict[str, Any]] = attrs.field(default=dict)
    drafter: Callable[[Any, dict[str, Any], Any], Any] | None = None
    extra: str | None = None

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
    """A parsed method spec.

    Attributes:
        name: the method's registry name.
        given: the parameters the spec set, in the order given, already typed.
        defaults: every parameter's default (filled in from the registry).
    """

    name: str
    given: tuple[tuple[str, Any], ...] = ()
    defaults: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        """The spec as it is shown in tables: ``tr:template=16``."""
        if not self.given:
            return self.name
        return self.name + ":" + ":".join(f"{k}={_show(v)}" for k, v in self.given)

    @property
    def params(self) -> dict[str, Any]:
        """Every parameter, defaults filled in and the given values on top."""
        return {**dict(self.defaults), **dict(self.given)}

    def __str__(self) -> str:
        return self.label


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ".".join(str(v) for v in value)
    return str(value)


def _known(registry: Mapping[str, MethodEntry]) -> str:
    return ", ".join(registry)


def parse_method(
    text: str, registry: Mapping[str, MethodEntry], extra: Sequence[str] = ()
) -> MethodSpec:
    """Parse one spec ``name[:key=value...]`` (``extra`` holds more ``key=value`` items)."""
    head, *rest = [part.strip() for part in text.strip().split(":")]
    if not head:
        raise ConfigError(f"a method spec must start with a method name; got {text!r}.")
    entry = registry.get(head)
    if entry is None:
        raise ConfigError(
            f"unknown method `{head}`; allowed: {_known(registry)}. "
            "Run `verispec methods` for their parameters."
        )
    given: dict[str, Any] = {}
    for item in [*rest, *extra]:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(
                f"method `{head}`: parameters are written `key=value`; got {item!r} in {text!r}."
            )
        param = entry.param(key)
        if key in given:
            raise ConfigError(f"method `{head}`: parameter `{key}` is given twice.")
        given[key] = param.parse(value.strip(), head)
    try:
        native = entry.native_defaults()
    except ConfigError:  # the drafter is not installed: no defaults to show
        native = {}
    defaults = tuple(
        (p.name, p.default if p.default is not None else native.get(p.name)) for p in entry.params
    )
    return MethodSpec(name=head, given=tuple(given.items()), defaults=defaults)


def parse_methods(
    texts: str | Sequence[str], registry: Mapping[str, MethodEntry]
) -> list[MethodSpec]:
    """Parse a comma-separated list of specs (or several such lists).

    Raises:
        ConfigError: an unknown method or parameter (the message lists what is
            allowed), a malformed value, an empty list, or the same spec twice.
    """
    if isinstance(texts, str):
        texts = [texts]
    groups: list[tuple[str, list[str]]] = []
    for text in texts:
        for raw in text.split(","):
            item = raw.strip()
            if not item:
                continue
            key, sep, _ = item.partition("=")
            if sep and ":" not in key:
                # `k=4` continues the previous spec: `tr:template=16,k=4`.
                if not groups:
                    raise ConfigError(
                        f"parameter {item!r} comes before any method name; write `name:key=value`."
                    )
                groups[-1][1].append(item)
            else:
                groups.append((item, []))
    if not groups:
        raise ConfigError(f"no method given; allowed: {_known(registry)}.")
    specs = [parse_method(head, registry, extra) for head, extra in groups]
    labels = [spec.label for spec in specs]
    for i, label in enumerate(labels):
        if label in labels[:i]:
            raise ConfigError(f"method `{label}` is listed twice.")
    return specs


def _auto_or_int(shown: str) -> Callable[[str], int | str]:
    def convert(text: str) -> int | str:
        if text == "auto":
            return text
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"an integer {shown} or `auto`") from None

    return convert


_KIND = {"int": int, "float": float, "bool": bool}


def _spec_name(field: Any) -> str:
    return field.metadata.get("spec") or field.name


def option_params(options: type, names: Sequence[str]) -> tuple[Param, ...]:
    """The parameters ``names`` (spec names) of a drafter's options class, in that order.

    Each takes its type, help and check from the options field; its default is ``None``
    (the drafter's own: :func:`option_defaults`).
    """
    fields = {_spec_name(f): f for f in attrs.fields(options)}
    params = []
    for name in names:
        field = fields[name]
        kind = field.metadata["kind"]
        if kind == "ints":  # each integer bounded when parsed, the whole by the drafter
            params.append(Param(name, tuple, None, field.metadata["help"], 1, option=field))
        elif kind == "int|auto":
            params.append(
                Param(name, str, None, field.metadata["help"],
                      convert=_auto_or_int(field.metadata["range"]), shown_kind=kind, option=field)
            )  # fmt: skip
        else:
            params.append(Param(name, _KIND[kind], None, field.metadata["help"], option=field))
    return tuple(params)


def option_defaults(options: type) -> dict[str, Any]:
    """The defaults of a drafter's options, by spec name."""
    return {_spec_name(f): f.default for f in attrs.fields(options)}


def option_names(options: type) -> dict[str, str]:
    """Spec name -> constructor keyword, where they differ (``max`` -> ``max_tokens``)."""
    return {_spec_name(f): f.name for f in attrs.fields(options) if _spec_name(f) != f.name}

"""The checks of a single value: "an integer >= 1", "in (0, 1)", "a finite number > 0".

Written once and used wherever a value enters verispec (the core's types, the
drafters' configurations, the models, the kernels, the benchmark and the CLI). Each
check returns the value and raises :class:`~verispec.errors.ConfigError` naming the
argument, what was given and what is allowed::

    integer("k", 0, 1)                  # ConfigError: `k` must be an integer >= 1; got 0.
    integer("seed", s, 0, below=2**64)  # ... must be an integer in [0, 2**64); ...
    interval("top_p", p, 0, 1, closed="high", note=" (1 disables it)")
    number("prior_strength", s, strict=True)  # ... must be a finite number > 0; ...

:func:`attrs_check` turns a check into an ``attrs`` validator (the attribute's name is
the argument's name); :func:`bounds` is the phrase for the allowed range, for messages
that are not :class:`ConfigError` (the CLI's argparse errors).

:func:`option` declares one field of a drafter's options (its default, its check and a
line of help), the one place a drafter's parameter is described: the drafter checks
its arguments by building its options, and the benchmark's method specs, ``verispec
methods`` and :func:`verispec.drafter` read the same fields.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any, Literal

import attrs

from verispec.errors import ConfigError

__all__ = [
    "attrs_check",
    "boolean",
    "bounds",
    "check_option",
    "choice",
    "in_bounds",
    "integer",
    "integer_or_auto",
    "interval",
    "number",
    "option",
    "or_none",
]


def _limit(value: int) -> str:
    """``2**64`` for a large power of two, else the number."""
    if value >= 1 << 16 and value & (value - 1) == 0:
        return f"2**{value.bit_length() - 1}"
    return str(value)


def bounds(low: int | None = None, high: int | None = None, below: int | None = None) -> str:
    """The allowed range as a phrase: ``">= 1"``, ``"in [1, 1024]"``, ``"in [0, 2**64)"``."""
    if high is not None:
        return f"in [{low}, {high}]"
    if below is not None:
        return f"in [{low}, {_limit(below)})"
    return f">= {low}" if low is not None else ""


def in_bounds(value: int, low: int | None, high: int | None, below: int | None) -> bool:
    """Whether ``value`` lies in the range :func:`bounds` describes."""
    return (
        (low is None or value >= low)
        and (high is None or value <= high)
        and (below is None or value < below)
    )


def integer(
    name: str,
    value: Any,
    low: int | None = None,
    *,
    high: int | None = None,
    below: int | None = None,
    note: str = "",
    integral: bool = False,
) -> int:
    """``value`` if it is an ``int`` (not a bool) in range, else :class:`ConfigError`.

    Args:
        name: the argument's name, as the message shows it (in backticks).
        low, high: inclusive bounds; ``below``: an exclusive upper bound.
        note: said after the range, e.g. ``" (0 disables it)"`` or ``" or 'auto'"``.
        integral: also accept other integral numbers (NumPy integers), returned as ``int``.
    """
    kinds: Any = numbers.Integral if integral else int
    if (
        isinstance(value, bool)
        or not isinstance(value, kinds)
        or not in_bounds(int(value), low, high, below)
    ):
        phrase = bounds(low, high, below)
        raise ConfigError(
            f"`{name}` must be an integer{' ' + phrase if phrase else ''}{note}; got {value!r}."
        )
    return int(value)


def interval(
    name: str,
    value: Any,
    low: float,
    high: float,
    *,
    closed: Literal["neither", "low", "high", "both"] = "neither",
    note: str = "",
) -> float:
    """``value`` if it is a real number (not a bool) in the interval, else :class:`ConfigError`.

    ``closed`` says which ends belong to it: ``"neither"`` is ``(low, high)``, ``"both"``
    is ``[low, high]``. NaN is never in it.
    """
    low_in, high_in = closed in ("low", "both"), closed in ("high", "both")
    real = isinstance(value, int | float) and not isinstance(value, bool)
    if not (
        real
        and (low <= value if low_in else low < value)
        and (value <= high if high_in else value < high)
    ):
        shown = f"{'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"
        raise ConfigError(f"`{name}` must be in {shown}{note}; got {value!r}.")
    return float(value)


def number(
    name: str,
    value: Any,
    low: float = 0.0,
    *,
    strict: bool = False,
    finite: bool = True,
    note: str = "",
) -> float:
    """``value`` if it is a real number (not a bool) ``>= low`` (``> low`` when ``strict``),
    and finite unless ``finite=False``; else :class:`ConfigError`. NaN never passes."""
    real = isinstance(value, int | float) and not isinstance(value, bool)
    if (
        not real
        or math.isnan(value)
        or (finite and math.isinf(value))
        or (value <= low if strict else value < low)
    ):
        what = f"a {'finite ' if finite else ''}number {'>' if strict else '>='} {low:g}"
        raise ConfigError(f"`{name}` must be {what}{note}; got {value!r}.")
    return float(value)


def choice(name: str, value: Any, allowed: tuple[Any, ...], *, note: str = "") -> Any:
    """``value`` if it is one of ``allowed`` (a ``Literal``'s values, ``typing.get_args``),
    else :class:`ConfigError`: "`runtime` must be one of ('auto', 'fast', 'hf'); got 'x'."."""
    if isinstance(value, bool) or value not in allowed:
        raise ConfigError(f"`{name}` must be one of {allowed}{note}; got {value!r}.")
    return value


def attrs_check(check: Callable[..., object], *args: Any, **kwargs: Any) -> Any:
    """An ``attrs`` validator running ``check(attribute.name, value, *args, **kwargs)``.

    The validator keeps ``(check, args, kwargs)`` as its ``check`` attribute, so a reader
    of the field (the CLI's generation flags) learns the allowed range from the field.
    """

    def validator(instance: object, attribute: Any, value: object) -> None:
        check(attribute.name, value, *args, **kwargs)

    validator.check = (check, args, kwargs)  # type: ignore[attr-defined]
    return validator


def boolean(name: str, value: Any) -> bool:
    """``value`` if it is ``True`` or ``False``, else :class:`ConfigError`."""
    if not isinstance(value, bool):
        raise ConfigError(f"`{name}` must be True or False; got {value!r}.")
    return value


def integer_or_auto(name: str, value: Any, low: int, *, note: str = "") -> int | str:
    """``"auto"``, or an integer ``>= low`` (:func:`integer`)."""
    if value == "auto":
        return "auto"
    return integer(name, value, low, note=" or 'auto'" + note)


def or_none(check: Callable[..., Any]) -> Callable[..., Any]:
    """``check`` that also accepts ``None`` (and says so in its message)."""

    def check_or_none(name: str, value: Any, *args: Any, note: str = "", **kwargs: Any) -> Any:
        if value is None:
            return None
        return check(name, value, *args, note=" or None" + note, **kwargs)

    check_or_none.wrapped = check  # type: ignore[attr-defined]
    return check_or_none


_KINDS: dict[Any, str] = {integer: "int", interval: "float", number: "float", boolean: "bool"}
_KINDS[integer_or_auto] = "int|auto"


def _range(check: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The allowed range a check with these arguments enforces, as ``verispec methods``
    shows it: ``>= 1``, ``in [1, 1024]``, ``in (0, 1]``, ``> 0``."""
    check = getattr(check, "wrapped", check)
    if check in (integer, integer_or_auto):
        low = args[0] if args else None
        return bounds(low, high=kwargs.get("high"), below=kwargs.get("below"))
    if check is interval:
        closed = kwargs.get("closed", "neither")
        low, high = args
        left, right = (
            "[" if closed in ("low", "both") else "(",
            "]" if closed in ("high", "both") else ")",
        )
        return f"in {left}{low:g}, {high:g}{right}"
    if check is number:
        low = args[0] if args else 0.0
        return f"{'>' if kwargs.get('strict') else '>='} {low:g}"
    return ""


def option(
    default: Any,
    check: Callable[..., object] | None = None,
    *args: Any,
    help: str,
    spec: str | None = None,
    kind: str | None = None,
    choices: tuple[str, ...] | None = None,
    converter: Callable[[Any], Any] | None = None,
    **kwargs: Any,
) -> Any:
    """A field of a drafter's options: ``attrs.field`` with the check as its validator.

    Args:
        default: the drafter's default.
        check: one of this module's checks (``None``: not checked), called with the
            field's name, the value, ``args`` and ``kwargs``.
        help: one line for ``verispec methods``.
        spec: the parameter's name in method specs, when not the field's
            (``pld:max`` for ``max_tokens``).
        kind: the type as method specs read it, when ``check`` does not say
            (``"bool"``, ``"int"``, ``"float"``, ``"str"``).
        choices: the names a method spec may give (``tr:template=16``), where the field
            takes names; the class may take more (a template as index paths).
        converter: turns an accepted value into the one the options hold, so that equal
            settings make equal options (``TokenRecycling(16)`` and ``tr:template=16``).
    """
    return attrs.field(
        default=default,
        converter=converter,
        validator=None if check is None else attrs_check(check, *args, **kwargs),
        metadata={
            "help": help,
            "spec": spec,
            "kind": kind or _KINDS[getattr(check, "wrapped", check)],
            "choices": choices,
            "range": _range(check, args, kwargs),
            "check": None if check is None else (check, args, kwargs),
        },
    )


def check_option(field: Any, name: str, value: Any) -> None:
    """Run an :func:`option` field's check on ``value``, naming it ``name`` in the error."""
    found = field.metadata.get("check")
    if found is not None:
        check, args, kwargs = found
        check(name, value, *args, **kwargs)

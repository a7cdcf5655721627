"""Tests of verispec/core/validate.py: the one set of value checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from verispec.core.validate import attrs_check, bounds, integer, interval, number
from verispec.errors import ConfigError


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: integer("k", 0, 1), "`k` must be an integer >= 1; got 0."),
        (lambda: integer("k", True, 1), "`k` must be an integer >= 1; got True."),
        (lambda: integer("k", 2.0, 1), "`k` must be an integer >= 1; got 2.0."),
        (lambda: integer("k", 1025, 1, high=1024), "`k` must be an integer in [1, 1024]; got"),
        (lambda: integer("s", 2**64, 0, below=2**64), "`s` must be an integer in [0, 2**64); got"),
        (lambda: integer("b", "x", 0, note=" or 'auto'"), "`b` must be an integer >= 0 or 'auto';"),
        (lambda: interval("p", 0, 0, 1, closed="high"), "`p` must be in (0, 1]; got 0."),
        (lambda: interval("p", math.nan, 0, 1, closed="both"), "`p` must be in [0, 1]; got nan."),
        (lambda: interval("p", False, 0, 1, closed="both"), "`p` must be in [0, 1]; got False."),
        (lambda: number("t", -0.5), "`t` must be a finite number >= 0; got -0.5."),
        (lambda: number("t", math.inf), "`t` must be a finite number >= 0; got inf."),
        (lambda: number("s", 0, strict=True), "`s` must be a finite number > 0; got 0."),
    ],
)  # fmt: skip
def test_bad_values_raise_config_error_naming_argument_value_and_range(call, message) -> None:  # type: ignore[no-untyped-def]
    """Each check refuses an out-of-range or wrongly typed value (bools included) with a
    ConfigError that names the argument, the value and the allowed range."""
    with pytest.raises(ConfigError) as error:
        call()
    assert str(error.value).startswith(message)


def test_good_values_pass_through() -> None:
    """In-range values come back (NumPy integers as ``int`` where ``integral``; an infinite
    number where ``finite=False``); the range phrases match the messages."""
    assert integer("k", 5, 1, high=5) == 5
    got = integer("seed", np.uint64(7), 0, below=2**64, integral=True)
    assert got == 7 and type(got) is int
    assert interval("p", 1, 0, 1, closed="high") == 1.0
    assert number("d", math.inf, finite=False) == math.inf
    assert bounds(1) == ">= 1" and bounds(0, below=2**64) == "in [0, 2**64)"


def test_attrs_check_names_the_attribute() -> None:
    """As an attrs validator, a check names the attribute it guards."""
    import attrs

    @attrs.frozen
    class Config:
        budget: int = attrs.field(validator=attrs_check(integer, 1))

    assert Config(3).budget == 3
    with pytest.raises(ConfigError, match="`budget` must be an integer >= 1; got 0"):
        Config(0)

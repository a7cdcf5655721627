"""Tests of verispec/bench/commands/target.py's heap freezing around a command's decoding."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from verispec.bench.commands.target import frozen_heap


@pytest.fixture(autouse=True)
def _no_automatic_collection() -> Iterator[None]:
    """Only the explicit collections run, so whether a cycle is still alive is decided by
    the code under test, not by an allocation count crossing a threshold."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class _Node:
    """An object that can sit in a reference cycle and be watched by a weak reference."""

    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_frozen_heap_freezes_what_is_alive_and_gives_it_back() -> None:
    """Inside, the objects alive on entry are frozen (out of the collector's view); on exit,
    none is; garbage left before entry is collected, not frozen; a cycle made and dropped
    inside is still collected."""
    assert gc.get_freeze_count() == 0
    leftover = _cycle()  # garbage from "loading": a cycle no one refers to
    assert leftover() is not None  # alive until a collection
    with frozen_heap():
        assert leftover() is None  # collected on entry, not frozen
        assert gc.get_freeze_count() > 0
        made_inside = _cycle()
        gc.collect()
        assert made_inside() is None  # decoding's own garbage is collected as before
    assert gc.get_freeze_count() == 0


def test_frozen_heap_leaves_a_process_that_freezes_its_own_objects_alone() -> None:
    """Where objects are already frozen on entry, nothing is collected, frozen or unfrozen."""
    gc.freeze()
    try:
        count = gc.get_freeze_count()
        assert count > 0
        leftover = _cycle()
        with frozen_heap():
            assert gc.get_freeze_count() == count
            assert leftover() is not None  # no collection on entry
        assert gc.get_freeze_count() == count
    finally:
        gc.unfreeze()

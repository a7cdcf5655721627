"""Notices of long waits, on stderr: measuring a latency table, converting a GGUF file,
compiling graphs. Each says what is happening, that it happens once (and where the result
is kept), and how long it took. ``set_notices(False)`` (the CLI's ``--no-progress``)
silences them.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator

__all__ = ["notice", "notices_enabled", "set_notices", "waiting"]

_STATE = {"enabled": True}


def set_notices(enabled: bool) -> None:
    """Print the notices (the default) or not."""
    _STATE["enabled"] = bool(enabled)


def notices_enabled() -> bool:
    """Whether notices are printed."""
    return _STATE["enabled"]


def notice(message: str) -> None:
    """``verispec: <message>`` on stderr (when notices are on)."""
    if _STATE["enabled"]:
        print(f"verispec: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def waiting(what: str) -> Iterator[None]:
    """``verispec: <what> ...`` before the block, ``... done in S s`` after it."""
    if not _STATE["enabled"]:
        yield
        return
    print(f"verispec: {what} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    yield
    print(f"verispec: ... done in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)

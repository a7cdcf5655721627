"""Where verispec keeps what it builds or measures once: one rule for every cache."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir(*parts: str) -> Path:
    """``$VERISPEC_CACHE`` if set, else ``~/.cache/verispec``, joined with ``parts``.

    The converted models live at its top, the latency tables in ``latency/``, inductor's
    graphs in ``inductor/`` and the built CPU kernel in ``kernels/``.
    """
    env = os.environ.get("VERISPEC_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "verispec"
    return root.joinpath(*parts)

"""Where verispec keeps what it builds or measures once: one rule for every cache, and
one way to write a file that another process may be writing at the same time."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["beside", "cache_dir", "write_atomic"]


def cache_dir(*parts: str) -> Path:
    """``$VERISPEC_CACHE`` if set, else ``~/.cache/verispec``, joined with ``parts``.

    The converted models live at its top, the latency tables in ``latency/``, inductor's
    graphs in ``inductor/`` and the built CPU kernel in ``kernels/``.
    """
    env = os.environ.get("VERISPEC_CACHE")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "verispec"
    return root.joinpath(*parts)


def beside(path: str | os.PathLike[str], suffix: str) -> Path:
    """A new empty hidden file in ``path``'s directory, named after it, with a unique name."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    return Path(name)


def write_atomic(path: str | os.PathLike[str], write: Callable[[Path], object]) -> None:
    """Call ``write(tmp)`` on a new temporary file beside ``path``, then rename it to
    ``path``, with the permissions ``open`` would give a new file (0666 less the umask;
    ``mkstemp`` makes it 0600). The temporary file's name is unique, so two processes
    writing the same cache file at once (two shards of a benchmark measuring one latency
    table) each rename a whole file, and the last one wins; a failed write leaves
    nothing behind."""
    path = Path(path)
    tmp = beside(path, ".tmp")
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o666 & ~umask)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)

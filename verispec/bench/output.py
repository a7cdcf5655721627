"""Writing benchmark results: atomic files, and a description of the machine.

Every output is written to a temporary file beside its destination and renamed
into place, so an interrupted run never leaves a half-written JSON, Markdown or
PNG file, and outputs are only written once the whole run has succeeded.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from verispec.errors import ConfigError

__all__ = ["check_writable", "machine_info", "write_atomic", "write_json", "write_text"]


def check_writable(path: str | Path, what: str) -> Path:
    """Fail now (before a long run) if ``path`` cannot be written later.

    The check does what the write will do: it creates (and removes) a temporary file
    in the destination's directory, and opens an existing destination for appending
    (which changes nothing in it). Permission bits alone say yes to root and on
    read-only mounts.
    """
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ConfigError(f"`{what}` must be a file path; {str(path)!r} is a directory.")
    if not parent.is_dir():
        raise ConfigError(f"`{what}`: the directory {str(parent)!r} does not exist.")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=parent)
        os.close(fd)
        os.unlink(probe)
        if path.exists():
            with open(path, "a"):
                pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(
            f"`{what}` must be writable; {str(path)!r} cannot be written: {reason}."
        ) from None
    return path


def write_atomic(path: str | Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it to ``path``."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text(path: str | Path, text: str) -> None:
    def write(tmp: Path) -> None:
        tmp.write_text(text, encoding="utf-8")

    write_atomic(path, write)


def write_json(path: str | Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(
    device: torch.device | str = "cpu", dtype: Any = None, runtime: str | None = None
) -> dict[str, Any]:
    """What ran the benchmark: CPU and its matrix instruction sets, cores, threads, GPU,
    library versions and the model runtime."""
    import transformers

    import verispec

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "verispec": verispec.__version__,
        "device": str(device),
    }
    if dtype is not None:
        info["dtype"] = str(dtype).replace("torch.", "")
    from verispec.models.runtime import cpu_features

    info["cpu_flags"] = " ".join(cpu_features()) or "unknown"
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    if runtime:
        info["runtime"] = runtime
    return info

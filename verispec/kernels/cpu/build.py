"""Building verispec's C kernels for this CPU, once, and loading them with ``ctypes``.

The CPU kernels are C files beside the modules that call them (the runtime's products,
attention and layers in :mod:`verispec.models`; the logits' top-k in
:mod:`verispec.kernels.cpu.topk`). :func:`build` compiles a set of them with the system's
C compiler for this machine (``-march=native``) into ``$VERISPEC_CACHE/kernels``, keyed by
the sources, the compiler, the flags and the CPU's instruction sets, so a library is built
once per machine and source and a changed source is built again. A library is written to a
temporary name and renamed: a half-written one is never loaded.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from verispec.core.paths import cache_dir
from verispec.kernels.cpu.features import cpu_flags

__all__ = ["COMPILE_FLAGS", "build", "source_hash"]

COMPILE_FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared")
"""How the kernels are compiled (also by ``benchmarks/kernel_products.py --against``)."""


def source_hash(paths: Sequence[Path]) -> str:
    """A short hash of C sources: what a timing measured with them depends on."""
    return hashlib.sha256(b"".join(p.read_bytes() for p in paths)).hexdigest()[:12]


def build(
    name: str,
    sources: Sequence[Path],
    headers: Sequence[Path] = (),
    extra_flags: Sequence[str] = (),
) -> ctypes.CDLL:
    """Compile ``sources`` (x86-64 with AVX2 and FMA) into one library named ``name`` and load it.

    ``extra_flags`` follow :data:`COMPILE_FLAGS` (a test builds the kernels without AVX-512
    with ``("-mno-avx512f",)`` to compare them with the native build).

    Raises:
        RuntimeError: not x86-64, no AVX2 or FMA, no C compiler, or the compiler failed
            (its last lines in the message).
    """
    if platform.machine() not in ("x86_64", "AMD64"):
        raise RuntimeError(f"the kernel is written for x86-64; this is {platform.machine()}")
    missing = {"avx2", "fma"} - cpu_flags()
    if missing:
        raise RuntimeError(f"this CPU lacks {', '.join(sorted(missing))}")
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc or gcc) on the PATH")
    source = b"".join(Path(path).read_bytes() for path in (*sources, *headers))
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    flags = [*COMPILE_FLAGS, *extra_flags]
    key = hashlib.sha256(
        source + version.encode() + " ".join(flags).encode() + str(sorted(cpu_flags())).encode()
    ).hexdigest()[:16]
    target = cache_dir("kernels", f"{name}-{key}.so")
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            done = subprocess.run(
                [compiler, *flags, *map(str, sources), "-o", str(built)],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                raise RuntimeError(f"{compiler} failed: {done.stderr.strip()[-400:]}")
            os.replace(built, target)  # atomic: a half-written library is never loaded
    return ctypes.CDLL(str(target))

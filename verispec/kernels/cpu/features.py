"""What this CPU offers the runtime's kernels: its instruction-set flags and native bfloat16.

:func:`cpu_flags` is what the C kernels are built for (:mod:`verispec.models.accelerators.blocks`
needs AVX2 and FMA); :func:`cpu_features` the subset that decides the matrix kernels, as
benchmark reports print it; :func:`bf16_supported` whether oneDNN multiplies bfloat16 at
all (natively, or emulated in float32 instructions on any AVX-512 CPU), and
:func:`bf16_native` whether this CPU has bfloat16 instructions (AVX-512 BF16 or AMX), which
:func:`default_dtype` reads: emulated bfloat16 products do a float32 product's work plus
the conversions, so they are no reason to give up float32's exactness.
"""

from __future__ import annotations

import torch

__all__ = ["bf16_native", "bf16_supported", "cpu_features", "cpu_flags", "default_dtype"]

_FEATURES = (
    "avx2",
    "fma",
    "avx_vnni",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_bf16",
    "amx_tile",
)
_BF16_INSTRUCTIONS = ("avx512_bf16", "amx_bf16")


def cpu_flags() -> set[str]:
    """The instruction-set flags this CPU reports (``/proc/cpuinfo``; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_features() -> list[str]:
    """Which of the instruction sets that decide the matrix kernels this CPU reports.

    Read from ``/proc/cpuinfo`` (Linux); empty elsewhere.
    """
    flags = cpu_flags()
    return [name for name in _FEATURES if name in flags]


def bf16_supported() -> bool:
    """Whether oneDNN multiplies bfloat16 on this CPU: natively (AVX-512 BF16 or AMX) or
    emulated (any AVX-512 CPU; oneDNN reports both alike). Prepacked bfloat16 weights need it."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def bf16_native() -> bool:
    """Whether this CPU multiplies bfloat16 in bfloat16 instructions (AVX-512 BF16 or AMX) and
    oneDNN uses them; an AVX-512 CPU without them (the Intel Xeon with VNNI) only emulates."""
    return bf16_supported() and any(flag in cpu_flags() for flag in _BF16_INSTRUCTIONS)


def default_dtype(device: str | torch.device = "cpu") -> torch.dtype:
    """bfloat16 on a GPU or a CPU that multiplies it natively (:func:`bf16_native`), float32
    elsewhere."""
    if torch.device(device).type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if bf16_native() else torch.float32

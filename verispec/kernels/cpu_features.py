"""What this CPU offers the runtime's kernels: its instruction-set flags and native bfloat16.

:func:`cpu_flags` is what the C kernels are built for (:mod:`verispec.models.cpu_linear`
needs AVX2 and FMA); :func:`cpu_features` the subset that decides the matrix kernels, as
benchmark reports print it; :func:`bf16_supported` whether oneDNN multiplies bfloat16
natively (AVX-512 BF16 or AMX), which :func:`default_dtype` reads: emulated bfloat16
products are slower than float32 ones.
"""

from __future__ import annotations

import torch

__all__ = ["bf16_supported", "cpu_features", "cpu_flags", "default_dtype"]

_FEATURES = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")


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
    """Whether this CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX), per oneDNN."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def default_dtype(device: str | torch.device = "cpu") -> torch.dtype:
    """bfloat16 on a GPU or a CPU that multiplies it natively, float32 elsewhere."""
    if torch.device(device).type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if bf16_supported() else torch.float32

"""The coupled rule's draw of a CPU row in C: the processed distribution and its race.

:class:`~verispec.verifiers.Coupled` draws the target's token at each visited row from the
processed distribution (:meth:`~verispec.core.sampling.SamplingParams.probs`) by a seeded
two-level exponential race (:func:`~verispec.verifiers.coupled.seeded_sample`). In torch and
NumPy that is about twenty calls over the logits of a row and two Philox generators, each
slow in the caches a forward has just swept (docs/kernels.rst has the figures).
:func:`coupled_draw` runs ``draw.c`` instead: one call, a few passes over the row.

The same law, not the same bits: the exponentials, the softmax sums and the noise's
logarithm round differently from torch's and NumPy's, so a draw differs from the torch
path's only where two contenders of the race (or two tokens at the top-p cut) are within
rounding of each other. Every drafter of fixed candidates and plain decoding take the same
path for the same row, so their seeded identity holds.

Built at first use (:func:`verispec.kernels.cpu.build.build`); where it cannot be, or for
rows it does not take (not a float32 row on the CPU, a NaN or infinite maximum, which the
torch path then reports), :func:`coupled_draw` returns ``None`` and the caller takes the
torch path.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import torch

from verispec.core.sampling import SamplingParams
from verispec.kernels.cpu.build import build

__all__ = ["coupled_draw", "library", "position_noise"]

_DIR = Path(__file__).parent
_SOURCE = _DIR / "draw.c"
_STATE: dict[str, object] = {}
_BUFFERS = threading.local()  # per thread: ctypes releases the GIL during a call


def library() -> ctypes.CDLL | None:
    """The built kernel (built on first call), or ``None`` where it cannot be built."""
    if "lib" not in _STATE:
        try:
            lib = build("cpu_draw", (_SOURCE,), headers=(_DIR / "simd.h",))
            i64, u64, ptr = ctypes.c_int64, ctypes.c_uint64, ctypes.c_void_p
            lib.vs_coupled_draw.argtypes = [
                ptr, i64, ctypes.c_double, i64, ctypes.c_double, ctypes.c_float, u64, u64, i64,
                ptr, ptr,
            ]  # fmt: skip
            lib.vs_coupled_draw.restype = i64
            lib.vs_position_noise.argtypes = [u64, u64, u64, i64, ptr]
            lib.vs_position_noise.restype = None
            _STATE["lib"], _STATE["why"] = lib, ""
        except (RuntimeError, OSError) as error:
            _STATE["lib"], _STATE["why"] = None, str(error)
    return _STATE["lib"]  # type: ignore[return-value]


def _buffers(vocab: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This thread's work buffers for rows of ``vocab`` logits: a float32 row (the
    exponentials) and the 64-bit keys (the top-k heap, the ranked top-p candidates, then the
    race's masses and noise)."""
    blocks = -(-vocab // block)
    size = 2 * vocab + 2 * blocks + 2 * block
    held = getattr(_BUFFERS, "held", None)
    if held is None or held[0].shape[0] < vocab or held[1].shape[0] < size:
        held = (torch.empty(vocab), torch.empty(size, dtype=torch.int64))
        _BUFFERS.held = held
    return held


def position_noise(seed: int, position: int, stream: int, count: int) -> torch.Tensor | None:
    """:func:`~verispec.verifiers.coupled.position_noise` computed by the kernel (float64,
    Shape: (count,)), or ``None`` where it cannot be built. The arguments are not checked:
    the verifier's are."""
    lib = library()
    if lib is None:
        return None
    out = torch.empty(count, dtype=torch.float64)
    lib.vs_position_noise(seed, position, stream, count, out.data_ptr())
    return out


def coupled_draw(
    row: torch.Tensor, sampling: SamplingParams, seed: int, position: int, block: int
) -> int | None:
    """The token the coupled rule draws from ``row`` at ``position`` for ``seed``, or
    ``None`` where the kernel does not take the row.

    Args:
        row: float32 logits on the CPU, Shape: (V,), unit stride.
        sampling: the processing (temperature 0 draws the first maximum).
        seed, position: the race's key, integers in [0, 2**64) (checked by the caller).
        block: tokens per block of the two-level race.

    Returns:
        The token id, or ``None``: not a float32 CPU row with unit stride and fewer than
        2**32 logits, the kernel cannot be built, or the row holds NaN or +inf or no finite
        value (the torch path raises the error that names it).
    """
    if row.device.type != "cpu" or row.dtype != torch.float32 or row.dim() != 1:
        return None
    if row.stride(0) != 1 or row.shape[0] >= 2**32:  # the kernel ranks 32-bit ids
        return None
    lib = library()
    if lib is None:
        return None
    vocab = row.shape[0]
    e, keys = _buffers(vocab, block)
    top_k = sampling.top_k if sampling.top_k < vocab else 0  # no cut (and no int64 overflow)
    token = lib.vs_coupled_draw(
        row.data_ptr(), vocab, sampling.temperature, top_k, sampling.top_p,
        sampling.min_p, seed, position, block, e.data_ptr(), keys.data_ptr(),
    )  # fmt: skip
    return None if token < 0 else int(token)

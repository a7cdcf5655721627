"""The top-k of CPU logit rows in C: what Token Recycling learns from each step, cheaply.

Token Recycling (:mod:`verispec.drafters.token_recycling`) and Dynamic Token Recycling
write the target's top-``k`` at every scored row into their matrix after each drafted
step. With ``torch`` ops that took a few percent of a two-thread decoding step for the one
to four rows of a small CPU tree (several ops, each with its own dispatch).
:func:`topk_rows` runs ``topk.c``: one pass over each row, a vector
maximum per eight logits, with (when asked) the log-sum-exp of the row's block maxima
(Dynamic Token Recycling's score normaliser). Same values as ``torch.topk``; among equal
values the lower id first.

Built at first use with the system's C compiler (:func:`verispec.kernels.cpu.build.build`);
where it cannot be, or for rows it does not take (not float32 on the CPU, a block size that
does not divide the vocabulary, a NaN), :func:`topk_rows` returns ``None`` and the caller
uses ``torch.topk``.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from verispec.kernels.cpu.build import build

__all__ = ["library", "topk_rows"]

_SOURCE = Path(__file__).with_name("topk.c")
_STATE: dict[str, object] = {}


def library() -> ctypes.CDLL | None:
    """The built kernel (built on first call), or ``None`` where it cannot be built."""
    if "lib" not in _STATE:
        try:
            lib = build("cpu_topk", (_SOURCE,))
            i64, ptr = ctypes.c_int64, ctypes.c_void_p
            lib.vs_topk.argtypes = [ptr, i64, i64, i64, ctypes.c_int, i64, ptr, ptr, ptr]
            lib.vs_topk.restype = ctypes.c_int
            _STATE["lib"], _STATE["why"] = lib, ""
        except (RuntimeError, OSError) as error:
            _STATE["lib"], _STATE["why"] = None, str(error)
    return _STATE["lib"]  # type: ignore[return-value]


def topk_rows(
    logits: torch.Tensor, k: int, block: int, *, lse: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
    """The ``k`` largest values of each row, their ids, and (``lse=True``) the log-sum-exp of
    the row's maxima over blocks of ``block`` consecutive ids; ``None`` where the kernel does
    not run.

    Args:
        logits: float32 on the CPU, Shape: (M, V), unit stride along V.
        k: candidates per row, ``1 <= k <= V``.
        block: a multiple of 8 that divides V.
        lse: also return the log-sum-exp (else ``None`` in its place).

    Returns:
        values (float32, Shape: (M, K), descending), int64 ids (Shape: (M, K); the lower id
        first among equal values) and float32 log-sum-exps (Shape: (M, 1)) or ``None``;
        ``None`` for other inputs, where the kernel cannot be built, or when a row holds a
        NaN.
    """
    rows, vocab = logits.shape
    if (
        logits.device.type != "cpu"
        or logits.dtype != torch.float32
        or logits.stride(-1) != 1
        or block % 8
        or vocab % block
        or not 1 <= k <= vocab
    ):
        return None
    lib = library()
    if lib is None:
        return None
    values = torch.empty(rows, k)
    ids = torch.empty(rows, k, dtype=torch.long)
    norm = torch.empty(rows, 1) if lse else None
    bad = lib.vs_topk(
        logits.data_ptr(), rows, vocab, logits.stride(0), k, block, values.data_ptr(),
        ids.data_ptr(), None if norm is None else norm.data_ptr(),
    )  # fmt: skip
    return None if bad else (values, ids, norm)

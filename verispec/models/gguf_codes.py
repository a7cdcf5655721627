"""GGUF's block formats decoded into integer codes, scales and minimums.

Every weight of a block matrix in a GGUF file is, as the ``gguf`` package widens it to
float32 (and so as ``transformers`` loads it), one rounding of ``code * scale + low``: an
integer ``code`` in -128..127, and a float32 ``scale`` and ``low`` shared by 16
consecutive weights of a row (32 for most formats, 16 for the K-quants' sub-blocks), each
of them itself an exact product of the block's float16 and 6- or 8-bit fields. So one
layout holds every format the decoder knows (:data:`DECODED`): :func:`decode` returns it,
and the CPU kernel's ``Q8_2`` blocks (``kernels/cpu/linear.c``) widen it with one fused
multiply-add, bit for bit as the loader did.

Per format (``d``, ``dmin`` float16; ``sc``, ``m`` the sub-block's 4- to 8-bit fields):

========  ====================  =============  ================  ============
format    code                  scale          low               per weights
========  ====================  =============  ================  ============
Q4_0      q (0..15)             d              -8 d              32
Q4_1      q (0..15)             d              m                 32
Q5_0      q (0..31)             d              -16 d             32
Q5_1      q (0..31)             d              m                 32
Q8_0      q                     d              -0                32
Q2_K      q (0..3)              d sc           -(dmin m)         16
Q3_K      q (-4..3)             d (sc - 32)    -0                16
Q4_K      q (0..15)             d sc           -(dmin m)         32
Q5_K      q (0..31)             d sc           -(dmin m)         32
Q6_K      q - 32                d sc           -0                16
IQ4_NL    table[q]              d              -0                32
IQ4_XS    table[q]              d (sc - 32)    -0                32
========  ====================  =============  ================  ============

Where the loader computes a plain product (``low`` -0), ``code * scale + -0`` rounds it
once as the product alone does, a zero's sign included; elsewhere ``code * scale`` is exact
in float32 (at most 24 significant bits), so its one rounding with ``low`` is the loader's
``scale * code - |low|``. A Q4_0 weight ``(q - 8) d`` is exact, and so is ``q d - 8 d``
(likewise Q5_0's ``(q - 16) d``): the same value, though an exact zero's sign may differ,
which no product sees (its sums start at +0).
"""

from __future__ import annotations

import attrs
import numpy as np

__all__ = ["DECODED", "GROUP", "Codes", "decode", "dequantize", "widen"]

GROUP = 16
"""Weights of a row that share one scale and one low in :class:`Codes`."""

_IQ4_VALUES = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8
)  # IQ4_NL's and IQ4_XS's table of code values (ggml's kvalues_iq4nl)


@attrs.frozen(eq=False)
class Codes:
    """A matrix as codes, scales and lows: ``w[r, i] = code[r, i] * scale[r, i // 16] +
    low[r, i // 16]``, in one rounding (a zero's sign aside).

    Attributes:
        code: int8, Shape: (rows, cols).
        scale: float32, Shape: (rows, cols / 16).
        low: float32, Shape: (rows, cols / 16).
    """

    code: np.ndarray
    scale: np.ndarray
    low: np.ndarray


def _f16(raw: np.ndarray) -> np.ndarray:
    """Little-endian float16 fields (``(n, 2)`` bytes) as float32, Shape: (n, 1)."""
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, width: int) -> np.ndarray:
    """GGUF's nibble packing: ``qs`` ``(n, g, width)`` bytes hold ``2 width`` codes, the
    low nibbles first. Shape: (n, g, 2 width)."""
    halves = qs[..., None, :] >> np.array([0, 4], dtype=np.uint8)[:, None]
    return (halves & 15).reshape(*qs.shape[:-1], 2 * width)


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's and Q5_K's twelve bytes of 6-bit scales and minimums, eight of each."""
    d, m, md = np.split(scales.reshape(-1, 3, 4), 3, axis=-2)
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.reshape(-1, 8).astype(np.float32), mn.reshape(-1, 8).astype(np.float32)


def _bits(field: np.ndarray, count: int, step: int = 1) -> np.ndarray:
    """Bit planes: ``field`` ``(n, g, w)`` shifted by 0, step, ... → ``(n, g, count, w)``."""
    shifts = np.arange(0, count * step, step, dtype=field.dtype)[:, None]
    return field[..., None, :] >> shifts


# Each decoder takes the blocks, Shape: (n, block bytes), and returns (code (n, block
# size), scale (n, groups), low (n, groups)) with block size / groups weights a group.
def _q4_0(b: np.ndarray) -> tuple[np.ndarray, ...]:
    d = _f16(b[:, :2])
    return _nibbles(b[:, None, 2:], 16)[:, 0], d, -8 * d


def _q4_1(b: np.ndarray) -> tuple[np.ndarray, ...]:
    return _nibbles(b[:, None, 4:], 16)[:, 0], _f16(b[:, :2]), _f16(b[:, 2:4])


def _five(b: np.ndarray, start: int) -> np.ndarray:
    """Q5_0's and Q5_1's codes: 16 bytes of nibbles from ``start``, the fifth bits in the
    four bytes before them."""
    high = np.ascontiguousarray(b[:, start - 4 : start]).view(np.uint32)
    fifth = (high >> np.arange(32, dtype=np.uint32)) & 1
    return _nibbles(b[:, None, start:], 16)[:, 0] | (fifth.astype(np.uint8) << 4)


def _q5_0(b: np.ndarray) -> tuple[np.ndarray, ...]:
    d = _f16(b[:, :2])
    return _five(b, 6), d, -16 * d


def _q5_1(b: np.ndarray) -> tuple[np.ndarray, ...]:
    return _five(b, 8), _f16(b[:, :2]), _f16(b[:, 2:4])


def _q8_0(b: np.ndarray) -> tuple[np.ndarray, ...]:
    d = _f16(b[:, :2])
    return np.ascontiguousarray(b[:, 2:]).view(np.int8), d, np.full_like(d, -0.0)


def _q2_k(b: np.ndarray) -> tuple[np.ndarray, ...]:
    scales, qs = b[:, :16], b[:, 16:80]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    codes = _bits(qs.reshape(-1, 2, 32), 4, 2) & 3  # (n, 2, 4, 32)
    scale = d * (scales & 0xF).astype(np.float32)
    return codes.reshape(-1, 256), scale, -(dmin * (scales >> 4).astype(np.float32))


def _q3_k(b: np.ndarray) -> tuple[np.ndarray, ...]:
    hmask, qs, packed, d = b[:, :32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])
    low = (packed[:, None, :8] >> np.array([0, 4], dtype=np.uint8)[:, None]).reshape(-1, 16)
    high = packed[:, None, 8:] >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
    sc = (low & 0x0F) | ((high.reshape(-1, 16) & 0x03) << 4)
    scale = d * (sc.astype(np.int8) - np.int8(32)).astype(np.float32)
    ql = (_bits(qs.reshape(-1, 2, 32), 4, 2) & 3).reshape(-1, 256)
    qh = ((_bits(hmask.reshape(-1, 1, 32), 8) & 1) ^ 1).reshape(-1, 256)
    codes = ql.astype(np.int16) - (qh.astype(np.int16) << 2)
    return codes, scale, np.full_like(scale, -0.0)


def _q4_k(b: np.ndarray) -> tuple[np.ndarray, ...]:
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    codes = _nibbles(b[:, 16:].reshape(-1, 4, 32), 32)  # (n, 4, 64): sub-blocks in pairs
    return codes.reshape(-1, 256), d * sc, -(dmin * mn)


def _q5_k(b: np.ndarray) -> tuple[np.ndarray, ...]:
    d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    low = _nibbles(b[:, 48:].reshape(-1, 4, 32), 32).reshape(-1, 256)
    high = (_bits(b[:, None, 16:48], 8) & 1).reshape(-1, 256)
    return low | (high << 4), d * sc, -(dmin * mn)


def _q6_k(b: np.ndarray) -> tuple[np.ndarray, ...]:
    ql, qh, scales, d = b[:, :128], b[:, 128:192], b[:, 192:208], _f16(b[:, 208:210])
    low = _nibbles(ql.reshape(-1, 2, 64), 64).reshape(-1, 256)
    high = (_bits(qh.reshape(-1, 2, 32), 4, 2) & 3).reshape(-1, 256)
    codes = (low | (high << 4)).astype(np.int16) - 32
    scale = d * np.ascontiguousarray(scales).view(np.int8).astype(np.float32)
    return codes, scale, np.full_like(scale, -0.0)


def _iq4_nl(b: np.ndarray) -> tuple[np.ndarray, ...]:
    d = _f16(b[:, :2])
    return _IQ4_VALUES[_nibbles(b[:, None, 2:], 16)[:, 0]], d, np.full_like(d, -0.0)


def _iq4_xs(b: np.ndarray) -> tuple[np.ndarray, ...]:
    d = _f16(b[:, :2])
    packed = np.ascontiguousarray(b[:, 2:4]).view(np.uint16)  # (n, 1)
    high = (packed >> np.arange(0, 16, 2, dtype=np.uint16)).astype(np.uint8) & 3  # (n, 8)
    low = (b[:, None, 4:8] >> np.array([0, 4], dtype=np.uint8)[:, None]) & 0x0F
    sc = low.transpose(0, 2, 1).reshape(-1, 8) | (high << 4)
    scale = d * (sc.astype(np.int8) - np.int8(32)).astype(np.float32)
    codes = _IQ4_VALUES[_nibbles(b[:, 8:].reshape(-1, 8, 16), 16).reshape(-1, 256)]
    return codes, scale, np.full_like(scale, -0.0)


_DECODERS = {
    "Q4_0": (_q4_0, 32, 18),
    "Q4_1": (_q4_1, 32, 20),
    "Q5_0": (_q5_0, 32, 22),
    "Q5_1": (_q5_1, 32, 24),
    "Q8_0": (_q8_0, 32, 34),
    "Q2_K": (_q2_k, 256, 84),
    "Q3_K": (_q3_k, 256, 110),
    "Q4_K": (_q4_k, 256, 144),
    "Q5_K": (_q5_k, 256, 176),
    "Q6_K": (_q6_k, 256, 210),
    "IQ4_NL": (_iq4_nl, 32, 18),
    "IQ4_XS": (_iq4_xs, 256, 136),
}

DECODED = tuple(_DECODERS)
"""The GGUF types (``GGMLQuantizationType`` names) :func:`decode` reads."""


def decode(kind: str, data: np.ndarray, cols: int) -> Codes:
    """A GGUF block matrix's codes, scales and lows (:class:`Codes`).

    Args:
        kind: its type's name, one of :data:`DECODED`.
        data: its bytes as the file holds them, uint8, Shape: (rows, row bytes).
        cols: weights in a row.

    Raises:
        ValueError: an unknown ``kind``, or ``data`` that is not whole rows of its blocks.
    """
    if kind not in _DECODERS:
        raise ValueError(f"`kind` must be one of {DECODED}; got {kind!r}")
    decoder, size, nbytes = _DECODERS[kind]
    rows = data.shape[0]
    if cols % size or data.dtype != np.uint8 or data.size != rows * cols // size * nbytes:
        raise ValueError(
            f"{kind} rows of {cols} weights are {cols // size} blocks of {nbytes} bytes; "
            f"got {data.dtype} data of shape {data.shape}"
        )
    code, scale, low = decoder(data.reshape(-1, nbytes))
    groups = size // GROUP
    repeat = groups // scale.shape[1]  # 32-weight scales held once per 16 weights
    scale, low = (np.repeat(t.astype(np.float32), repeat, axis=1) for t in (scale, low))
    return Codes(
        code=code.astype(np.int8).reshape(rows, cols),
        scale=scale.reshape(rows, cols // GROUP),
        low=low.reshape(rows, cols // GROUP),
    )


def widen(codes: Codes, cols: int | None = None) -> np.ndarray:
    """The first ``cols`` (default: all) weights of each row ``codes`` stand for, float32, as
    the ``gguf`` package computes them: ``code * scale`` and then ``+ low``, two roundings
    (one where the product is exact). Shape: (rows, cols)."""
    rows, cols = codes.code.shape[0], codes.code.shape[1] if cols is None else cols
    code = codes.code[:, :cols].reshape(rows, cols // GROUP, GROUP).astype(np.float32)
    code *= codes.scale[:, : cols // GROUP, None]
    code += codes.low[:, : cols // GROUP, None]
    return code.reshape(rows, cols)


def dequantize(kind: str, data: np.ndarray, cols: int) -> np.ndarray:
    """A GGUF block matrix widened to float32 bit for bit as the ``gguf`` package widens it
    (what ``transformers`` loads), a zero's sign included: Q4_0's and Q5_0's ``(q - 8) d``
    is a zero of ``d``'s sign where ``q d - 8 d`` is +0. Shape: (rows, cols).

    Raises:
        ValueError: as :func:`decode`.
    """
    codes = decode(kind, data, cols)
    values = widen(codes)
    if kind in ("Q4_0", "Q5_0"):
        rows, cols = values.shape
        grouped = values.reshape(rows, cols // GROUP, GROUP)
        np.copyto(grouped, np.copysign(grouped, codes.scale[..., None]), where=grouped == 0)
    return values

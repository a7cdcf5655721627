"""A GGUF file's block rows, found again by their values in the matrices built from them.

:func:`~verispec.models.accelerators.blocks.recover_blocks` finds Q4_1, Q4_0 and Q8_0
blocks from the float32 weights alone. The K-quants, the 5-bit formats and IQ4 make each
weight from a code and several scale fields, which its float32 value does not determine,
so their codes are read from the file (:mod:`verispec.models.gguf_codes`).

To find which of the file's rows a projection of the runtime holds, each row is widened
as the loader widens it and keyed by its values up to a power of two. So a row is found
whatever was done to it between the file and the runtime: renamed, reordered
(``transformers`` permutes a Llama's query and key rows), fused (the runtime's ``wqkv`` and
``w13``), scaled by a power of two (the query rows carry the softmax scale) or tied (the LM
head is the embedding). The keys only propose: whoever uses the codes checks that they
widen to the projection's weights, bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from verispec.models.gguf import matrices
from verispec.models.gguf_codes import DECODED, GROUP, Codes, decode, widen

__all__ = ["KERNEL_TYPES", "FileRows", "holds_decoded"]

_DECODED_LEAD = 256  # the leading weights of a row decoded for its key (whole blocks of any format)
_KEYED = 64  # the leading weights a key is made from


def _keys(lead: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's key, from its leading weights ``lead`` (float32, Shape: (N, 64) or fewer):
    a hash of their values (a zero of either sign as one) divided by the power of two of
    their largest magnitude (exact), and that power's exponent (the largest magnitude's
    ``frexp`` exponent; 0 for zeros)."""
    _, exponent = np.frexp(np.abs(lead).max(axis=1))
    scaled = np.ldexp(lead, -exponent[:, None]) + np.float32(0)  # -0 as +0 (Q4_0's zeros)
    pairs = np.ascontiguousarray(scaled, dtype=np.float32).view(np.uint64)  # two a word
    rng = np.random.default_rng(pairs.shape[1])
    multipliers = rng.integers(1, 2**63, size=pairs.shape[1], dtype=np.uint64) | np.uint64(1)
    return (pairs * multipliers).sum(1, dtype=np.uint64), exponent  # wraps modulo 2**64


KERNEL_TYPES = (*DECODED, "F16", "BF16")
"""The GGUF matrix types the block kernels read: the :data:`DECODED` ones, and F16 and BF16
(read as halves)."""


def holds_decoded(path: str | Path) -> bool:
    """Whether the GGUF file holds matrices of the :data:`KERNEL_TYPES` (its header only)."""
    return any(kind in KERNEL_TYPES for _, kind, _ in matrices(Path(path)))


class FileRows:
    """The rows of a GGUF file's block matrices of the :data:`DECODED` types, by their values.

    Reading it decodes only the leading 256 weights of each row (its key is made of the
    first 64); a matrix is decoded whole when a product asks for one of its rows.

    Args:
        path: the GGUF file.

    Attributes:
        types: the number of matrices read, by GGUF type name.
    """

    def __init__(self, path: str | Path) -> None:
        self._matrices: list[tuple[str, np.ndarray, int]] = []  # (type, bytes, row length)
        self.types: dict[str, int] = {}
        keys, exponents, places = [], [], []
        for tensor, kind, data in matrices(Path(path)):
            cols = int(tensor.shape[0])
            if kind not in DECODED:
                continue
            lead = min(cols, _DECODED_LEAD)
            head = np.asarray(data[:, : data.shape[1] * lead // cols])
            key, exponent = _keys(widen(decode(kind, head, lead), min(cols, _KEYED)))
            rows = len(key)
            keys.append(key)
            exponents.append(exponent)
            places.append(np.stack([np.full(rows, len(self._matrices)), np.arange(rows)], 1))
            self._matrices.append((kind, data, cols))
            self.types[kind] = self.types.get(kind, 0) + 1
        every = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
        self._order = np.argsort(every, kind="stable")
        self._keys = every[self._order]
        self._exponents = np.concatenate(exponents) if exponents else np.zeros(0, np.int32)
        self._places = np.concatenate(places) if places else np.zeros((0, 2), np.int64)

    def _codes(self, index: int) -> Codes:
        """Matrix ``index`` decoded whole (each time: a matrix is asked for once or twice, and
        keeping them all would hold 1.5 bytes a weight)."""
        kind, data, cols = self._matrices[index]
        return decode(kind, np.asarray(data), cols)

    def codes_for(self, weight: torch.Tensor) -> Codes | None:
        """The codes of the file's rows whose values are ``weight``'s rows up to a power of
        two, with that power applied to their scales and lows; ``None`` if some row is not
        found. Unchecked: the caller compares their widening with ``weight``.

        Args:
            weight: float32, Shape: (N, K).
        """
        if weight.dtype != torch.float32 or weight.dim() != 2 or weight.shape[1] % 32:
            return None
        cols = weight.shape[1]
        rows_of = weight.detach().cpu().numpy()
        keys, exponent = _keys(rows_of[:, :_KEYED])
        if not len(self._keys):
            return None
        left = np.searchsorted(self._keys, keys, "left")
        right = np.searchsorted(self._keys, keys, "right")
        if (right == left).any():
            return None
        found = self._order[left]
        sources, rows = self._places[found, 0], self._places[found, 1]
        if any(self._matrices[source][2] != cols for source in np.unique(sources)):
            return None
        shift = (exponent - self._exponents[found]).astype(np.int32)
        power = np.ldexp(np.float32(1), shift)[:, None].astype(np.float32)
        code = np.empty((len(rows), cols), dtype=np.int8)
        scale = np.empty((len(rows), cols // GROUP), dtype=np.float32)
        low = np.empty_like(scale)
        for source in np.unique(sources):
            codes, chosen = self._codes(int(source)), sources == source
            picked = rows[chosen]
            code[chosen] = codes.code[picked]
            scale[chosen] = codes.scale[picked] * power[chosen]
            low[chosen] = codes.low[picked] * power[chosen]
        codes = Codes(code=code, scale=scale, low=low)
        for i in np.flatnonzero(right - left > 1):  # rows whose leading values others share
            self._settle(
                codes, int(i), rows_of[i], self._order[left[i] : right[i]], int(exponent[i])
            )
        return codes

    def _settle(
        self, codes: Codes, i: int, row: np.ndarray, candidates: np.ndarray, exponent: int
    ) -> None:
        """Row ``i`` of ``codes`` from the first of the ``candidates`` (indices of file rows
        with the same key) that widens to ``row``, where the first one found does not: rows
        that agree in their leading 64 values (an embedding's unused tokens) differ later."""
        first = Codes(
            code=codes.code[i : i + 1], scale=codes.scale[i : i + 1], low=codes.low[i : i + 1]
        )
        if np.array_equal(widen(first, len(row))[0], row):
            return
        for candidate in candidates:
            source, file_row = self._places[candidate]
            kind, data, cols = self._matrices[source]
            if cols != len(row):
                continue
            one = decode(kind, np.asarray(data[file_row : file_row + 1]), cols)
            power = np.ldexp(np.float32(1), exponent - self._exponents[candidate])
            one = Codes(code=one.code, scale=one.scale * power, low=one.low * power)
            if np.array_equal(widen(one, cols)[0], row):
                codes.code[i], codes.scale[i], codes.low[i] = one.code[0], one.scale[0], one.low[0]
                return

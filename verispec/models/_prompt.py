"""Whether the runtime is running a prompt's causal pass (a prefill chunk).

A tree pass must give every row the bits sequential decoding gives it (the row invariance
of docs/runtime.rst), so its products and attention sum in one fixed order whatever the
row count. A prompt's prefill needs no such thing: every decoding method prefills the same
prompt the same way, and the first token comes from the root's row in the first tree pass.
Inside :func:`prompt_pass`, kernels built for many rows may therefore be used: the block
products widen their weight once and run one float32 GEMM
(:class:`~verispec.models.cpu_linear.BlockLinear`), and the attention is one fused
``scaled_dot_product_attention`` call (:func:`~verispec.models.llama.attend_prompt`).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

__all__ = ["in_prompt_pass", "prompt_pass"]

_PROMPT = contextvars.ContextVar("verispec_prompt_pass", default=False)


@contextlib.contextmanager
def prompt_pass() -> Iterator[None]:
    """Within the block, the model runs a prompt's causal pass (see the module docstring)."""
    token = _PROMPT.set(True)
    try:
        yield
    finally:
        _PROMPT.reset(token)


def in_prompt_pass() -> bool:
    """Whether the caller runs inside :func:`prompt_pass`."""
    return _PROMPT.get()

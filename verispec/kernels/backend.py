"""Which implementation runs a kernel: Triton or the PyTorch reference.

``triton`` is optional. The choice, made per call from the tensors' device:

* ``VERISPEC_KERNELS=auto`` (the default): Triton for CUDA tensors when the
  ``triton`` package imports, the reference everywhere else;
* ``VERISPEC_KERNELS=triton``: Triton, or :class:`~verispec.errors.KernelUnavailableError`
  when it cannot run (no ``triton`` package, or CPU tensors without Triton's
  interpreter, ``TRITON_INTERPRET=1``);
* ``VERISPEC_KERNELS=reference``: always the PyTorch reference.

:func:`use_backend` overrides the environment variable inside a ``with`` block
(tests use it). Triton reads ``TRITON_INTERPRET`` when a ``@triton.jit`` function
is *defined*, so the kernel modules are imported lazily, on the first Triton call,
and re-imported if the interpreter setting changed since (:func:`kernel_module`).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Literal

import torch

from verispec.errors import ConfigError, KernelUnavailableError

__all__ = [
    "ENV_VAR",
    "Backend",
    "choose",
    "interpreting",
    "kernel_module",
    "requested_backend",
    "triton_available",
    "use_backend",
]

ENV_VAR = "VERISPEC_KERNELS"
Backend = Literal["triton", "reference"]
_MODES = ("auto", "triton", "reference")
_override: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "verispec_kernel_backend", default=None
)


def triton_available() -> bool:
    """Whether the optional ``triton`` package imports."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreting() -> bool:
    """Whether Triton's CPU interpreter is on (``TRITON_INTERPRET=1``)."""
    if not triton_available():
        return False
    from triton import knobs

    return bool(knobs.runtime.interpret)


def requested_backend() -> str:
    """``"auto"``, ``"triton"`` or ``"reference"``: :func:`use_backend`, else the env var."""
    mode = _override.get()
    if mode is None:
        mode = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if mode not in _MODES:
        raise ConfigError(f"`{ENV_VAR}` must be one of {_MODES}; got {mode!r}.")
    return mode


@contextlib.contextmanager
def use_backend(mode: str) -> Iterator[None]:
    """Force ``"triton"``, ``"reference"`` or ``"auto"`` inside a ``with`` block."""
    if mode not in _MODES:
        raise ConfigError(f"`mode` must be one of {_MODES}; got {mode!r}.")
    token = _override.set(mode)
    try:
        yield
    finally:
        _override.reset(token)


def _why_not_triton(device: torch.device) -> str | None:
    if not triton_available():
        return "the optional `triton` package is not installed (`pip install triton`)"
    if device.type == "cuda":
        return None
    if device.type == "cpu":
        if interpreting():
            return None
        return (
            "the tensors are on the CPU and Triton's interpreter is off; set "
            "TRITON_INTERPRET=1 in the environment to run the kernels on the CPU (slow)"
        )
    return f"Triton kernels run on CUDA devices, not on {device.type!r}"


def choose(device: torch.device, kernel: str) -> Backend:
    """The backend that runs ``kernel`` on tensors on ``device``.

    Raises:
        KernelUnavailableError: Triton is forced but cannot run here.
    """
    mode = requested_backend()
    if mode == "reference":
        return "reference"
    why = _why_not_triton(device)
    if mode == "triton":
        if why is not None:
            raise KernelUnavailableError(
                f"the Triton {kernel} kernel was forced ({ENV_VAR}=triton or "
                f"use_backend('triton')) but cannot run: {why}. Unset {ENV_VAR} (or set it "
                "to 'reference') to use the PyTorch reference."
            )
        return "triton"
    return "triton" if why is None and device.type == "cuda" else "reference"


def kernel_module(name: str) -> ModuleType:
    """Import ``verispec.kernels.<name>`` (``@triton.jit`` code) for the current mode.

    A module imported while the interpreter was off holds compiled-kernel objects that
    cannot run on CPU tensors (and the other way round), so it is re-imported when
    ``TRITON_INTERPRET`` changed since.
    """
    from triton.runtime.interpreter import InterpretedFunction

    module = importlib.import_module(f"verispec.kernels.{name}")
    kernel = getattr(module, f"{name}_kernel", None)
    if kernel is not None and isinstance(kernel, InterpretedFunction) != interpreting():
        module = importlib.reload(module)
    return module

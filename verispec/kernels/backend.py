"""The kernel switch: which implementation of a rule runs, Triton or PyTorch.

Every rule that has a Triton kernel (tree attention, greedy and recursive rejection
verification, Token Recycling's expansion and update, KV compaction) asks
:func:`backend_for` once per call, with the tensors' device and the ``kernels`` value
its owner was built with:

* ``kernels="triton"``: the Triton kernel, or :class:`~verispec.errors.KernelUnavailableError`
  when it cannot run (no ``triton`` >= 3.4, or tensors not on CUDA while Triton's
  interpreter, ``TRITON_INTERPRET=1``, is off);
* ``kernels="torch"``: the PyTorch implementation, everywhere;
* ``kernels="auto"`` (the default): what a :func:`use_backend` block or the
  ``VERISPEC_KERNELS`` environment variable asks for, else Triton for CUDA tensors
  (when ``triton`` imports) and PyTorch for everything else.

An explicit ``"triton"``/``"torch"`` argument wins over ``use_backend``, which wins
over the environment variable. A model that runs tree attention of its own asks
:func:`tree_attention_backend` (``"triton"`` or ``"torch"``) for its device.

Triton reads ``TRITON_INTERPRET`` when a ``@triton.jit`` function is *defined*, so the
kernel modules are imported lazily, on the first Triton call, and re-imported if the
interpreter setting changed since (:func:`kernel_module`). ``benchmarks/compile_check.py``
swaps the launches for recordings (:func:`recording_launches`), so that the host
wrappers' real arguments can be compiled for a GPU that is not there.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import os
import re
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, Literal, get_args

import torch

from verispec.core.validate import choice
from verispec.errors import KernelUnavailableError

__all__ = [
    "ENV_VAR",
    "KERNEL_CHOICES",
    "MIN_TRITON",
    "Kernels",
    "Backend",
    "backend_for",
    "check_kernels",
    "interpreting",
    "kernel_module",
    "launch_device",
    "recording_launches",
    "require_triton",
    "requested_backend",
    "tree_attention_backend",
    "triton_available",
    "triton_version",
    "use_backend",
]

ENV_VAR = "VERISPEC_KERNELS"
Kernels = Literal["auto", "triton", "torch"]
"""Which implementation a rule with a kernel runs (the module notes); one check,
:func:`check_kernels`, and the CLI's ``--kernels`` choices read it."""
KERNEL_CHOICES: tuple[Kernels, ...] = get_args(Kernels)
MIN_TRITON = (3, 4)
"""Oldest Triton the kernels support (``triton.knobs`` and the compile check's API);
``pyproject.toml`` states the same floor (a test keeps them equal)."""

Backend = Literal["triton", "torch"]
_override: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "verispec_kernel_backend", default=None
)
# Set by `recording_launches`: maps a kernel module name to a stand-in module.
_recorder: contextvars.ContextVar[Callable[[str], Any] | None] = contextvars.ContextVar(
    "verispec_kernel_recorder", default=None
)


def check_kernels(value: object, name: str = "kernels") -> Kernels:
    """``value`` if it is in :data:`KERNEL_CHOICES`; else :class:`ConfigError` naming ``name``."""
    checked: Kernels = choice(name, value, KERNEL_CHOICES)
    return checked


def triton_version() -> tuple[int, int] | None:
    """``(major, minor)`` of the installed ``triton``, or ``None`` when it does not import."""
    try:
        import triton
    except ImportError:
        return None
    match = re.match(r"(\d+)\.(\d+)", getattr(triton, "__version__", ""))
    return (int(match.group(1)), int(match.group(2))) if match else None


def triton_available() -> bool:
    """Whether a ``triton`` new enough for the kernels (:data:`MIN_TRITON`) imports."""
    version = triton_version()
    return version is not None and version >= MIN_TRITON


def interpreting() -> bool:
    """Whether Triton's CPU interpreter is on (``TRITON_INTERPRET=1``); never while recording."""
    if _recorder.get() is not None or not triton_available():
        return False
    from triton import knobs

    return bool(knobs.runtime.interpret)


def requested_backend() -> str:
    """``"auto"``, ``"triton"`` or ``"torch"``: the :func:`use_backend` block, else the env var."""
    mode = _override.get()
    if mode is None:
        mode = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
        check_kernels(mode, ENV_VAR)
    return mode


@contextlib.contextmanager
def use_backend(mode: str) -> Iterator[None]:
    """Inside the block, ``kernels="auto"`` means ``mode`` (``"auto"``, ``"triton"``, ``"torch"``).

    For code that takes no ``kernels`` argument (a transformers model's attention, the
    adapter's KV cache); arguments given explicitly still win.
    """
    check_kernels(mode, "mode")
    token = _override.set(mode)
    try:
        yield
    finally:
        _override.reset(token)


def _why_not_triton(device: torch.device) -> str | None:
    version = triton_version()
    if version is None:
        return "the optional `triton` package is not installed (`pip install 'triton>=3.4'`)"
    if version < MIN_TRITON:
        wanted = ".".join(map(str, MIN_TRITON))
        got = ".".join(map(str, version))
        return f"the kernels need triton >= {wanted}; triton {got} is installed"
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


def backend_for(rule: str, device: torch.device | str, kernels: str = "auto") -> Backend:
    """The implementation that runs ``rule`` on tensors on ``device``.

    Args:
        rule: what runs, for messages (``"tree attention"``, ``"greedy verification"``...).
        device: where the rule's tensors are.
        kernels: ``"auto"``, ``"triton"`` or ``"torch"`` (see the module docstring).

    Raises:
        ConfigError: ``kernels`` (or ``VERISPEC_KERNELS``) is not a valid choice.
        KernelUnavailableError: Triton is asked for but cannot run here.
    """
    check_kernels(kernels)
    if _recorder.get() is not None:
        return "triton"
    device = torch.device(device)
    if kernels != "auto":
        mode, source = kernels, f"`kernels={kernels!r}`"
    else:
        mode = requested_backend()
        from_block = _override.get() is not None
        source = f"use_backend({mode!r})" if from_block else f"{ENV_VAR}={mode}"
    if mode == "torch" or (mode == "auto" and device.type != "cuda"):
        return "torch"  # "auto" is Triton on CUDA only: no need to probe the package
    why = _why_not_triton(device)
    if mode == "triton":
        if why is not None:
            raise KernelUnavailableError(
                f"{source} asks for the Triton {rule} kernel, which cannot run here: {why}. "
                "Use kernels='auto' (Triton on CUDA, PyTorch elsewhere) or kernels='torch'."
            )
        return "triton"
    return "triton" if why is None else "torch"


def tree_attention_backend(device: torch.device | str, kernels: str = "auto") -> Backend:
    """``"triton"`` or ``"torch"``: how a model on ``device`` should run tree attention.

    For models with attention of their own: ``"triton"`` means call
    :func:`verispec.kernels.ops.tree_attention` (or ``launch_tree_attention``),
    ``"torch"`` means the model's PyTorch attention. Same rules as :func:`backend_for`.
    """
    return backend_for("tree attention", device, kernels)


def require_triton(
    kernels: str, name: str = "kernels", device: torch.device | str | None = None
) -> Kernels:
    """Check ``kernels`` when its owner is built (or a command starts); returns it.

    With ``"triton"``: a ``triton`` >= :data:`MIN_TRITON` must import, and ``device``
    must be a CUDA device (or the CPU with Triton's interpreter on, ``TRITON_INTERPRET=1``,
    as in the tests); ``device=None`` means "CUDA if this machine has it, else the CPU".
    Each call checks its tensors' device again when it runs.

    Raises:
        ConfigError: ``kernels`` is not one of :data:`KERNEL_CHOICES`.
        KernelUnavailableError: ``kernels="triton"`` and the kernels cannot run there.
    """
    checked = check_kernels(kernels, name)
    if checked == "triton":
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        why = _why_not_triton(torch.device(device))
        if why is not None:
            shown = name if name.startswith("-") else f"{name}='triton'"
            raise KernelUnavailableError(
                f"`{shown}` needs the Triton kernels, which cannot run here: {why}. "
                "Use 'auto' (Triton on CUDA, PyTorch elsewhere) or 'torch'."
            )
    return checked


def launch_device(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Make ``device`` current while a kernel launches (Triton launches on the current one).

    Needed when a model is split over GPUs (``device_map``): a tensor on ``cuda:1``
    launched while ``cuda:0`` is current would run on the wrong device.
    """
    if device.type == "cuda" and _recorder.get() is None:
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def kernel_module(name: str) -> ModuleType:
    """Import ``verispec.kernels.triton.<name>`` (``@triton.jit`` code) for the current mode.

    A module imported while the interpreter was off holds compiled-kernel objects that
    cannot run on CPU tensors (and the other way round), so it is re-imported when
    ``TRITON_INTERPRET`` changed since. While recording, a stand-in module is returned.
    """
    recorder = _recorder.get()
    if recorder is not None:
        return recorder(name)  # type: ignore[no-any-return]
    from triton.runtime.interpreter import InterpretedFunction

    module = importlib.import_module(f"verispec.kernels.triton.{name}")
    kernel = getattr(module, f"{name}_kernel", None)
    if kernel is not None and isinstance(kernel, InterpretedFunction) != interpreting():
        module = importlib.reload(module)
    return module


@contextlib.contextmanager
def recording_launches(module_for: Callable[[str], Any]) -> Iterator[None]:
    """Inside the block the host wrappers record launches instead of running them.

    ``module_for(name)`` returns the stand-in for kernel module ``name``; every rule
    then picks Triton whatever the device, and :func:`interpreting` is ``False`` (so the
    wrappers choose the tile sizes of a real GPU). Used by ``benchmarks/compile_check.py``.
    """
    token = _recorder.set(module_for)
    try:
        yield
    finally:
        _recorder.reset(token)

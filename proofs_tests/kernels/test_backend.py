"""Backend choice: Triton on CUDA, the reference elsewhere, a clear error when forced."""

from __future__ import annotations

import pytest
import torch

from verispec.errors import ConfigError, KernelUnavailableError
from verispec.kernels import backend, ops
from verispec.kernels.backend import choose, use_backend


def test_auto_uses_the_reference_on_the_cpu_and_triton_on_cuda() -> None:
    """``auto`` picks the reference for CPU tensors (even with the interpreter on) and
    Triton for CUDA tensors when the package imports."""
    with use_backend("auto"):
        assert choose(torch.device("cpu"), "x") == "reference"
        expected = "triton" if backend.triton_available() else "reference"
        assert choose(torch.device("cuda"), "x") == expected


def test_reference_mode_never_uses_triton() -> None:
    """``reference`` wins on every device."""
    with use_backend("reference"):
        assert choose(torch.device("cuda"), "x") == "reference"


def test_forcing_triton_without_the_package_names_the_fix(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Forced Triton without the ``triton`` package raises KernelUnavailableError naming the
    kernel, the missing package and how to go back to the reference."""
    monkeypatch.setattr(backend, "triton_available", lambda: False)
    with use_backend("triton"), pytest.raises(KernelUnavailableError) as info:
        ops.greedy_verify(__import__("verispec").DraftTree.empty(), torch.zeros(1, 3))
    message = str(info.value)
    assert "greedy verification" in message and "pip install triton" in message
    assert "VERISPEC_KERNELS" in message


def test_forcing_triton_on_the_cpu_without_the_interpreter_says_so(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Forced Triton on CPU tensors with the interpreter off raises KernelUnavailableError
    that tells the user to set TRITON_INTERPRET=1."""
    monkeypatch.setattr(backend, "interpreting", lambda: False)
    monkeypatch.setattr(backend, "triton_available", lambda: True)
    with use_backend("triton"), pytest.raises(KernelUnavailableError, match="TRITON_INTERPRET=1"):
        choose(torch.device("cpu"), "tree attention")


def test_environment_variable_is_read_and_checked(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``VERISPEC_KERNELS`` selects the mode when no ``use_backend`` block is active, and an
    unknown value raises ConfigError listing the valid ones."""
    monkeypatch.setenv("VERISPEC_KERNELS", "reference")
    assert backend.requested_backend() == "reference"
    monkeypatch.setenv("VERISPEC_KERNELS", "fast")
    with pytest.raises(ConfigError, match="auto"):
        backend.requested_backend()
    with pytest.raises(ConfigError), use_backend("fast"):
        pass


def test_kernel_module_follows_the_interpreter_setting(triton_backend, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A kernel module defined under the other interpreter setting is re-imported, so a
    kernel imported before TRITON_INTERPRET was set still runs."""
    from triton.runtime.interpreter import InterpretedFunction

    if not backend.interpreting():
        pytest.skip("checks the interpreter's stale-module case")
    module = backend.kernel_module("kv_compaction")
    assert isinstance(module.kv_compaction_kernel, InterpretedFunction) == backend.interpreting()
    stale = object()
    monkeypatch.setattr(module, "kv_compaction_kernel", stale)
    fresh = backend.kernel_module("kv_compaction")
    assert fresh.kv_compaction_kernel is not stale

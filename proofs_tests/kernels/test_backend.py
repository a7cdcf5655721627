"""The kernel switch: Triton on CUDA, PyTorch elsewhere, explicit choices win, clear errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from verispec.drafters import TokenRecycling
from verispec.errors import ConfigError, KernelUnavailableError
from verispec.kernels import backend, ops
from verispec.kernels.backend import backend_for, tree_attention_backend, use_backend
from verispec.verifiers import Greedy, RecursiveRejection

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.fixture
def no_interpreter(monkeypatch):  # type: ignore[no-untyped-def]
    """Triton importable, its interpreter off, no CUDA device: a plain CPU machine."""
    monkeypatch.setattr(backend, "interpreting", lambda: False)
    monkeypatch.setattr(backend, "triton_version", lambda: backend.MIN_TRITON)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_auto_uses_torch_on_the_cpu_and_triton_on_cuda() -> None:
    """``auto`` picks PyTorch for CPU tensors (even with the interpreter on) and Triton for
    CUDA tensors when a recent enough ``triton`` imports; the same for tree attention."""
    with use_backend("auto"):
        assert backend_for("x", CPU) == "torch"
        expected = "triton" if backend.triton_available() else "torch"
        assert backend_for("x", CUDA) == expected
        assert tree_attention_backend(CUDA) == expected
        assert tree_attention_backend("cpu") == "torch"


def test_torch_wins_everywhere_and_explicit_arguments_win_over_the_scope() -> None:
    """``kernels="torch"`` is PyTorch on every device; an explicit argument beats a
    ``use_backend`` block, and ``"auto"`` follows the block."""
    assert backend_for("x", CUDA, "torch") == "torch"
    with use_backend("torch"):
        assert backend_for("x", CUDA) == "torch"
        if backend.triton_available():
            assert backend_for("x", CUDA, "triton") == "triton"
    with use_backend("triton"):
        assert backend_for("x", CUDA, "torch") == "torch"


def test_forcing_triton_without_the_package_names_the_fix(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``kernels="triton"`` without the ``triton`` package raises KernelUnavailableError naming
    the argument, the rule, the missing package and the alternatives."""
    monkeypatch.setattr(backend, "triton_version", lambda: None)
    with pytest.raises(KernelUnavailableError) as info:
        ops.greedy_verify(
            __import__("verispec").DraftTree.empty(), torch.zeros(1, 3), kernels="triton"
        )
    message = str(info.value)
    assert "`kernels='triton'`" in message and "greedy verification" in message
    assert "pip install" in message and "kernels='torch'" in message


def test_an_old_triton_is_refused_with_its_version(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A ``triton`` older than the floor (3.2 here) counts as unavailable: ``auto`` falls back
    to PyTorch on CUDA and ``"triton"`` raises an error that names both versions."""
    import triton

    monkeypatch.setattr(triton, "__version__", "3.2.0")
    assert not backend.triton_available()
    assert backend_for("x", CUDA) == "torch"
    with pytest.raises(KernelUnavailableError, match=r"triton >= 3\.4; triton 3\.2 is installed"):
        backend_for("tree attention", CUDA, "triton")


def test_pyproject_states_the_floor_the_code_needs() -> None:
    """The ``triton`` requirement in pyproject.toml has the floor ``backend.MIN_TRITON``
    (3.4: ``triton.knobs`` and the compile check's API), so an install cannot pick an older
    Triton than the kernels run on."""
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    requirements = re.findall(r'"(triton[^"]*)"', pyproject)
    floors = [re.match(r"triton>=(\d+)\.(\d+)", r) for r in requirements]
    assert requirements and all(m is not None for m in floors), requirements
    assert {(int(m.group(1)), int(m.group(2))) for m in floors if m} == {backend.MIN_TRITON}


def test_forcing_triton_on_the_cpu_without_the_interpreter_says_so(no_interpreter) -> None:  # type: ignore[no-untyped-def]
    """On CPU tensors with the interpreter off, ``kernels="triton"`` raises
    KernelUnavailableError telling the user to set TRITON_INTERPRET=1; so do the rules'
    owners when they are built on a machine without CUDA, naming their argument."""
    with pytest.raises(KernelUnavailableError, match="TRITON_INTERPRET=1"):
        backend_for("tree attention", CPU, "triton")
    for build in (
        lambda: Greedy(kernels="triton"),
        lambda: RecursiveRejection(kernels="triton"),
        lambda: TokenRecycling(kernels="triton"),
    ):
        with pytest.raises(KernelUnavailableError, match="`kernels='triton'`"):
            build()
    with pytest.raises(KernelUnavailableError, match="`--kernels triton`"):
        backend.require_triton("triton", "--kernels triton", "cpu")


def test_bad_choices_are_refused_naming_the_argument(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """An unknown ``kernels`` value raises ConfigError naming the argument and the valid
    values, in the owners' constructors, in ``backend_for``, in ``use_backend`` and in
    ``VERISPEC_KERNELS``; the old name ``reference`` is not accepted."""
    for build in (lambda: Greedy(kernels="fast"), lambda: TokenRecycling(kernels="reference")):
        with pytest.raises(ConfigError, match=r"`kernels` must be one of \('auto', 'triton'"):
            build()
    with pytest.raises(ConfigError, match="`kernels`"):
        backend_for("x", CPU, "cuda")
    with pytest.raises(ConfigError, match="`mode`"), use_backend("fast"):
        pass
    monkeypatch.setenv("VERISPEC_KERNELS", "torch")
    assert backend.requested_backend() == "torch"
    assert backend_for("x", CUDA) == "torch"
    monkeypatch.setenv("VERISPEC_KERNELS", "fast")
    with pytest.raises(ConfigError, match="`VERISPEC_KERNELS`"):
        backend_for("x", CPU)


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

"""Compile-only check: every kernel, as its host wrapper launches it, compiles for sm_90 and
sm_80 with Triton's own compiler and no GPU; a broken kernel fails; nothing recompiles as
a sequence grows; the attention gets its scale in float64.

Compiling needs a process where ``TRITON_INTERPRET`` was off when ``triton`` was imported
(this session turns it on for the interpreter tests), so the compiles run in a fresh
Python; signatures and cache keys come from Triton's binder, which runs here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from verispec.kernels import ops
from verispec.kernels.backend import triton_available

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "benchmarks" / "compile_check.py"  # a CI tool outside the package
sys.path.append(str(SCRIPT.parent))
import compile_check  # noqa: E402  (benchmarks/ is on the path from here)

pytestmark = pytest.mark.skipif(not triton_available(), reason="needs triton >= 3.4")


def _fresh_python(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python *args`` from the repository root without ``TRITON_INTERPRET``, with
    ``benchmarks/`` (``compile_check``) on the path."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(SCRIPT.parent), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )


def test_every_kernel_compiles_to_a_cubin_without_spills(tmp_path: Path) -> None:
    """``python benchmarks/compile_check.py --arch 90`` compiles every launch of every
    scenario (tree attention in four dtypes, D = 128, causal and split; greedy and rejection
    verification; Token Recycling; KV compaction; the graphed runtime's static attention
    and batch-invariant product and norm) for sm_90 (the H100 and H200 this project is lent)
    through TTIR, TTGIR, LLVM IR and PTX to a cubin (Triton's bundled ptxas), and ptxas
    reports no register spills for any of them. sm_80 doubles the half minute this takes on
    two cores; ``benchmarks/compile_check.py`` compiles for both by default."""
    out = tmp_path / "compile.json"
    done = _fresh_python(str(SCRIPT), "--arch", "90", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    reports = json.loads(out.read_text())["reports"]
    assert {r["kernel"] for r in reports} == {
        "tree_attention_kernel",
        "tree_attention_combine_kernel",
        "row_argmax_kernel",
        "greedy_verify_kernel",
        "rejection_verify_kernel",
        "token_recycling_kernel",
        "adjacency_update_kernel",
        "kv_compaction_kernel",
        "static_attention_kernel",
        "static_attention_rows_kernel",
        "batch_invariant_kernel",
        "rms_norm_rows_kernel",
    }
    assert {r["arch"] for r in reports} == {90}
    for r in reports:
        assert r["stages"][:5] == ["ttir", "ttgir", "llir", "ptx", "cubin"], r
        assert r["registers"] is not None and r["spill_stores"] == r["spill_loads"] == 0, r


_BROKEN = textwrap.dedent(
    """
    import sys, torch, triton, triton.language as tl
    from triton.runtime.jit import JITFunction
    import compile_check

    def add(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n)
        tl.store(out_ptr + offs, x + 1.0, mask=offs < n)

    def add_type_error(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n)
        tl.store(out_ptr + offs, x + out_ptr, mask=offs < n)  # a float plus a pointer

    def add_api_error(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n)
        tl.store(out_ptr + offs, tl.no_such_function(x), mask=offs < n)

    x = torch.zeros(64)
    target = compile_check.cuda_target(90)
    for fn, args in ((add, (x, x, 64)), (add_type_error, (x, x, 64)),
                     (add_api_error, (x, x, 64)), (add, (x, x, 64, 5))):
        launch = compile_check.Launch("t", fn.__name__, JITFunction(fn), (1,), args, {"BLOCK": 64})
        try:
            kernel, _ = compile_check.compile_launch(launch, target)
            print(fn.__name__, len(args), "compiled", "cubin" in kernel.asm)
        except triton.CompilationError:
            print(fn.__name__, len(args), "CompilationError")
        except TypeError:
            print(fn.__name__, len(args), "TypeError")
    """
)


def test_a_broken_kernel_fails_to_compile(tmp_path: Path) -> None:
    """For sm_90, a kernel adding a pointer to a float, or calling a ``tl`` function that does
    not exist, raises ``triton.CompilationError``, and a launch with an argument the kernel
    does not take fails in Triton's binder; the same kernel without the bug compiles to a
    cubin, so each failure is the bug's."""
    script = tmp_path / "broken.py"
    script.write_text(_BROKEN)
    done = _fresh_python(str(script))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[:4] == [
        "add 3 compiled True",
        "add_type_error 3 CompilationError",
        "add_api_error 3 CompilationError",
        "add 4 TypeError",
    ]


def test_attention_gets_its_scale_in_float64() -> None:
    """Triton types the score scale of the tree attention launch as float64 for every dtype
    (a plain Python float would be float32: 128 ** -0.5 rounded to 24 bits moves every
    score by about 3e-8 relative, far above the float64 kernel's 1e-12; the 16- and 32-bit
    kernels round it to their float32 accumulator themselves)."""
    for dtype in (torch.float64, torch.float32, torch.float16):
        [launch] = compile_check.record_launches(compile_check._attention(dtype, 128, 5, 7))
        assert compile_check.launch_signature(launch)["scale"] == "fp64"


def _keys(calls) -> set[str]:  # type: ignore[no-untyped-def]
    keys = set()
    for call in calls:
        for launch in compile_check.record_launches(call):
            keys.add(compile_check.specialization_key(launch))
    return keys


def _attention_step(n: int, s: int):  # type: ignore[no-untyped-def]
    """One decoding step's attention as the HF adapter launches it: float16, 9 heads over 3,
    D = 64, the tree and prefix masks slices of one (1, N, S + N) mask."""

    def call() -> None:
        q = torch.zeros(1, 9, n, 64, dtype=torch.float16)
        kv = torch.zeros(1, 3, s + n, 64, dtype=torch.float16)
        full = torch.ones(1, n, s + n, dtype=torch.bool)
        full[:, :, s:] = torch.ones(n, n, dtype=torch.bool).tril()
        full[:, 0, 0] = False  # a partial prefix tile
        ops.tree_attention(
            q, kv[:, :, :s], kv[:, :, :s], kv[:, :, s:], kv[:, :, s:], full[:, :, s:],
            prefix_mask=full[:, :, :s] if s else None, kernels="triton",
        )  # fmt: skip

    return call


def test_no_recompile_as_the_sequence_grows() -> None:
    """Triton's cache key (signature, specialisation, options) is the same for every step of
    a growing sequence: tree attention over prefixes of 1-1023 tokens with trees of 1-16
    nodes (one tile size); rejection verification of trees of 1-80 nodes; Token Recycling
    from roots 1, 16 and 37 and updates of 2-81 rows; KV compaction at offsets 1-48."""
    from verispec.drafters.templates import resolve_template

    attention = [_attention_step(n, s) for n in (1, 2, 7, 16) for s in (1, 15, 16, 17, 100, 1023)]
    assert len(_keys(attention)) == 1

    def compaction(start: int, moved: list[int]):  # type: ignore[no-untyped-def]
        return lambda: ops.compact_kv(
            [torch.zeros(1, 3, 64, 64, dtype=torch.float16)], start, torch.tensor(moved),
            kernels="triton",
        )  # fmt: skip

    assert len(_keys([compaction(s, [s + 1, s + 2, s + 4]) for s in (1, 16, 17, 48)])) == 1
    template = resolve_template("2.2.2", 8)
    adjacency = torch.zeros(500, 8, dtype=torch.int32)
    args = (template.parents, template.slots, template.level_starts)
    expand = [
        lambda r=r: ops.expand_template(adjacency, r, *args, kernels="triton") for r in (1, 16, 37)
    ]
    assert len(_keys(expand)) == 1
    update = [
        lambda m=m: ops.update_adjacency(
            adjacency, torch.arange(m), torch.zeros(m, 8, dtype=torch.long), kernels="triton"
        )
        for m in (2, 16, 33, 81)
    ]
    assert len(_keys(update)) == 1
    rejection = [compile_check._rejection(n) for n in (1, 16, 17, 80)]
    assert len(_keys(rejection)) == 1

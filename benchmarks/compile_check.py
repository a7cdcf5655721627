"""Compile every Triton kernel for a GPU that is not there: type and API errors fail early.

The host wrappers in :mod:`verispec.kernels.ops` run on CPU tensors with their
launches *recorded* instead of run (:func:`verispec.kernels.backend.recording_launches`):
each recording holds the ``@triton.jit`` function (compiled from source with the
interpreter off), the grid and the exact arguments the wrapper passed. Triton's own
binder then derives the signature, the specialisation (which arguments are constants,
which are multiples of 16) and the options, as ``JITFunction.run`` does on a GPU, and
``triton.compile`` takes the kernel through every stage for an explicit CUDA target:
Triton IR, TritonGPU IR, LLVM IR, PTX and, with the ``ptxas`` that ships with Triton,
a cubin. ``ptxas -v``'s log gives registers and spills per kernel.

So CI, with no GPU, compiles exactly what a GPU run would compile from the same
wrapper code: a wrong type, an argument the kernel does not take, a Triton API that
moved, or a float64 argument passed as float32 all fail here.

Run it as ``python benchmarks/compile_check.py [--arch 90 --arch 80] [--json PATH]`` from
the repository (``scripts/gpu_check.sh``'s ``compile`` stage and
``proofs_tests/kernels/test_compile_check.py`` do). It is a CI tool, not part of the
package: its scenarios build trees with :mod:`verispec.drafters`, a layer above
``verispec/kernels`` (docs/architecture.rst). It must run in a process where
``TRITON_INTERPRET`` was not set when ``triton`` was imported: Triton then defines parts
of ``triton.language`` itself (``tl.zeros``...) as interpreted functions, which cannot be
compiled; the command line clears it first.
:func:`specialization_key` is the key Triton caches compiled kernels under; equal
keys for launches at different sequence lengths mean no recompile as a sequence grows.

Shape glossary: N tree nodes, S prefix, H heads, D head dim, V vocabulary.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

import attrs
import torch

from verispec.kernels import backend

__all__ = [
    "ARCHS",
    "CompileReport",
    "Launch",
    "compile_all",
    "compile_launch",
    "cuda_target",
    "jit_module",
    "launch_signature",
    "record_launches",
    "scenarios",
    "specialization_key",
]

ARCHS = (90, 80)
"""Compute capabilities compiled by default: H100 (sm_90) and A100 (sm_80)."""


@attrs.frozen
class Launch:
    """One kernel launch as a host wrapper made it."""

    module: str
    kernel: str
    fn: Any  # triton.runtime.jit.JITFunction
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@attrs.frozen
class CompileReport:
    """One kernel compiled for one target.

    Attributes:
        scenario: which wrapper call produced the launch (:func:`scenarios`).
        kernel: the ``@triton.jit`` function's name.
        arch: compute capability (90 = sm_90).
        stages: the stages Triton produced, in order (``ttir`` ... ``cubin``).
        registers, spill_stores, spill_loads: from ``ptxas -v``; ``None`` without a cubin.
        seconds: compile time.
    """

    scenario: str
    kernel: str
    arch: int
    stages: tuple[str, ...]
    registers: int | None
    spill_stores: int | None
    spill_loads: int | None
    seconds: float


def cuda_target(arch: int) -> Any:
    """``GPUTarget("cuda", arch, 32)``: NVIDIA compute capability ``arch``, 32-thread warps."""
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", arch, 32)


_JIT_MODULES: dict[str, ModuleType] = {}


@contextlib.contextmanager
def _interpreter_off() -> Iterator[None]:
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved


def jit_module(name: str) -> ModuleType:
    """A private copy of ``verispec.kernels.triton.<name>`` whose kernels are
    ``JITFunction`` objects.

    Loaded from source with the interpreter off, whatever ``TRITON_INTERPRET`` says,
    and kept out of ``sys.modules`` so the interpreted module in use is untouched.
    """
    module = _JIT_MODULES.get(name)
    if module is None:
        spec = importlib.util.find_spec(f"verispec.kernels.triton.{name}")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        with _interpreter_off():
            spec.loader.exec_module(module)
        _JIT_MODULES[name] = module
    return module


class _Recorder:
    """Stand-in for a kernel module: ``kernel[grid](*args, **kwargs)`` appends a Launch."""

    def __init__(self, name: str, launches: list[Launch]) -> None:
        self._name = name
        self._module = jit_module(name)
        self._launches = launches

    def __getattr__(self, kernel: str) -> Any:
        fn = getattr(self._module, kernel)
        name, launches = self._name, self._launches

        class _Grid:
            def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
                def launch(*args: Any, **kwargs: Any) -> None:
                    launches.append(Launch(name, kernel, fn, tuple(grid), args, kwargs))

                return launch

        return _Grid()


def record_launches(call: Callable[[], Any]) -> list[Launch]:
    """Run ``call()`` (host wrappers on CPU tensors) and return the launches it made."""
    launches: list[Launch] = []
    with backend.recording_launches(lambda name: _Recorder(name, launches)):
        call()
    return launches


def _bind(launch: Launch, target: Any) -> tuple[Any, ...]:
    """Triton's own binding for ``target``: (backend, bound args, specialization, options)."""
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    compiler_backend = make_backend(target)
    fn = launch.fn
    binder = create_function_from_signature(fn.signature, fn.params, compiler_backend)
    bound_args, specialization, options = binder(*launch.args, **launch.kwargs)
    return compiler_backend, bound_args, specialization, options


def launch_signature(launch: Launch, target: Any = None) -> dict[str, str]:
    """The type Triton gives each argument of the launch (``"fp64"``, ``"*fp16"``, ``"constexpr"``).

    What ``JITFunction.run`` would compile: a Python float is ``"fp32"`` unless the
    kernel annotates it, an int ``"i32"`` or ``"i64"``, a tensor a typed pointer.
    """
    _, bound_args, specialization, _ = _bind(launch, target or cuda_target(ARCHS[0]))
    return {name: spec[0] for name, spec in zip(bound_args, specialization, strict=True)}


def specialization_key(launch: Launch, target: Any = None) -> str:
    """The key under which Triton caches the compiled kernel for this launch's arguments.

    Two launches with equal keys run the same binary: the second does not compile.
    """
    from triton.runtime.jit import compute_cache_key

    _, _, specialization, options = _bind(launch, target or cuda_target(ARCHS[0]))
    return f"{launch.module}.{launch.kernel}:" + compute_cache_key({}, specialization, options)


_USED = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def compile_launch(launch: Launch, target: Any) -> tuple[Any, str]:
    """``triton.compile`` the launch for ``target``; returns the kernel and ``ptxas -v``'s log.

    Raises:
        triton.CompilationError: the kernel does not compile (type errors, API errors).
    """
    import triton
    from triton import knobs
    from triton.compiler import ASTSource

    compiler_backend, bound_args, specialization, options = _bind(launch, target)
    options, signature, constexprs, attrs_ = launch.fn._pack_args(
        compiler_backend, launch.kwargs, bound_args, specialization, options
    )
    source = ASTSource(launch.fn, signature, constexprs, attrs_)
    log = io.StringIO()
    saved = knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile
    # always compile (a cache hit has no ptxas log) and print ptxas -v's log
    knobs.nvidia.dump_ptxas_log = knobs.compilation.always_compile = True
    try:
        with contextlib.redirect_stdout(log), _interpreter_off():
            kernel = triton.compile(source, target=target, options=options.__dict__)
    finally:
        knobs.nvidia.dump_ptxas_log, knobs.compilation.always_compile = saved
    return kernel, log.getvalue()


# -- what to compile: one wrapper call per configuration a run uses --------------------


def _attention(
    dtype: torch.dtype, d: int, n: int, s: int, *, causal: bool = False, splits: int | None = None
) -> Callable[[], Any]:
    def call() -> Any:
        from verispec.core.tree import DraftTree
        from verispec.kernels import ops

        g = torch.Generator().manual_seed(n)
        q = torch.randn(1, 9, n, d, generator=g).to(dtype)
        kp, vp = (torch.randn(1, 3, s, d, generator=g).to(dtype) for _ in range(2))
        kt, vt = (torch.randn(1, 3, n, d, generator=g).to(dtype) for _ in range(2))
        parents = [-1] + [int(torch.randint(-1, i, (), generator=g)) for i in range(1, n)]
        tmask = None if causal else DraftTree.from_parents([0] * n, parents).ancestor_mask
        pmask = None if causal else torch.rand(n, s, generator=g) < 0.9
        return ops.tree_attention(
            q, kp, vp, kt, vt, tmask, prefix_mask=pmask, num_splits=splits, kernels="triton"
        )

    return call


def _greedy(dtype: torch.dtype) -> Callable[[], Any]:
    def call() -> Any:
        from verispec.drafters.templates import resolve_template
        from verispec.kernels import ops
        from verispec.kernels.reference import children_csr

        template = resolve_template("2.2.2", 8)
        logits = torch.zeros(81, 49152, dtype=dtype)
        child_ptr, child_idx = children_csr(template.parents)
        tokens = torch.arange(80)
        return ops.greedy_verify_packed(logits, tokens, child_ptr, child_idx, 8, kernels="triton")

    return call


def _rejection(num_nodes: int = 80) -> Callable[[], Any]:
    def call() -> Any:
        from verispec.core.tree import DraftTree, WithoutReplacement
        from verispec.drafters.templates import resolve_template
        from verispec.kernels import ops

        vocab = 49152
        parents = resolve_template("2.2.2", 8).parents[:num_nodes]
        draft = torch.full((vocab,), 1 / vocab, dtype=torch.float64)
        tree = DraftTree.from_parents(torch.arange(num_nodes), parents, WithoutReplacement(draft))
        probs = torch.full((num_nodes + 1, vocab), 1 / vocab, dtype=torch.float64)
        codes, rows, drafts = ops.law_tensors(tree, vocab, probs.device)
        tokens, child_ptr, child_idx = ops.tree_csr(tree, probs.device)
        uniforms = torch.full((num_nodes + 1,), 0.5, dtype=torch.float64)
        return ops.rejection_verify_packed(
            probs, drafts, rows, codes, tokens, child_ptr, child_idx, uniforms, kernels="triton"
        )

    return call


def _token_recycling() -> Any:
    from verispec.drafters.templates import resolve_template
    from verispec.kernels import ops

    template = resolve_template("2.2.2", 8)
    adjacency = torch.full((49152, 8), -1, dtype=torch.int32)
    args = (template.parents, template.slots, template.level_starts)
    rows = ops.expand_template(adjacency, 11, *args, kernels="triton")
    ops.update_adjacency(adjacency, torch.arange(81), torch.zeros(81, 8), kernels="triton")
    return rows


def _kv_compaction(dtype: torch.dtype) -> Callable[[], Any]:
    def call() -> Any:
        from verispec.kernels import ops

        caches = [torch.zeros(1, 3, 64, 64, dtype=dtype) for _ in range(4)]
        ops.compact_kv(caches, 40, torch.tensor([41, 43, 44]), kernels="triton")

    return call


def _static_attention(
    heads: int, kv_heads: int, d: int, by_position: bool = False
) -> Callable[[], Any]:
    def call() -> Any:
        from verispec.kernels.graph_ops import static_attention

        q = torch.zeros(81, heads, d)
        k, v = torch.zeros(81, kv_heads, d), torch.zeros(81, kv_heads, d)
        cache_k, cache_v = torch.zeros(kv_heads, 512, d), torch.zeros(kv_heads, 512, d + 1)
        mask = torch.ones(81, 81, dtype=torch.bool).tril()
        where = torch.tensor(300)
        return static_attention(q, k, v, cache_k, cache_v, where, mask, by_position=by_position)

    return call


def _invariant(dtype: torch.dtype) -> Callable[[], Any]:
    def call() -> Any:
        from verispec.kernels.graph_ops import invariant_linear, invariant_rms_norm

        x = torch.zeros(81, 576, dtype=dtype)
        invariant_rms_norm(x, torch.ones(576, dtype=dtype), 1e-5)
        return invariant_linear(x, torch.zeros(1536, 576, dtype=dtype), None)

    return call


def scenarios() -> dict[str, Callable[[], Any]]:
    """One host-wrapper call per kernel configuration a run uses, by name.

    Tree attention in every dtype (SmolLM2's 9 heads over 3 KV heads, D = 64, a
    37-node tree over a 300-token prefix with a prefix mask), at D = 128, causal (a
    prefill) and split over the prefix; greedy verification of float32 and float64
    logits and rejection verification at V = 49,152 over the "2.2.2" tree; Token
    Recycling's expansion and update; KV compaction in float16 and bfloat16; the graphed
    runtime's static attention (SmolLM2's heads and a 7B shape's, float32, by slot tile and
    by sequence position) and the
    batch-invariant product and norm in each dtype.
    """
    return {
        "tree_attention[float16]": _attention(torch.float16, 64, 37, 300),
        "tree_attention[bfloat16]": _attention(torch.bfloat16, 64, 37, 300),
        "tree_attention[float32]": _attention(torch.float32, 64, 37, 300),
        "tree_attention[float64]": _attention(torch.float64, 64, 37, 300),
        "tree_attention[float16,D=128]": _attention(torch.float16, 128, 80, 300),
        "tree_attention[float32,D=128]": _attention(torch.float32, 128, 37, 300),
        "tree_attention[float16,causal]": _attention(torch.float16, 64, 200, 0, causal=True),
        "tree_attention[float16,split]": _attention(torch.float16, 64, 8, 1024, splits=4),
        "greedy_verify[float32]": _greedy(torch.float32),
        "greedy_verify[float64]": _greedy(torch.float64),
        "rejection_verify[float64]": _rejection(80),
        "token_recycling[int32]": _token_recycling,
        "kv_compaction[float16]": _kv_compaction(torch.float16),
        "kv_compaction[bfloat16]": _kv_compaction(torch.bfloat16),
        "static_attention[float32]": _static_attention(9, 3, 64),
        "static_attention[float32,D=128]": _static_attention(32, 32, 128),
        "static_attention[float32,by_position]": _static_attention(9, 3, 64, by_position=True),
        "static_attention[float32,D=128,by_position]": _static_attention(32, 32, 128, True),
        "batch_invariant[float16]": _invariant(torch.float16),
        "batch_invariant[bfloat16]": _invariant(torch.bfloat16),
        "batch_invariant[float32]": _invariant(torch.float32),
    }


def compile_all(
    archs: Sequence[int] = ARCHS,
    calls: dict[str, Callable[[], Any]] | None = None,
) -> list[CompileReport]:
    """Compile every launch of every scenario for every arch; one report per compile.

    Raises:
        triton.CompilationError: the first kernel that does not compile.
    """
    reports = []
    for scenario, call in (calls or scenarios()).items():
        for launch in record_launches(call):
            for arch in archs:
                start = time.perf_counter()
                kernel, log = compile_launch(launch, cuda_target(arch))
                seconds = time.perf_counter() - start
                used = _USED.findall(log)
                spills = _SPILLS.findall(log)
                reports.append(
                    CompileReport(
                        scenario=scenario,
                        kernel=launch.kernel,
                        arch=arch,
                        stages=tuple(k for k in kernel.asm if k not in ("source", "json")),
                        registers=int(used[-1]) if used else None,
                        spill_stores=int(spills[-1][0]) if spills else None,
                        spill_loads=int(spills[-1][1]) if spills else None,
                        seconds=seconds,
                    )
                )
    return reports


def main(argv: Sequence[str] | None = None) -> int:
    """Compile every scenario; print one line per compile; 1 if a kernel does not compile."""
    parser = argparse.ArgumentParser(prog="python benchmarks/compile_check.py")
    parser.add_argument("--arch", type=int, action="append", help="compute capability (90, 80)")
    parser.add_argument("--json", metavar="PATH", help="write the reports as JSON")
    parser.add_argument("--scenario", help="only the scenarios whose name contains this")
    args = parser.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    import triton

    start = time.perf_counter()
    try:
        calls = {k: v for k, v in scenarios().items() if (args.scenario or "") in k}
        reports = compile_all(tuple(args.arch or ARCHS), calls)
    except triton.CompilationError as exc:
        print(f"compile_check: a kernel does not compile:\n{exc}", file=sys.stderr)
        return 1
    for r in reports:
        spills = "-" if r.spill_stores is None else f"{r.spill_stores}/{r.spill_loads}"
        print(
            f"{r.scenario:32} {r.kernel:30} sm_{r.arch}  {'>'.join(r.stages):28} "
            f"registers {r.registers}  spill stores/loads {spills}  {r.seconds:.1f} s"
        )
    total = time.perf_counter() - start
    print(f"{len(reports)} compiles in {total:.1f} s (triton {triton.__version__})")
    if args.json:
        payload = {
            "triton": triton.__version__,
            "seconds": total,
            "reports": [attrs.asdict(r) for r in reports],
        }
        with open(args.json, "w") as out:
            json.dump(payload, out, indent=1)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

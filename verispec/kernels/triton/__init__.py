"""The ``@triton.jit`` kernels, one module each, imported only when a Triton kernel runs.

:func:`verispec.kernels.backend.kernel_module` imports them (again when
``TRITON_INTERPRET`` changed); the host wrappers that validate, allocate and launch them are
:mod:`verispec.kernels.ops` and :mod:`verispec.kernels.graph_ops`, and each kernel's PyTorch
twin is in :mod:`verispec.kernels.reference` (or beside its wrapper).
"""

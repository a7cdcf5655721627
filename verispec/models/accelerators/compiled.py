"""The fast runtime's compiled forward: ``torch.compile`` per tree-size bucket.

:class:`CompiledForward` compiles :meth:`Transformer.forward
<verispec.models.llama.Transformer.forward>` once per bucket of new-token counts
(:data:`~verispec.models.accelerators.buckets.BUCKETS`: a pass of Q tokens runs in the smallest
bucket that holds it, the extra rows masked), so each compiled graph has static shapes.
Two parts stay outside the graphs, as opaque custom operators that call the eager code,
each registered by the module that uses it:

* ``verispec::packed_linear`` (:mod:`verispec.models.accelerators.linear_op`) — the oneDNN
  product with a prepacked weight (:class:`~verispec.models.accelerators.onednn.PackedLinear`;
  inductor's own prepacking would pick MKL for float32, which is slower here and whose rows
  depend on the row count) or the block kernel's; :meth:`CompiledForward.attach` registers
  each such module's key;
* ``verispec::cached_attention`` (:func:`verispec.models.attention.cached_attention`, the
  tree passes' attention core that :meth:`CompiledForward.attach` sets) —
  :func:`~verispec.models.attention.attend`: the cache write and the attention over the used
  slots, whose count changes every step. Its positions travel in a tensor, so a new
  position does not recompile.

What inductor compiles and fuses is the rest: the embedding, RMSNorm, the rotary
embedding, residuals, SwiGLU and the casts around the bfloat16 products. The cache is
allocated at 4,096 slots; a longer context doubles it and recompiles (counted).

Graphs are cached on disk by inductor's FX graph cache under
``$VERISPEC_CACHE/inductor`` (default ``~/.cache/verispec/inductor``), so another
process loads them instead of compiling. :meth:`CompiledForward.warm_up` compiles every
bucket up front and returns the seconds it took; callers report that instead of timing
it with an answer. Passes that see a slot range other than the committed cache plus
themselves (a draft model growing a tree with ``extend_from``) run eagerly.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from verispec.core.paths import cache_dir
from verispec.models.accelerators.base import Accelerator, Plan
from verispec.models.accelerators.buckets import BucketedForward
from verispec.models.accelerators.linear_op import register_products
from verispec.models.attention import cached_attention
from verispec.models.llama import KVCache, Pass, PassKind, Transformer

__all__ = ["COMPILED_CAPACITY", "CompiledForward"]

COMPILED_CAPACITY = 4096
"""Slots of compiled mode's first cache allocation (a new capacity recompiles)."""


def inductor_cache_dir() -> Path:
    """``$VERISPEC_CACHE/inductor`` if set, else ``~/.cache/verispec/inductor``."""
    return cache_dir("inductor")


class CompiledForward(BucketedForward):
    """``Transformer.forward``, compiled per bucket of new-token counts (see module docstring).

    Attributes:
        setup_s: seconds spent compiling (or loading from the disk cache) so far.
    """

    name = "compiled"
    capacity_cap = COMPILED_CAPACITY

    def __init__(self, transformer: Transformer) -> None:
        super().__init__(transformer)
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(inductor_cache_dir()))
        import torch._dynamo  # here, not at the top: importing it costs a second

        # One graph per bucket and per layer choice (a self-draft is another graph).
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        self._forward = torch.compile(transformer.forward, dynamic=False, fullgraph=True)
        self._warm: set[tuple[int, Any, int]] = set()

    @classmethod
    def attach(
        cls, model: Transformer, plan: Plan, attached: Sequence[Accelerator]
    ) -> CompiledForward | None:
        """With ``compile=True`` and no CUDA graphs: the products registered as opaque
        operators, the tree passes' attention core :func:`cached_attention`."""
        if not plan.compile or plan.graphs:
            return None
        register_products(model)
        for block in model.blocks:
            block.attention.cores[PassKind.TREE] = cached_attention
        return cls(model)

    def run_bucket(self, p: Pass) -> torch.Tensor:
        key = (len(p.tokens), p.layers, p.caches[0].capacity)  # a new capacity recompiles too
        if key in self._warm:
            return self._forward(p)
        start = time.perf_counter()  # compiles now: counted, never silently
        out = self._forward(p)
        self.setup_s += time.perf_counter() - start
        self._warm.add(key)
        return out

    def warm_up(self, caches: list[KVCache], layers: tuple[int, ...] | None = None) -> float:
        """Compile every bucket for these caches (their slots are overwritten); return seconds."""
        before = self.setup_s
        for size in self.buckets:  # inputs made as FastModel makes them (outside inference mode)
            tokens = torch.zeros(size, dtype=torch.long, device=caches[0].k.device)
            mask = torch.ones(size, size, dtype=torch.bool, device=tokens.device).tril_()
            positions, where = torch.arange(size), torch.tensor([0, 128])
            with torch.inference_mode():
                self(Pass(tokens, positions, caches, where, mask, layers))
        return self.setup_s - before

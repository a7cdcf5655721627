"""CUDA graphs for the fast runtime: one captured forward per tree-size bucket.

On a GPU a step of a small model is a few hundred kernel launches; replaying them from a
CUDA graph removes the launch overhead. A graph replays fixed kernels on fixed
addresses, so everything that changes from step to step lives in static buffers that
are overwritten before each replay: the token ids, their positions, the first cache
slot (a 0-d tensor on the device) and the ``(Q, Q)`` mask among the new tokens. These
passes are ``PassKind.STATIC`` passes, whose attention core is
:func:`~verispec.models.attention.attend_static`: it writes the cache with ``index_copy_`` at
device-side slots and attends to the whole cache with a mask built on the device, so no
shape depends on the step and nothing is read on the host. The cache is allocated once at
its full size (a graph holds its addresses).

One graph is captured per bucket of new-token counts
(:data:`~verispec.models.accelerators.buckets.GRAPH_BUCKETS`)
and per layer choice (a self-draft is another graph), on first use or all at once by
:meth:`GraphedForward.warm_up`. Passes that are not a bucket's shape (a draft model
growing its tree with ``extend_from``) run eagerly.

With ``compile=True`` the forward that is captured is first compiled by inductor, once
for every bucket (the row count is a symbolic size): its normalisations, rotary
embedding, masking and SwiGLU become a few fused kernels instead of tens of small ones a
layer. A graph replays each of its kernels anyway, so on a small model, where a step is
hundreds of launches of microsecond kernels, fewer kernels is what makes the step shorter.

``capture=False`` runs the same static-buffer path without capturing: it is how the
plumbing is tested on a machine without CUDA (and, with ``compile=True``, inductor's CPU
code stands in for its GPU code).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any, cast

import torch

from verispec.models.accelerators.base import Accelerator, Plan
from verispec.models.accelerators.buckets import GRAPH_BUCKETS, BucketedForward
from verispec.models.accelerators.linear_op import register_products
from verispec.models.llama import KVCache, Pass, PassKind, Transformer

__all__ = ["GraphedForward"]


class _Graph:
    """One bucket's static inputs, its output, and the captured graph (or none)."""

    def __init__(self, size: int, device: torch.device) -> None:
        self.tokens = torch.zeros(size, dtype=torch.long, device=device)
        self.positions = torch.zeros(size, dtype=torch.long, device=device)
        self.start = torch.zeros((), dtype=torch.long, device=device)
        self.mask = torch.ones(size, size, dtype=torch.bool, device=device).tril_()
        self.graph: Any = None
        self.out: torch.Tensor | None = None


class GraphedForward(BucketedForward):
    """``Transformer.forward`` replayed from one CUDA graph per bucket (see module docstring).

    Attributes:
        setup_s: seconds spent capturing so far.
    """

    name = "cuda-graphs"
    buckets = GRAPH_BUCKETS
    capacity_cap = None  # a graph holds the cache's addresses: allocated once, whole

    def __init__(
        self, transformer: Transformer, *, capture: bool = True, compile: bool = False
    ) -> None:
        super().__init__(transformer)
        self.capture = capture
        self.compiled = compile
        self._graphs: dict[tuple[int, Any], _Graph] = {}
        self._forward: Any = functools.partial(transformer.forward, kind=PassKind.STATIC)
        if compile:
            self.name = "compiled+cuda-graphs"
            import torch._dynamo  # here, not at the top: importing it costs a second

            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            # One compile for every bucket (the row count is symbolic), fused by inductor,
            # then captured per bucket like the plain forward.
            self._forward = torch.compile(self._forward, dynamic=True, fullgraph=True)

    @classmethod
    def attach(
        cls, model: Transformer, plan: Plan, attached: Sequence[Accelerator]
    ) -> GraphedForward | None:
        """With CUDA graphs (``cuda_graphs``); compiled first with ``compile=True`` (the
        products registered as opaque operators)."""
        if not plan.graphs:
            return None
        if plan.compile:
            register_products(model)
        return cls(model, compile=plan.compile)

    def run_bucket(self, p: Pass) -> torch.Tensor:
        caches, layers = p.caches, p.layers
        key = (len(p.tokens), layers)
        entry = self._graphs.get(key) or _Graph(len(p.tokens), caches[0].k.device)
        self._graphs[key] = entry
        entry.tokens.copy_(p.tokens, non_blocking=True)
        entry.positions.copy_(p.positions, non_blocking=True)
        entry.start.fill_(int(p.where[0]))  # where is on the host: no device read
        entry.mask.copy_(p.local_mask, non_blocking=True)
        if self.capture and entry.graph is None:
            self._capture(entry, caches, layers)  # with this step's inputs in the buffers
        if entry.graph is not None:
            entry.graph.replay()
            assert entry.out is not None
            return entry.out
        return self._run(entry, caches, layers)

    def warm_up(self, caches: list[KVCache], layers: tuple[int, ...] | None = None) -> float:
        """Capture every bucket's graph now (before any sequence); return the seconds."""
        before = self.setup_s
        for size in self.buckets:
            entry = self._graphs.setdefault((size, layers), _Graph(size, caches[0].k.device))
            if self.capture and entry.graph is None:
                self._capture(entry, caches, layers)
        return self.setup_s - before

    def _run(self, entry: _Graph, caches: Sequence[KVCache], layers: Any) -> torch.Tensor:
        start = time.perf_counter()
        out = self._forward(
            Pass(entry.tokens, entry.positions, caches, entry.start, entry.mask, layers)
        )
        if self.compiled and not self.capture:  # compiling, uncaptured: counted here
            self.setup_s += time.perf_counter() - start
        return cast(torch.Tensor, out)

    def _capture(self, entry: _Graph, caches: Sequence[KVCache], layers: Any) -> None:
        start = time.perf_counter()
        # The warm-up passes run with the buffers' inputs: they write slots
        # [start, start + size), exactly the slots the replay writes next; committed slots
        # (before ``start``) are never touched.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.inference_mode(), torch.cuda.stream(stream):
            for _ in range(2):
                self._run(entry, caches, layers)
        torch.cuda.current_stream().wait_stream(stream)
        entry.graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(entry.graph):
            entry.out = self._run(entry, caches, layers)
        torch.cuda.synchronize()
        self.setup_s += time.perf_counter() - start

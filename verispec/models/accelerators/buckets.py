"""Tree-size buckets: the pass sizes the compiled and graphed forwards are built for.

A forward with static shapes (a ``torch.compile`` graph, a captured CUDA graph) is built
once per bucket of new-token counts (:data:`BUCKETS`); a pass runs in the smallest bucket
that holds it (:func:`bucket_for`), its extra rows padded and masked. :class:`BucketedForward`
is what both such forwards share (:mod:`verispec.models.accelerators.compiled`,
:mod:`verispec.models.accelerators.graphs`): the plain :class:`~verispec.models.llama.Transformer`
serves every pass that is not a bucket's shape.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import torch

from verispec.models.accelerators.base import Accelerator
from verispec.models.llama import KVCache, Pass, Transformer

__all__ = ["BUCKETS", "GRAPH_BUCKETS", "BucketedForward", "bucket_for"]

BUCKETS: tuple[int, ...] = (2, 4, 8, 12, 16, 20, 24, 32, 48, 64, 96, 128)
"""New-token counts the compiled forwards are built for (one graph each): up to the largest
trees the drafters send (80 nodes for Token Recycling's 2.2.2 template, 64 for
``dtr:budget=auto``) with their root, so that every step of a generation runs a built graph;
longer passes (prefill chunks, shared by every method) run eagerly."""

GRAPH_BUCKETS: tuple[int, ...] = (*BUCKETS, 160, 192, 256)
"""The CUDA graphs' buckets: :data:`BUCKETS` and on to 256 new tokens. A captured graph
costs a replay, not a compile, and a GPU's T(n) is nearly flat, so a tree of 128 nodes and
its root (129 tokens) runs a graph too instead of falling off the last one to run eagerly,
several times slower (docs/benchmarks.rst, the H100 report)."""


def bucket_for(queries: int, buckets: tuple[int, ...] = BUCKETS) -> int:
    """The smallest of ``buckets`` holding ``queries`` new tokens (past the last: itself)."""
    return next((size for size in buckets if queries <= size), queries)


class BucketedForward(Accelerator):
    """A forward built once per bucket (compiled, or captured as CUDA graphs) around the plain
    :class:`~verispec.models.llama.Transformer`, which serves every other pass.

    A pass has a bucket's shape when its Q new tokens fill a bucket and see only the
    committed slots and each other (``local_mask`` is square): the target's steps and the
    prefill. A draft model growing a tree (``extend_from``) sees more slots: it runs eagerly.

    Attributes:
        name: what the runtime's description calls this forward.
        capacity_cap: the most slots of a cache's first allocation (``None``: the whole
            context, allocated once).
        setup_s: seconds spent building (compiling or capturing) so far.
    """

    name: str
    capacity_cap: ClassVar[int | None]
    buckets: ClassVar[tuple[int, ...]] = BUCKETS

    @classmethod
    def bucket(cls, queries: int) -> int:
        """The rows a pass of ``queries`` new tokens runs on (:func:`bucket_for`)."""
        return bucket_for(queries, cls.buckets)

    def __init__(self, transformer: Transformer) -> None:
        self.transformer = transformer
        self.setup_s = 0.0
        self.forward = self

    def __call__(self, p: Pass) -> torch.Tensor:
        """As :meth:`Transformer.forward <verispec.models.llama.Transformer.forward>` (a tree
        pass)."""
        queries, width = p.local_mask.shape
        if queries != width or queries not in self.buckets:  # a long prefill chunk: eager
            return self.transformer(p)
        return self.run_bucket(p)

    @abc.abstractmethod
    def run_bucket(self, p: Pass) -> torch.Tensor:
        """The built forward of the bucket ``len(p.tokens)`` (built now if it is not yet)."""

    @abc.abstractmethod
    def warm_up(self, caches: list[KVCache], layers: tuple[int, ...] | None = None) -> float:
        """Build every bucket for these caches now; return the seconds it took."""

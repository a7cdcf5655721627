"""The device picks the tree size: latency tables and the tokens-per-second budget rule.

A step that sends ``n`` tree nodes costs the target ``T(n)`` seconds and commits on
average ``1 + v_1 + ... + v_n`` tokens, where ``v_i`` is the probability that node ``i``
is accepted (its *value*; the 1 is the extra token). With the nodes in decreasing
value order — a prefix of which is always a connected tree when values never grow
down a path — the best size is

    n* = argmax_n (1 + v_1 + ... + v_n) / T(n),

the expected tokens per second. ``T`` is measured once per model and device for a
grid of sizes (:func:`measure_latency`), interpolated linearly between them, and
cached on disk (:func:`latency_for`). The rule (:func:`choose_budget`) only needs
values, so any drafter that estimates them can use it (dynamic Token Recycling,
DySpec's slot values...).

Not in the Token Recycling or DySpec papers: both fix the tree size; the rule here
sizes trees to maximise expected accepted tokens per second
(docs/methods/dynamic_token_recycling.rst, docs/methods/dyspec.rst).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import statistics
import time
from bisect import bisect_right
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from verispec.core import paths
from verispec.core.notices import waiting
from verispec.core.tree import DraftTree
from verispec.core.types import BaseDrafter, LanguageModel
from verispec.errors import ConfigError

__all__ = [
    "DEFAULT_CONTEXTS",
    "DEFAULT_SIZES",
    "LatencyBound",
    "LatencyTable",
    "choose_budget",
    "device_key",
    "latency_for",
    "latency_path",
    "measure_latency",
]

DEFAULT_SIZES: tuple[int, ...] = (0, 1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
DEFAULT_CONTEXTS: tuple[int, ...] = (256, 1024, 2048)  # committed tokens the table is measured at
TABLE_VERSION = 2  # how tables are measured (2: passes over all sizes); older ones remeasure


def _check_table(instance: LatencyTable, attribute: attrs.Attribute, value: Any) -> None:
    sizes, rows, contexts = instance.sizes, instance.rows, instance.contexts
    if any(len(row) != len(sizes) for row in rows) or not sizes:
        raise ConfigError(
            f"a latency table needs one time per size in every row; got {len(sizes)} sizes "
            f"and rows of {[len(row) for row in rows]} times."
        )
    if list(sizes) != sorted(set(sizes)) or sizes[0] != 0:
        raise ConfigError(
            f"latency table sizes must be increasing, distinct and start at 0; got {list(sizes)}."
        )
    if len(contexts) != len(rows) or list(contexts) != sorted(set(contexts)) or contexts[0] < 0:
        raise ConfigError(
            f"latency table contexts must be increasing, >= 0 and one per row; got "
            f"{list(contexts)} for {len(rows)} rows."
        )
    if any(not (t > 0) for row in rows for t in row):
        raise ConfigError(f"latency table times must be > 0 seconds; got {list(rows)}.")


def _floats(value: Any) -> tuple[float, ...]:
    return tuple(float(x) for x in value)


def _rows(value: Any) -> tuple[tuple[float, ...], ...]:
    return tuple(_floats(row) for row in value)


def _interpolate(xs: torch.Tensor, ys: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Linear between the points ``(xs, ys)`` (xs increasing), along the end slopes beyond."""
    if len(xs) == 1:
        return ys[0].expand_as(x).clone()
    hi = torch.searchsorted(xs, x, right=True).clamp(1, len(xs) - 1)
    lo = hi - 1
    slope = (ys[hi] - ys[lo]) / (xs[hi] - xs[lo])
    return ys[lo] + slope * (x - xs[lo])


@attrs.frozen
class LatencyTable:
    """Measured seconds of one target step for a grid of tree sizes, at one or more contexts.

    A step's cost grows with the tree and, through attention, with the committed context, so
    a table may hold one row of times per context length measured.

    Attributes:
        sizes: tree sizes measured, increasing, starting at 0 (the plain decoding step).
        seconds: median seconds of one ``forward_tree`` at each size, at ``contexts[0]``.
        key: what was measured (model, dtype, device), see :func:`device_key`.
        contexts: committed tokens each row was measured after, increasing (``(0,)``: one
            row, context not recorded).
        longer: the rows of ``contexts[1:]``, one time per size each.
    """

    sizes: tuple[int, ...] = attrs.field(converter=lambda v: tuple(int(x) for x in v))
    seconds: tuple[float, ...] = attrs.field(converter=_floats)
    key: str = ""
    contexts: tuple[int, ...] = attrs.field(
        default=(0,), converter=lambda v: tuple(int(x) for x in v)
    )
    longer: tuple[tuple[float, ...], ...] = attrs.field(
        default=(), converter=_rows, validator=_check_table
    )
    _dense: dict[int, list[list[float]]] = attrs.field(
        factory=dict, init=False, eq=False, repr=False
    )  # upto()'s rows, by limit

    @property
    def rows(self) -> tuple[tuple[float, ...], ...]:
        """Times per size, one row per context: ``(seconds, *longer)``."""
        return (self.seconds, *self.longer)

    def at(self, n: torch.Tensor | Sequence[int] | int, context: int | None = None) -> torch.Tensor:
        """``T(n)`` after ``context`` committed tokens (``None``: the first row's context).

        Linear between measured sizes and contexts, and beyond the last along the last
        slope (below the first context: the first row).

        Returns:
            float64, the shape of ``n``.
        """
        n_t = torch.as_tensor(n, dtype=torch.float64).clamp(min=0)
        xs = torch.tensor(self.sizes, dtype=torch.float64)
        per_row = [
            _interpolate(xs, torch.tensor(row, dtype=torch.float64), n_t) for row in self.rows
        ]
        if context is None or len(per_row) == 1:
            return per_row[0]
        stacked = torch.stack(per_row, -1)  # (..., contexts)
        at = torch.tensor(float(max(context, self.contexts[0])), dtype=torch.float64)
        cs = torch.tensor(self.contexts, dtype=torch.float64)
        hi = int(torch.searchsorted(cs, at, right=True).clamp(1, len(cs) - 1))
        weight = (at - cs[hi - 1]) / (cs[hi] - cs[hi - 1])
        return stacked[..., hi - 1] + weight * (stacked[..., hi] - stacked[..., hi - 1])

    def upto(self, limit: int, context: int | None = None) -> torch.Tensor:
        """``T(0), ..., T(limit)`` after ``context`` committed tokens: :meth:`at` of
        ``arange(limit + 1)``, from rows interpolated once per limit.

        Returns:
            float64, Shape: (limit + 1,).
        """
        return torch.tensor(self.upto_list(limit, context), dtype=torch.float64)

    def upto_list(self, limit: int, context: int | None = None) -> list[float]:
        """:meth:`upto` as a Python list (a drafter asks every step it drafts, where a
        tensor operator costs more than the few numbers)."""
        rows = self._dense.get(limit)
        if rows is None:
            n = torch.arange(limit + 1, dtype=torch.float64)
            xs = torch.tensor(self.sizes, dtype=torch.float64)
            rows = [
                _interpolate(xs, torch.tensor(row, dtype=torch.float64), n).tolist()
                for row in self.rows
            ]
            self._dense[limit] = rows
        if context is None or len(rows) == 1:
            return list(rows[0])
        at = float(max(context, self.contexts[0]))
        hi = min(max(bisect_right(self.contexts, at), 1), len(self.contexts) - 1)
        lo_c, hi_c = self.contexts[hi - 1], self.contexts[hi]
        weight = (at - lo_c) / (hi_c - lo_c)
        return [a + weight * (b - a) for a, b in zip(rows[hi - 1], rows[hi], strict=True)]

    @property
    def max_size(self) -> int:
        return self.sizes[-1]

    def to_json(self) -> str:
        return json.dumps(
            {
                "key": self.key,
                "sizes": self.sizes,
                "seconds": self.seconds,
                "contexts": self.contexts,
                "longer": self.longer,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> LatencyTable:
        data = json.loads(text)
        return cls(
            data["sizes"],
            data["seconds"],
            data.get("key", ""),
            data.get("contexts", (0,)),
            data.get("longer", ()),
        )

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the table to ``path`` (atomically, so that processes measuring the same
        table at once never leave a half-written or a failed file)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        text = self.to_json()
        paths.write_atomic(target, lambda tmp: tmp.write_text(text))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> LatencyTable:
        return cls.from_json(Path(path).read_text())


def choose_budget(
    values_sorted_desc: torch.Tensor | Sequence[float],
    latency: LatencyTable,
    context: int | None = None,
    *,
    overhead: float = 0.0,
) -> int:
    """The tree size ``n`` that maximises ``(1 + sum of the first n values) / (T(n) + D)``,
    with ``D = 0`` for ``n = 0``.

    Args:
        values_sorted_desc: float, Shape: (M,). Acceptance probability of each candidate
            node, largest first (a prefix must be a connected tree).
        latency: the target's step time by tree size.
        context: committed tokens now; ``T`` is read at this context (attention grows with
            it), ``None``: the table's first context.
        overhead: ``D``, the drafter's own seconds on a step that sends nodes (proposing
            and learning from the outcome), which a plain decoding step does not pay.

    Returns:
        ``n`` in ``[0, M]``; the smallest such ``n`` on ties.

    Raises:
        ConfigError: a negative or non-finite ``overhead``.
    """
    if not 0.0 <= overhead < math.inf:
        raise ConfigError(f"`overhead` must be a finite number of seconds >= 0; got {overhead}.")
    if isinstance(values_sorted_desc, torch.Tensor):
        values_sorted_desc = values_sorted_desc.reshape(-1).tolist()
    values = [float(v) for v in values_sorted_desc]  # M is small: Python beats tensor ops
    times = latency.upto_list(len(values), context)
    best, best_rate, expected = 0, 1.0 / times[0], 1.0
    for n, value in enumerate(values, 1):
        expected += value
        if expected / (times[n] + overhead) > best_rate:
            best, best_rate = n, expected / (times[n] + overhead)
    return best


def _chain_like_tree(n: int, generator: torch.Generator, vocab_size: int) -> DraftTree:
    """A tree of ``n`` nodes shaped like the ones drafters send (a few branches, deep trunk)."""
    parents = [-1 if i < min(4, n) else (i - 4 if i < 8 else i - 1 - (i % 3)) for i in range(n)]
    tokens = torch.randint(vocab_size, (n,), generator=generator)
    return DraftTree.from_parents(tokens, parents)


def measure_latency(
    model: LanguageModel,
    sizes: Sequence[int] = DEFAULT_SIZES,
    *,
    context: int | Sequence[int] = 256,
    repeats: int = 9,
    warmup: int = 2,
) -> LatencyTable:
    """Time one target step (``forward_tree``) for every tree size in ``sizes``.

    For each context length, the model is prefilled with that many random tokens, then
    ``warmup`` untimed and ``repeats`` timed passes run every size once each (the median
    per size is kept, raised where needed so that no size costs less than a smaller one;
    CUDA is synchronised), and the model is reset afterwards. Every repetition builds a fresh tree,
    so the tree-mask work each real step does is included.

    Args:
        model: the target.
        sizes: tree sizes; 0 (plain decoding) is added if missing.
        context: the committed tokens to measure after, one length or several (one row of
            the table each); lengths that do not fit the model's context with the largest
            tree are left out, and at least one (shortened) length is always measured.

    Raises:
        ConfigError: a negative size, or sizes that do not fit the model's context.
    """
    grid = sorted({0, *(int(s) for s in sizes)})
    if grid[0] < 0:
        raise ConfigError(f"`sizes` must be >= 0; got {grid[0]}.")
    if repeats < 1 or warmup < 0:
        raise ConfigError(f"`repeats` must be >= 1 and `warmup` >= 0; got {repeats}, {warmup}.")
    if grid[-1] + 2 > model.max_length:
        raise ConfigError(
            f"a tree of {grid[-1]} nodes does not fit the model's context of {model.max_length}."
        )
    wanted = sorted({int(c) for c in ([context] if isinstance(context, int) else context)})
    room = model.max_length - grid[-1] - 1
    contexts = [c for c in wanted if 1 <= c <= room] or [max(1, min(wanted[0], room))]
    rows = [_measure_row(model, grid, c, repeats, warmup) for c in contexts]
    return LatencyTable(grid, rows[0], device_key(model), contexts, rows[1:])


def _measure_row(
    model: LanguageModel, grid: list[int], context: int, repeats: int, warmup: int
) -> list[float]:
    """Median seconds of one step per tree size after ``context`` random tokens.

    Each repetition is one pass over every size, so a stretch of machine load falls on all
    sizes alike instead of on the few measured while it lasted (measured one size at a
    time, a table once priced the first node above the second). A larger tree never costs
    less than a smaller one: the medians are raised to the largest before them."""
    generator = torch.Generator().manual_seed(0)
    model.prefill(torch.randint(model.vocab_size, (context,), generator=generator))
    device = getattr(model, "device", torch.device("cpu"))
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    times: list[list[float]] = [[] for _ in grid]
    try:
        for i in range(warmup + repeats):
            for j, n in enumerate(grid):
                tree = _chain_like_tree(n, generator, model.vocab_size)
                sync()
                start = time.perf_counter()
                model.forward_tree(tree)
                sync()
                if i >= warmup:
                    times[j].append(time.perf_counter() - start)
    finally:
        model.reset()
    seconds = [statistics.median(t) for t in times]
    for j in range(1, len(seconds)):
        seconds[j] = max(seconds[j], seconds[j - 1])
    return seconds


def device_key(model: Any) -> str:
    """A name for what a latency table describes: model, dtype, device, CPU threads, the
    class (and runtime variant) that runs the forward and the source of its C kernels."""
    config = getattr(model, "config", None)
    name = str(getattr(config, "_name_or_path", "") or getattr(config, "model_type", "")) or (
        type(model).__name__
    )
    layers = getattr(model, "layer_indices", None)
    dtype = str(getattr(model, "dtype", "")).replace("torch.", "")
    device = torch.device(getattr(model, "device", "cpu"))
    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
    else:
        where = f"{platform.machine()}-{platform.processor() or 'cpu'}-{torch.get_num_threads()}t"
    shape = f"V{getattr(model, 'vocab_size', '?')}-L{len(layers) if layers else '?'}"
    runtime = type(model).__name__ + (f"-{model.runtime}" if hasattr(model, "runtime") else "")
    kernels = getattr(model, "kernel_id", "")  # the C kernels' source, where they run
    return (
        f"{name}|{shape}|{dtype}|{device.type}|{where}|{runtime}"
        + (f"|kernels-{kernels}" if kernels else "")
        + f"|table-v{TABLE_VERSION}"
    )


def latency_path(model: LanguageModel, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where :func:`latency_for` keeps ``model``'s table: named after :func:`device_key`,
    under ``cache_dir``, else ``$VERISPEC_CACHE/latency`` or ``~/.cache/verispec/latency``."""
    folder = Path(cache_dir) if cache_dir is not None else paths.cache_dir("latency")
    return folder / (hashlib.sha1(device_key(model).encode()).hexdigest()[:16] + ".json")


def latency_for(
    model: LanguageModel,
    *,
    sizes: Sequence[int] = DEFAULT_SIZES,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    remeasure: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
) -> LatencyTable:
    """The model's latency table from the on-disk cache, measured (and cached) if missing.

    The cache file is named after :func:`device_key` (model, dtype, device, CPU threads,
    runtime), under ``$VERISPEC_CACHE/latency`` or ``~/.cache/verispec/latency``. A cached
    table that lacks a requested size, or a requested context that fits the model, is
    measured again; ``remeasure=True`` always measures and overwrites it. Sizes that
    do not fit the model's context are left out.
    """
    key = device_key(model)
    sizes = [s for s in sizes if s + 2 <= model.max_length] or [0]  # trees that fit
    path = latency_path(model, cache_dir)
    fitting = {c for c in contexts if c + max(sizes, default=0) < model.max_length}
    if not remeasure and path.is_file():
        try:
            table = LatencyTable.load(path)
            if (
                table.key == key
                and set(sizes) <= set(table.sizes) | {0}
                and fitting <= set(table.contexts)
            ):
                return table
        except (ValueError, KeyError, OSError, TypeError):
            pass  # a corrupt or foreign file: measure again
    with waiting(
        f"measuring this model's step latency for the budget rule (once per model, dtype, "
        f"device and thread count; kept in {path})"
    ):
        table = measure_latency(model, sizes, context=contexts)
    table.save(path)
    return table


_NEEDS_LATENCY = (
    "{} is sized by the device and needs the target's latency table: pass "
    "`latency=verispec.drafters.budget.latency_for(model)`, or run it through "
    "verispec.SpeculativeDecoder (which binds it), or give a fixed size."
)


class LatencyBound(BaseDrafter):
    """A drafter that may size its trees by the target's latency table (``"auto"``): the
    table is given at construction or bound by :meth:`bind_target`.

    :class:`verispec.SpeculativeDecoder` calls ``bind_target(target)`` on the drafter it
    is given; the table is then read from the on-disk cache, or measured once per model,
    dtype, device and thread count (:func:`latency_for`). DySpec's ``budget="auto"`` binds
    it so; :class:`~verispec.drafters.gate.DeviceSized` adds a draft gate.
    """

    sized_by_device: bool = False
    _latency: LatencyTable | None = None

    def _size_by_device(self, auto: bool, latency: LatencyTable | None) -> None:
        """Whether this drafter is sized by the device, and its table if given.

        Raises:
            ConfigError: ``latency`` is not a :class:`LatencyTable`.
        """
        if latency is not None and not isinstance(latency, LatencyTable):
            raise ConfigError(
                "`latency` must be the target's latency table "
                f"(verispec.drafters.budget.latency_for(target)); got {type(latency).__name__}."
            )
        self.sized_by_device = auto
        self.latency = latency

    @property
    def latency(self) -> LatencyTable | None:
        """The target's latency table (``None``: not given or bound yet)."""
        return self._latency

    @latency.setter
    def latency(self, table: LatencyTable | None) -> None:
        self._latency = table

    def bind_target(self, target: LanguageModel) -> None:
        """Read (or measure) ``target``'s latency table if this drafter is sized by the
        device and has none yet."""
        if self.sized_by_device and self.latency is None:
            self._size_by_device(True, latency_for(target))

    def _latency_table(self, what: str) -> LatencyTable:
        """The table; a clear error naming ``what`` where none was given or bound."""
        if self._latency is None:
            raise ConfigError(_NEEDS_LATENCY.format(what))
        return self._latency

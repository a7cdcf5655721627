"""The benchmark's PNGs, as docs/benchmarks.rst ("Plots") describes them.

:func:`save_plot` (``--plot``): speedup per category and method, beside the MAT view of all
answers. :func:`save_mat_plot` (``--mat-plot``): the MAT view, "all" first, then one panel
per category. The MAT view draws mean accepted tokens per step against draft nodes per step,
one curve per method *family* (:func:`method_family`); ``ar`` is a star at (0, 1) and
the peers (transformers, llama.cpp) are left out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verispec.bench.report import BenchReport, Figures
from verispec.specs import DRAFTERS, show

__all__ = [
    "SIZE_PARAMS", "family_labels", "mat_curves", "method_family", "save_mat_plot", "save_plot"
]  # fmt: skip

# Parameters that set how many nodes a method drafts per step: they vary along a curve.
# ``k`` is a size only for ``chain`` (its length); for ``tr``/``dtr`` it is candidates per
# token, which changes the method, not its budget.
SIZE_PARAMS: dict[str, frozenset[str]] = {
    "*": frozenset({"budget", "template", "branching", "width", "depth"}),
    "chain": frozenset({"k"}),
    "pld": frozenset({"max"}),
}


def _is_size(name: str, key: str) -> bool:
    return key in SIZE_PARAMS["*"] or key in SIZE_PARAMS.get(name, ())


def method_family(name: str, params: Mapping[str, Any]) -> str:
    """The family of a method: its name and every parameter but the size ones
    (:data:`SIZE_PARAMS`), sorted: ``method_family("dtr", {"budget": 8, "fusion": False,
    "k": 8})`` is ``"dtr:fusion=false:k=8"``."""
    rest = sorted((key, show(value)) for key, value in params.items() if not _is_size(name, key))
    return name + "".join(f":{key}={value}" for key, value in rest)


def family_labels(families: list[str]) -> dict[str, str]:
    """Short legend labels: each family key without the parameters its siblings share
    (``dtr:fusion=true:k=8`` and ``dtr:fusion=false:k=8`` are ``dtr:fusion=true`` and
    ``dtr:fusion=false``)."""
    labels = {}
    for family in families:
        name, *own = family.split(":")
        siblings = [other.split(":")[1:] for other in families if other.split(":")[0] == name]
        shared = set(siblings[0]).intersection(*siblings[1:])
        labels[family] = ":".join([name, *(item for item in own if item not in shared)])
    return labels


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def mat_curves(
    methods: Mapping[str, Figures], specs: Mapping[str, tuple[str, Mapping[str, Any]]]
) -> dict[str, list[tuple[float, float, str]]]:
    """The MAT plot's curves for one group of answers (``methods``: figures per label;
    ``specs``: name and parameters per label): per family, ``(nodes/step, MAT, label)``
    points sorted by tree size, families in the order their first method appears.
    Only verispec's methods are drawn: the peers (transformers, llama.cpp) draft out of
    sight, or not at all (plain ``llama-cpp`` would sit on ``ar``'s (0, 1))."""
    curves: dict[str, list[tuple[float, float, str]]] = {}
    for label, figures in methods.items():
        name, params = specs.get(label, (label, {}))
        if figures.mean_tree_size is None or name not in DRAFTERS:
            continue
        point = (figures.mean_tree_size, figures.mean_accepted, label)
        curves.setdefault(method_family(name, params), []).append(point)
    return {family: sorted(points) for family, points in curves.items()}


class _Canvas:
    """What both PNGs share: pyplot, the groups of answers ("all", then each category),
    every method's spec, and one colour and marker per family, the same in every panel."""

    def __init__(self, report: BenchReport) -> None:
        self.plt, self.config = _pyplot(), report.config
        self.groups = {"all": report.methods, **report.per_category}
        self.specs = {label: report.specs.get(label, (label, {})) for label in report.methods}
        palette, markers = [self.plt.get_cmap("tab10")(i) for i in range(10)], "osD^v<>pPX"
        self.style = {
            fam: ("black", "*") if fam == "ar" else (palette[i % 10], markers[i // 10 % 10])
            for i, fam in enumerate(mat_curves(report.methods, self.specs))
        }
        self.handles: dict[str, Any] = {}  # the first line drawn of each family

    def mat_panel(self, ax: Any, figures: Mapping[str, Figures], sizes: bool) -> None:
        """One group's MAT curves on ``ax``; with ``sizes``, each point marked with its size."""
        for fam, points in mat_curves(figures, self.specs).items():
            color, marker = self.style.get(fam, ("grey", "o"))
            xs, ys, _ = zip(*points, strict=True)
            (line,) = ax.plot(
                xs, ys, color=color, marker=marker, markersize=9 if marker == "*" else 4,
                linewidth=1.2,
            )  # fmt: skip
            self.handles.setdefault(fam, line)
            for x, y, label in points if sizes else []:
                name, params = self.specs[label]
                sized = [show(v) for k, v in params.items() if _is_size(name, k) and v is not None]
                if sized:
                    ax.annotate("x".join(sized), (x, y), fontsize=6, xytext=(3, -8),
                                textcoords="offset points")  # fmt: skip
        ax.grid(alpha=0.3)

    def save(self, fig: Any, owner: Any, path: str | Path, rect: Any = None, **legend: Any) -> None:
        """Add the families' legend to ``owner`` (the figure or an axis), lay ``fig`` out
        within ``rect``, save it as PNG to ``path`` (as given, not atomically) and close it."""
        names = family_labels(list(self.handles))
        labels = [names[fam] for fam in self.handles]
        owner.legend(list(self.handles.values()), labels, fontsize="small", **legend)
        fig.tight_layout(rect=rect)
        fig.savefig(path, format="png", dpi=120)
        self.plt.close(fig)


def save_plot(report: BenchReport, path: str | Path) -> None:
    """Draw the speedups and the MAT view of all answers, as PNG to ``path``."""
    canvas, labels = _Canvas(report), list(report.methods)
    baseline = next((peer for peer in ("ar", "hf") if peer in labels), None)
    fig, (bars, mat) = canvas.plt.subplots(1, 2, figsize=(13, 4.8), width_ratios=(2.2, 1))
    width = 0.8 / max(len(labels), 1)
    for i, label in enumerate(labels):
        group = [figures[label] for figures in canvas.groups.values()]
        speedups = [getattr(f, f"speedup_vs_{baseline}") if baseline else None for f in group]
        heights = [
            s if s is not None else f.tokens_per_s for s, f in zip(speedups, group, strict=True)
        ]
        xs = [g + (i - (len(labels) - 1) / 2) * width for g in range(len(group))]
        bars.bar(xs, heights, width=width, label=label, color=canvas.plt.get_cmap("tab20")(i % 20))
    bars.set_xticks(range(len(canvas.groups)), list(canvas.groups), rotation=30, ha="right")
    if baseline is not None:
        bars.axhline(1.0, color="black", linewidth=0.8)
    speedup = f"speedup (tokens/s over {baseline})"
    bars.set(ylabel=speedup if baseline else "tokens/s", title="Speedup per category")
    bars.legend(fontsize="small", ncol=2)
    canvas.mat_panel(mat, report.methods, sizes=True)
    mat.set(xlabel="draft nodes per step", ylabel="mean accepted tokens per step (MAT)")
    mat.set_title("Accepted tokens vs tree size")
    canvas.save(fig, mat, path)


def save_mat_plot(report: BenchReport, path: str | Path) -> None:
    """Draw MAT against draft nodes per step, one curve per method family, as PNG to
    ``path``: a panel for all answers, then one per category."""
    canvas = _Canvas(report)
    groups = canvas.groups
    columns = min(4, len(groups))
    rows = math.ceil(len(groups) / columns)
    legend_height = 0.2 + 0.25 * math.ceil(max(len(canvas.style), 1) / 6)  # inches
    fig, axes = canvas.plt.subplots(
        rows, columns, figsize=(3.3 * columns, 2.7 * rows + 0.5 + legend_height),
        squeeze=False, sharex=True,
    )  # fmt: skip
    for ax, (group, figures) in zip(axes.flat, groups.items(), strict=False):
        canvas.mat_panel(ax, figures, sizes=group == "all")
        answers = next(iter(figures.values())).outputs if figures else 0
        ax.set_title(f"{group} ({answers} answer{'' if answers == 1 else 's'})", fontsize="small")
        ax.tick_params(labelsize="x-small")
        ax.margins(x=0.08, y=0.08)
    for ax in axes.flat[len(groups) :]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("MAT", fontsize="small")
    for column in range(columns):  # the lowest visible panel of each column shows the x axis
        ax = axes[(len(groups) - 1 - column) // columns, column]
        ax.xaxis.set_tick_params(labelbottom=True)
        ax.set_xlabel("draft nodes per step", fontsize="small")
    fig.suptitle(
        "Mean accepted tokens per step (MAT) vs draft nodes per step; temperature "
        f"{canvas.config.get('temperature')}, max {canvas.config.get('max_new_tokens')} new tokens",
        fontsize="medium",
    )
    rect = (0, legend_height / fig.get_figheight(), 1, 0.95)
    ncol = min(len(canvas.handles), 6) or 1
    canvas.save(fig, fig, path, rect, loc="lower center", ncol=ncol, frameon=False)

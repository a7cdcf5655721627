"""The benchmark's PNGs: speedup per category, and accepted tokens vs draft budget.

:func:`save_plot` (``--plot``). Left panel: grouped bars, one group per category
(and "all"), one bar per method, height = tokens/s over the baseline's (``ar`` if
it ran, else ``hf``). Right panel: one point per method, mean accepted tokens per
step (MAT) against mean draft-tree nodes per step.

:func:`save_mat_plot` (``--mat-plot``). The same MAT-vs-nodes view, "all" first and
then one small panel per category, with the methods of one *family* joined by a
line in order of tree size: a family is a method with every parameter fixed except
its size parameters (:func:`method_family`), so ``tr:template=8/16/32`` is one
curve and ``dtr:budget=8/16`` another. Each curve shows how much MAT each extra
tree node buys. ``ar`` (no tree, MAT 1) is drawn as a single point, the origin of
every curve; transformers' peers (``hf``, ``hf-pld``, ``hf-assist-ee``), whose
drafting is not visible, are left out of both MAT views.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verispec.bench.report import BenchReport, Figures
from verispec.specs import show

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


def _size_params(name: str) -> frozenset[str]:
    return SIZE_PARAMS["*"] | SIZE_PARAMS.get(name, frozenset())


def method_family(name: str, params: Mapping[str, Any]) -> str:
    """The family of a method: its name and every parameter but the size ones
    (:data:`SIZE_PARAMS`), sorted: ``method_family("dtr", {"budget": 8, "fusion": False,
    "k": 8})`` is ``"dtr:fusion=false:k=8"``."""
    size = _size_params(name)
    rest = sorted((key, show(value)) for key, value in params.items() if key not in size)
    return name + "".join(f":{key}={value}" for key, value in rest)


def family_labels(families: list[str]) -> dict[str, str]:
    """Short legend labels: each family key without the parameters its siblings share
    (``dtr:fusion=true:k=8`` and ``dtr:fusion=false:k=8`` are ``dtr:fusion=true`` and
    ``dtr:fusion=false``)."""
    by_name: dict[str, list[str]] = {}
    for family in families:
        by_name.setdefault(family.split(":", 1)[0], []).append(family)
    labels = {}
    for name, members in by_name.items():
        items = [family.split(":")[1:] for family in members]
        shared = set(items[0]).intersection(*items[1:]) if len(members) > 1 else set(items[0])
        for family, own in zip(members, items, strict=True):
            labels[family] = ":".join([name, *(item for item in own if item not in shared)])
    return labels


def _size_text(name: str, params: Mapping[str, Any]) -> str:
    size = _size_params(name)
    return "x".join(show(v) for k, v in params.items() if k in size and v is not None)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_plot(report: BenchReport, path: str | Path) -> None:
    """Draw the report and save it as PNG to ``path`` (written as given, not atomically)."""
    plt = _pyplot()
    labels = list(report.methods)
    baseline = "ar" if "ar" in labels else ("hf" if "hf" in labels else None)
    groups = {"all": report.methods, **report.per_category}
    fig, (bars_ax, mat_ax) = plt.subplots(1, 2, figsize=(13, 4.8), width_ratios=(2.2, 1))
    width = 0.8 / max(len(labels), 1)
    palette = [plt.get_cmap("tab20")(i) for i in range(20)]
    colors = {label: palette[i % len(palette)] for i, label in enumerate(labels)}
    for i, label in enumerate(labels):
        heights = []
        for figures in groups.values():
            f = figures[label]
            value = f.speedup_vs_ar if baseline == "ar" else f.speedup_vs_hf
            heights.append(value if value is not None else f.tokens_per_s)
        xs = [g + (i - (len(labels) - 1) / 2) * width for g in range(len(groups))]
        bars_ax.bar(xs, heights, width=width, label=label, color=colors[label])
    bars_ax.set_xticks(range(len(groups)), list(groups), rotation=30, ha="right")
    if baseline is not None:
        bars_ax.axhline(1.0, color="black", linewidth=0.8)
        bars_ax.set_ylabel(f"speedup (tokens/s over {baseline})")
    else:
        bars_ax.set_ylabel("tokens/s")
    bars_ax.set_title("Speedup per category")
    bars_ax.legend(fontsize="small", ncol=2)

    for label, f in report.methods.items():
        if f.mean_tree_size is None:  # transformers' drafting peers: tree size not visible
            continue
        size = f.mean_tree_size
        mat_ax.scatter([size], [f.mean_accepted], color=colors[label])
        mat_ax.annotate(
            label,
            (size, f.mean_accepted),
            fontsize="small",
            xytext=(4, 4),
            textcoords="offset points",
        )
    mat_ax.set_xlabel("draft nodes per step")
    mat_ax.set_ylabel("mean accepted tokens per step (MAT)")
    mat_ax.set_title("Accepted tokens vs tree size")
    mat_ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=120)
    plt.close(fig)


def mat_curves(
    methods: Mapping[str, Figures], specs: Mapping[str, tuple[str, Mapping[str, Any]]]
) -> dict[str, list[tuple[float, float, str]]]:
    """The MAT plot's curves for one group of answers (``methods``: figures per label;
    ``specs``: name and parameters per label): per family, ``(nodes/step, MAT, label)``
    points sorted by tree size, families in the order their first method appears.
    transformers' peers and methods with no tree size are left out; ``ar`` is (0, 1)."""
    curves: dict[str, list[tuple[float, float, str]]] = {}
    for label, figures in methods.items():
        name, params = specs.get(label, (label, {}))
        if figures.mean_tree_size is None or name.startswith("hf"):  # tree size not visible
            continue
        point = (figures.mean_tree_size, figures.mean_accepted, label)
        curves.setdefault(method_family(name, params), []).append(point)
    return {family: sorted(points) for family, points in curves.items()}


def save_mat_plot(report: BenchReport, path: str | Path) -> None:
    """Draw MAT against draft nodes per step, one curve per method family, as PNG: a
    panel for all answers, then one per category (written as given, not atomically)."""
    plt = _pyplot()
    specs = {label: report.specs.get(label, (label, {})) for label in report.methods}
    order = list(mat_curves(report.methods, specs))
    names = family_labels(order)
    palette = [plt.get_cmap("tab10")(i) for i in range(10)]
    markers = "osD^v<>pPX"
    style = {
        fam: (
            "black" if fam == "ar" else palette[i % len(palette)],
            "*" if fam == "ar" else markers[(i // len(palette)) % len(markers)],
        )
        for i, fam in enumerate(order)
    }
    groups = {"all": report.methods, **report.per_category}
    columns = min(4, len(groups))
    rows = math.ceil(len(groups) / columns)
    legend_rows = math.ceil(max(len(order), 1) / 6)
    legend_height = 0.2 + 0.25 * legend_rows  # inches
    fig, axes = plt.subplots(
        rows,
        columns,
        figsize=(3.3 * columns, 2.7 * rows + 0.5 + legend_height),
        squeeze=False,
        sharex=True,
    )
    handles: dict[str, Any] = {}
    for ax, (group, figures) in zip(axes.flat, groups.items(), strict=False):
        curves = mat_curves(figures, specs)
        for fam in order:
            points = curves.get(fam)
            if not points:
                continue
            color, marker = style[fam]
            (line,) = ax.plot(
                [p[0] for p in points],
                [p[1] for p in points],
                color=color,
                marker=marker,
                markersize=9 if marker == "*" else 4,
                linewidth=1.2,
            )
            handles.setdefault(fam, line)
            if group == "all":
                for x, y, label in points:
                    text = _size_text(*specs[label])
                    if text:
                        ax.annotate(
                            text, (x, y), fontsize=6, xytext=(3, -8), textcoords="offset points"
                        )
        answers = next(iter(figures.values())).outputs if figures else 0
        plural = "" if answers == 1 else "s"
        ax.set_title(f"{group} ({answers} answer{plural})", fontsize="small")
        ax.tick_params(labelsize="x-small")
        ax.margins(x=0.08, y=0.08)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(groups) :]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("MAT", fontsize="small")
    for column in range(columns):  # the lowest visible panel of each column shows the x axis
        ax = axes[(len(groups) - 1 - column) // columns, column]
        ax.xaxis.set_tick_params(labelbottom=True)
        ax.set_xlabel("draft nodes per step", fontsize="small")
    config = report.config
    fig.suptitle(
        "Mean accepted tokens per step (MAT) vs draft nodes per step; "
        f"temperature {config.get('temperature')}, max {config.get('max_new_tokens')} "
        "new tokens",
        fontsize="medium",
    )
    fig.legend(
        list(handles.values()),
        [names[fam] for fam in handles],
        loc="lower center",
        ncol=min(len(handles), 6) or 1,
        fontsize="small",
        frameon=False,
    )
    fig.tight_layout(rect=(0, legend_height / fig.get_figheight(), 1, 0.95))
    fig.savefig(path, format="png", dpi=120)
    plt.close(fig)

"""The benchmark's PNG: speedup per category per method, and accepted tokens vs tree size.

Left panel: grouped bars, one group per category (and "all"), one bar per method,
height = tokens/s over the baseline's (``ar`` if it ran, else ``hf``). Right panel:
one point per method, mean accepted tokens per step (MAT) against mean draft-tree
nodes per step: how much each extra tree node buys (methods whose tree size is not
visible, transformers' drafting peers, are left out).
"""

from __future__ import annotations

from pathlib import Path

from verispec.bench.report import BenchReport

__all__ = ["save_plot"]


def save_plot(report: BenchReport, path: str | Path) -> None:
    """Draw the report and save it as PNG to ``path`` (written as given, not atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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

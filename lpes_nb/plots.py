"""One figure style for the whole workbook, and the figure types the studies share.

Every figure is saved as PNG (200 dpi) and PDF through :func:`save`, sized for a paper column and
with fonts readable in print."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from .results import output_dir

STYLE = {
    "figure.figsize": (6.0, 3.6),
    "figure.dpi": 100,
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.fontsize": 8.5,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.6,
    "lines.markersize": 5,
    "savefig.bbox": "tight",
    "figure.constrained_layout.use": True,  # colorbars and panel labels never overlap
    "axes.prop_cycle": matplotlib.cycler(color=["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00",
                                                "#56B4E9", "#F0E442", "#000000"]),  # colour-blind safe
}


def use_style() -> None:
    matplotlib.rcParams.update(STYLE)


def save(fig, name: str, profile: str) -> None:
    """Write ``figures/[<profile>/]<name>.png`` and ``.pdf``. Returns nothing, so that a notebook cell
    ending in ``plots.save(...)`` shows only the figure (nbval executes without input history, where
    IPython ignores a trailing semicolon)."""
    directory = output_dir("figures", profile)
    # no creation date: a rerun that draws the same figure leaves the committed file unchanged
    fig.savefig(directory / f"{name}.png", dpi=200)
    fig.savefig(directory / f"{name}.pdf", metadata={"CreationDate": None})


def accuracy_by_position(tables: Mapping[str, pd.DataFrame], ax=None, title: str | None = None, relative: bool = False):
    """Accuracy vs gold position with 95 % CI bars, one line per label (tables from accuracy_table).
    ``relative`` puts the position on [0, 1] (needs a ``num_items`` column) to compare context sizes."""
    ax = ax or plt.subplots()[1]
    for label, t in tables.items():
        x = t["position"] / (t["num_items"] - 1) if relative else t["position"]
        yerr = np.vstack([t["mean"] - t["ci_low"], t["ci_high"] - t["mean"]])
        ax.errorbar(x, t["mean"], yerr=yerr, marker="o", capsize=3, label=label)
    ax.set_xlabel("relative gold position (0 = first, 1 = last)" if relative else "gold position (0 = first)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.03, 1.03)
    if title:
        ax.set_title(title)
    if len(tables) > 1:
        ax.legend()
    return ax


def scale_curves(curves: Mapping[str, Sequence[float]], ax=None, title: str | None = None):
    """Per-layer scales, one line per label."""
    ax = ax or plt.subplots()[1]
    for label, s in curves.items():
        ax.plot(np.arange(len(s)), s, marker=".", label=label)
    ax.set_xlabel("layer")
    ax.set_ylabel("RoPE scale $s_l$")
    if title:
        ax.set_title(title)
    if len(curves) > 1:
        ax.legend()
    return ax


def heatmap(matrix, ax=None, xlabels=None, ylabels=None, cbar_label: str = "", title: str | None = None, **kw):
    ax = ax or plt.subplots()[1]
    im = ax.imshow(np.asarray(matrix, dtype=float), aspect="auto", origin="lower", **kw)
    ax.figure.colorbar(im, ax=ax, label=cbar_label)
    ax.grid(False)
    if xlabels is not None:
        step = max(1, len(xlabels) // 12)
        ax.set_xticks(range(0, len(xlabels), step), [str(x) for x in xlabels][::step])
    if ylabels is not None:
        step = max(1, len(ylabels) // 12)
        ax.set_yticks(range(0, len(ylabels), step), [str(y) for y in ylabels][::step])
    if title:
        ax.set_title(title)
    return ax


def convergence(summary: pd.DataFrame, ax=None, title: str | None = None):
    """GA best / mean-of-best-4 / population mean fitness by generation."""
    ax = ax or plt.subplots()[1]
    for column, label in (("best", "best"), ("mean_best_4", "mean of best 4"), ("mean", "population mean")):
        ax.plot(summary["generation"], summary[column], marker=".", label=label)
    ax.set_xlabel("generation")
    ax.set_ylabel("fitness")
    ax.legend()
    if title:
        ax.set_title(title)
    return ax


def method_dots(acc: pd.DataFrame, highlight: Mapping[str, str] | None = None, reference: str = "baseline"):
    """Accuracy per method as dots with 95 % CI whiskers: one row of panels per task, one panel per
    gold position, methods on the y axis in the order they first appear; the reference method's
    accuracy is a dashed line. ``acc``: ``task, method, position, n, mean, ci_low, ci_high``."""
    highlight = highlight or {}
    tasks = list(dict.fromkeys(acc.task))
    methods = list(dict.fromkeys(acc.method))
    width = max(acc.groupby("task").position.nunique())
    fig, axes = plt.subplots(len(tasks), width, figsize=(2.6 * width + 1.2, 0.24 * len(methods) * len(tasks) + 1.2),
                             sharex=True, sharey=True, squeeze=False, layout="constrained")
    y = {m: i for i, m in enumerate(methods)}
    for row, task in zip(axes, tasks):
        t = acc[acc.task == task]
        for ax, (position, g) in zip(row, t.groupby("position")):
            colours = [highlight.get(m, "#0072B2") for m in g.method]
            ax.hlines([y[m] for m in g.method], 100 * g.ci_low, 100 * g.ci_high, colors=colours, lw=1.4)
            ax.scatter(100 * g["mean"], [y[m] for m in g.method], c=colours, s=18, zorder=3)
            ref = g[g.method == reference]
            if len(ref):
                ax.axvline(100 * ref["mean"].iloc[0], color="black", ls="--", lw=0.8)
            ax.set_title(f"{task}, gold at item {position + 1} (n = {int(g.n.iloc[0])})", fontsize=9)
        for ax in row[t.position.nunique():]:
            ax.set_visible(False)
    axes[0, 0].set_yticks(range(len(methods)), methods)  # the y axis is shared: set (and invert) it once
    axes[0, 0].invert_yaxis()
    for ax in axes[-1]:
        ax.set_xlabel("accuracy (%), 95 % CI")
    axes[0, 0].set_xlim(-3, 103)
    return fig


def latency_ratios(latency: pd.DataFrame, title: str, highlight: str = "LPES"):
    """Inference time relative to the baseline: median ratio as a bar, min-max over rounds as a whisker."""
    order = latency.sort_values("median_ratio")
    fig, ax = plt.subplots(figsize=(7, 0.3 * len(order) + 1.2))
    ax.barh(order.variant, order.median_ratio, color=["#D55E00" if v == highlight else "#0072B2" for v in order.variant],
            xerr=np.vstack([order.median_ratio - order.min_ratio, order.max_ratio - order.median_ratio]),
            error_kw=dict(ecolor="black", lw=1, capsize=2))
    ax.axvline(1.0, color="black", lw=1, ls="--")
    ax.set_xlabel("inference time / baseline (bar: median, whisker: min-max over rounds)")
    ax.set_title(title)
    ax.grid(axis="y", visible=False)
    return fig

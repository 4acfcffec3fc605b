"""One figure style for the whole workbook, and the figure types the studies share.

Every figure is saved as PNG (200 dpi) and PDF through :func:`save`, sized for a paper column and
with fonts readable in print."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

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
    "axes.prop_cycle": matplotlib.cycler(color=["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00",
                                                "#56B4E9", "#F0E442", "#000000"]),  # colour-blind safe
}


def use_style() -> None:
    matplotlib.rcParams.update(STYLE)


def save(fig, name: str, profile: str) -> list[Path]:
    """Write ``figures/[<profile>/]<name>.png`` and ``.pdf``; return the paths."""
    directory = output_dir("figures", profile)
    paths = [directory / f"{name}.png", directory / f"{name}.pdf"]
    # no creation date: a rerun that draws the same figure leaves the committed file unchanged
    fig.savefig(paths[0], dpi=200)
    fig.savefig(paths[1], metadata={"CreationDate": None})
    return paths


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


def layer_scales(curves: Mapping[str, Sequence[float]], ax=None, title: str | None = None):
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

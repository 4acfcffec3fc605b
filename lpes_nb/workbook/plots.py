"""One figure style for the whole workbook, and the figure types the studies share.

Every figure is saved as PNG (200 dpi) and PDF through :func:`save` at the width of a paper's single or
double column (:data:`COLUMNS_IN`), so that its fonts print at the sizes set here, none below
:data:`SMALLEST_PT`."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.text import Text

from ..store.models import model_label
from ..store.results import output_dir

STYLE = {
    "figure.figsize": (6.0, 3.6),
    "figure.dpi": 100,
    # print sizes: a figure is saved at a column's width (save), so these are the points on paper
    "font.size": 8,
    "axes.titlesize": 8.5,
    "figure.titlesize": 9,
    "axes.labelsize": 8,
    "legend.fontsize": 7.5,
    "xtick.labelsize": 7.5,
    "ytick.labelsize": 7.5,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.6,
    "lines.markersize": 5,
    "figure.constrained_layout.use": True,  # colorbars and panel labels never overlap
}
EXPLORATORY = "exploratory"  # a stamp that starts with it labels the figure's title too
COLUMNS_IN = (3.3, 6.9)  # a two-column paper's single and double column, inches: the widths a figure is saved at
SMALLEST_PT = 7  # the smallest text readable in print
STAMP_IN = 0.16  # the height of one line of the stamp under a figure, inches
COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]  # colour-blind safe
# the curve families (lpes_nb.studies.profiles.SPACES) as a figure names them
SPACE_NAMES = {"bezier": "cubic Bézier", "linear": "piecewise linear", "free": "free per layer"}


def use_style() -> None:
    """seaborn's theme (white grid, the colour-blind palette) with the workbook's sizes on top."""
    sns.set_theme(context="paper", style="whitegrid", palette=COLOURS, rc=STYLE)


def intervals(ax, x, y, low, high, label: str | None = None, color: str = COLOURS[0], marker: str = "o", **line):
    """A line of points with *our* intervals (exact, paired or clustered: computed by the study, never
    by the plotting library): seaborn draws the line, the whiskers are [low, high]."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    sns.lineplot(x=x, y=y, marker=marker, color=color, label=label, errorbar=None, ax=ax, **line)
    ax.errorbar(x, y, yerr=np.vstack([y - np.asarray(low, dtype=float), np.asarray(high, dtype=float) - y]),
                fmt="none", capsize=3, color=color, lw=1)


def stamp(model: str, dtype, n: str, intervals: str | None = None, exploratory: str | None = None) -> str:
    """What a figure stands on, for :func:`save`: the model with its quantisation and dtype, ``n`` (say of
    what: "30 records per position") and the intervals drawn, if any. ``exploratory``: why the study is
    too weak to read as a result (one window, a search that never left its start); :func:`save` then
    puts the word in the figure's title too."""
    dtype = str(dtype).removeprefix("torch.")
    head = [f"{EXPLORATORY} ({exploratory})"] if exploratory else []
    return " · ".join(head + [model_label(model, dtype), n] + ([intervals] if intervals else []))


def save(fig, name: str, profile: str, stamp: str) -> None:
    """Write ``figures/[<profile>/]<name>.png`` and ``.pdf`` at a column's width (:data:`COLUMNS_IN`: the
    nearer one to the width drawn, the height kept), with ``stamp`` (:func:`stamp`: model, quantisation,
    dtype, n, intervals) printed under the figure, so that a figure read alone, in print, says what it
    stands on. Text below :data:`SMALLEST_PT` is refused, naming the figure. Returns nothing, so that a
    notebook cell ending in ``plots.save(...)`` shows only the figure (nbval executes without input
    history, where IPython ignores a trailing semicolon)."""
    if not isinstance(stamp, str) or not stamp.strip():
        raise ValueError(f"figure {name!r}: a stamp naming model, quantisation, dtype and n is required, got {stamp!r}")
    if stamp.startswith(EXPLORATORY):
        reason = stamp.split(" · ")[0]
        title = fig.get_suptitle()
        fig.suptitle(f"{reason.capitalize()}: {title}" if title else reason.capitalize())
    width, height = fig.get_size_inches()
    column = min(COLUMNS_IN, key=lambda c: abs(c - width))
    lines = textwrap.wrap(stamp, width=int(column * 20))  # 7-point text: about 20 characters per inch (as drawn here)
    fig.set_size_inches(column, height + STAMP_IN * len(lines))
    # the stamp gets its own strip at the bottom; the layout engine fits the panels above it
    if fig.get_layout_engine() is None:  # a figure drawn outside the workbook's style
        fig.set_layout_engine("constrained")
    strip = STAMP_IN * len(lines) / (height + STAMP_IN * len(lines))
    fig.get_layout_engine().set(rect=(0, strip, 1, 1 - strip))  # left, bottom, width, height
    fig.text(0.5, 0.01, "\n".join(lines), ha="center", va="bottom", fontsize=SMALLEST_PT, color="0.3")
    _fit_text(fig)
    small = sorted({t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()
                    and t.get_fontsize() < SMALLEST_PT})
    if small:
        raise ValueError(f"figure {name!r}: text at {small} pt, below the {SMALLEST_PT} pt readable in print")
    directory = output_dir("figures", profile)
    # no creation date: a rerun that draws the same figure leaves the committed file unchanged
    fig.savefig(directory / f"{name}.png", dpi=200)
    fig.savefig(directory / f"{name}.pdf", metadata={"CreationDate": None})


def _chars(inches: float, points: float) -> int:
    """About how many characters of ``points``-sized text fit in ``inches`` (a character is ~0.6 em wide)."""
    return max(12, int(inches * 72 / (0.6 * points)))


def _fit_text(fig) -> None:
    """What a narrower print width would cut or crowd: the title wrapped to the figure's width, panel
    titles and x-axis labels to their panel's, and x tick labels that overlap their neighbours turned
    upright."""
    width = fig.get_size_inches()[0]
    if fig._suptitle is not None:
        title = fig._suptitle
        title.set_text(textwrap.fill(title.get_text().replace("\n", " "), _chars(width, title.get_fontsize())))
    fig.canvas.draw()  # the panels' widths at the print width
    for ax in fig.axes:
        panel = ax.get_position().width * width
        for text in (ax.title, ax.xaxis.label):
            if text.get_text():
                text.set_text("\n".join(textwrap.fill(line, _chars(panel, text.get_fontsize()))
                                        for line in text.get_text().split("\n")))
    fig.canvas.draw()  # the tick labels' extents in the final layout
    for ax in fig.axes:
        boxes = [t.get_window_extent() for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        if any(a.x1 > b.x0 for a, b in zip(boxes, boxes[1:])):
            ax.tick_params(axis="x", labelrotation=90)


def accuracy_by_position(tables: Mapping[str, pd.DataFrame], ax=None, title: str | None = None, relative: bool = False):
    """Accuracy (%) vs gold position with 95 % CI bars, one line per label (tables from accuracy_table).
    ``relative`` puts the position on [0, 1] (needs a ``num_items`` column) to compare context sizes."""
    ax = ax or plt.subplots()[1]
    span = 1.0 if relative else max(float(t["position"].max()) for t in tables.values()) or 1.0
    for k, (label, t) in enumerate(tables.items()):
        x = t["position"] / (t["num_items"] - 1) if relative else t["position"]
        # a small sideways offset per series, so that equal values and their intervals stay apart
        x = x + (k - (len(tables) - 1) / 2) * 0.012 * span
        intervals(ax, x, 100 * t["mean"], 100 * t["ci_low"], 100 * t["ci_high"], label=label, color=COLOURS[k % len(COLOURS)])
    ax.set_xlabel("relative gold position (0 = first, 1 = last)" if relative else "gold position (0 = first)")
    ax.set_ylabel("accuracy (%), 95 % CI")
    ax.set_ylim(-3, 103)
    if title:
        ax.set_title(title)
    if len(tables) > 1:
        ax.legend()
    elif ax.get_legend() is not None:
        ax.get_legend().remove()
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
    sns.heatmap(np.asarray(matrix, dtype=float), ax=ax, cbar_kws={"label": cbar_label}, **kw)
    ax.invert_yaxis()  # the first row at the bottom, as the axis labels read
    if xlabels is not None:
        step = max(1, len(xlabels) // 12)
        ax.set_xticks(np.arange(0, len(xlabels), step) + 0.5, [str(x) for x in xlabels][::step], rotation=0)
    if ylabels is not None:
        step = max(1, len(ylabels) // 12)
        ax.set_yticks(np.arange(0, len(ylabels), step) + 0.5, [str(y) for y in ylabels][::step], rotation=0)
    if title:
        ax.set_title(title)
    return ax


def convergence(summary: pd.DataFrame, ax=None, title: str | None = None, reference: tuple[float, float] | None = None):
    """GA best / mean-of-best-4 / population mean fitness by generation; ``reference`` = (fitness,
    SE) of the unmodified model on the same search set, drawn as a line with a ±1 SE band (the best
    individual rises by elitism alone: the question is whether it clears this line)."""
    ax = ax or plt.subplots()[1]
    if reference is not None:
        value, se = reference
        ax.axhspan(value - se, value + se, color="0.85", zorder=0)
        ax.axhline(value, color="k", ls="--", lw=1, label=f"unmodified model ({value:.3f} ± {se:.3f} SE)")
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
            ax.set_title(f"{task}, gold at item {position + 1} (n = {int(g.n.iloc[0])})")
        for ax in row[t.position.nunique():]:
            ax.set_visible(False)
    axes[0, 0].set_yticks(range(len(methods)), methods)  # the y axis is shared: set (and invert) it once
    axes[0, 0].invert_yaxis()
    for ax in axes[-1]:
        ax.set_xlabel("accuracy (%), 95 % CI")
    axes[0, 0].set_xlim(-3, 103)
    return fig


def latency_ratios(latency: pd.DataFrame, title: str, highlight: str = "LPES"):
    """Inference time relative to the baseline: median ratio as a bar, the interquartile range of the
    per-round ratios as a whisker."""
    order = latency.sort_values("median_ratio")
    fig, ax = plt.subplots(figsize=(7, 0.3 * len(order) + 1.2))
    ax.barh(order.variant, order.median_ratio, color=["#D55E00" if v == highlight else "#0072B2" for v in order.variant],
            xerr=np.vstack([order.median_ratio - order.q25_ratio, order.q75_ratio - order.median_ratio]),
            error_kw=dict(ecolor="black", lw=1, capsize=2))
    ax.axvline(1.0, color="black", lw=1, ls="--")
    ax.set_xlabel("inference time / baseline (bar: median, whisker: interquartile range over rounds)")
    ax.set_title(title)
    ax.grid(axis="y", visible=False)
    return fig


def _wrapped(labels, width: int = 24) -> list[str]:
    """Row labels on lines of at most ``width`` characters: beside panels that share a column's width in
    print, a long method name would take the panels' room or run off the page."""
    return [textwrap.fill(str(label), width) for label in labels]


def difference_intervals(diffs: pd.DataFrame, title: str):
    """Paired Δλ of each method against each reference with its 95 % interval (rows of
    :func:`lpes_nb.evaluation.fitness.paired_differences`), one panel per reference, zero marked; the
    minimum detectable effect (80 % power) as a grey band around zero."""
    refs = list(dict.fromkeys(diffs["reference"]))
    fig, axes = plt.subplots(1, len(refs), figsize=(4.2 * len(refs), 0.45 * diffs["method"].nunique() + 1.4),
                             sharex=True, squeeze=False)
    for a, ref in zip(axes[0], refs):
        d = diffs[diffs["reference"] == ref].reset_index(drop=True)
        y = np.arange(len(d))
        mde = d["mde_80"].median()
        a.axvspan(-mde, mde, color="0.88", zorder=0)
        a.axvline(0, color="k", lw=0.8)
        same = d["identical"].to_numpy(dtype=bool) if "identical" in d else np.zeros(len(d), dtype=bool)
        a.errorbar(d["difference"][~same], y[~same], xerr=np.vstack([d["difference"] - d["ci_low"], d["ci_high"] - d["difference"]])[:, ~same],
                   fmt="o", capsize=3, color="#0072B2")
        a.plot(d["difference"][same], y[same], "D", color="0.45")
        a.set_yticks(y, _wrapped(d["method"]))
        a.invert_yaxis()
        # said under the axis, not in a legend box that would sit on a row
        a.set_xlabel(f"Δλ-score vs {ref} (paired, {int(d['records'].iloc[0])} records)\n"
                     f"grey: ±MDE at 80 % power ≈ {mde:.2f}" + ("\n◆ identical to the reference (no interval)" if same.any() else ""))
    fig.suptitle(title)
    return fig


def position_length_heatmaps(table: pd.DataFrame, title: str):
    """The position × length map: one panel per (model, task), accuracy in % by relative gold position
    (x) and prompt length (y), each cell annotated with its accuracy and 95 % interval."""
    panels = list(table.groupby(["model", "dtype", "task"], sort=False).groups)
    models = list(dict.fromkeys(m for m, _, _ in panels))
    tasks = list(dict.fromkeys(t for _, _, t in panels))
    # a task per row and a model per column: each panel gets half a double column, wide enough for a cell's
    # accuracy and its interval at 7 points
    lengths = table.groupby(["model", "task"]).length_tokens.nunique().max()  # rows of the tallest panel
    fig, axes = plt.subplots(len(tasks), len(models), figsize=(6.9, (0.45 * lengths + 1.2) * len(tasks)), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    for model, dtype, task in panels:
        ax = axes[tasks.index(task), models.index(model)]
        ax.set_visible(True)
        t = table[(table.model == model) & (table.task == task)]
        acc = t.pivot_table(index="length_tokens", columns="relative_position", values="accuracy") * 100
        lo = t.pivot_table(index="length_tokens", columns="relative_position", values="ci_low") * 100
        hi = t.pivot_table(index="length_tokens", columns="relative_position", values="ci_high") * 100
        labels = acc.round().astype(int).astype(str) + "\n[" + lo.round().astype(int).astype(str) + "–" \
            + hi.round().astype(int).astype(str) + "]"
        sns.heatmap(acc, ax=ax, vmin=0, vmax=100, cmap="viridis", cbar=False, annot=labels, fmt="",
                    annot_kws={"fontsize": SMALLEST_PT}, xticklabels=[f"{c:g}" for c in acc.columns], yticklabels=list(acc.index))
        ax.invert_yaxis()  # longer prompts higher up
        ax.tick_params(axis="y", rotation=0)
        mesh = ax.collections[0]  # one colour scale (0-100 %) for every panel
        ax.set_title(f"{model} ({dtype})\n{task}")
        ax.set_xlabel("gold position (0 = first, 1 = last)")
        ax.set_ylabel("prompt tokens")
    fig.colorbar(mesh, ax=axes, label="accuracy (%)", shrink=0.8)
    fig.suptitle(title)
    return fig


def record_cell(summary: pd.DataFrame, to_ends: pd.DataFrame, to_ends_logprob: pd.DataFrame | None, title: str,
                papers: pd.DataFrame | None = None):
    """One record cell of the map: (a) accuracy (%) by relative gold position with Wilson 95 %
    intervals, the closed-book and oracle accuracy as bands, and the papers' curves beside (``papers``:
    rows of ``position_map.paper_curves``, one curve per ``label``); (b) and
    (c) each position's paired difference to the mean of the two ends (accuracy in points, gold
    log-probability in nats; ``to_ends_logprob`` None where the cell's gold scores are withdrawn) with
    record-clustered 95 % intervals; below zero is a lost middle."""
    fig, axes = plt.subplots(1, 3, figsize=(11.5, 4.4))
    docs = summary[summary["relative_position"].notna()].sort_values("relative_position")  # closed-book / oracle have none
    x = docs["relative_position"]
    ax = axes[0]
    for condition, colour in (("closed_book", "0.55"), ("oracle", "#009E73")):
        row = summary[summary["condition"] == condition]
        if len(row):
            r = row.iloc[0]
            ax.axhspan(100 * r["ci_low"], 100 * r["ci_high"], color=colour, alpha=0.18, lw=0)
            ax.axhline(100 * r["accuracy"], color=colour, ls=":", lw=1.2,
                       label=f"{condition.replace('_', '-')} {100 * r['accuracy']:.0f} % (n = {int(r['n'])})")
    intervals(ax, x, 100 * docs["accuracy"], 100 * docs["ci_low"], 100 * docs["ci_high"],
              label=f"ours (n = {int(docs['n'].min())} per position)")
    if papers is not None:  # empty where the papers report no curve at this layout
        for (label, curve), (marker, colour) in zip(papers.groupby("label", sort=False), (("s", "#D55E00"), ("^", "#CC79A7"))):
            ax.plot(curve["relative_position"], curve["accuracy_percent"], f"{marker}--", color=colour, label=label)
    ax.set_xlabel("relative gold position")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1)  # below: the curves use the height
    for a, d, unit in ((axes[1], to_ends, "accuracy, points"), (axes[2], to_ends_logprob, "gold log-prob, nats")):
        scale = 100 if unit.startswith("accuracy") else 1
        if d is None:
            a.text(0.5, 0.5, "gold log-prob withdrawn:\nscored without the\nquotes the model writes", ha="center",
                   va="center", transform=a.transAxes)
            a.set_xticks([]), a.set_yticks([])
            continue
        a.axhline(0, color="k", lw=0.8)
        intervals(a, d["relative_position"], scale * d["difference"], scale * d["ci_low"], scale * d["ci_high"])
        a.set_xlabel("relative gold position")
        a.set_ylabel(f"Δ to the ends' mean ({unit})")
    axes[1].set_title("paired, per record")
    axes[2].set_title("paired, per record")
    fig.suptitle(title)
    return fig


def size_curves(summaries: Mapping[str, pd.DataFrame], differences: pd.DataFrame, scores: Mapping[str, tuple[str, float, str, int]],
                title: str, papers: pd.DataFrame | None = None):
    """Model size on one record cell: (a) accuracy (%) by relative gold position of each model on the
    same records, Wilson 95 % intervals, the papers' curves beside (``papers``: rows of
    ``position_map.paper_curves``); then per score in ``differences`` (rows of
    ``position_gate.size_differences`` with a ``value`` column; ``scores``: value -> (name, scale,
    unit, decimals)) the larger − smaller difference at each position, on the average and on ends − middle, with
    its record-clustered 95 % interval."""
    values = list(dict.fromkeys(differences["value"]))
    fig, axes = plt.subplots(1, 1 + len(values), figsize=(6.9, 3.6), gridspec_kw={"width_ratios": [1.5] + [1] * len(values)})
    short = {m: model_label(m).split("-Instruct")[0].removeprefix("Qwen2.5-Coder-") for m in summaries}
    ax = axes[0]
    for k, (model, s) in enumerate(summaries.items()):
        docs = s[s["relative_position"].notna()].sort_values("relative_position")
        intervals(ax, docs["relative_position"] + (k - (len(summaries) - 1) / 2) * 0.015, 100 * docs["accuracy"],
                  100 * docs["ci_low"], 100 * docs["ci_high"], label=short[model], color=COLOURS[k % len(COLOURS)])
    if papers is not None:
        for (label, curve), marker in zip(papers.groupby("label", sort=False), ("s", "^")):
            ax.plot(curve["relative_position"], curve["accuracy_percent"], f"{marker}--", color="0.45", ms=4,
                    label=label.split(":")[0] + ": " + label.split(":")[1].split(",")[0].strip() if ":" in label else label)
    ax.set_xlabel("relative gold position")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize=7)  # below: the curves use the height
    for a, value in zip(axes[1:], values):
        d = differences[differences["value"] == value].reset_index(drop=True)
        name, scale, unit, _ = scores[value]
        y = np.arange(len(d))
        a.axvline(0, color="k", lw=0.8)
        a.errorbar(scale * d["difference"], y, xerr=scale * np.vstack([d["difference"] - d["ci_low"], d["ci_high"] - d["difference"]]),
                   fmt="o", capsize=3, color=COLOURS[0])
        a.set_yticks(y, [f"{p:.2f}" if isinstance(p, float) else p for p in d["position"]])
        a.invert_yaxis()
        a.set_title(name, fontsize=8)
        a.set_xlabel(unit)
    axes[1].set_ylabel("gold position")
    for a in axes[2:]:
        a.tick_params(labelleft=False)
    pair = differences.iloc[0]
    fig.suptitle(f"{title}: {short.get(pair['method'], pair['method'])} − {short.get(pair['reference'], pair['reference'])} "
                 f"on the same {int(pair['n'])} records")
    return fig


def search_convergence(table: pd.DataFrame, title: str):
    """Searches' best fitness (solid) and mean of their best 4 (dashed) against the evaluations they
    scored, one panel per curve family (``space``), one colour per seed (rows of
    :func:`lpes_nb.studies.lpes_at_power.study`'s ``convergence``); the unmodified model's fitness on the same
    records is the dotted line a curve must clear. Evaluations, not wall hours: the GA's budget is the
    same for every family and seed, while an evaluation's hours depend on the CPU its sitting ran on."""
    spaces = list(dict.fromkeys(table["space"]))
    seeds = sorted(table["seed"].unique())
    fig, axes = plt.subplots(1, len(spaces), figsize=(1.2 + 3.4 * len(spaces), 3.6), sharex=True, sharey=True, squeeze=False)
    for ax, space in zip(axes[0], spaces):
        family = table[table["space"] == space]
        for seed, rows in family.groupby("seed", sort=True):
            colour = COLOURS[seeds.index(seed) % len(COLOURS)]
            ax.plot(rows["evaluated"], rows["best"], marker="o", color=colour, label=f"seed {seed}: best")
            ax.plot(rows["evaluated"], rows["mean_best_4"], ls="--", marker=".", color=colour, label=f"seed {seed}: mean of best 4")
        ax.axhline(family["unmodified"].iloc[0], color="k", ls=":", lw=1.2, label="unmodified model")
        ax.set_title(SPACE_NAMES.get(space, space))
        ax.set_xlabel("evaluations scored")
    axes[0, 0].set_ylabel("fitness (Eq. 8-weighted gold log-prob)")
    axes[0, 0].ticklabel_format(axis="y", useOffset=False)
    axes[0, -1].legend(loc="lower right")
    fig.suptitle(title)
    return fig


def _score(value: str) -> tuple[str, int, str]:
    """A paired difference's score as an axis names it, with its factor and unit: ``correct`` (accuracy),
    ``correct_first<k>`` (accuracy on the answers' first k words) or ``gold_logprob``."""
    if value == "gold_logprob":
        return "gold log-prob", 1, "nats"
    if value == "correct" or (value.startswith("correct_first") and value[len("correct_first"):].isdigit()):
        words = value[len("correct_first"):]
        return "accuracy" + (f", first {words} words" if words else ""), 100, "points"
    raise ValueError(f"unknown score {value!r}: correct, correct_first<k> or gold_logprob")


def paired_averages(diffs: pd.DataFrame, title: str):
    """Each comparison's paired difference averaged over the gold positions (rows of
    :func:`lpes_nb.evaluation.position_gate.method_differences` at ``position == "average"``) with its
    record-clustered 95 % interval, one panel per score (accuracy and accuracy on the answers' first
    words in points, the gold answer's log-probability in nats); the grey bar around zero is each row's
    minimum detectable effect (80 % power)."""
    averaged = diffs[diffs["position"] == "average"]
    values = list(dict.fromkeys(averaged["value"]))
    pairs = list(dict.fromkeys(averaged["method"] + " − " + averaged["reference"]))
    fig, axes = plt.subplots(1, len(values), figsize=(4.4 * len(values), 0.5 * len(pairs) + 1.5), sharey=True, squeeze=False)
    for ax, value in zip(axes[0], values):
        d = averaged[averaged["value"] == value]
        score, factor, unit = _score(value)
        y = np.array([pairs.index(p) for p in d["method"] + " − " + d["reference"]])
        ax.barh(y, 2 * factor * d["mde"], left=-factor * d["mde"], height=0.5, color="0.88", zorder=0)
        ax.axvline(0, color="k", lw=0.8)
        x = factor * d["difference"]
        ax.errorbar(x, y, xerr=np.vstack([x - factor * d["ci_low"], factor * d["ci_high"] - x]), fmt="o", capsize=3, color=COLOURS[0])
        ax.set_yticks(range(len(pairs)), _wrapped(pairs))
        low, high = int(d["n"].min()), int(d["n"].max())
        # on its own line: beside the score, three panels' labels ran into each other
        ax.set_xlabel(f"paired Δ {score} ({unit})\nn = {low if low == high else f'{low}–{high}'} records; grey: ±MDE at 80 % power")
    axes[0][0].invert_yaxis()  # the first comparison on top (the axes share y: invert once)
    fig.suptitle(title)
    return fig


def throughput(forward: pd.DataFrame, comparisons: pd.DataFrame, title: str, cpu: str | None = None,
               others: dict[str, pd.DataFrame] | None = None):
    """This CPU's speed (:func:`lpes_nb.operations.throughput.tables`): above, one forward's share of the GEMM
    peak of its dtype against the prompt length, per model and dtype; below, each plain-vs-shared
    comparison's time ratio (whiskers: its rounds' range) beside the token and FLOP ratios the shared
    prefixes allow and the bar it must meet; ``others`` (CPU name → its comparisons) adds the same
    comparisons' time ratios on other CPUs, just below this CPU's (``cpu``). Stacked, so that the
    comparisons' long names keep the page's width at a double column."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.9, 6.2), gridspec_kw={"height_ratios": [1, 1.6]})
    for k, ((model, dtype), rows) in enumerate(forward.groupby(["model", "dtype"], sort=False)):
        top.plot(rows["tokens"], rows["percent_of_gemm_peak"], marker="o", color=COLOURS[k % len(COLOURS)], label=f"{model}, {dtype}")
    top.set_xlabel("prompt tokens (one forward)")
    top.set_ylabel("% of the dtype's\nGEMM peak")
    top.set_ylim(0, 105)
    top.legend(loc="center left", bbox_to_anchor=(1.02, 0.5))  # beside: inside, it hid the lowest line
    y = np.arange(len(comparisons))
    ratio = comparisons["time_ratio"].to_numpy()
    bottom.errorbar(ratio, y, xerr=np.vstack([ratio - comparisons["ratio_low"], comparisons["ratio_high"] - ratio]), fmt="o",
                    capsize=3, color=COLOURS[0], label=f"time ratio on {cpu}" if cpu else "time ratio (shared ÷ plain)")
    keys = ["comparison", "model", "dtype"]
    row_of = {tuple(r): i for i, r in enumerate(comparisons[keys].itertuples(index=False))}
    for k, (other, table) in enumerate((others or {}).items()):
        at = table[keys].apply(lambda r: row_of.get(tuple(r)), axis=1)  # a comparison this CPU lacks is not drawn
        shown = table[at.notna()]
        bottom.scatter(shown["time_ratio"], at.dropna().to_numpy() + 0.22 * (k + 1), marker="s^D"[k % 3],
                       facecolors="none", edgecolors=COLOURS[(3 + k) % len(COLOURS)], label=f"time ratio on {other}", zorder=3)
    bottom.scatter(comparisons["token_ratio"], y, marker="x", color=COLOURS[1], label="token ratio", zorder=3)
    bottom.scatter(comparisons["flop_ratio"], y, marker="+", s=60, color=COLOURS[2], label="FLOP ratio", zorder=3)
    bottom.scatter(comparisons["bar"], y, marker="|", s=200, color="k", label="bar to meet", zorder=3)
    bottom.set_yticks(y, [f"{r.comparison}\n{r.model}, {r.dtype}" for r in comparisons.itertuples()])
    bottom.invert_yaxis()
    bottom.set_xlim(0, 1.05)
    bottom.axvline(1, color="0.6", lw=0.8)
    bottom.set_xlabel("shared ÷ plain (lower is faster)")
    handles, labels = bottom.get_legend_handles_labels()
    # the time ratios first, this CPU's before the others'
    order = sorted(range(len(labels)), key=lambda i: (not labels[i].startswith("time ratio"), labels[i] != f"time ratio on {cpu}"))
    bottom.legend([handles[i] for i in order], [labels[i] for i in order], loc="upper center", bbox_to_anchor=(0.3, -0.2), ncol=2)
    fig.suptitle(title)
    return fig

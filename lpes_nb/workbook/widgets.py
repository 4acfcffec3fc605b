"""The interactive Bézier explorer: drag control points, watch the per-layer scales, use them.

Works in JupyterLab and under Voila (``voila notebooks/07_bezier_explorer.ipynb``). The constraint
logic (:func:`clamp_points`) is pure numpy and tested on its own; the widget only wires bqplot marks,
sliders and buttons to it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import bqplot as bq
import ipywidgets as w
import numpy as np
from IPython.display import display

from ..core.bezier import CURVES, Y_RANGE, layer_positions, layer_scales
from ..store.models import model_label
from ..store.results import BEST_SCALES, read_scales, save_scales
from ..store.stored_curve import transferred_points

_DRAW_POINTS = 200  # samples along the curve for drawing it


def clamp_points(points, num_layers: int, moved: int | None = None, y_range=Y_RANGE, gap: float | None = None) -> np.ndarray:
    """Make control points valid: x strictly increasing (by at least ``gap``) inside [0, L-1], y
    inside ``y_range``. If one point was ``moved``, only it yields (it stops at its neighbours, so a
    point cannot be dragged past them); otherwise all points are clamped from left to right."""
    pts = np.array(points, dtype=float)
    n, top = len(pts), num_layers - 1
    gap = top * 1e-3 if gap is None else gap
    pts[:, 1] = np.clip(pts[:, 1], *y_range)
    if moved is not None:
        lo = pts[moved - 1, 0] + gap if moved > 0 else 0.0
        hi = pts[moved + 1, 0] - gap if moved < n - 1 else top
        pts[moved, 0] = float(np.clip(pts[moved, 0], lo, hi))
        return pts
    for k in range(n):
        lo = pts[k - 1, 0] + gap if k > 0 else 0.0
        pts[k, 0] = float(np.clip(pts[k, 0], lo, top - (n - 1 - k) * gap))
    return pts


def default_points(num_layers: int, count: int) -> np.ndarray:
    x = np.linspace(0, num_layers - 1, count)
    return np.stack([x, np.full(count, 1.5)], axis=1)


def stored_curves(results_dir: Path) -> dict[str, Path]:
    """Every stored curve that has control points, labelled with the model it was found on: notebook 10's
    chosen curves (Qwen, one per curve family) first, then notebook 5's best GA result."""
    paths = [*sorted((results_dir / "lpes_at_power").glob("chosen_scales_*.json")), results_dir / BEST_SCALES]
    curves = {}
    for path in paths:
        if not path.is_file():
            continue
        payload = read_scales(path)
        if not payload.get("control_points"):
            continue
        found_on = payload.get("model") if isinstance(payload.get("model"), dict) else {}
        how = (f"notebook 10's chosen {payload.get('curve', 'bezier')} curve" if path.name.startswith("chosen_scales")
               else "notebook 5's best GA result")
        curves[f"{model_label(found_on.get('name', 'a model not named'))}: {how}"] = path
    return curves


class BezierExplorer:
    """bqplot view of control points (draggable), the curve, the per-layer scales and PI's mean.

    ``evaluate``: optional callable(scales) -> DataFrame shown under the widget when the user clicks
    "Evaluate" (the notebook passes one that scores a handful of task samples)."""

    def __init__(self, num_layers: int = 30, count: int = 4, curve: str = "bezier",
                 results_dir: str | Path = "results", evaluate: Callable[[list[float]], object] | None = None):
        if curve not in CURVES:
            raise ValueError(f"unknown curve type {curve!r}; choose one of {CURVES}")
        self.num_layers, self.curve = num_layers, curve
        self.results_dir, self.evaluate_fn = Path(results_dir), evaluate
        self.points = default_points(num_layers, count)
        self._syncing = False
        self._dragging = False  # while True the handles are the browser's: writing them back mid-drag races it

        xs, ys = bq.LinearScale(min=0, max=num_layers - 1), bq.LinearScale(min=0.95, max=2.05)
        self._line = bq.Lines(scales={"x": xs, "y": ys}, colors=["#0072B2"])
        self._layers = bq.Scatter(scales={"x": xs, "y": ys}, colors=["#0072B2"], default_size=12)
        self._handles = bq.Scatter(scales={"x": xs, "y": ys}, colors=["#D55E00"], default_size=160,
                                   enable_move=True, update_on_move=True, restrict_x=False)
        self.curve_figure = bq.Figure(
            marks=[self._line, self._layers, self._handles], title="drag the control points",
            axes=[bq.Axis(scale=xs, label="x (layer units)"), bq.Axis(scale=ys, side="left", label="scale")],
            layout=w.Layout(width="520px", height="340px"), fig_margin=dict(top=40, bottom=45, left=55, right=15))
        bx, by = bq.LinearScale(min=-0.5, max=num_layers - 0.5), bq.LinearScale(min=0.95, max=2.05)
        self._bars = bq.Bars(x=np.arange(num_layers), scales={"x": bx, "y": by}, colors=["#009E73"], padding=0.2)
        self._pi = bq.Lines(x=[-0.5, num_layers - 0.5], scales={"x": bx, "y": by}, colors=["#000000"],
                            line_style="dashed", labels=["PI (mean)"], display_legend=True)
        self.scales_figure = bq.Figure(
            marks=[self._bars, self._pi], title="per-layer scales",
            axes=[bq.Axis(scale=bx, label="layer"), bq.Axis(scale=by, side="left", label="scale")],
            layout=w.Layout(width="520px", height="340px"), fig_margin=dict(top=40, bottom=45, left=55, right=15))
        self._handles.observe(self._on_drag, names=["x", "y"])
        self._handles.on_drag_start(self._on_drag_start)
        self._handles.on_drag_end(self._on_drag_end)

        self._curve_menu = w.Dropdown(options=list(CURVES), value=curve, description="curve")
        self._count = w.IntSlider(value=count, min=2, max=min(6, num_layers), description="points")
        self._curve_menu.observe(lambda change: self._set_curve(change["new"]), names="value")
        self._count.observe(lambda change: self.set_points(default_points(num_layers, change["new"])), names="value")
        self._sliders_box = w.VBox()
        # points and scales in one widget: one message updates both, so the page never shows the
        # scales of one drag event next to the points of another
        self._values = w.HTML()
        self._path = w.Text(value=str(self.results_dir / "explorer_scales.json"), description="export to",
                            layout=w.Layout(width="420px"))
        export = w.Button(description="Export JSON", icon="download")
        self._stored = w.Dropdown(options=stored_curves(self.results_dir), description="stored",
                                  layout=w.Layout(width="520px"))
        load = w.Button(description="Load stored curve", icon="upload")
        evaluate = w.Button(description="Evaluate", icon="play", disabled=evaluate is None,
                            tooltip="score the current scales on a handful of task samples")
        export.on_click(lambda _: self._export())
        load.on_click(lambda _: self._load_stored())
        evaluate.on_click(lambda _: self._evaluate())
        self.output = w.Output()
        self._status = w.HTML()
        self.widget = w.VBox([
            w.HBox([self._curve_menu, self._count]),
            w.HBox([self.curve_figure, self.scales_figure]),
            self._sliders_box, self._values,
            w.HBox([self._stored, load]), w.HBox([export, evaluate]), self._path, self._status, self.output,
        ])
        self._build_sliders()
        self._refresh()

    # --- state ----------------------------------------------------------------------------------

    @property
    def scales(self) -> list[float]:
        return [float(s) for s in layer_scales(self.points, self.num_layers, self.curve)]

    def set_points(self, points, moved: int | None = None) -> None:
        self.points = clamp_points(points, self.num_layers, moved)
        if len(self._sliders_box.children) != len(self.points):  # one row (x, y) per point
            self._build_sliders()
        self._refresh()

    def _set_curve(self, curve: str) -> None:
        self.curve = curve
        self._refresh()

    # --- events ---------------------------------------------------------------------------------

    def _on_drag(self, change) -> None:
        if self._syncing:
            return
        new = np.stack([np.asarray(self._handles.x, float), np.asarray(self._handles.y, float)], axis=1)
        if new.shape != self.points.shape:
            return
        moved = np.flatnonzero(np.any(np.abs(new - self.points) > 1e-12, axis=1))
        self.set_points(new, int(moved[0]) if len(moved) == 1 else None)

    def _on_drag_start(self, _mark, _event) -> None:
        self._dragging = True

    def _on_drag_end(self, _mark, _event) -> None:
        # the drop is the moment to show where the constraints stopped the point
        self._dragging = False
        self._refresh()

    def _on_slider(self, k: int, axis: int, value: float) -> None:
        if self._syncing or value == self.points[k, axis]:
            return
        pts = self.points.copy()
        pts[k, axis] = value
        self.set_points(pts, k)

    def _build_sliders(self) -> None:
        rows = []
        for k in range(len(self.points)):
            # continuous_update=False: the browser's slider snaps every value the kernel sets to its
            # step grid and, with continuous updates, sends the snapped value straight back; that
            # echo moved the point, the kernel wrote the slider again, and the two never settled
            sx = w.FloatSlider(min=0, max=self.num_layers - 1, step=0.01, description=f"x{k}", readout_format=".2f",
                               continuous_update=False)
            sy = w.FloatSlider(min=Y_RANGE[0], max=Y_RANGE[1], step=0.01, description=f"y{k}", readout_format=".2f",
                               continuous_update=False)
            sx.observe(lambda c, k=k: self._on_slider(k, 0, c["new"]), names="value")
            sy.observe(lambda c, k=k: self._on_slider(k, 1, c["new"]), names="value")
            rows += [sx, sy]
        self._sliders_box.children = [w.HBox(rows[i : i + 2]) for i in range(0, len(rows), 2)]

    def _refresh(self) -> None:
        self._syncing = True
        try:
            draw_x = layer_positions(self.points, _DRAW_POINTS)
            draw_y = layer_scales(self.points, _DRAW_POINTS, self.curve)
            scales = self.scales
            if not self._dragging:
                with self._handles.hold_sync():
                    self._handles.x, self._handles.y = self.points[:, 0], self.points[:, 1]
            self._line.x, self._line.y = draw_x, draw_y
            self._layers.x, self._layers.y = layer_positions(self.points, self.num_layers), scales
            self._bars.y = scales
            self._pi.y = [float(np.mean(scales))] * 2
            for box, (x, y) in zip(self._sliders_box.children, self.points):
                box.children[0].value, box.children[1].value = float(x), float(y)
            self._values.value = (
                f'<code class="lpes-points">control points: {json.dumps(np.round(self.points, 6).tolist())}</code><br>'
                '<code class="lpes-scales">scales: ' + " ".join(f"{s:.4f}" for s in scales) + "</code>")
        finally:
            self._syncing = False

    def _export(self) -> None:
        path = save_scales(Path(self._path.value), self.scales, control_points=np.round(self.points, 6).tolist(),
                           curve=self.curve, source="explorer")
        self._status.value = f"wrote {path}"

    def _load_stored(self) -> None:
        """The selected stored curve's control points; a curve found at another depth is moved to the same
        relative depth of this one (a starting point to drag from, not a searched result), and says so."""
        if self._stored.value is None:
            self._status.value = f"no stored curve with control points under {self.results_dir} yet: run notebook 5 or 10 first"
            return
        path = Path(self._stored.value)
        payload = read_scales(path)
        points, found = transferred_points(payload, self.num_layers), len(payload["scales"])
        if payload.get("curve") in CURVES:
            self._curve_menu.value = payload["curve"]
        self._count.value = len(points)
        self.set_points(points)
        moved = (f"; moved from {found} to {self.num_layers} layers at the same relative depth (a starting point, not "
                 "a searched result)" if found != self.num_layers else "")
        self._status.value = f"loaded {path.name} ({self._stored.label}){moved}"

    def _evaluate(self) -> None:
        self.output.clear_output()
        with self.output:
            self._status.value = "evaluating..."
            display(self.evaluate_fn(self.scales))
            self._status.value = "done"

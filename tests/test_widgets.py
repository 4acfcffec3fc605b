"""The Bézier explorer: constraint logic, widget state, export/load (no browser here)."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpes_nb.core.bezier import layer_scales, validate_control_points
from lpes_nb.workbook.widgets import clamp_points, default_points

pytest.importorskip("bqplot")


@settings(max_examples=200, deadline=None)
@given(st.integers(5, 60), st.lists(st.tuples(st.floats(-50, 100), st.floats(-1, 4)), min_size=2, max_size=6),
       st.integers(0, 5))
def test_clamped_points_are_always_valid(num_layers, raw, moved):
    start = default_points(num_layers, len(raw))
    dragged = start.copy()
    k = moved % len(raw)
    dragged[k] = raw[k]
    for pts in (clamp_points(dragged, num_layers, moved=k), clamp_points(raw, num_layers)):
        validate_control_points(pts, num_layers)  # raises if x not strictly increasing / out of range


def test_a_point_cannot_be_dragged_past_its_neighbour():
    pts = default_points(30, 4)  # x = 0, 9.67, 19.33, 29
    pts[1, 0] = 25.0
    out = clamp_points(pts, 30, moved=1)
    assert out[1, 0] < out[2, 0] == pytest.approx(58 / 3) and out[1, 0] == pytest.approx(58 / 3 - 0.029)
    assert np.array_equal(out[[0, 2, 3]], pts[[0, 2, 3]])  # only the moved point yields


def test_explorer_state_follows_a_drag_and_exports(tmp_path):
    from lpes_nb.workbook.widgets import BezierExplorer

    ex = BezierExplorer(30, 4, results_dir=tmp_path)
    assert ex.scales == [1.5] * 30
    # simulate the front end moving point 1 up and far right (past point 2)
    x, y = np.array(ex._handles.x, float), np.array(ex._handles.y, float)
    x[1], y[1] = 26.0, 1.95
    ex._handles.x, ex._handles.y = x, y
    ex._on_drag(None)
    assert ex.points[1, 0] < ex.points[2, 0] and ex.points[1, 1] == pytest.approx(1.95)
    assert ex.scales == pytest.approx(list(layer_scales(ex.points, 30)))
    assert max(ex.scales) > 1.5 and list(ex._bars.y) == pytest.approx(ex.scales)
    assert f"{ex.scales[10]:.4f}" in ex._values.value
    ex._curve_menu.value = "step"
    assert ex.scales == pytest.approx(list(layer_scales(ex.points, 30, "step")))
    ex._path.value = str(tmp_path / "out.json")
    ex._export()
    saved = json.loads((tmp_path / "out.json").read_text())
    assert saved["scales"] == pytest.approx(ex.scales) and saved["curve"] == "step"


def test_handles_are_left_to_the_browser_mid_drag_and_clamped_on_drop(tmp_path):
    from lpes_nb.workbook.widgets import BezierExplorer

    ex = BezierExplorer(30, 4, results_dir=tmp_path)
    ex._on_drag_start(ex._handles, {"event": "drag_start", "index": 1})
    x, y = np.array(ex._handles.x, float), np.array(ex._handles.y, float)
    x[1], y[1] = 26.0, 1.8  # past point 2
    ex._handles.x, ex._handles.y = x, y
    ex._on_drag(None)
    assert ex._handles.x[1] == 26.0  # not written back while the browser still moves the point
    assert ex.points[1, 0] < ex.points[2, 0] and f"{ex.scales[15]:.4f}" in ex._values.value  # shown live, clamped
    ex._on_drag_end(ex._handles, {"event": "drag_end", "index": 1})
    assert np.array_equal(ex._handles.x, ex.points[:, 0]) and ex._handles.x[1] < ex._handles.x[2]


def test_sliders_follow_the_points_without_echoing_back(tmp_path):
    from lpes_nb.workbook.widgets import BezierExplorer

    ex = BezierExplorer(30, 4, results_dir=tmp_path)
    assert ex._handles.update_on_move  # live updates while dragging, as the issue asks
    sliders = [s for box in ex._sliders_box.children for s in box.children]
    # a continuously updating browser slider sends back its grid-snapped copy of every value the
    # kernel writes (1.93 -> 1.9300000000000002), which moved the point and looped without end
    assert sliders and not any(s.continuous_update for s in sliders)
    x, y = np.array(ex._handles.x, float), np.array(ex._handles.y, float)
    y[1] = 1.934972
    ex._handles.x, ex._handles.y = x, y
    ex._on_drag(None)
    assert sliders[3].value == ex.points[1, 1] == 1.934972  # the exact point, not a rounded copy
    sliders[3].value = 1.62  # the user moves slider y1
    assert ex.points[1, 1] == 1.62 and ex._handles.y[1] == 1.62 and f"{ex.scales[10]:.4f}" in ex._values.value


def test_explorer_loads_the_best_ga_result(tmp_path):
    from lpes_nb.store.results import save_scales
    from lpes_nb.workbook.widgets import BezierExplorer

    ex = BezierExplorer(30, 4, results_dir=tmp_path)
    ex._load_best()
    assert "run notebook 5 first" in ex._status.value
    save_scales(tmp_path / "lpes_best_scales.json", [1.0] * 30, control_points=[[0, 1.2], [10, 1.9], [29, 1.1]], fitness=0.5)
    ex._load_best()
    assert ex.points.tolist() == [[0, 1.2], [10, 1.9], [29, 1.1]] and ex._count.value == 3
    assert ex.scales == pytest.approx(list(layer_scales(ex.points, 30)))

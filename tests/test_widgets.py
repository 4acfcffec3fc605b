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


def test_explorer_loads_every_stored_curve_qwen_first_at_its_own_depth(tmp_path):
    from lpes_nb.store.results import save_scales
    from lpes_nb.workbook.widgets import BezierExplorer

    ex = BezierExplorer(30, 4, results_dir=tmp_path)
    ex._load_stored()
    assert "run notebook 5 or 10 first" in ex._status.value
    save_scales(tmp_path / "lpes_best_scales.json", [1.0] * 30, control_points=[[0, 1.2], [10, 1.9], [29, 1.1]], fitness=0.5,
                model={"name": "smollm2-135m", "layers": 30})
    save_scales(tmp_path / "lpes_at_power" / "chosen_scales_mdqa20_qwen2.5-coder-0.5b_bfloat16.json", [1.0] * 24,
                control_points=[[2, 1.3], [7, 1.0], [18, 1.1], [23, 1.2]], curve="bezier",
                model={"name": "qwen2.5-coder-0.5b", "layers": 24})
    ex = BezierExplorer(30, 4, results_dir=tmp_path)
    labels = list(ex._stored.options)
    assert labels == ["Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, de-quantised): notebook 10's chosen bezier curve",
                      "SmolLM2-135M-Instruct (Q4_1, de-quantised): notebook 5's best GA result"]
    ex._load_stored()  # the Qwen curve, 24 layers, on a 30-layer explorer: x moved to the same relative depth
    assert ex.points[:, 0].tolist() == pytest.approx([2 * 29 / 23, 7 * 29 / 23, 18 * 29 / 23, 29.0])
    assert "moved from 24 to 30 layers" in ex._status.value
    ex._stored.value = ex._stored.options[labels[1]]
    ex._load_stored()
    assert ex.points.tolist() == [[0, 1.2], [10, 1.9], [29, 1.1]] and ex._count.value == 3 and "moved" not in ex._status.value
    assert ex.scales == pytest.approx(list(layer_scales(ex.points, 30)))


def test_the_chosen_curves_control_points_give_their_scales():
    """The explorer redraws notebook 10's chosen curves from their control points: those must be the curves."""
    from lpes_nb.store.results import project_root, read_scales

    chosen = sorted((project_root() / "results" / "lpes_at_power").glob("chosen_scales_*.json"))
    drawn = [read_scales(p) for p in chosen if read_scales(p).get("control_points")]
    assert len(drawn) >= 2
    for payload in drawn:
        assert layer_scales(payload["control_points"], len(payload["scales"]), payload["curve"]) == pytest.approx(payload["scales"])
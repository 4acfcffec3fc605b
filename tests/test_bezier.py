"""Bézier mapping: exactness on known curves, inversion of x(t), the ablation curves, bad input."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpes_nb.core.bezier import (
    bernstein,
    curve_point,
    default_control_points,
    layer_positions,
    layer_scales,
    smoothness,
    solve_t,
    validate_control_points,
)


@st.composite
def control_points(draw, min_points=2, max_points=6):
    num_layers = draw(st.integers(min_value=max_points, max_value=80))
    n = draw(st.integers(min_value=min_points, max_value=max_points))
    xs = sorted(draw(st.lists(st.floats(0, num_layers - 1), min_size=n, max_size=n, unique=True)))
    if np.any(np.diff(xs) <= 1e-6):  # keep the points distinct enough to be a monotone curve
        xs = list(np.linspace(0, num_layers - 1, n))
    ys = draw(st.lists(st.floats(1.0, 2.0), min_size=n, max_size=n))
    return np.stack([xs, ys], axis=1), num_layers


@settings(max_examples=200, deadline=None)
@given(control_points(), st.floats(0, 1))
def test_t_of_x_inverts_x_of_t(case, t):
    pts, _ = case
    x, _ = curve_point(pts, np.array([t]))
    t_back = solve_t(pts, x)
    x_back, _ = curve_point(pts, t_back)
    assert abs(t_back[0] - t) <= 1e-9 or abs(x_back[0] - x[0]) <= 1e-9 * max(1.0, abs(x[0]))
    assert abs(x_back[0] - x[0]) <= 1e-9 * max(1.0, abs(x[0]))


@settings(max_examples=200, deadline=None)
@given(control_points())
def test_scales_stay_inside_the_hull_of_the_y_values(case):
    pts, num_layers = case
    for curve in ("bezier", "linear", "step"):
        s = layer_scales(pts, num_layers, curve)
        assert s.shape == (num_layers,)
        assert pts[:, 1].min() - 1e-12 <= s.min() and s.max() <= pts[:, 1].max() + 1e-12


@settings(max_examples=100, deadline=None)
@given(control_points(), st.floats(1.0, 2.0))
def test_constant_curve_gives_constant_scales(case, y):
    pts, num_layers = case
    pts[:, 1] = y
    for curve in ("bezier", "linear", "step"):
        assert np.all(layer_scales(pts, num_layers, curve) == y)  # exact, not approximately


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 80), st.integers(1, 6), st.floats(1.0, 2.0), st.floats(1.0, 2.0))
def test_straight_line_gives_exact_linear_scales(num_layers, degree, y0, y1):
    """Evenly spaced collinear control points make a degree-elevated straight line (x(t) linear)."""
    degree = min(degree, num_layers - 1)
    x = np.arange(degree + 1) * (num_layers - 1) / degree
    y = y0 + (y1 - y0) * x / (num_layers - 1)
    expected = y0 + (y1 - y0) * np.arange(num_layers) / (num_layers - 1)
    for curve in ("bezier", "linear"):
        np.testing.assert_allclose(layer_scales(np.stack([x, y], 1), num_layers, curve), expected, atol=1e-10)


def test_first_individual_of_the_paper_is_all_1_5():
    pts = default_control_points(30, degree=3)
    np.testing.assert_allclose(pts[:, 0], [0, 29 / 3, 58 / 3, 29])
    np.testing.assert_array_equal(layer_scales(pts, 30), np.full(30, 1.5))


def test_known_cubic_value_by_hand():
    # x(t) = 0, 1, 2, 3 -> x(t) = 3t; y = (1, 2, 2, 1) -> y(t) = 1 + 3t(1-t)
    pts = [[0, 1.0], [1, 2.0], [2, 2.0], [3, 1.0]]
    s = layer_scales(pts, 4)
    t = np.arange(4) / 3
    np.testing.assert_allclose(s, 1 + 3 * t * (1 - t), atol=1e-12)
    np.testing.assert_allclose(bernstein(3, [0.5]).sum(), 1.0)


def test_layers_span_first_to_last_control_point():
    pts = [[4, 1.0], [10, 2.0], [20, 1.5]]
    np.testing.assert_allclose(layer_positions(pts, 5), [4, 8, 12, 16, 20])


def test_step_and_linear_curves():
    pts = [[0, 1.0], [5, 2.0], [10, 1.2]]
    np.testing.assert_allclose(layer_scales(pts, 11, "linear")[[0, 2, 5, 8, 10]], [1.0, 1.4, 2.0, 1.52, 1.2])
    step = layer_scales(pts, 11, "step")
    assert step.tolist() == [1.0] * 3 + [2.0] * 5 + [1.2] * 3  # ties (x=2.5, 7.5) never occur here


def test_smoothness():
    assert smoothness([1.0, 1.1, 1.2, 1.3]) == pytest.approx(0.0)
    assert smoothness([1.0, 2.0, 1.0]) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="at least 3 scales"):
        smoothness([1.0, 2.0])


@pytest.mark.parametrize(
    "points, num_layers, message",
    [
        ([[0, 1.5]], 30, "need at least 2 control points, got 1"),
        ([[0, 1.5], [30, 1.5]], 30, r"x\[1\] = 30 is outside the allowed range \[0, 29\]"),
        ([[-1, 1.5], [29, 1.5]], 30, r"x\[0\] = -1 is outside the allowed range \[0, 29\]"),
        ([[0, 1.5], [9, 1.5], [9, 1.6], [29, 1.5]], 30, r"strictly increasing: x\[2\] = 9 <= x\[1\] = 9"),
        ([[0, 1.5], [29, 2.3]], 30, r"y\[1\] = 2.3 is outside the allowed range \[1, 2\]"),
        ([[0, 0.9], [29, 1.5]], 30, r"y\[0\] = 0.9 is outside the allowed range \[1, 2\]"),
        ([[0, 1.5], [29, 1.5]], 1, "num_layers must be an integer >= 2, got 1"),
        ([[0, 1.5, 3], [29, 1.5, 3]], 30, r"shape \(n, 2\)"),
        ([[0, float("nan")], [29, 1.5]], 30, "must be finite"),
    ],
)
def test_bad_control_points_are_named(points, num_layers, message):
    with pytest.raises(ValueError, match=message):
        validate_control_points(points, num_layers)


def test_configurable_y_range_and_unknown_curve():
    assert layer_scales([[0, 3.0], [9, 3.0]], 10, y_range=(1.0, 4.0)).max() == pytest.approx(3.0)
    with pytest.raises(ValueError, match="unknown curve type 'spline'"):
        layer_scales([[0, 1.5], [9, 1.5]], 10, curve="spline")

"""Per-layer scales from control points: Bézier curves (LPES Eq. 3-6, App. D), plus the
piecewise-linear and step curves of the curve-type ablation. Pure numpy.

Control points P_k = (x_k, y_k), k = 0..d, with x strictly increasing inside [0, L-1] and y inside
``y_range``. Layer h of L sits at x_h = x_0 + (x_d - x_0) h / (L - 1); its scale is the curve's
height there. For the Bézier curve x(t) is strictly increasing in t (its derivative is a positive
combination of the x increments), so t with x(t) = x_h is found by bisection and s_h = y(t).
"""

from __future__ import annotations

from math import comb

import numpy as np

CURVES = ("bezier", "linear", "step")
Y_RANGE = (1.0, 2.0)


def validate_control_points(points, num_layers: int, y_range: tuple[float, float] = Y_RANGE) -> np.ndarray:
    """Return the points as a float (n, 2) array or raise a ValueError naming the bad value."""
    if isinstance(num_layers, bool) or not isinstance(num_layers, (int, np.integer)) or num_layers < 2:
        raise ValueError(f"num_layers must be an integer >= 2, got {num_layers!r}")
    lo, hi = y_range
    if not lo < hi:
        raise ValueError(f"y_range must be (low, high) with low < high, got {y_range!r}")
    try:
        pts = np.asarray(points, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"control points must be numbers (x, y), shape (n, 2), got {points!r}") from None
    if pts.ndim != 2 or pts.shape[1] != 2:
        raise ValueError(f"control points must have shape (n, 2), got {pts.shape}")
    if len(pts) < 2:
        raise ValueError(f"need at least 2 control points, got {len(pts)}")
    if not np.isfinite(pts).all():
        raise ValueError(f"control points must be finite, got {pts.tolist()}")
    x, y = pts[:, 0], pts[:, 1]
    for k, xk in enumerate(x):
        if not 0 <= xk <= num_layers - 1:
            raise ValueError(f"x[{k}] = {xk:g} is outside the allowed range [0, {num_layers - 1}]")
    for k in range(1, len(x)):
        if x[k] <= x[k - 1]:
            raise ValueError(f"x must be strictly increasing: x[{k}] = {x[k]:g} <= x[{k - 1}] = {x[k - 1]:g}")
    for k, yk in enumerate(y):
        if not lo - 1e-12 <= yk <= hi + 1e-12:
            raise ValueError(f"y[{k}] = {yk:g} is outside the allowed range [{lo:g}, {hi:g}]")
    return pts


def bernstein(degree: int, t) -> np.ndarray:
    """Bernstein basis B_{k,d}(t) = C(d, k) t^k (1 - t)^(d - k), shape (len(t), d + 1)."""
    t = np.asarray(t, dtype=float)[..., None]
    k = np.arange(degree + 1)
    coeff = np.array([comb(degree, int(i)) for i in k], dtype=float)
    return coeff * t**k * (1.0 - t) ** (degree - k)


def curve_point(points, t) -> tuple[np.ndarray, np.ndarray]:
    """(x(t), y(t)) of the Bézier curve with these control points.

    Evaluated as P_0 + sum_k B_k(t) (P_k - P_0): the Bernstein weights sum to 1 only up to rounding,
    and this form keeps a constant curve exactly constant (the paper's first individual is all 1.5)."""
    pts = np.asarray(points, dtype=float)
    basis = bernstein(len(pts) - 1, t)
    rel = pts - pts[0]
    return pts[0, 0] + basis @ rel[:, 0], pts[0, 1] + basis @ rel[:, 1]


def layer_positions(points, num_layers: int) -> np.ndarray:
    """x_h = x_0 + (x_d - x_0) h / (L - 1) for h = 0..L-1 (Eq. 6)."""
    pts = np.asarray(points, dtype=float)
    h = np.arange(num_layers)
    return pts[0, 0] + (pts[-1, 0] - pts[0, 0]) * h / (num_layers - 1)


def solve_t(points, x_targets, iterations: int = 64) -> np.ndarray:
    """t in [0, 1] with x(t) = x_target, by vectorised bisection on the monotone x(t) (App. D).

    64 halvings shrink the bracket below float resolution, so t is exact to rounding."""
    x_targets = np.asarray(x_targets, dtype=float)
    lo, hi = np.zeros_like(x_targets), np.ones_like(x_targets)
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        below = curve_point(points, mid)[0] < x_targets
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return 0.5 * (lo + hi)


def layer_scales(points, num_layers: int, curve: str = "bezier", y_range: tuple[float, float] = Y_RANGE) -> np.ndarray:
    """Per-layer scales s_0..s_{L-1} defined by the control points.

    bezier: s_h = y(t_h) with x(t_h) = x_h.
    linear: the polyline through the control points, evaluated at x_h.
    step:   s_h = y of the control point nearest to x_h (ties go to the left point).
    """
    pts = validate_control_points(points, num_layers, y_range)
    xs = layer_positions(pts, num_layers)
    if curve == "bezier":
        return curve_point(pts, solve_t(pts, xs))[1]
    if curve == "linear":
        return np.interp(xs, pts[:, 0], pts[:, 1])
    if curve == "step":
        nearest = np.abs(xs[:, None] - pts[None, :, 0]).argmin(axis=1)
        return pts[nearest, 1]
    raise ValueError(f"unknown curve type {curve!r}; choose one of {CURVES}")


def default_control_points(num_layers: int, degree: int = 3, y: float = 1.5) -> np.ndarray:
    """The GA's first individual (Eq. 8): x_k = k (L - 1) / d, all y equal."""
    if isinstance(degree, bool) or not isinstance(degree, (int, np.integer)) or degree < 1:
        raise ValueError(f"degree must be an integer >= 1, got {degree!r}")
    x = np.arange(degree + 1) * (num_layers - 1) / degree
    return validate_control_points(np.stack([x, np.full(degree + 1, y)], axis=1), num_layers)


def smoothness(scales) -> float:
    """Curvature smoothness S = mean_l |s_{l+1} - 2 s_l + s_{l-1}| (LPES Eq. 14); 0 for a straight line."""
    s = np.asarray(scales, dtype=float)
    if s.ndim != 1 or len(s) < 3:
        raise ValueError(f"smoothness needs a 1-d sequence of at least 3 scales, got shape {s.shape}")
    return float(np.abs(s[2:] - 2 * s[1:-1] + s[:-2]).mean())

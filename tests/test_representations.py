"""The RSM helpers of the representation study."""

import numpy as np
import pytest

from lpes_nb.representations import rsm, rsm_deviation, scale_variants


def test_rsm_and_variants():
    states = np.random.default_rng(0).normal(size=(3, 5, 8))
    m = rsm(states)
    assert m.shape == (3, 5, 5) and np.allclose(np.diagonal(m, axis1=1, axis2=2), 1)
    assert np.allclose(rsm_deviation(m, m), 0) and (rsm_deviation(m, rsm(states[:, ::-1])) > 0).all()
    s = list(np.linspace(1.1, 1.9, 30))
    v = scale_variants(s, seed=0)
    assert v["uniform (mean)"] == [pytest.approx(np.mean(s))] * 30
    assert sorted(v["shuffled"]) == sorted(s) and v["shuffled"] != s
    assert np.all(np.abs(np.array(v["noisy Bézier"]) - s) <= 0.1 + 1e-12)
    assert all(1 <= x <= 2 for x in v["random U(1,2)"]) and scale_variants(s, 0) == v

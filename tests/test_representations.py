"""The representation study's helpers (Eq. 12-13 itself is checked in test_statistics.py)."""

import numpy as np
import pandas as pd
import pytest

from lpes_nb.studies.representations import deviation_summary, layer_rsm, scale_variants


def test_layer_rsm_and_variants():
    states = np.random.default_rng(0).normal(size=(3, 5, 8))  # layers, inputs, hidden
    m = layer_rsm(states)
    assert m.shape == (5, 3, 3) and np.allclose(m, m.transpose(0, 2, 1))
    assert m[2, 0, 1] == pytest.approx(states[0, 2] @ states[1, 2])
    s = list(np.linspace(1.1, 1.9, 30))
    v = scale_variants(s, seed=0)
    assert v["uniform (mean)"] == [pytest.approx(np.mean(s))] * 30
    assert sorted(v["shuffled"]) == sorted(s) and v["shuffled"] != s
    assert np.all(np.abs(np.array(v["noisy Bézier"]) - s) <= 0.1 + 1e-12)
    assert all(1 <= x <= 2 for x in v["random U(1,2)"]) and scale_variants(s, 0) == v


def test_deviation_summary_draws_whole_inputs():
    per_input = pd.DataFrame({"variant": "v", "seed": [0, 0, 1, 1], "input": [0, 1, 0, 1], "deviation": [1.0, 3.0, 1.0, 3.0]})
    row = deviation_summary(per_input).iloc[0]
    assert row["mean"] == 2.0 and row["inputs"] == 2 and row["seeds"] == 2
    assert 1.0 <= row["ci_low"] < 2.0 < row["ci_high"] <= 3.0

"""The λ-weighted position fitness: the position table, the weighted score, the GA's fitness and its
on-disk cache."""

import numpy as np
import pandas as pd
import pytest

import lpes_nb.fitness as fitness_module
from lpes_nb.data import Sample
from lpes_nb.evaluate import evaluate_samples
from lpes_nb.fitness import PositionFitness, position_table, weighted_fitness
from lpes_nb.results import ResultCache


def _toy_samples(n_per_pos=2):
    return [Sample("kv", i, pos, 3, f"Key {i} at {pos}: value is", ("7",)) for pos in (0, 1, 2) for i in range(n_per_pos)]


def test_position_table_has_one_row_per_position(tiny_llama, tokenizer):
    table = position_table(evaluate_samples(tiny_llama, tokenizer, _toy_samples(), progress=False))
    assert table["position"].tolist() == [0, 1, 2] and table["n"].tolist() == [2, 2, 2]


def test_weighted_fitness():
    df = pd.DataFrame({"position": [0, 0, 5, 5, 9, 9], "correct": [1, 1, 0, 1, 0, 0]})
    assert weighted_fitness(df) == pytest.approx(0.2 * 1 + 0.3 * 0.5 + 0.5 * 0)
    assert weighted_fitness(df, (0, 0, 1)) == 0
    with pytest.raises(ValueError, match="exactly 3 gold positions"):
        weighted_fitness(df[df.position < 9])


def test_position_fitness_caches_on_disk_and_depends_on_scales(tiny_llama, tokenizer, tmp_path, monkeypatch):
    samples = _toy_samples()
    fitness = PositionFitness(tiny_llama, tokenizer, samples, cache=ResultCache(tmp_path), model_name="tiny", tie_break=1e-3)
    scales = np.array([[1.0] * 4, [2.0, 1.5, 1.0, 3.0]])
    first = fitness(scales)
    assert first.shape == (2,) and first[0] != first[1]  # the tie-break log-prob sees the scales
    assert len(list(tmp_path.glob("*.csv"))) == 2
    monkeypatch.setattr(fitness_module, "evaluate_samples", lambda *a, **k: pytest.fail("re-evaluated a cached configuration"))
    again = PositionFitness(tiny_llama, tokenizer, samples, cache=ResultCache(tmp_path), model_name="tiny", tie_break=1e-3)
    np.testing.assert_allclose(again(scales), first)
    with pytest.raises(ValueError, match="exactly 3 gold positions"):
        PositionFitness(tiny_llama, tokenizer, samples[:4])

"""The curve-constrained GA: constraints, quality vs random search, resume, caching."""

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lpes_nb.core.bezier import layer_scales
from lpes_nb.store.results import save_ga
from lpes_nb.core.ga import (
    BezierSpace,
    GAConfig,
    GeneticSearch,
    PerLayerSpace,
    TargetCurveFitness,
    random_search,
)

L = 30
TARGET = layer_scales([[0, 1.2], [8, 1.9], [21, 1.1], [29, 1.6]], L)  # a known optimum curve


rmse_fitness = TargetCurveFitness(tuple(TARGET))


SMALL = GAConfig(population=12, parents=4, mutations=6, crossovers=2, generations=5)


def _bezier_ok(genome, num_layers):
    x, y = genome[:, 0], genome[:, 1]
    return x[0] >= 0 and x[-1] <= num_layers - 1 and np.all(np.diff(x) > 0) and np.all((y >= 10) & (y <= 20))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), num_layers=st.integers(6, 40), degree=st.integers(1, 4),
       curve=st.sampled_from(["bezier", "linear", "step"]))
def test_every_individual_ever_created_satisfies_the_constraints(seed, num_layers, degree, curve):
    degree = min(degree, num_layers - 2)
    space = BezierSpace(num_layers, degree=degree, curve=curve)
    target = np.linspace(1.1, 1.9, num_layers)
    res = GeneticSearch(space, lambda s: -np.abs(s - target).mean(axis=1), GAConfig(seed=seed, population=12, parents=4,
                        mutations=6, crossovers=2, generations=3), progress=False).run()
    genomes = [np.asarray(json.loads(g)) for g in res.history["genome"]]
    assert all(_bezier_ok(g, num_layers) for g in genomes)
    assert all(g.dtype.kind == "i" for g in genomes)  # x on the integer grid, y on the 0.1 grid
    for gen, rows in res.history.groupby("generation"):
        assert len(rows) == 12 and rows["genome"].is_unique
    scales = np.array([json.loads(s) for s in res.history["scales"]])
    assert scales.min() >= 1.0 and scales.max() <= 2.0


def test_first_individual_is_the_papers_and_all_1_5():
    space = BezierSpace(L)
    first = space.first()
    assert first.tolist() == [[0, 15], [10, 15], [19, 15], [29, 15]]
    assert np.all(space.decode(first) == 1.5)
    res = GeneticSearch(space, rmse_fitness, SMALL, progress=False).run()
    gen0 = res.history[res.history.generation == 0]
    assert json.dumps(first.tolist()) in set(gen0["genome"])


def test_first_individual_starts_inside_a_narrow_range():
    space = BezierSpace(L, y_range=(1.0, 1.3), y_step=0.05)
    assert space.is_valid(space.first()) and np.allclose(space.decode(space.first()), 1.15)
    cfg = GAConfig(population=6, parents=3, mutations=2, crossovers=1, generations=2, y_step=0.05, my=0.1, seed=1)
    res = GeneticSearch(space, rmse_fitness, cfg, progress=False).run()
    assert np.all((res.best_scales >= 1.0 - 1e-9) & (res.best_scales <= 1.3 + 1e-9))


def test_mutation_moves_stay_within_mx_my():
    space, cfg, rng = BezierSpace(L), GAConfig(), np.random.default_rng(0)
    g = space.first()
    deltas = np.array([space.mutate(g, rng, cfg) - g for _ in range(2000)])
    assert deltas[:, :, 0].min() == -2 and deltas[:, :, 0].max() == 2
    assert deltas[:, :, 1].min() == -2 and deltas[:, :, 1].max() == 2  # +-0.2 in units of 0.1


def test_ga_reaches_the_known_optimum_and_beats_random_search():
    """On a synthetic fitness (RMSE to a known Bézier curve) with the paper's hyperparameters."""
    ga_err, rs_err = [], []
    for seed in range(3):
        res = GeneticSearch(BezierSpace(L), rmse_fitness, GAConfig(seed=seed), progress=False).run()
        _, rs_best = random_search(BezierSpace(L), rmse_fitness, budget=res.evaluations, seed=seed)
        ga_err.append(-res.best_fitness)
        rs_err.append(-rs_best)
    # measured: GA RMSE 0.024 / 0.016 / 0.008 vs random search 0.046 / 0.048 / 0.028 (same budgets)
    assert max(ga_err) <= 0.05
    assert all(g < r for g, r in zip(ga_err, rs_err))
    assert np.mean(ga_err) <= 0.6 * np.mean(rs_err)


def test_fitness_improves_monotonically_and_summary_is_complete():
    res = GeneticSearch(BezierSpace(L), rmse_fitness, GAConfig(seed=1, generations=8), progress=False).run()
    best = res.summary["best"].to_numpy()
    assert np.all(np.diff(best) >= 0)  # parents survive, so the best never gets worse
    assert best[-1] > best[0]
    assert list(res.summary.columns) == ["generation", "best", "mean", "smoothness_mean",
                                         "mean_best_1", "mean_best_2", "mean_best_4", "mean_best_8", "evaluated"]
    # every genome scored is counted, crossover children that did not join the population too
    evaluated = res.summary["evaluated"].to_numpy()
    assert evaluated[0] == 32 and np.all(np.diff(evaluated) > 0) and evaluated[-1] == res.evaluations == len(res.scored)
    assert res.history["genome"].nunique() < res.evaluations
    assert (res.summary["mean_best_1"] == res.summary["best"]).all()
    assert (res.summary["mean_best_8"] <= res.summary["mean_best_4"] + 1e-12).all()
    assert len(res.history) == 32 * 9


def test_no_individual_is_scored_twice():
    seen = []

    def recording(scales):
        seen.extend(map(tuple, np.round(scales, 12)))
        return rmse_fitness(scales)

    # per-layer genomes map one-to-one to scales, so a repeated scales row is a repeated genome
    res = GeneticSearch(PerLayerSpace(L), recording, GAConfig(seed=2, generations=10), progress=False).run()
    assert len(seen) == len(set(seen)) == res.evaluations
    assert res.evaluations < len(res.history)  # survivors were looked up, not re-scored
    # every genome in the history was scored; the extra ones are the crossovers' losing children
    assert res.history["genome"].nunique() <= res.evaluations <= res.history["genome"].nunique() + 4 * 10


def test_resume_after_a_kill_gives_exactly_the_uninterrupted_result(tmp_path):
    cfg = GAConfig(seed=5, generations=6)
    full = GeneticSearch(BezierSpace(L), rmse_fitness, cfg, progress=False).run()

    class Killed(Exception):
        pass

    calls = {"n": 0}

    class DiesInGeneration3(TargetCurveFitness):  # the same fitness (and fingerprint), killed part-way
        def __call__(self, scales):
            calls["n"] += len(scales)
            if calls["n"] > 110:  # 32 individuals in generation 0, then about 24 new ones a generation
                raise Killed
            return super().__call__(scales)

    dies_in_generation_3 = DiesInGeneration3(rmse_fitness.target)

    ckpt = tmp_path / "ga.ckpt.json"
    with pytest.raises(Killed):
        GeneticSearch(BezierSpace(L), dies_in_generation_3, cfg, checkpoint=ckpt, progress=False).run()
    saved = json.loads(ckpt.read_text())["generation"]
    assert 0 < saved < cfg.generations
    resumed = GeneticSearch(BezierSpace(L), rmse_fitness, cfg, checkpoint=ckpt, progress=False).run()
    pd.testing.assert_frame_equal(resumed.history, full.history)
    pd.testing.assert_frame_equal(resumed.summary, full.summary)
    assert resumed.best_genome.tolist() == full.best_genome.tolist()
    assert list(tmp_path.iterdir()) == [ckpt]  # atomic writes leave no temporary files

    with pytest.raises(ValueError, match="another search configuration"):
        GeneticSearch(BezierSpace(L), rmse_fitness, GAConfig(seed=6), checkpoint=ckpt, progress=False).run()


def test_per_layer_variant_records_smoothness_and_improves():
    res = GeneticSearch(PerLayerSpace(L), rmse_fitness, GAConfig(seed=0, generations=10), progress=False).run()
    genomes = np.array([json.loads(g) for g in res.history["genome"]])
    assert genomes.min() >= 10 and genomes.max() <= 20
    gen0 = res.history[res.history.generation == 0]
    assert gen0["smoothness"].mean() > 0.3  # U(1, 2) scales are rough
    assert res.summary["best"].iloc[-1] > res.summary["best"].iloc[0]
    assert res.control_points is None and len(res.best_scales) == L



def test_results_are_saved_as_csv_and_scales_json(tmp_path):
    res = GeneticSearch(BezierSpace(L), rmse_fitness, SMALL, progress=False).run()
    best = json.loads(save_ga(res, tmp_path, "lpes").read_text())
    assert best["scales"] == pytest.approx(res.best_scales.tolist())
    assert best["control_points"] == res.control_points and len(best["control_points"]) == 4
    assert pd.read_csv(tmp_path / "lpes_history.csv").shape[0] == len(res.history)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(population=30), r"parents \+ mutations \+ crossovers must equal population: 12 \+ 16 \+ 4 != 30"),
        (dict(parents=0, mutations=28), "GAConfig.parents must be"),
        (dict(mx=-1), r"GAConfig.mx \(x moves in whole layers\) must be an integer >= 0, got -1"),
        (dict(generations=-1), "GAConfig.generations must be"),
    ],
)
def test_bad_ga_config_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GAConfig(**kwargs)


def test_bad_space_and_fitness_are_named():
    with pytest.raises(ValueError, match="unknown curve type 'cubic'"):
        BezierSpace(L, curve="cubic")
    with pytest.raises(ValueError, match="4 control points need at least as many layers, got 3"):
        BezierSpace(3)
    with pytest.raises(ValueError, match="non-finite score"):
        GeneticSearch(BezierSpace(L), lambda s: np.full(len(s), np.nan), SMALL, progress=False).run()
    with pytest.raises(ValueError, match="returned 1 scores for 12 individuals"):
        GeneticSearch(BezierSpace(L), lambda s: [0.0], SMALL, progress=False).run()
    with pytest.raises(RuntimeError, match="search space is too small"):
        GeneticSearch(BezierSpace(4, y_range=(1.0, 1.1)), TargetCurveFitness((1.0,) * 4), GAConfig(), progress=False).run()


def test_smoothness_trend_compares_the_first_and_last_generation_with_an_interval():
    from lpes_nb.studies.search import smoothness_trend

    rng = np.random.default_rng(1)
    history = pd.DataFrame([{"generation": g, "smoothness": 0.7 - 0.05 * g + rng.normal(0, 0.02)} for g in range(5) for _ in range(12)])
    (row,) = smoothness_trend(history).to_dict("records")
    assert row["generations"] == 4 and row["individuals"] == 12
    assert row["ci_low"] < row["difference"] < row["ci_high"] < 0 and row["difference"] == pytest.approx(-0.2, abs=0.03)
    with pytest.raises(ValueError, match="two generations of at least two individuals"):
        smoothness_trend(history[history.generation == 0])

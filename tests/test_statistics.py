"""The statistics as the papers define them: exact intervals, CALIOPE's ρ, LPES's structure deviation,
record-clustered paired differences, power; the two-fact layout; judging and the copy control."""

import numpy as np
import pandas as pd
import pytest

from lpes_nb.evaluation import metrics
from lpes_nb.evaluation.fitness import paired_differences, paired_fitness_difference, position_table
from lpes_nb.evaluation.tasks import TASKS, copy_columns
from lpes_nb.store import data
from lpes_nb.studies.representations import structure_deviation


def test_proportion_ci_is_wilson_and_never_of_zero_width():
    assert metrics.proportion_ci(0, 30) == pytest.approx((0.0, 0.1135), abs=1e-4)
    low, high = metrics.proportion_ci(30, 30)
    assert high == pytest.approx(1.0) and low == pytest.approx(0.8865, abs=1e-4)
    low, high = metrics.proportion_ci(15, 30)
    assert low == pytest.approx(0.3315, abs=1e-4) and high == pytest.approx(0.6685, abs=1e-4)  # Wilson, not Wald


def test_accuracy_table_uses_the_exact_interval_for_accuracies_and_the_bootstrap_otherwise():
    binary = metrics.accuracy_table(pd.DataFrame({"position": [0] * 30, "correct": [0.0] * 30}))
    assert binary.loc[0, "ci_high"] > 0.1
    scores = metrics.accuracy_table(pd.DataFrame({"position": [0] * 4, "correct": [0.2, 0.4, 0.6, 0.8]}))
    assert 0.2 < scores.loc[0, "ci_low"] < scores.loc[0, "ci_high"] < 0.8


# CALIOPE Table 2 (LLM-as-a-Judge accuracy at relative positions 0, .2, .5, .8, 1, and ρ(δ, a) × 100);
# each cell is 500 questions × 3 seeds
CALIOPE_TABLE_2 = {
    "Llama-3.1-8B d=20": ([45.53, 48.20, 46.27, 49.07, 49.87], 0.83),
    "Llama-3.1-8B d=50": ([36.47, 40.47, 40.13, 38.93, 48.20], 1.60),
    "Llama-3.1-8B d=100": ([27.47, 31.53, 33.40, 34.33, 44.53], 2.08),
    "Qwen-2.5-14B d=20": ([57.93, 52.67, 56.00, 55.40, 56.20], 1.06),
    "Qwen-2.5-14B d=50": ([57.73, 51.60, 54.07, 51.93, 55.33], 2.14),
    "Qwen-2.5-14B d=100": ([56.87, 50.93, 53.13, 51.93, 56.60], 2.97),
}


@pytest.mark.parametrize("row", sorted(CALIOPE_TABLE_2))
def test_u_shape_rho_reproduces_caliope_table_2_from_per_sample_data(row):
    rates, rho = CALIOPE_TABLE_2[row]
    n = 1500
    positions, outcomes = [], []
    for rel, rate in zip([0, 0.2, 0.5, 0.8, 1], rates):
        k = round(rate / 100 * n)
        positions += [rel] * n
        outcomes += [1.0] * k + [0.0] * (n - k)
    # the paper's cells carry ±1–3 points over seeds; within that, ρ moves by about ±0.2
    assert metrics.u_shape_rho(positions, outcomes) == pytest.approx(rho, abs=0.25)


def test_u_shape_rho_is_over_samples_not_position_means():
    # a primacy curve 90 / 10 / 13 %: the old statistic over 3 position means called it ρ = +53
    n = 30
    positions = [0.0] * n + [0.5] * n + [1.0] * n
    outcomes = [1.0] * 27 + [0.0] * 3 + [1.0] * 3 + [0.0] * 27 + [1.0] * 4 + [0.0] * 26
    rho = metrics.u_shape_rho(positions, outcomes)
    assert 0 < rho < 53
    assert np.isnan(metrics.u_shape_rho([0.0, 0.5, 1.0], [1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        metrics.u_shape_rho([0, 2, 4], [1.0, 0.0, 1.0])


def test_structure_deviation_equals_eq_12_13_written_out():
    rng = np.random.default_rng(0)
    layers, inputs, hidden = 5, 4, 7
    ref, other = rng.normal(size=(layers, inputs, hidden)), rng.normal(size=(layers, inputs, hidden))
    direct = []
    for x in range(inputs):
        total = 0.0
        for i in range(layers):
            for j in range(layers):
                total += abs(other[i, x] @ other[j, x] - ref[i, x] @ ref[j, x])
        direct.append(total / layers**2)
    np.testing.assert_allclose(structure_deviation(ref, other), direct, rtol=1e-12)
    assert (structure_deviation(ref, ref) == 0).all()


def _per_sample(outcomes: dict[str, np.ndarray]) -> pd.DataFrame:
    """outcomes[method]: records × 3 positions of 0/1."""
    rows = []
    for method, table in outcomes.items():
        for record, row in enumerate(table):
            for position, correct in zip((0, 5, 9), row):
                rows.append({"method": method, "sample": record, "position": position, "correct": float(correct)})
    return pd.DataFrame(rows)


def test_paired_difference_is_clustered_by_record():
    rng = np.random.default_rng(1)
    base = rng.integers(0, 2, size=(60, 3))
    # a method that flips whole records: its gains at the three positions come together per record
    better = base.copy()
    better[:15] = 1
    per_sample = _per_sample({"baseline": base, "m": better})
    out = paired_fitness_difference(per_sample, "m", "baseline")
    expected = (better - base).mean(axis=0) @ np.array([0.2, 0.3, 0.5])
    assert out["difference"] == pytest.approx(expected) and out["records"] == 60
    assert out["ci_low"] < out["difference"] < out["ci_high"]
    assert out["mde_80"] == pytest.approx(metrics.minimum_detectable_effect(out["se"]))
    # records drawn whole: the bootstrap SE matches the SE of the per-record λ-weighted difference
    per_record = (better - base) @ np.array([0.2, 0.3, 0.5])
    assert out["se"] == pytest.approx(per_record.std(ddof=1) / np.sqrt(60), rel=0.1)
    both = paired_differences(per_sample, references=("baseline", "m"))
    assert both[["method", "reference"]].values.tolist() == [["m", "baseline"]]  # each pair once
    same = paired_fitness_difference(per_sample, "baseline", "baseline")
    assert same["difference"] == 0 and same["ci_low"] == pytest.approx(-0.0601, abs=1e-4) == -same["ci_high"]  # Wilson 0/60


def test_minimum_detectable_effect_and_planning():
    assert metrics.minimum_detectable_effect(0.1) == pytest.approx(0.2802, abs=1e-4)
    # the figure: n = 20 per position resolves only effects of about 0.15 λ or more
    assert 0.13 < metrics.minimum_detectable_effect(metrics.planned_lambda_se(20, discordance=0.15)) < 0.17


def test_position_table_rho_is_per_sample():
    df = pd.DataFrame({"position": [0] * 10 + [5] * 10 + [10] * 10, "num_items": 11, "prompt_tokens": 100,
                       "correct": [1.0] * 10 + [0.0] * 10 + [1.0] * 10})
    table = position_table(df)
    assert table["rho"].iloc[0] == pytest.approx(100.0)
    assert (table["ci_high"] > table["ci_low"]).all()


def test_two_fact_block_keeps_the_gap_whatever_the_depth():
    filler = [f"Filler sentence number {i} is here." for i in range(20)]
    for depth in (0.0, 0.25, 0.5, 0.75, 1.0):
        s = data.two_fact_sample(filler, depth, seed=3, gap=2)
        (a0, a1), (b0, _) = s.spans
        between = s.prompt[a1:b0]
        assert between.count("Filler sentence") == 2
    first = data.two_fact_sample(filler, 0.0, seed=3, gap=2)
    last = data.two_fact_sample(filler, 1.0, seed=3, gap=2)
    assert first.spans[0][0] == 0  # the block opens the context at depth 0 ...
    assert last.prompt[last.spans[1][1]:].startswith("\n\nQuestion")  # ... and closes it at depth 1


def test_judging_follows_the_original_evaluations():
    kv, mdqa = TASKS["kv"], TASKS["mdqa"]
    # KV (lost-in-the-middle's KV script): the value anywhere in the answer, newlines included
    assert kv.correct('\n{"abc": "1234"}', ("1234",)) == 1.0
    assert not kv.settings().stop_at_newline
    # MDQA: up to 100 new tokens, the first line only: an answer that starts with a newline is empty
    assert mdqa.settings().max_new_tokens == 100 and mdqa.settings().stop_at_newline
    assert mdqa.correct("\nParis", ["Paris"]) == 0.0 and mdqa.correct("Paris, France\nmore", ["Paris"]) == 1.0
    assert TASKS["two_fact_block"].correct(" kitchen.", ("kitchen",)) == 1.0
    assert TASKS["passkey"].correct("12345 and 6", ("12345",)) == 1.0


def test_copy_control_names_the_first_and_last_items():
    record = data.generate_kv(5, 1, seed=0, key_format="letters6", value_format="digits4")[0]
    sample = data.kv_sample(record, 2)
    pairs = [tuple(p) for p in record["ordered_kv_records"]]
    pairs.remove((record["key"], record["value"]))
    pairs.insert(2, (record["key"], record["value"]))
    first_value, last_value = pairs[0][1], pairs[-1][1]
    assert copy_columns(sample, f'{{"{pairs[0][0]}": "{first_value}"') == {"copies_first": 1.0, "copies_last": 0.0}
    assert copy_columns(sample, f"the value is {last_value}") == {"copies_first": 0.0, "copies_last": 1.0}
    filler = [f"Sentence {i} of the filler text." for i in range(6)]
    assert copy_columns(data.two_fact_sample(filler, 0.5, gap=1), "kitchen") == {}

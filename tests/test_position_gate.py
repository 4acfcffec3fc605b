"""The paired position gate and the data split."""

import numpy as np
import pandas as pd
import pytest

from scipy import stats

from lpes_nb.evaluation import position_gate
from lpes_nb.evaluation.position_gate import contrasts, gate, newcombe_paired, paired_wide
from lpes_nb.store import splits


def _cell(n: int, accuracy: dict, seed: int = 0, noise: float = 0.1) -> pd.DataFrame:
    """n records at positions 0 / 0.25 / 0.5 / 0.75 / 1, outcomes from one latent ability per record
    (so positions are correlated, as real records are), with a share ``noise`` flipped independently."""
    rng = np.random.default_rng(seed)
    u = rng.random(n)
    rows = []
    for pos, acc in accuracy.items():
        y = (u < acc).astype(float)
        flip = rng.random(n) < noise
        y[flip] = 1 - y[flip]
        rows += [{"record": r, "relative_position": pos, "correct": y[r]} for r in range(n)]
    return pd.DataFrame(rows)


U8 = {0.0: 0.60, 0.25: 0.55, 0.5: 0.52, 0.75: 0.55, 1.0: 0.60}
FLAT = {p: 0.55 for p in U8}


def test_a_paired_8_point_dip_at_n_400_passes_and_is_named_a_u():
    out = gate({"dip": _cell(400, U8)})
    row = out.iloc[0]
    assert row["n"] == 400 and row["verdict"] == "U"
    assert row["ends_minus_middle_ci_low"] > 0 and row["p_holm"] < 0.05
    assert row["ends_minus_middle"] == pytest.approx(0.08, abs=0.03)
    # pairing is the power: the SE an unpaired comparison of the three accuracies would have is larger
    wide = paired_wide(_cell(400, U8))
    var = (wide.mean() * (1 - wide.mean())).to_dict()
    unpaired_se = np.sqrt((0.25 * (var["first"] + var["last"]) + var["middle"]) / 400)
    assert contrasts(wide).set_index("contrast").loc["ends_minus_middle", "se"] < 0.8 * unpaired_se


def test_a_flat_curve_fails_and_states_its_mde():
    row = gate({"flat": _cell(400, FLAT, seed=1)}).iloc[0]
    assert row["verdict"].startswith("no deficit at MDE ")
    assert 0 < row["ends_minus_middle_mde"] < 0.1 and f"{row['ends_minus_middle_mde']:.3f}" in row["verdict"]


def test_primacy_and_holm_over_the_family():
    primacy = {0.0: 0.8, 0.25: 0.6, 0.5: 0.5, 0.75: 0.45, 1.0: 0.4}
    out = gate({"primacy": _cell(300, primacy, seed=2), "flat": _cell(300, FLAT, seed=3)}).set_index("cell")
    assert out.loc["primacy", "verdict"] == "primacy"
    assert (out["p_holm"] >= out["ends_minus_middle_p"]).all()


def test_unpaired_input_and_a_missing_middle_are_refused():
    cell = _cell(20, U8)
    with pytest.raises(ValueError, match="no record is present at all three positions"):
        shifted = cell.assign(record=cell["record"] + 1000 * (cell["relative_position"] == 0.5))
        shifted = shifted[~((shifted["record"] < 1000) & (shifted["relative_position"] == 0.5))]
        paired_wide(shifted.assign(record=np.where(shifted["relative_position"] == 0.0, shifted["record"] + 5000, shifted["record"])))
    with pytest.raises(ValueError, match="lack a position"):
        paired_wide(cell.drop(index=cell.index[(cell["relative_position"] == 0.5) & (cell["record"] == 3)]))
    with pytest.raises(ValueError, match="no middle position 0.5"):
        paired_wide(cell[cell["relative_position"] != 0.5])


def test_newcombe_never_has_zero_width():
    same = np.ones(30)
    low, high = newcombe_paired(same, same)
    assert low < 0 < high and high - low > 0.05
    x = np.r_[np.ones(25), np.zeros(5)]
    y = np.r_[np.ones(20), np.zeros(10)]
    low, high = newcombe_paired(x, y)
    assert low < 5 / 30 < high and low > -0.1


def test_the_split_is_disjoint_and_budgets_mdqa():
    splits.check_disjoint()
    assert [len(splits.records("mdqa20", p)) for p in ("search", "validation", "test")] == [60, 60, 321]
    every = splits.SPLIT[splits.SPLIT["dataset"] == "mdqa20"]["record"]
    assert sorted(every) == list(range(441))
    with pytest.raises(ValueError, match="parts must be disjoint"):
        bad = pd.concat([splits.SPLIT, splits.SPLIT.iloc[[0]].assign(part="test")])
        splits.check_disjoint(bad)


def test_the_split_refuses_bad_requests_by_name():
    with pytest.raises(ValueError, match="unknown part 'train'"):
        splits.records("mdqa20", "train")
    with pytest.raises(ValueError, match="unknown dataset 'squad'"):
        splits.records("squad", "test")
    with pytest.raises(ValueError, match=r"n=400 records of mdqa20/test, which holds 321"):
        splits.records("mdqa20", "test", 400)


def test_a_cell_at_the_ceiling_is_undetermined_not_a_negative():
    ceiling = _cell(50, {p: 1.0 for p in U8}, noise=0.0)
    row = gate({"ceiling": ceiling}).iloc[0]
    assert row["verdict"].startswith("undetermined") and row["ends_minus_middle_ci_low"] == -1.0


def test_a_fall_from_the_first_position_to_a_floor_is_primacy_not_a_u():
    fall = {0.0: 0.35, 0.25: 0.15, 0.5: 0.15, 0.75: 0.15, 1.0: 0.16}
    row = gate({"fall": _cell(300, fall, seed=4, noise=0.02)}).iloc[0]
    assert row["p_holm"] < 0.05 and row["verdict"] == "primacy"


def _method_cells(n=400, positions=(0, 5, 10, 14, 19), base=0.6, gain=0.08, seed=0):
    """Two methods on the same records: the method answers right wherever the reference does, and in
    ``gain / (1 - base)`` of the rest (a paired gain of ``gain`` at every position)."""
    rng = np.random.default_rng(seed)
    rows = {"reference": [], "method": [], "null": []}
    for r in range(n):
        for p in positions:
            ref = float(rng.random() < base)
            rows["reference"].append({"sample": r, "position": p, "correct": ref, "gold_logprob": -1.0 - rng.random()})
            better = ref or float(rng.random() < gain / (1 - base))
            rows["method"].append({"sample": r, "position": p, "correct": float(better),
                                   "gold_logprob": rows["reference"][-1]["gold_logprob"] + 0.1 + 0.05 * rng.normal()})
            rows["null"].append({"sample": r, "position": p, "correct": float(rng.random() < base), "gold_logprob": -1.5})
    return {k: pd.DataFrame(v) for k, v in rows.items()}


def test_methods_are_compared_paired_by_record_with_holm_and_mde():
    cells = _method_cells()
    table = position_gate.method_differences(cells, [("method", "reference"), ("null", "reference")])
    avg = table[table.position == "average"].set_index("method")
    assert list(table.position[:6]) == [0, 5, 10, 14, 19, "average"] and (table.n == 400).all()
    assert avg.loc["method", "difference"] == pytest.approx(0.08, abs=0.02) and avg.loc["method", "ci_low"] > 0.04
    assert avg.loc["method", "verdict"] == "higher" and avg.loc["method", "mde"] < 0.03
    assert avg.loc["null", "verdict"].startswith("no difference at MDE") and avg.loc["null", "ci_low"] < 0 < avg.loc["null", "ci_high"]
    # the averaged difference is one number per record: its interval is the t interval of those
    d = (cells["method"].groupby("sample").correct.mean() - cells["reference"].groupby("sample").correct.mean()).to_numpy()
    half = stats.t.ppf(0.975, 399) * d.std(ddof=1) / np.sqrt(400)
    assert avg.loc["method", "ci_high"] == pytest.approx(d.mean() + half)
    # Holm over the two averages: the smaller p doubled
    assert avg["p_holm"].min() == pytest.approx(min(1.0, 2 * avg["p"].min()))
    # a 0/1 outcome at one position: McNemar's exact p and Newcombe's interval
    one = table[(table.method == "method") & (table.position == 10)].iloc[0]
    wide = {m: cells[m][cells[m].position == 10].set_index("sample").correct for m in ("method", "reference")}
    assert (one.ci_low, one.ci_high) == pytest.approx(position_gate.newcombe_paired(wide["method"].to_numpy(), wide["reference"].to_numpy()))
    logprob = position_gate.method_differences(cells, [("method", "reference")], value="gold_logprob")
    assert logprob.loc[logprob.position == "average", "difference"].iloc[0] == pytest.approx(0.1, abs=0.01)
    assert (logprob.verdict == "higher").all()


def test_a_method_comparison_refuses_unpaired_records_and_never_has_zero_width():
    cells = _method_cells(n=50)
    short = {**cells, "method": cells["method"][cells["method"]["sample"] != 7]}
    with pytest.raises(ValueError, match=r"not paired: records only on one side \[7\]"):
        position_gate.method_differences(short, [("method", "reference")])
    with pytest.raises(ValueError, match="no cell for \\['PI'\\]"):
        position_gate.method_differences(cells, [("method", "PI")])
    same = position_gate.method_differences({**cells, "copy": cells["reference"]}, [("copy", "reference")])
    assert (same.difference == 0).all() and (same.ci_high > 0).all() and (same.ci_low < 0).all()
    assert same.verdict.iloc[-1] == "undetermined: no record differs"


def test_size_differences_pair_records_per_position_and_on_ends_minus_middle_in_one_holm_family():
    from lpes_nb.evaluation.position_gate import size_differences

    rng = np.random.default_rng(0)
    positions = (0.0, 0.25, 0.5, 0.75, 1.0)
    def cell(middle_rate, records):
        return pd.DataFrame([{"record": r, "relative_position": p,
                              "correct": float(rng.random() < (0.9 if p in (0.0, 1.0) else middle_rate))}
                             for r in records for p in positions])
    small, large = cell(0.2, range(200)), cell(0.8, range(120))  # the larger model: no dip, fewer records so far
    out = size_differences({"1.5B": large, "0.5B": small}, [("1.5B", "0.5B")])
    assert list(out.position) == [*positions, "average", "ends − middle"] and (out.n == 120).all()
    shape = out.set_index("position").loc["ends − middle"]
    assert shape.difference < -0.4 and shape.ci_high < 0 and shape.verdict.startswith("lower")
    assert (out.p_holm >= out.p - 1e-12).all()
    ends = out.set_index("position").loc[0.0]
    assert ends.ci_low < 0 < ends.ci_high  # equal at the first position: no difference claimed
    with pytest.raises(ValueError, match="not paired"):
        size_differences({"1.5B": cell(0.8, range(300, 320)), "0.5B": small}, [("1.5B", "0.5B")])

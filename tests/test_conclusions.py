"""Conclusions printed from stored tables: the numbers and the verdicts follow the tables given."""

import numpy as np
import pandas as pd

from lpes_nb.evaluation.position_gate import gate
from lpes_nb.studies import calibration, position_map, representations


def _positions(accs, lows, highs, n=30):
    return pd.DataFrame({"task": "kv", "num_items": 10, "position": [0, 4, 9], "n": n, "mean": accs, "ci_low": lows,
                         "ci_high": highs, "prompt_tokens": 160.0, "rho": 40.0})


def test_calibration_shape_reads_only_non_overlapping_intervals():
    assert calibration.shape(_positions([0.9, 0.1, 0.8], [0.75, 0.03, 0.6], [0.97, 0.26, 0.9])) == "U"
    assert calibration.shape(_positions([0.9, 0.1, 0.13], [0.75, 0.03, 0.05], [0.97, 0.26, 0.3])) == "primacy"
    assert calibration.shape(_positions([0.05, 0.05, 0.25], [0.01, 0.01, 0.11], [0.24, 0.24, 0.47])) == "no clear position effect"
    assert calibration.shape(_positions([0.05, 0.05, 0.6], [0.01, 0.01, 0.42], [0.2, 0.2, 0.75])) == "recency"
    text = calibration.conclusion(_positions([0.9, 0.1, 0.13], [0.75, 0.03, 0.05], [0.97, 0.26, 0.3]),
                                  _positions([0.05, 0.05, 0.25], [0.01, 0.01, 0.11], [0.24, 0.24, 0.47]).assign(task="mdqa"),
                                  chosen_pairs=10, window=8192)
    assert "90 [75, 97] / 10 [3, 26] / 13 [5, 30] % → **primacy**" in text and "search and test size" in text
    assert "**no clear position effect**" in text and "2 % of the 8,192-token window" in text


def test_structure_pairing_counts_inputs_and_reads_the_ratio_interval():
    rng = np.random.default_rng(0)
    base = rng.uniform(900, 1300, 30)
    rows = [{"variant": v, "seed": -1, "input": i, "deviation": d} for v, ds in
            (("Bézier", base), ("shuffled", base / 0.6), ("noisy Bézier", base * rng.uniform(0.95, 1.05, 30)))
            for i, d in enumerate(ds)]
    paired = representations.paired_against(pd.DataFrame(rows)).set_index("variant")
    assert paired.loc["shuffled", "reference_lower"] == 30 and abs(paired.loc["shuffled", "median_ratio"] - 0.6) < 1e-9
    text = representations.conclusion(representations.deviation_summary(pd.DataFrame(rows)), paired.reset_index())
    assert "shuffled: lower on 30 of 30 inputs, median ratio 0.60 [0.60, 0.60] → **Bézier deviates less**" in text
    assert "noisy Bézier" in text and "**no difference resolved**" in text


def test_map_conclusion_names_the_gate_verdict_and_the_copying():
    rows = []
    for i in range(30):
        for r, acc in zip(position_map.RELATIVE_POSITIONS, [0.9, 0.05, 0.05, 0.05, 0.05]):
            rows.append({"model": "m", "dtype": "float32", "task": "kv", "num_items": 17, "position": round(r * 16),
                         "sample": i, "prompt_tokens": 250, "correct": float(i < round(acc * 30)), "truncated": False,
                         "copies_first": 0.8 if r > 0 else 1.0, "copies_last": 0.0})
    per_sample = pd.DataFrame(rows)
    table = position_map.summarize(per_sample)
    gated = gate({"m float32 kv-17": position_map.with_nominal_positions(per_sample)}).assign(source=position_map.FIXED_CELLS)
    text = position_map.map_conclusion(table, gated, {"m": 8192}, None)
    assert "kv, 17 items (~250 tokens): 90 / 7 / 7 / 7 / 7 %" in text and "**primacy**" in text
    assert "80 % of the answers with the gold item elsewhere hold the first item's text" in text
    assert "did not run" in text


def test_attention_conclusion_reads_its_four_tables():
    from lpes_nb.studies import attention

    entropy = pd.DataFrame([{"layer": l, "length": t, "scale": s, "entropy": np.log2(t) * 0.5 + (0.2 if s == 2.0 else 0.0) + l * 0.0,
                             "middle_mass": 0.1} for t in (256, 512, 1024) for s in (1.0, 2.0) for l in range(2)])
    by_scale = pd.DataFrame([{"layer": l, "scale": s, "entropy": 3.0, "middle_mass": 0.1 + (0.05 * l if s == 3.0 else 0.0),
                              "cosine": 0.7 + (0.04 if s == 3.0 else 0.0)} for l in range(3) for s in (1.0, 3.0)])
    removal = pd.DataFrame([{"removed_layers": k, "layer": l, "first_tokens": 0.9, "later_tokens": 0.8} for k in (1, 2) for l in range(3)])
    ranges = pd.DataFrame([{"method": m, "position": p, "n": 10, "mean": v} for m, vals in
                           (("none", (0.9, 0.0, 0.0)), ("layers 0-1", (0.4, 0.1, 0.0))) for p, v in zip((0, 4, 9), vals)])
    text = attention.conclusion(entropy, by_scale, removal, ranges)
    assert f"{0.5 * np.log2(256):.2f} nats at 256 tokens" in text and "0.50 nats per doubling (uniform attention: 0.69)" in text
    assert "+0.20 to +0.20 nats" in text and "largest rise is in layer 2 (+0.100)" in text and "from 0.70 to 0.74" in text
    assert "| 2 | 0.900 | 0.800 |" in text and "none scaled: 90 / 0 / 0 %" in text and "layers 0-1: 40 / 10 / 0 %" in text


def test_probe_conclusion_ranks_layers_and_names_the_noise_control():
    from lpes_nb.studies import probes

    probe = pd.DataFrame([{"layer": l, "windows": 8, "change_pct_mask": m, "ci_low_mask": m - 1, "ci_high_mask": m + 1,
                           "mask_vs_noise_pct": v, "mask_vs_noise_low": v - 1, "mask_vs_noise_high": v + 1}
                          for l, m, v in ((0, 4.0, -3.0), (1, 26.0, 7.0), (2, 2.0, 0.5), (3, 12.0, 0.0))])
    coarsening = pd.DataFrame([{"layer": l, "k": k, "change_pct": c} for l, k, c in
                               ((0, 2, 1.0), (1, 2, 9.0), (1, 64, 20.0), (3, 64, 22.0))])
    recall = pd.DataFrame([{"layer": l, "position": p, "n": 30, "mean": v} for l, vals in
                           ((-1, (0.9, 0.1, 0.0)), (0, (0.0, 0.1, 0.0)), (1, (0.95, 0.2, 0.05))) for p, v in zip((0, 4, 9), vals)])
    text = probes.conclusion(probe, coarsening, recall, window=512, top=2)
    assert "most in layer 1 (+26.0 % [+25.0, +27.0]), layer 3" in text and "least in layer 0" in text and "layer 2 (+2.0 %" in text
    assert "more than noise of its own size in 1 layer — 1 (+7.0 %" in text and "less than noise in 1 — 0 (-3.0 %" in text
    assert "at k = 2 costs at most +9.0 % (layer 1)" in text and "k = 64: layer 3 (+22.0 %)" in text
    assert "unpatched: 90 / 10 / 0 %" in text and "ranges 0–95 %" in text and "gold 4 above 20 % or gold 9 above 5 %" in text


def test_difference_text_states_the_verdict_its_interval_supports():
    from lpes_nb.evaluation.fitness import difference_text

    row = {"method": "LPES", "reference": "PI", "difference": 0.04, "ci_low": 0.01, "ci_high": 0.07, "mde_80": 0.03, "records": 320}
    assert difference_text(row) == "LPES vs PI: Δλ +0.040 [+0.010, +0.070], MDE 0.03, 320 records → **better**"
    assert difference_text({**row, "difference": -0.04, "ci_low": -0.07, "ci_high": -0.01}).endswith("**worse**")
    assert difference_text({**row, "ci_low": -0.01}).endswith("**no effect of ≥ 0.03 resolved**")


def test_search_budget_counts_prompt_forwards():
    from lpes_nb.core.ga import GAConfig
    from lpes_nb.studies.search import search_forwards
    from lpes_nb.evaluation.tasks import TaskConfig

    assert search_forwards(GAConfig(population=16, parents=6, mutations=8, crossovers=2, generations=6),
                           TaskConfig("kv", 10, n=8)) == 16 * 7 * 24

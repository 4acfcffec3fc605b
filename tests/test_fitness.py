"""The λ-weighted position fitness: the position table, the weighted score, the GA's fitness and its
on-disk cache."""

import numpy as np
import pandas as pd
import pytest

import lpes_nb.evaluation.fitness as fitness_module
from lpes_nb.evaluation.evaluate import evaluate_samples
from lpes_nb.store.data import Sample
from lpes_nb.evaluation.fitness import (
    PositionFitness,
    paired_fitness_difference,
    position_table,
    proxy_agreement,
    split_half_reliability,
    subset_agreement,
    weighted_fitness,
)
from lpes_nb.store.results import ResultCache


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


def test_paired_difference_is_the_fitness_difference_with_a_paired_interval():
    rng = np.random.default_rng(0)
    rows = []
    for pos in (0, 5, 9):
        base = rng.random(40) < 0.5
        better = base | (rng.random(40) < (0.3 if pos == 9 else 0.0))  # the method only ever adds correct answers at the end
        rows += [{"method": "baseline", "position": pos, "sample": i, "correct": b} for i, b in enumerate(base)]
        rows += [{"method": "m", "position": pos, "sample": i, "correct": b} for i, b in enumerate(better)]
    df = pd.DataFrame(rows)
    out = paired_fitness_difference(df, "m", "baseline")
    expected = weighted_fitness(df[df.method == "m"]) - weighted_fitness(df[df.method == "baseline"])
    assert out["difference"] == pytest.approx(expected) and out["difference"] > 0
    assert 0 < out["ci_low"] <= out["difference"] <= out["ci_high"]  # pairing resolves a one-sided gain
    same = paired_fitness_difference(df, "baseline", "baseline")
    assert same["difference"] == 0 and same["ci_high"] == -same["ci_low"] > 0  # no [0, 0]: the exact bound for 0 of 40
    with pytest.raises(ValueError, match="no per-sample results for \\['x'\\]"):
        paired_fitness_difference(df, "x", "baseline")


def test_generate_mode_tie_break_scores_the_gold_answer(tiny_llama, tokenizer, tmp_path):
    """Generate mode judges text and has no log-probability: the tie-break must come from a scoring
    pass, else equal accuracies stay tied in whatever order the GA met them."""
    from lpes_nb.core.methods import LayerScales
    from lpes_nb.evaluation.tasks import EvalSettings

    samples, scales = _toy_samples(), [2.0, 1.5, 1.0, 3.0]
    generate = EvalSettings(mode="generate", max_new_tokens=3)
    plain = PositionFitness(tiny_llama, tokenizer, samples, generate)(np.array([scales]))[0]
    broken = PositionFitness(tiny_llama, tokenizer, samples, generate, cache=ResultCache(tmp_path), tie_break=1e-3)
    scored = evaluate_samples(tiny_llama, tokenizer, samples, LayerScales(scales), EvalSettings(), progress=False)
    assert broken(np.array([scales]))[0] == pytest.approx(plain + 1e-3 * scored["gold_logprob"].mean())
    assert len(list(tmp_path.glob("*.csv"))) == 2  # the generated answers and the scoring pass, each cached


def test_the_logprob_fitness_weights_the_gold_answers_log_probability(tiny_llama, tokenizer):
    from lpes_nb.core.methods import LayerScales
    from lpes_nb.evaluation.tasks import EvalSettings

    samples, scales, score = _toy_samples(), [2.0, 1.5, 1.0, 3.0], EvalSettings(mode="score")
    logprob = PositionFitness(tiny_llama, tokenizer, samples, score, value="gold_logprob")
    scored = evaluate_samples(tiny_llama, tokenizer, samples, LayerScales(scales), score, progress=False)
    assert logprob(np.array([scales]))[0] == pytest.approx(weighted_fitness(scored, value="gold_logprob"))
    accuracy = PositionFitness(tiny_llama, tokenizer, samples, score)
    assert accuracy(np.array([scales]))[0] == pytest.approx(weighted_fitness(scored))
    # a checkpoint of one never resumes as the other; the accuracy fitness keeps its key of before
    assert logprob.fingerprint() != accuracy.fingerprint()
    with pytest.raises(ValueError, match="needs settings.mode='score' \\(got 'generate'\\)"):
        PositionFitness(tiny_llama, tokenizer, samples, EvalSettings(mode="generate"), value="gold_logprob")
    with pytest.raises(ValueError, match="and tie_break=0 \\(got 0.001"):
        PositionFitness(tiny_llama, tokenizer, samples, score, tie_break=1e-3, value="gold_logprob")
    with pytest.raises(ValueError, match="value must be one of \\('correct', 'gold_logprob'\\), got 'f1'"):
        PositionFitness(tiny_llama, tokenizer, samples, score, value="f1")
    # continuations in pieces: the same value up to summation order, under its own key
    chunked = PositionFitness(tiny_llama, tokenizer, samples, score, value="gold_logprob", prefill_chunk=3)
    assert chunked(np.array([scales]))[0] == pytest.approx(logprob(np.array([scales]))[0], abs=1e-4)
    assert chunked.fingerprint() != logprob.fingerprint()
    with pytest.raises(ValueError, match="prefill_chunk must be None .* got 0"):
        PositionFitness(tiny_llama, tokenizer, samples, score, prefill_chunk=0)

def test_a_fitness_with_progress_shows_a_bar_over_its_records(tiny_llama, tokenizer, monkeypatch):
    """A validation scores one curve for most of an hour on a CPU: its bar counts the records as they
    are scored; a GA's fitness stays quiet. (The bars are read as counted, not as drawn: tqdm draws at
    most every 0.1 s, and this toy fitness finishes sooner.)"""
    import lpes_nb.evaluation.evaluate as evaluate_module
    from lpes_nb.evaluation.tasks import EvalSettings

    bars = []

    class Counted(evaluate_module.tqdm):
        def close(self):
            bars.append(None if self.disable else (self.desc, self.total, self.n))  # a disabled bar keeps no desc or count
            super().close()

    monkeypatch.setattr(evaluate_module, "tqdm", Counted)
    samples, scales = _toy_samples(), np.array([[2.0, 1.5, 1.0, 3.0]])
    PositionFitness(tiny_llama, tokenizer, samples, EvalSettings(mode="score"), value="gold_logprob")(scales)
    assert bars and all(bar is None for bar in bars)
    bars.clear()
    PositionFitness(tiny_llama, tokenizer, samples, EvalSettings(mode="score"), value="gold_logprob", progress=True)(scales)
    assert [bar for bar in bars if bar] == [("scoring (shared prefixes)", 2, 2)]  # 2 records, 3 positions each


def test_the_fitness_bar_counts_candidates_only_when_there_are_several(tiny_llama, tokenizer, monkeypatch):
    """The GA scores a population under one bar; one curve scored alone (the unmodified model's line in
    a notebook) draws none: its bar would count nothing and stay in the notebook's outputs."""
    from lpes_nb.evaluation.tasks import EvalSettings

    bars = []

    class Counted(fitness_module.tqdm):
        def close(self):
            bars.append(None if self.disable else (self.desc, self.total, self.n))
            super().close()

    monkeypatch.setattr(fitness_module, "tqdm", Counted)
    fit = PositionFitness(tiny_llama, tokenizer, _toy_samples(), EvalSettings(mode="score"), value="gold_logprob")
    fit(np.ones((1, 4)))
    assert bars and not any(bars)
    bars.clear()
    fit(np.array([[1.0] * 4, [2.0, 1.5, 1.0, 3.0]]))
    assert [bar for bar in bars if bar] == [("fitness", 2, 2)]  # a closed bar closes again, disabled, when collected


def _candidate_table(accuracy: float, logprob: float, records: int = 20) -> pd.DataFrame:
    """One candidate's per-sample table at 3 positions: ``accuracy`` correct, gold log-prob ``logprob``."""
    k = round(accuracy * records)
    return pd.DataFrame([{"position": p, "num_items": 3, "sample": r, "correct": float(r < k), "gold_logprob": logprob}
                         for p in (0, 1, 2) for r in range(records)])


def test_proxy_agreement_ranks_candidates_by_both_fitnesses():
    accuracies = np.linspace(0.1, 0.9, 15)
    faithful = [_candidate_table(a, -3 + 2 * a) for a in accuracies]  # log-prob rises with accuracy
    got = proxy_agreement(faithful)
    assert got["rho"] == pytest.approx(1.0) and got["ci_low"] > 0.9 and got["candidates"] == 15
    shuffled = [_candidate_table(a, lp) for a, lp in zip(accuracies, np.random.default_rng(3).permutation(-3 + 2 * accuracies))]
    got = proxy_agreement(shuffled)
    assert got["ci_low"] < 0 < got["ci_high"] and got["ci_high"] - got["ci_low"] > 0.8  # 15 candidates say little
    # a proxy from other tables (a shorter task): one per candidate
    assert proxy_agreement(faithful, shuffled)["rho"] == pytest.approx(got["rho"])
    with pytest.raises(ValueError, match="one proxy table per candidate: 15 real, 14 proxy"):
        proxy_agreement(faithful, shuffled[:14])
    with pytest.raises(ValueError, match=r"needs >= 15 candidates, got 14"):
        proxy_agreement(faithful[:14])
    with pytest.raises(ValueError, match="same for every candidate"):
        proxy_agreement([_candidate_table(0.5, lp) for lp in range(15)])
    with pytest.raises(ValueError, match="no column 'gold_logprob'"):
        weighted_fitness(faithful[0].drop(columns="gold_logprob"), value="gold_logprob")


def _noisy_tables(true_accuracy, records=20, seed=0):
    """Candidates whose per-record correctness is Bernoulli(their true accuracy), gold log-prob its
    true accuracy plus small noise."""
    rng = np.random.default_rng(seed)
    return [pd.DataFrame([{"position": p, "sample": r, "correct": float(rng.random() < a), "gold_logprob": a + 0.01 * rng.normal()}
                          for p in (0, 1, 2) for r in range(records)]) for a in true_accuracy]


def test_split_half_reliability_tells_signal_from_sampling_noise():
    spread = _noisy_tables(np.linspace(0.05, 0.95, 15))  # candidates far apart: halves rank them alike
    got = split_half_reliability(spread)
    assert got["half_rho"] > 0.8 and got["reliability"] == pytest.approx(2 * got["half_rho"] / (1 + got["half_rho"]))
    assert got["records"] == 20 and got["ranked_splits"] == 200 and got["candidates"] == 15
    assert got["ci_low"] < got["half_rho"] < got["ci_high"] <= 1  # Fisher z over the 15 candidates
    # more records per set, more alike; the halves' agreement is the curve's last point
    curve = got["by_records"]
    assert list(curve) == list(range(1, 11)) and curve[10] == got["half_rho"] and curve[1] < curve[4] < curve[10]
    with pytest.raises(ValueError, match=r"size must be in \[1, 10\] \(two disjoint sets of the 20 shared records\), got 11"):
        subset_agreement(spread, 11)
    alike = _noisy_tables(np.full(15, 0.3))  # equal candidates: what differs is noise
    assert abs(split_half_reliability(alike)["half_rho"]) < 0.2
    assert split_half_reliability(alike, value="gold_logprob")["half_rho"] < 0.2  # noise there too
    assert split_half_reliability(spread, value="gold_logprob")["reliability"] > 0.95
    with pytest.raises(ValueError, match="needs >= 4 records shared by every candidate, got 3"):
        split_half_reliability(_noisy_tables(np.linspace(0.1, 0.9, 15), records=3))
    with pytest.raises(ValueError, match="every halving of the 6 records gives every candidate the same 'correct'"):
        split_half_reliability([_candidate_table(0.5, lp, records=6) for lp in range(15)])


def test_a_method_identical_to_its_reference_is_said_to_be_without_an_interval():
    """Issue #99: Dynamic NTK inside the trained window changes nothing; its rows are the baseline's and
    read "identical to the baseline", not a difference with an interval — also where another evaluation
    path's rounding moved its log-probabilities, but never where an outcome differs."""
    from lpes_nb.evaluation.fitness import difference_text, paired_differences, paired_fitness_difference

    rows = [{"method": m, "sample": s, "position": p, "correct": float((s + p + (m == "PI")) % 3 == 0), "gold_logprob": -1.0 - s * 0.1 - p}
            for m in ("baseline", "Dynamic NTK", "PI") for s in range(6) for p in (0, 4, 9)]
    per_sample = pd.DataFrame(rows)
    same = paired_fitness_difference(per_sample, "Dynamic NTK", "baseline")
    assert same["identical"] and same["difference"] == 0
    text = difference_text(same)
    assert "identical to the baseline**: every answer and gold log-probability of the 6 records" in text and "[" not in text
    nudged = per_sample.assign(gold_logprob=per_sample["gold_logprob"].where(
        (per_sample.method == "baseline") | (per_sample["sample"] != 2), -7.0))  # same answers, another log-prob
    changed = paired_fitness_difference(nudged, "Dynamic NTK", "baseline")
    assert not changed["identical"] and "identical" not in difference_text(changed)
    why = "the longest prompt, 90 tokens, is inside the 2,048-token window it grows from"
    rounded = paired_differences(nudged, ("baseline", "PI"), unchanged={"Dynamic NTK": why}).set_index(["method", "reference"])
    text = difference_text(rounded.loc[("Dynamic NTK", "baseline")].to_dict() | {"method": "Dynamic NTK", "reference": "baseline"})
    assert f"**identical to the baseline** ({why}): it changes nothing" in text and "[" not in text
    assert not rounded.loc[("Dynamic NTK", "PI"), "identical"] and not rounded.loc[("PI", "baseline"), "identical"]
    flipped = nudged.assign(correct=nudged["correct"].where((nudged.method == "baseline") | (nudged["sample"] != 1), 1 - nudged["correct"]))
    moved = paired_fitness_difference(flipped, "Dynamic NTK", "baseline", unchanged=why)
    assert not moved["identical"] and moved["unchanged"] is None and "[" in difference_text(moved)

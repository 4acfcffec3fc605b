"""The LPES search at power: on the split's search records only, the log-prob fitness, a convergence
table against the evaluations' recorded wall time, readable from a checkpoint while a search runs."""

import json
import re

import numpy as np
import pytest
import torch

from lpes_nb.core.ga import GAConfig, GeneticSearch
from lpes_nb.store import splits
from lpes_nb.store.models import load_model, load_tokenizer, model_identity
from lpes_nb.studies import lpes_at_power
from lpes_nb.studies.search import bezier_space, search_fitness

GA = GAConfig(population=4, parents=2, mutations=1, crossovers=1, generations=2)
PLAN = lpes_at_power.Plan(records=2, ga=GA, items=5, profile="smoke")


def test_the_search_runs_on_search_records_with_the_logprob_fitness(tmp_path, monkeypatch):
    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path))
    model, tokenizer = load_model("tiny-llama"), load_tokenizer("tiny-llama")
    table = lpes_at_power.search_seed(model, tokenizer, "tiny-llama", 0, PLAN, progress=False)

    task, run = PLAN.task(), PLAN.run(0)
    assert {s.sample_id for s in task.samples()} == set(splits.records("mdqa20", "search", 2))
    assert run.value == "gold_logprob" and run.settings.mode == "score" and run.tie_break == 0
    assert list(table["generation"]) == [0, 1, 2] and list(table["evaluated"])[0] == 4
    assert np.all(np.diff(table["evaluated"]) > 0) and np.all(np.diff(table["hours"]) > 0) and table["hours"].iloc[0] > 0
    assert np.all(np.diff(table["best"]) >= 0) and (table["best"] < 0).all()  # a mean log-probability
    fitness = search_fitness(model, tokenizer, task, run, "tiny-llama")
    # the hours are the sum of the cached evaluations' own times, the unmodified model's line left out
    search = GeneticSearch(bezier_space(model), fitness, run.ga)
    search.checkpoint = run.out_dir / f"{run.name}-{search.fingerprint()}.ckpt.json"
    scored = search.stored().scored
    seconds = [fitness.seconds(search.space.decode(np.asarray(json.loads(k)))) for k in scored]
    assert table["hours"].iloc[-1] == pytest.approx(sum(seconds) / 3600)
    assert table["unmodified"].nunique() == 1 and table["unmodified"].iloc[0] == fitness(np.ones((1, search.space.num_layers)))[0]

    # read back from the checkpoint (what a report on a running search does): the same table, nothing scored
    monkeypatch.setattr("lpes_nb.evaluation.fitness.evaluate_samples", lambda *a, **k: pytest.fail("a report must not evaluate"))
    again = lpes_at_power.search_seed(model, tokenizer, "tiny-llama", 0, PLAN, report_only=True)
    assert again.equals(table)


def test_a_report_before_the_search_or_without_recorded_times_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path))
    model, tokenizer = load_model("tiny-llama"), load_tokenizer("tiny-llama")
    with pytest.raises(FileNotFoundError, match="run the search first"):
        lpes_at_power.search_seed(model, tokenizer, "tiny-llama", 0, PLAN, report_only=True)
    lpes_at_power.search_seed(model, tokenizer, "tiny-llama", 0, PLAN, progress=False)
    cache = tmp_path / "results" / "smoke" / "lpes_at_power" / "fitness_cache"
    victim = sorted(cache.glob("*.csv"))[0]
    victim.write_text(victim.read_text().replace("eval_seconds", "other"))
    with pytest.raises(ValueError, match="no recorded time|not cached"):
        lpes_at_power.search_seed(model, tokenizer, "tiny-llama", 0, PLAN, report_only=True)


def test_a_search_of_one_seed_keeps_the_other_seeds_rows_in_the_stored_convergence_table(tmp_path, monkeypatch):
    """The notebook names an unfinished seed's resume as ``search --seeds 1``: that call must write the
    convergence table with seed 0's rows still in it, as the notebook itself writes it."""
    import pandas as pd

    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path))
    cli = ["--profile", "smoke", "--model", "tiny-llama", "--dtype", "float32"]
    path = lpes_at_power._paths(lpes_at_power.Plan.of("smoke"), "tiny-llama", "float32")["convergence"]
    lpes_at_power.main(["search", *cli, "--seeds", "0"])
    alone = pd.read_csv(path)
    assert set(alone["seed"]) == {0}
    lpes_at_power.main(["search", *cli, "--seeds", "1"])
    both = pd.read_csv(path)
    assert list(both["seed"].unique()) == [0, 1] and both[both["seed"] == 0].reset_index(drop=True).equals(alone)
    lpes_at_power.main(["report", *cli, "--seeds", "0"])
    assert pd.read_csv(path).equals(both)
    # the stored table is the notebook's: what study() writes from every seed's checkpoint
    monkeypatch.setattr("lpes_nb.evaluation.fitness.evaluate_samples", lambda *a, **k: pytest.fail("a report must not evaluate"))
    model, tokenizer = load_model("tiny-llama"), load_tokenizer("tiny-llama")
    notebook = pd.concat([lpes_at_power.search_seed(model, tokenizer, "tiny-llama", seed, lpes_at_power.Plan.of("smoke"), report_only=True)
                          for seed in (0, 1)], ignore_index=True).round(5)
    assert pd.read_csv(path).equals(pd.read_csv(lpes_at_power.write_csv(tmp_path / "nb.csv", notebook)))


def test_validation_picks_one_finalist_and_the_test_pairs_methods_on_test_records(tmp_path, monkeypatch):
    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path))
    model, tokenizer = load_model("tiny-llama"), load_tokenizer("tiny-llama")
    for seed in (0, 1):
        lpes_at_power.search_seed(model, tokenizer, "tiny-llama", seed, PLAN, progress=False)
    finals = lpes_at_power.finalists(model, tokenizer, "tiny-llama", (0, 1), PLAN, top=2)
    assert list(finals["seed"]) == [0, 0, 1, 1] and finals.groupby("seed")["search_fitness"].is_monotonic_decreasing.all()
    table = lpes_at_power.validate(model, tokenizer, "tiny-llama", finals, PLAN, records=3, progress=False)
    finalists_only = table[table.candidate != "unmodified"]
    assert table["chosen"].sum() == 1 and table.loc[table.chosen, "validation"].iloc[0] == finalists_only["validation"].max()
    assert (table["validation"] < 0).all() and table["validation_unmodified"].nunique() == 1
    # the unmodified model is a candidate (the last row), and each finalist says whether it beats it
    unmodified = table.iloc[-1]
    assert unmodified["candidate"] == "unmodified" and json.loads(unmodified["scales"]) == [1.0] * model.config.num_hidden_layers
    assert unmodified["validation"] == unmodified["validation_unmodified"] and not unmodified["chosen"]
    assert list(finalists_only["beats_unmodified"]) == list(finalists_only["validation"] > unmodified["validation"])
    lead = lpes_at_power.validation_text(table)
    assert lead.startswith("- **The search found nothing better than the unmodified model on validation**" if not
                           finalists_only["beats_unmodified"].any() else "- **Validation**: ")
    losing = table.assign(validation=table["validation"].where(table.candidate == "unmodified", -1e9), beats_unmodified=False)
    assert lpes_at_power.validation_text(losing).startswith("- **The search found nothing better than the unmodified model")

    chosen = json.loads(table.loc[table.chosen, "scales"].iloc[0])
    exported = json.loads(lpes_at_power.export_chosen(tmp_path / "chosen.json", table, model, "tiny-llama", PLAN).read_text())
    assert exported["scales"] == pytest.approx(chosen) and exported["model"] == model_identity(model, "tiny-llama")
    assert exported["search_records"] == splits.records("mdqa20", "search", 2) and exported["seeds"] == [0, 1]
    assert exported["validation"] == table["validation"].max() and exported["dtype"] == "float32" and exported["validation_records"] == 3
    methods = lpes_at_power.methods_for_test(chosen, ["baseline", "LPES", "PI"])
    assert methods["baseline"] is None and methods["PI"].scales == pytest.approx([np.mean(chosen)] * len(chosen))
    cells = lpes_at_power.cells_on_test(model, tokenizer, "tiny-llama", "float32", methods, {"baseline": 3, "LPES": 2, "PI": 2},
                                        profile="smoke", items=5, progress=False)
    test = set(splits.records("mdqa20", "test", 3))
    assert set(cells["baseline"]["sample"]) == test and set(cells["LPES"]["sample"]) == set(splits.records("mdqa20", "test", 2))
    assert not test & (set(splits.records("mdqa20", "search")) | set(splits.records("mdqa20", "validation")))
    diffs = lpes_at_power.differences_on_test(cells, "gold_logprob")
    assert [tuple(p) for p in diffs[diffs.position == "average"][["method", "reference"]].to_numpy()] == \
        [("LPES", "baseline"), ("PI", "baseline"), ("LPES", "PI")]
    assert (diffs["n"] == 2).all() and list(diffs["position"][:5]) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="unknown test method"):
        lpes_at_power.methods_for_test(chosen, ["LPES", "YaRN"])
    # the transfer test: a curve searched on KV, tested on MDQA beside its own twin
    transfer = lpes_at_power.methods_for_test(chosen, ["baseline", "LPES", "PI"], searched_on="kv75")
    assert list(transfer) == ["baseline", "LPES (searched on kv75)", "PI (searched on kv75)"]
    both = {**cells, "LPES (searched on kv75)": cells["LPES"], "PI (searched on kv75)": cells["PI"]}
    pairs = lpes_at_power.differences_on_test(both, "gold_logprob").query("position == 'average'")
    assert ("LPES (searched on kv75)", "PI (searched on kv75)") in set(zip(pairs.method, pairs.reference))
    assert ("LPES", "PI (searched on kv75)") not in set(zip(pairs.method, pairs.reference))
    for trained in ("MoICE", lpes_at_power.PER_HEAD_MOICE):
        with pytest.raises(ValueError, match=f"{re.escape(trained)} needs a router trained on this model"):
            lpes_at_power.methods_for_test(chosen, ["LPES", trained])
    untrained = lpes_at_power.methods_for_test(chosen, [lpes_at_power.UNTRAINED_MOICE])[lpes_at_power.UNTRAINED_MOICE]
    assert not untrained.trained


def test_the_test_computes_block_by_block_every_method_on_a_block_before_the_next(monkeypatch):
    import pandas as pd

    calls = []

    def fake_cell(model, tokenizer, model_name, dtype, task, items, records, batch_size, profile, progress, method=None):
        calls.append((method, list(records)))
        return pd.DataFrame({"sample": list(records)})

    monkeypatch.setattr(lpes_at_power, "record_cell", fake_cell)
    monkeypatch.setattr(lpes_at_power, "positional_rows", lambda rows: rows)
    methods = {"baseline": None, "LPES": "lpes", "PI": "pi", "Ms-PoE": "mspoe"}
    cells = lpes_at_power.cells_on_test(None, None, "tiny-llama", "float32", methods, {"LPES": 5, "PI": 5, "Ms-PoE": 3},
                                        progress=False, block=2)
    ids = splits.records("mdqa20", "test", 5)
    computed = calls[:-len(methods)]  # the last calls read each whole cell back
    assert computed == [(None, ids[0:2]), ("lpes", ids[0:2]), ("pi", ids[0:2]), ("mspoe", ids[0:2]),
                        (None, ids[2:4]), ("lpes", ids[2:4]), ("pi", ids[2:4]), ("mspoe", ids[2:3]),
                        (None, ids[4:5]), ("lpes", ids[4:5]), ("pi", ids[4:5])]
    assert {m: list(c["sample"]) for m, c in cells.items()} == {"baseline": ids, "LPES": ids, "PI": ids, "Ms-PoE": ids[:3]}
    with pytest.raises(ValueError, match="block must be a whole number of records >= 1, got 0"):
        lpes_at_power.cells_on_test(None, None, "tiny-llama", "float32", methods, {"LPES": 5}, progress=False, block=0)


def test_validation_refuses_an_unfinished_search(tmp_path, monkeypatch):
    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path))
    model, tokenizer = load_model("tiny-llama"), load_tokenizer("tiny-llama")
    lpes_at_power.search_seed(model, tokenizer, "tiny-llama", 0, PLAN, progress=False)
    search, _ = lpes_at_power.searched(model, tokenizer, "tiny-llama", 0, PLAN)
    state = json.loads(search.checkpoint.read_text())
    search.checkpoint.write_text(json.dumps({**state, "generation": 1}))  # as a search stopped after generation 1
    with pytest.raises(ValueError, match="stands at generation .* of 2: finish it"):
        lpes_at_power.finalists(model, tokenizer, "tiny-llama", (0,), PLAN)


def test_a_plan_names_its_dataset_and_curve_family_and_keeps_the_first_search_s_name():
    model = load_model("tiny-llama")
    assert lpes_at_power.Plan().run(0).name == "search_mdqa20_s0"  # the running search's checkpoint name
    free = lpes_at_power.Plan("kv75", "free")
    assert free.run(1).name == "search_kv75_free_s1" and type(free.search_space(model)).__name__ == "PerLayerSpace"
    assert lpes_at_power.Plan(space="linear").search_space(model).curve == "linear"
    assert free.task().source == "file" and {s.sample_id for s in free.task().samples()} == set(splits.records("kv75", "search", 8))
    # a profile's documents per prompt are MDQA's: a KV record's prompt holds all its pairs
    assert lpes_at_power.Plan.of("smoke").items == 5 and lpes_at_power.Plan.of("smoke", "kv75").items is None
    for bad, match in ((dict(dataset="kv20"), "unknown dataset 'kv20'"), (dict(space="step"), "unknown search space 'step'")):
        with pytest.raises(ValueError, match=match):
            lpes_at_power.Plan(**bad)


def test_table1_layout_and_verdicts_per_claim():
    import pandas as pd

    from lpes_nb.evaluation.position_gate import method_differences

    rng = np.random.default_rng(0)
    rel = [0.0, 0.25, 0.5, 0.75, 1.0]

    def cell(p):
        return pd.DataFrame([{"sample": r, "position": k, "relative_position": x, "correct": float(rng.random() < p)}
                             for r in range(300) for k, x in enumerate(rel)])

    base = cell(0.5)
    better = base.assign(correct=np.maximum(base["correct"], (rng.random(len(base)) < 0.2).astype(float)))  # ~ +10 points
    worse = base.assign(correct=base["correct"] * (rng.random(len(base)) < 0.8))  # ~ -10 points
    cells = {"baseline": base, "LPES": better, "PI": worse, "Ms-PoE": base.copy()}
    table = lpes_at_power.table1(cells)
    ours, paper = table[table.source == "ours"].set_index("method"), table[table.source != "ours"].set_index("method")
    assert list(table.columns) == ["source", "method", "records", "0", "0.25", "0.5", "0.75", "1", "average"]
    assert ours.loc["baseline", "records"] == 300 and ours.loc["LPES", "average"] > ours.loc["baseline", "average"] + 5
    # the paper's Qwen MDQA rows (Table 1: baseline 69.4 / 61.0 / 62.6 / 58.6 / 63.6)
    assert list(paper.loc["baseline", ["0", "0.25", "0.5", "0.75", "1"]]) == [69.4, 61.0, 62.6, 58.6, 63.6]
    diffs = method_differences(cells, [("LPES", "baseline"), ("PI", "baseline"), ("Ms-PoE", "baseline"), ("LPES", "PI")],
                               position="relative_position")
    verdicts = lpes_at_power.claims(table, diffs).set_index("method")["verdict"]
    paper_gap = paper.loc["LPES", "average"] - paper.loc["baseline", "average"]
    assert paper_gap > 0 and verdicts["LPES"].iloc[0] == "reproduced"  # LPES vs baseline, then vs PI
    # the paper's PI row averages what its baseline does (63.0 both): its claim is "no difference"
    assert round(paper.loc["PI", "average"] - paper.loc["baseline", "average"], 1) == 0
    assert verdicts["PI"] == "not reproduced: ours differs"
    assert verdicts["Ms-PoE"] == "undetermined: no record differs"  # the same answers: no test, no negative
    noisy = {**cells, "Ms-PoE": base.assign(correct=np.where(rng.random(len(base)) < 0.1, 1 - base["correct"], base["correct"]))}
    diffs = method_differences(noisy, [("Ms-PoE", "baseline")], position="relative_position")
    assert lpes_at_power.claims(table, diffs)["verdict"].iloc[0].startswith("not reproduced at MDE ")
    # a method the paper's Qwen rows lack (CALIOPE): ours alone, its MDE in the table's points like every other row
    nopaper = {**noisy, "CALIOPE-Moses": noisy["Ms-PoE"], "CALIOPE-Decay": worse}
    diffs = method_differences(nopaper, [("CALIOPE-Moses", "baseline"), ("CALIOPE-Decay", "baseline")], position="relative_position")
    rows = lpes_at_power.claims(table, diffs).set_index("method")
    assert rows["paper_points"].isna().all()
    moses = rows.loc["CALIOPE-Moses"]
    assert moses["verdict"] == f"no paper figure; ours: no difference at MDE {moses['mde_points']:.1f} points"
    assert moses["mde_points"] > 1  # points, not a fraction
    assert rows.loc["CALIOPE-Decay", "verdict"] == "no paper figure; ours: lower"


def test_ms_poe_against_its_parts_is_a_holm_family_of_its_own_that_leaves_the_claims_as_they_were():
    import pandas as pd

    rng = np.random.default_rng(1)

    def cell(p):
        return pd.DataFrame([{"sample": r, "position": k, "relative_position": k / 4, "correct": float(rng.random() < p)}
                             for r in range(200) for k in range(5)])

    fixed, mean_pi = lpes_at_power.MS_POE_PARTS
    assert (fixed, mean_pi) == ("Ms-PoE, fixed head order", "PI at the mean Ms-PoE ratio from layer 2")
    assert {fixed, mean_pi} < set(lpes_at_power.TEST_METHODS)
    methods = lpes_at_power.methods_for_test([1.0] * 4, ["baseline", "Ms-PoE", fixed, mean_pi])
    assert methods[fixed].assign == "normal" and methods[mean_pi].ms_poe == methods["Ms-PoE"]
    claims_only = {"baseline": cell(0.5), "LPES": cell(0.55), "PI": cell(0.5), "Ms-PoE": cell(0.3)}
    alone = lpes_at_power.differences_on_test(claims_only)
    with_parts = lpes_at_power.differences_on_test({**claims_only, fixed: cell(0.3), mean_pi: cell(0.32)})
    diagnostic = with_parts.iloc[len(alone):]
    assert set(zip(diagnostic.method, diagnostic.reference)) == {(fixed, "baseline"), (mean_pi, "baseline"), ("Ms-PoE", fixed),
                                                                  ("Ms-PoE", mean_pi)}
    # the claims' Holm p are those without the diagnostic (its pairs would otherwise weaken them)
    before = alone.set_index(["method", "reference", "position"])["p_holm"]
    after = with_parts.set_index(["method", "reference", "position"])["p_holm"]
    assert after.loc[before.index].equals(before) and len(with_parts) == len(alone) + len(diagnostic)
    # the claims ledger holds the paper's claims only
    table = lpes_at_power.table1({**claims_only, fixed: cell(0.3), mean_pi: cell(0.32)})
    ledger = lpes_at_power.claims(table, with_parts)
    assert {fixed, mean_pi} <= set(ledger["method"]) and ledger["reference"].isin([fixed, mean_pi]).sum() == 2
    conclusion = lpes_at_power.conclusion({"claims": ledger, "pending": []}, "cpu")
    assert "Reading Ms-PoE against its parts" in conclusion


def test_the_length_check_judges_each_answer_on_its_first_words_against_its_own_record():
    import pandas as pd

    from lpes_nb.store.data import load_mdqa

    ids, records = splits.records("mdqa20", "test", 2), load_mdqa()
    gold = [records[r]["answers"][0] for r in ids]
    filler = "Paris, London, Berlin, Madrid, Rome, Vienna, Prague, Warsaw, Lisbon, Dublin, "
    cell = pd.DataFrame({"sample": [ids[0], ids[0], ids[1]],
                         "prediction": [f" {gold[0]}\n", filler + gold[0], f" {gold[0]}"]})
    judged = lpes_at_power.with_short_answers({"LPES": cell})["LPES"]
    # the gold after ten words counts for the original metric only; record 2's answer is judged against its own gold
    assert list(judged[lpes_at_power.SHORT]) == [1.0, 0.0, float(gold[0] in records[ids[1]]["answers"])]
    assert list(lpes_at_power.with_short_answers({"LPES": cell}, words=40)["LPES"]["correct_first40"])[:2] == [1.0, 1.0]


def test_the_paired_figure_draws_one_panel_per_score_with_its_unit():
    import pandas as pd

    from lpes_nb.workbook import plots
    from lpes_nb.evaluation.position_gate import method_differences

    rng = np.random.default_rng(0)
    rows = [{"sample": r, "position": p, "correct": float(rng.random() < 0.3), lpes_at_power.SHORT: float(rng.random() < 0.2),
             "gold_logprob": -rng.random()} for r in range(12) for p in range(5)]
    cells = {"baseline": pd.DataFrame(rows), "LPES": pd.DataFrame(rows).sample(frac=1, random_state=1).assign(correct=lambda f: 1 - f.correct)}
    diffs = pd.concat([method_differences(cells, [("LPES", "baseline")], v) for v in ("correct", lpes_at_power.SHORT, "gold_logprob")])
    fig = plots.paired_averages(diffs, "t")
    labels = [ax.get_xlabel().split("\n") for ax in fig.axes]
    assert [first for first, _ in labels] == ["paired Δ accuracy (points)", f"paired Δ accuracy, first {lpes_at_power.SHORT_WORDS} words "
                                              "(points)", "paired Δ gold log-prob (nats)"]
    assert {second for _, second in labels} == {"n = 12 records; grey: ±MDE at 80 % power"}
    # rows on different records name the range
    uneven = plots.paired_averages(pd.concat([diffs, diffs.assign(method="PI", n=7)]), "t")
    assert uneven.axes[0].get_xlabel().endswith("n = 7–12 records; grey: ±MDE at 80 % power")
    with pytest.raises(ValueError, match="unknown score 'correct_firstten': correct, correct_first<k> or gold_logprob"):
        plots.paired_averages(diffs.assign(value="correct_firstten"), "t")


def test_the_convergence_figure_draws_each_family_against_its_evaluations_not_its_hours():
    import pandas as pd

    from lpes_nb.workbook import plots

    def seed(space, seed, hours):  # the same budget, run on CPUs of different speeds
        return pd.DataFrame({"space": space, "seed": seed, "generation": [0, 1], "best": [-10.0, -9.0], "mean_best_4": [-11.0, -9.5],
                             "evaluated": [16, 28], "hours": hours, "unmodified": -8.7})

    table = pd.concat([seed("bezier", 0, [1.8, 3.1]), seed("bezier", 1, [0.3, 0.6]), seed("linear", 0, [1.6, 2.9])])
    fig = plots.search_convergence(table, "t")
    assert [ax.get_title() for ax in fig.axes] == ["cubic Bézier", "piecewise linear"]
    bezier, linear = fig.axes
    assert [list(line.get_xdata()) for line in bezier.lines[:4]] == [[16, 28]] * 4 and len(linear.lines) == 3
    assert bezier.lines[0].get_color() == linear.lines[0].get_color() != bezier.lines[2].get_color()  # a seed keeps its colour


def test_the_test_step_reads_the_exported_curve_and_refuses_it_on_another_model(tmp_path, monkeypatch):
    import pandas as pd

    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path))
    model = load_model("tiny-llama")
    layers = model.config.num_hidden_layers
    table = pd.DataFrame({"seed": [0, 1], "rank": [0, 0], "search_fitness": [-2.0, -2.5], "validation": [-3.0, -2.9],
                          "validation_unmodified": -3.5, "validation_records": 60, "scales": [json.dumps([1.2] * layers), json.dumps([1.4] * layers)],
                          "chosen": [False, True]})
    # the curve stored under tiny-qwen2's name, but found on tiny-llama (a copied file, a renamed model)
    paths = lpes_at_power._paths(lpes_at_power.Plan(profile="smoke"), "tiny-qwen2", "float32")
    lpes_at_power.export_chosen(paths["chosen"], table, model, "tiny-llama")
    with pytest.raises(ValueError, match=r"found on another model than 'tiny-qwen2': .*name 'tiny-llama' \(here 'tiny-qwen2'\)"):
        lpes_at_power.main(["test", "--model", "tiny-qwen2", "--dtype", "float32", "--profile", "smoke"])
    with pytest.raises(FileNotFoundError, match="run the validate step of the kv75 search"):
        lpes_at_power.main(["test", "--model", "tiny-qwen2", "--dtype", "float32", "--profile", "smoke", "--searched-on", "kv75"])
    with pytest.raises(ValueError, match="names 2 chosen curves, not one"):
        lpes_at_power.export_chosen(tmp_path / "x.json", table.assign(chosen=True), model, "tiny-llama")


def test_moice_is_tested_with_a_router_trained_on_search_records_once(tmp_path, monkeypatch):
    from lpes_nb.studies.benchmarks import method_key
    from lpes_nb.evaluation.moice import RouterTraining

    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path))
    model, tokenizer = load_model("tiny-llama"), load_tokenizer("tiny-llama")
    budget = RouterTraining(steps=2, batch_size=2, lr=3e-3)
    moice = lpes_at_power.moice_for_test(model, tokenizer, "tiny-llama", "smoke", budget, records=2, items=5, progress=False)
    stored = json.loads((tmp_path / "results" / "smoke" / "lpes_at_power" / "moice_router_tiny-llama_float32.json").read_text())
    assert len(stored["loss"]) == 2 and "search" not in stored["task"] and "records=(" in stored["task"]
    assert f"records={tuple(splits.records('mdqa20', 'search', 2))}" in stored["task"] and "positions=(0, 1, 2, 3, 4)" in stored["task"]
    assert moice.trained and "router=" in method_key(moice) and budget.history == []  # the recipe's budget is not mutated

    # known by its recipe: read back, never trained twice, the same key
    monkeypatch.setattr("lpes_nb.evaluation.moice.train_router", lambda *a, **k: pytest.fail("the router was trained again"))
    again = lpes_at_power.moice_for_test(model, tokenizer, "tiny-llama", "smoke", budget, records=2, items=5, progress=False)
    assert method_key(again) == method_key(moice)
    per_head = lpes_at_power.PER_HEAD_MOICE
    methods = lpes_at_power.methods_for_test([1.5] * model.config.num_hidden_layers, ["baseline", per_head], moice={per_head: again})
    cells = lpes_at_power.cells_on_test(model, tokenizer, "tiny-llama", "float32", methods, {"baseline": 2, per_head: 2},
                                        profile="smoke", items=5, progress=False)
    assert set(cells[per_head]["sample"]) == set(splits.records("mdqa20", "test", 2)) and cells[per_head]["gold_logprob"].notna().all()
    assert not cells[per_head]["gold_logprob"].equals(cells["baseline"]["gold_logprob"])


def test_moice_as_published_is_trained_once_on_general_text_and_tested_by_its_recipe(tmp_path, monkeypatch):
    from lpes_nb.evaluation.moice import ReferenceRouter, ReferenceTraining
    from lpes_nb.studies.benchmarks import method_key

    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path))
    model, tokenizer = load_model("tiny-llama"), load_tokenizer("tiny-llama")
    budget = ReferenceTraining(steps=3, batch_size=2, lr=1e-2, tokens=48)
    moice = lpes_at_power.reference_moice_for_test(model, tokenizer, "tiny-llama", "smoke", budget, progress=False)
    stored = json.loads((tmp_path / "results" / "smoke" / "lpes_at_power" / "moice_reference_router_tiny-llama_float32.json").read_text())
    assert isinstance(moice.router, ReferenceRouter) and len(stored["loss"]) == 3 and stored["router"] == "reference"
    assert "without the MDQA-20 questions" in stored["data"] and budget.history == []
    monkeypatch.setattr("lpes_nb.evaluation.moice.train_reference_router", lambda *a, **k: pytest.fail("trained again"))
    again = lpes_at_power.reference_moice_for_test(model, tokenizer, "tiny-llama", "smoke", budget, progress=False)
    assert isinstance(again.router, ReferenceRouter) and method_key(again) == method_key(moice)
    assert all(torch.equal(a, b) for a, b in zip(again.router.state_dict().values(), moice.router.state_dict().values()))
    methods = lpes_at_power.methods_for_test([1.0] * model.config.num_hidden_layers, ["MoICE"], moice={"MoICE": again})
    assert methods["MoICE"] is again
    # a clone holds the JSON, not the weights: the recipe still names the published router
    (tmp_path / "results" / "smoke" / "lpes_at_power" / "moice_reference_router_tiny-llama_float32.safetensors").unlink()
    lazy = lpes_at_power.reference_moice_for_test(model, tokenizer, "tiny-llama", "smoke", budget, progress=False)
    assert lazy.router is None and lazy.trained and moice.label == lazy.label == "MoICE"


def test_a_search_killed_with_sigkill_resumes_to_the_uninterrupted_result(tmp_path):
    """A real ``kill -9`` in the middle of a generation (the checkpoint stands at the last finished one,
    some of the next one's evaluations are cached): resumed, the search ends where an uninterrupted
    one does."""
    import os
    import signal
    import subprocess
    import sys
    import time

    plan = lpes_at_power.Plan(records=2, ga=GAConfig(population=5, parents=2, mutations=2, crossovers=1, generations=3),
                              items=5, profile="smoke")
    # the child computes with this process's thread count: another count sums matmuls in another order
    code = ("from lpes_nb.studies import lpes_at_power; from lpes_nb.core.ga import GAConfig; from lpes_nb.store.models import load_model, load_tokenizer; "
            f"import torch; torch.set_num_threads({torch.get_num_threads()}); plan = {plan!r}; "
            "lpes_at_power.search_seed(load_model('tiny-llama'), load_tokenizer('tiny-llama'), 'tiny-llama', 0, plan, progress=False)")
    code = code.replace("Plan(", "lpes_at_power.Plan(")
    folder = tmp_path / "killed" / "results" / "smoke" / "lpes_at_power"
    child = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "LPES_OUTPUT_ROOT": str(tmp_path / "killed")})
    # wait for generation 0's checkpoint, then for one more evaluation of the next generation, and kill
    deadline, cached = time.monotonic() + 300, None
    while child.poll() is None and time.monotonic() < deadline:
        count = len(list(folder.glob("fitness_cache/*.csv")))
        if cached is None and list(folder.glob("*.ckpt.json")):
            cached = count
        elif cached is not None and count > cached:
            child.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    assert child.wait(60) == -signal.SIGKILL, "the search finished (or failed) before it could be killed"
    assert json.loads(next(folder.glob("*.ckpt.json")).read_text())["generation"] < plan.ga.generations

    model, tokenizer = load_model("tiny-llama"), load_tokenizer("tiny-llama")
    results = {}
    for name in ("killed", "uninterrupted"):
        os.environ["LPES_OUTPUT_ROOT"] = str(tmp_path / name)
        try:
            table = lpes_at_power.search_seed(model, tokenizer, "tiny-llama", 0, plan, progress=False)
            search, _ = lpes_at_power.searched(model, tokenizer, "tiny-llama", 0, plan)
            results[name] = (table.drop(columns="hours"), search.stored())
        finally:
            del os.environ["LPES_OUTPUT_ROOT"]
    (table, resumed), (table_full, full) = results["killed"], results["uninterrupted"]
    assert resumed.history.equals(full.history) and resumed.scored == full.scored and table.equals(table_full)
    assert resumed.best_fitness == full.best_fitness and list(table["generation"]) == [0, 1, 2, 3]


def test_the_cpu_profile_names_the_committed_search_and_bad_settings_are_refused():
    """The notebook and the CLI read the study's settings from the profile: under ``cpu`` they must
    name the search whose checkpoint is committed (a moved key would show it as never run)."""
    from dataclasses import replace

    from lpes_nb.store.models import QWEN
    from lpes_nb.studies.profiles import PROFILES, LpesAtPower
    from lpes_nb.store.results import project_root

    model, tokenizer = load_model(QWEN, dtype="bfloat16"), load_tokenizer(QWEN)
    search, _ = lpes_at_power.searched(model, tokenizer, QWEN, 0, lpes_at_power.Plan.of("cpu"))
    assert search.checkpoint.name == "search_mdqa20_s0-9d83ba9bcf354603.ckpt.json"
    assert (project_root() / "results" / "lpes_at_power" / search.checkpoint.name).exists()
    cpu = PROFILES["cpu"].lpes_at_power
    for bad, match in (({"items": 25}, r"items must be None .* \[2, 20\], got 25"),
                       ({"finalists": 17}, r"finalists must be in \[1, 16\]"),
                       ({"validation_records": 61}, r"validation_records must be in \[1, 60\]"),
                       ({"test_records": (("LPES", 400), ("PI", 321))}, r"records in \[1, 321\]\), got \('LPES', 400\)"),
                       ({"test_records": (("LPES", 321),)}, "must test LPES and its PI twin"),
                       ({"seeds": (0, 0)}, "seeds must be distinct"), ({"dtype": "float16"}, "dtype must be"),
                       ({"spaces": ("linear", "bezier")}, r"spaces must be distinct families of .*'bezier' .* first, got \('linear', 'bezier'\)"),
                       ({"spaces": ("bezier", "step")}, r"spaces must be .* got \('bezier', 'step'\)"),
                       ({"transfer": ("mdqa20",)}, r"transfer must be distinct datasets of \['kv140', 'kv75'\] .*got \('mdqa20',\)"),
                       ({"in_domain": (("kv140", 150),)}, r"in_domain: each entry is \(a dataset of transfer \('kv75',\).*got \('kv140', 150\)"),
                       ({"in_domain": (("kv75", 301),)}, r"in_domain: .*got \('kv75', 301\)")):
        with pytest.raises(ValueError, match=match):
            replace(cpu, **bad)
    with pytest.raises(ValueError, match="unknown test method"):
        lpes_at_power.methods_for_test([1.0] * 4, ["baseline", "LPES", "Ms-PoE2"])
    assert isinstance(cpu, LpesAtPower) and cpu.read_only and not PROFILES["smoke"].lpes_at_power.read_only
    assert replace(cpu, in_domain=()).in_domain == ()  # no in-domain test: allowed


def _profile_for(monkeypatch, name: str, **changes):
    from dataclasses import replace

    from lpes_nb.studies.profiles import PROFILES

    smoke = PROFILES["smoke"]
    monkeypatch.setitem(PROFILES, name, replace(smoke, name=name, lpes_at_power=replace(smoke.lpes_at_power, **changes)))


def test_a_read_only_study_computes_nothing_and_names_every_step_not_yet_run(tmp_path, monkeypatch):
    """The ``cpu`` notebook reads what the background runs stored: one seed searched, the other not,
    no validation, no test -- the convergence of the one, the commands for the rest, nothing computed."""
    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path))
    _profile_for(monkeypatch, "smoke-read", read_only=True)
    name = "paper-dry-llama"  # the smoke profile's
    model, tokenizer = load_model(name), load_tokenizer(name)
    plan = lpes_at_power.Plan.of("smoke-read")
    stored = lpes_at_power.search_seed(model, tokenizer, name, 0, plan, progress=False)  # what a background run left
    monkeypatch.setattr("lpes_nb.evaluation.fitness.evaluate_samples", lambda *a, **k: pytest.fail("a read-only study must not evaluate"))
    found = lpes_at_power.study("smoke-read", progress=False)
    assert (found["convergence"]["space"] == "bezier").all() and found["convergence"].drop(columns="space").equals(stored.round(5))
    assert not {"validation", "claims", "families", "transfer"} & found.keys()
    command = "lpes lpes-at-power {} --profile smoke-read"
    assert found["pending"] == [
        f"the mdqa20 search of seed(s) [1] has not finished: {command.format('search')} --seeds 1",
        f"validation of the mdqa20 search: {command.format('validate')} --seeds 0 1",
        f"test: {command.format('test')} --methods LPES PI Ms-PoE 'MoICE (per-head router, task-trained)'",
        f"the mdqa20_linear search of seed(s) [0, 1] has not finished: {command.format('search')} --space linear --seeds 0 1",
        f"validation of the mdqa20_linear search: {command.format('validate')} --space linear --seeds 0 1",
        f"the mdqa20_free search of seed(s) [0, 1] has not finished: {command.format('search')} --space free --seeds 0 1",
        f"validation of the mdqa20_free search: {command.format('validate')} --space free --seeds 0 1",
        f"the kv75 search of seed(s) [0, 1] has not finished: {command.format('search')} --dataset kv75 --seeds 0 1",
        f"validation of the kv75 search: {command.format('validate')} --dataset kv75 --seeds 0 1",
        f"test of the curve searched on kv75: {command.format('test')} --methods LPES PI --searched-on kv75",
        f"test on kv75's test part: {command.format('test')} --methods LPES PI --tested-on kv75"]
    text = lpes_at_power.conclusion(found, "smoke-read")
    assert "**Search (bezier), seed 0**: generation 1 of 1" in text and text.count("*Not yet run*") == 11
    assert f"**Setting**: {name}, float32" in text and "search part" in text


def test_the_bezier_curve_meets_the_unmodified_model_on_validation_before_any_other_family_is_validated(monkeypatch):
    import pandas as pd

    _profile_for(monkeypatch, "smoke-bezier", read_only=True)
    chosen = [1.2, 1.1]
    validation = pd.DataFrame({"scales": [json.dumps(chosen)], "chosen": [True]})

    def searched_and_validated(model, tokenizer, profile, plan, progress, pending):  # Bézier on MDQA-20 alone is validated
        return {"validation": validation} if (plan.space, plan.dataset) == ("bezier", "mdqa20") else {}

    monkeypatch.setattr(lpes_at_power, "_searched_and_validated", searched_and_validated)
    monkeypatch.setattr(lpes_at_power, "_tested", lambda *a, **k: {})
    asked = []
    monkeypatch.setattr(lpes_at_power, "families", lambda model, tokenizer, name, curves, plan, records: asked.append(curves) or pd.DataFrame())
    found = lpes_at_power.study("smoke-bezier", progress=False)
    assert asked == [{"bezier": chosen}] and found["family_curves"] == {"bezier": chosen}


def test_tables_of_some_methods_are_read_back_with_the_rest_pending_and_other_record_counts_refused(tmp_path, monkeypatch):
    import pandas as pd

    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path))
    _profile_for(monkeypatch, "smoke-part", read_only=True)
    model = load_model("paper-dry-llama")
    plan = lpes_at_power.Plan.of("smoke-part")
    paths = lpes_at_power._paths(plan, "paper-dry-llama", "float32")
    paths["claims"].parent.mkdir(parents=True)
    for name in ("test_differences", "claims"):
        pd.DataFrame({"method": ["LPES"]}).to_csv(paths[name], index=False)

    def stored(lpes: int):
        pd.DataFrame({"source": ["ours"] * 3 + ["paper"], "method": ["baseline", "LPES", "PI", "LPES"],
                      "records": [3, lpes, 3, np.nan]}).to_csv(paths["table1"], index=False)

    stored(3)
    pending = []
    found = lpes_at_power._tested(model, None, "smoke-part", plan, {"LPES": 3, "PI": 3, "Ms-PoE": 2}, "mdqa20", False, pending, True)
    assert list(found["claims"]["method"]) == ["LPES"]
    assert pending == ["test of Ms-PoE (the tables hold LPES, PI): lpes lpes-at-power test --profile smoke-part "
                       "--methods LPES PI Ms-PoE"]
    pending.clear()
    lpes_at_power._tested(model, None, "smoke-part", plan, {"LPES": 3, "PI": 3}, "mdqa20", False, pending, True)
    assert pending == []
    stored(2)
    with pytest.raises(ValueError, match=r"holds \{'baseline': 3, 'LPES': 2, 'PI': 3\} records per method, the profile 'smoke-part' asks"):
        lpes_at_power._tested(model, None, "smoke-part", plan, {"LPES": 3, "PI": 3, "Ms-PoE": 2}, "mdqa20", False, pending, True)
    stored(3)
    with pytest.raises(ValueError, match="rerun its test step"):  # a stored method the profile no longer asks for
        lpes_at_power._tested(model, None, "smoke-part", plan, {"LPES": 3}, "mdqa20", False, pending, True)


def test_a_computing_study_runs_every_step_and_refuses_tables_made_under_other_settings(tmp_path, monkeypatch):
    import pandas as pd

    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path))
    settings = dict(test_records=(("LPES", 2), ("PI", 2)), validation_records=2, spaces=("bezier", "linear"))
    _profile_for(monkeypatch, "smoke-all", **settings)
    found = lpes_at_power.study("smoke-all", progress=False)
    assert found["pending"] == [] and found["convergence"].groupby("space", sort=False)["seed"].unique().map(list).to_dict() == {
        "bezier": [0, 1], "linear": [0, 1]}
    assert found["validation"]["chosen"].sum() == 1 and (found["validation"]["validation_records"] == 2).all()
    assert set(found["claims"]["method"]) == {"LPES", "PI"} and (found["claims"]["n"] == 2).all()
    assert list(dict.fromkeys(found["test_differences"]["value"])) == ["correct", lpes_at_power.SHORT, "gold_logprob"]
    # the linear family against the unmodified model and Bézier on the validation records; the KV-75 curve on MDQA-20's test
    families = found["families"][found["families"]["position"] == "average"]
    assert list(zip(families.method, families.reference)) == [("bezier", "unmodified"), ("linear", "unmodified"), ("linear", "bezier")]
    assert (families["n"] == 2).all() and set(found["family_curves"]) == {"bezier", "linear"}
    transfer = found["transfer"]
    assert list(zip(transfer.method, transfer.reference)) == [("LPES (searched on kv75)", "baseline"), ("PI (searched on kv75)", "baseline"),
                                                              ("LPES (searched on kv75)", "PI (searched on kv75)")]
    assert (transfer["n"] == 2).all() and (transfer["searched_on"] == "kv75").all() and transfer["verdict"].str.startswith("no paper figure; ours: ").all()
    kv = json.loads((tmp_path / "results" / "smoke-all" / "lpes_at_power" / "chosen_scales_kv75_paper-dry-llama_float32.json").read_text())
    assert kv["dataset"] == "kv75" and kv["search_records"] == splits.records("kv75", "search", 1)
    text = lpes_at_power.conclusion(found, "smoke-all")
    assert all(f"**Search ({space}), seed {seed}**: generation 1 of 1" in text for space in ("bezier", "linear") for seed in (0, 1))
    assert all(f"**{r.method} − {r.reference}**" in text and r.verdict in text for r in found["claims"].itertuples())
    assert all(f"**Curve family {r.method} − {r.reference}**" in text for r in families.itertuples())
    assert all(f"*Length check, {m} − {ref}*" in text for m, ref in [("LPES", "baseline"), ("PI", "baseline"), ("LPES", "PI")])
    assert all(f"**Transfer, {r.method} − {r.reference}**" in text and r.verdict in text for r in transfer.itertuples())
    # the KV-75 curve on KV-75's own test part: plain labels, no length check, no paper rows, tables of their own
    in_domain = found["in_domain"]
    assert list(zip(in_domain.method, in_domain.reference)) == [("LPES", "baseline"), ("PI", "baseline"), ("LPES", "PI")]
    assert (in_domain["n"] == 2).all() and (in_domain["tested_on"] == "kv75").all()
    assert all(f"**In-domain KV75 test, {r.method} − {r.reference}**" in text and r.verdict in text for r in in_domain.itertuples())
    folder = tmp_path / "results" / "smoke-all" / "lpes_at_power"
    kv_test = pd.read_csv(folder / "test_differences_kv75_tested_on_kv75_paper-dry-llama_float32.csv")
    assert list(dict.fromkeys(kv_test["value"])) == ["correct", "gold_logprob"] and set(kv_test["n"]) == {2}
    kv_table = pd.read_csv(folder / "table1_kv75_tested_on_kv75_paper-dry-llama_float32.csv")
    assert (kv_table["source"] == "ours").all() and kv_table["records"].tolist() == [2, 2, 2]
    assert (folder / "claims_kv75_paper-dry-llama_float32.csv").exists()  # the transfer's tables keep their names
    # read back: the same tables, nothing evaluated
    monkeypatch.setattr("lpes_nb.evaluation.fitness.evaluate_samples", lambda *a, **k: pytest.fail("a stored study must not evaluate"))
    monkeypatch.setattr("lpes_nb.studies.position_map.evaluate_samples", lambda *a, **k: pytest.fail("a stored study must not evaluate"))
    again = lpes_at_power.study("smoke-all", progress=False)
    for table in ("claims", "families", "transfer", "in_domain"):
        pd.testing.assert_frame_equal(again[table], found[table], check_dtype=False)
    _profile_for(monkeypatch, "smoke-all", **settings | dict(test_records=(("LPES", 3), ("PI", 3))))
    with pytest.raises(ValueError, match=r"holds \{.*'LPES': 2.*records per method, the profile 'smoke-all' asks for \{'LPES': 3, 'PI': 3\}"):
        lpes_at_power.study("smoke-all", progress=False)
    _profile_for(monkeypatch, "smoke-all", **settings | dict(validation_records=3))
    with pytest.raises(ValueError, match="holds seeds \\[0, 1\\] on 2 validation records, the profile 'smoke-all' asks for \\[0, 1\\] on 3"):
        lpes_at_power.study("smoke-all", progress=False)


def test_the_test_refuses_dynamic_ntk_where_every_prompt_is_inside_its_window():
    """Inside the trained window Dynamic NTK keeps the base: hours of the baseline's answers, tabled as a
    method's. Refused, naming the longest prompt and the window; where a prompt passes the window it runs."""
    from lpes_nb.core.methods import DynamicNTK

    model, tokenizer = load_model("tiny-llama"), load_tokenizer("tiny-llama")
    window = model.config.max_position_embeddings
    inside = lpes_at_power.methods_for_test([1.0] * model.config.num_hidden_layers, ["baseline", "LPES", "Dynamic NTK"])
    with pytest.raises(ValueError, match=rf"Dynamic NTK changes nothing on its 2 test records on tiny-llama: the longest prompt, "
                                         rf"\d+ tokens, is inside the {window:,}-token window it grows from"):
        lpes_at_power.refuse_unchanged(model, tokenizer, "tiny-llama", inside, {"LPES": 2, "Dynamic NTK": 2}, items=5)
    shorter = {**inside, "Dynamic NTK": DynamicNTK(original_max_positions=64)}  # 5-document prompts pass 64 tokens
    lpes_at_power.refuse_unchanged(model, tokenizer, "tiny-llama", shorter, {"LPES": 2, "Dynamic NTK": 2}, items=5)

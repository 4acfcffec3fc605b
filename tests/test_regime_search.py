"""The search where the map shows a middle deficit: which regime, which sets, and the run end to end."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from lpes_nb.core.ga import GAConfig
from lpes_nb.evaluation.position_gate import gate
from lpes_nb.evaluation.tasks import TASKS
from lpes_nb.store.data import MDQA_RECORDS
from lpes_nb.studies import position_map, regime_search
from lpes_nb.studies.profiles import MapModel, PositionMap, RegimeSearch

TINY_GA = GAConfig(population=4, parents=2, mutations=1, crossovers=1, generations=1)


def _map(cells, model="m"):
    """A map table and its paired gate from (task, num_items, tokens, accuracies at the five
    positions), n = 30 records, record i right wherever i < accuracy x 30 (so differences are paired)."""
    rows = []
    for task, items, tokens, accs in cells:
        for i in range(30):
            for r, acc in zip(position_map.RELATIVE_POSITIONS, accs):
                rows.append({"model": model, "dtype": "float32", "task": task, "num_items": items, "position": round(r * (items - 1)),
                             "sample": i, "prompt_tokens": tokens, "correct": float(i < round(acc * 30)), "truncated": False})
    per_sample = pd.DataFrame(rows)
    cells = {f"{model} float32 {task}-{items}": position_map.with_nominal_positions(group)
             for (task, items), group in per_sample.groupby(["task", "num_items"], sort=False)}
    return position_map.summarize(per_sample), gate(cells).assign(source=position_map.FIXED_CELLS)


def test_the_regime_is_the_largest_paired_u():
    rs = RegimeSearch(TINY_GA, search_n=2, test_n=2)
    table, gated = _map([("kv", 20, 500, [0.9, 0.6, 0.4, 0.6, 0.9]),  # a 50-point U
                         ("kv", 78, 2000, [0.9, 0.5, 0.2, 0.5, 0.9]),  # a 70-point U: the regime
                         ("two_fact_block", 26, 600, [1.0, 0.5, 0.0, 0.5, 0.1]),  # larger ends - middle, but primacy
                         ("mdqa", 10, 1500, [0.6, 0.5, 0.45, 0.5, 0.6])])  # 15 points on 4 discordant records: no U
    regime = regime_search.choose_regime(table, gated, rs)
    assert (regime["task"], regime["num_items"], regime["verdict"]) == ("kv", 78, "U")
    assert regime["ends_minus_middle"] == pytest.approx(0.7) and regime["relative_position"] == 0.5
    # the transfer: MDQA on the same model at the length closest to the regime's
    assert regime_search.search_tasks(table, regime, rs) == [("kv", 78), ("mdqa", 10)]
    assert regime_search.search_tasks(table, regime, RegimeSearch(TINY_GA, 2, 2, transfer=False)) == [("kv", 78)]
    flat_table, flat_gated = _map([("kv", 20, 500, [0.9, 0.1, 0.1, 0.1, 0.1]), ("mdqa", 10, 1500, [0.6, 0.55, 0.6, 0.5, 0.6])])
    assert regime_search.choose_regime(flat_table, flat_gated, rs) is None  # no search where the gate finds no U
    dry = regime_search.choose_regime(flat_table, flat_gated, RegimeSearch(TINY_GA, 2, 2, require_u=False))
    assert (dry["task"], dry["num_items"], dry["verdict"]) == ("kv", 20, "primacy")  # dry runs: the largest difference


def test_search_and_test_sets_are_disjoint_and_at_the_ends_and_middle():
    rs = RegimeSearch(TINY_GA, search_n=200, test_n=500)
    search, test = rs.split("kv", 78)
    assert search.positions == test.positions == (0, 38, 77)
    assert {s.prompt for s in search.samples()[:20]}.isdisjoint({s.prompt for s in test.samples()[:20]})
    search, test = rs.split("mdqa", 20)
    assert (search.offset, search.n) == (300, MDQA_RECORDS - 300) and (test.offset, test.n) == (0, 300)
    assert test.offset + test.n <= search.offset  # MDQA records: test before the split, search after


@pytest.mark.parametrize("kwargs, match", [
    (dict(search_n=0), "search_n must be an integer >= 1, got 0"),
    (dict(seeds=(1, 1)), r"seeds must be distinct integers >= 0, got \(1, 1\)"),
    (dict(mdqa_split=441), r"mdqa_split must be in \[1, 440\], got 441"),
    (dict(require_u=1), r"require_u must be True or False, got 1"),
    (dict(test_seed=301), "search_seed and test_seed must differ"),
])
def test_bad_settings_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RegimeSearch(**{"ga": TINY_GA, "search_n": 2, "test_n": 2, **kwargs})


def test_the_search_runs_where_the_deficit_is_and_pairs_every_curve(tmp_path, monkeypatch):
    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path))
    # the plumbing, not the answers: a random model's 100-token answers only cost time; the budgets
    # still hold every gold answer (evaluate.check_answer_budget refuses less)
    for task, tokens in (("kv", 6), ("mdqa", 16)):
        monkeypatch.setitem(TASKS, task, replace(TASKS[task], answer_tokens=tokens))
    table, gated = _map([("kv", 6, 100, [0.9, 0.5, 0.1, 0.5, 0.9]), ("mdqa", 5, 900, [0.5] * 5)], model="tiny-llama")
    spec = PositionMap(models=(MapModel("tiny-llama", "float32", lengths=(96,), mdqa_docs=(5,)),), n=2, batch_size=4)
    rs = RegimeSearch(TINY_GA, search_n=1, test_n=3, seeds=(0, 1))
    regime = regime_search.choose_regime(table, gated, rs)
    found = regime_search.run_regime_search(spec, rs, table, regime, "smoke", progress=False)
    assert found["searches"][["task", "seed"]].values.tolist() == [["kv", 0], ["kv", 1], ["mdqa", 0], ["mdqa", 1]]
    lpes = found["scales"]["LPES kv s0"]
    np.testing.assert_allclose(found["scales"]["PI kv s0"], np.mean(lpes))  # PI: the curve's mean scale on every layer
    d = found["differences"]
    # 4 curves x 2 references x 2 test sets, each on the test set's 3 records, never a zero-width interval
    assert len(d) == 16 and set(d.reference) == {"baseline", "PI kv s0", "PI kv s1", "PI mdqa s0", "PI mdqa s1"}
    assert d.records.eq(3).all() and (d.ci_high > d.ci_low).all() and d.mde_80.gt(0).all()
    assert (tmp_path / "results" / "smoke" / "regime_search.csv").exists()

"""The length × position map: cell sizing, the summary table, the middle-deficit criterion."""

import numpy as np
import pandas as pd
import pytest

from lpes_nb import position_map
from lpes_nb.evaluate import encode


def _cell(task, num_items, accuracies, n=30, tokens=500):
    rows = []
    for r, acc in zip(position_map.RELATIVE_POSITIONS, accuracies):
        index = round(r * (num_items - 1))
        k = round(acc * n)
        for i in range(n):
            rows.append({"model": "m", "dtype": "float32", "task": task, "num_items": num_items, "position": index,
                         "sample": i, "prompt_tokens": tokens, "correct": float(i < k), "truncated": False,
                         "copies_first": float(i < 3), "copies_last": 0.0})
    return pd.DataFrame(rows)


def test_summary_has_exact_intervals_nominal_positions_and_rho():
    per_sample = pd.concat([_cell("kv", 78, [0.9, 0.5, 0.2, 0.5, 0.9]), _cell("kv", 17, [0.9, 0.8, 0.7, 0.6, 0.5], tokens=250)])
    table = position_map.summarize(per_sample)
    assert len(table) == 10 and set(table.relative_position) == set(position_map.RELATIVE_POSITIONS)
    assert (table.ci_high > table.ci_low).all() and table.n.eq(30).all()
    u = table[table.num_items == 78]
    assert u.rho.iloc[0] > 30  # a U
    assert u.set_index("relative_position").gold_index[0.5] == 38  # round(0.5 * 77): the nominal middle
    assert table.copies_first.eq(0.1).all()


def test_middle_deficit_needs_both_ends_and_clear_intervals():
    table = position_map.summarize(pd.concat([_cell("kv", 78, [0.9, 0.5, 0.2, 0.5, 0.9]),
                                              _cell("two_fact_block", 26, [0.9, 0.5, 0.2, 0.5, 0.25], tokens=600),
                                              _cell("mdqa", 10, [0.6, 0.5, 0.45, 0.5, 0.6], tokens=1500)]))
    d = position_map.middle_deficits(table).set_index("task")
    assert d.loc["kv", "deficit"] and d.loc["kv", "middle_deficit"] == pytest.approx(0.7)
    assert not d.loc["two_fact_block", "deficit"]  # the middle is below the start only: primacy, no U
    assert d.loc["mdqa", "middle_deficit"] >= 0.1 and not d.loc["mdqa", "deficit"]  # 15 points, overlapping intervals at n = 30


def test_items_for_length_hits_the_target_length(tokenizer):
    for task, target in (("kv", 512), ("two_fact_block", 1024)):
        cfg = position_map.items_for_length(task, target, tokenizer, n=3, seed=300)
        tokens = np.mean([len(encode(tokenizer, s)) for s in cfg.samples()])
        assert abs(tokens - target) / target < 0.15, (task, tokens)
        assert len(cfg.positions) == 5 and cfg.positions[0] == 0 and cfg.positions[-1] == cfg.num_items - 1


def test_record_cells_on_two_local_workers_equal_one_process(tmp_path, monkeypatch):
    """The map's record cell sharded over two spawned workers (each loading the model once) gives the
    table one process gives; the parent alone writes the store, and a rerun reads it."""
    from lpes_nb.data import data_dir
    from lpes_nb.models import load_model, load_tokenizer
    from lpes_nb.position_map import mdqa_records

    if not (data_dir() / "mdqa").is_dir():
        pytest.skip("needs the real MDQA records (../shared/data)")
    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path / "one"))
    one = mdqa_records(load_model("tiny-llama"), load_tokenizer("tiny-llama"), "tiny-llama", "float32", 5, range(4), 4,
                       "smoke", progress=False)
    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path / "two"))
    two = mdqa_records(None, None, "tiny-llama", "float32", 5, range(4), 4, "smoke", progress=False,
                       backend="processes", workers=2)
    assert len(one) == 4 * 7 and list(two["prediction"]) == list(one["prediction"])
    assert list(two["sample"]) == list(one["sample"]) == [r for r in range(4) for _ in range(7)]  # stored under its own id
    np.testing.assert_allclose(two["gold_logprob"], one["gold_logprob"], rtol=1e-5, atol=1e-5)
    again = mdqa_records(None, None, "tiny-llama", "float32", 5, range(4), 4, "smoke", progress=False,
                         backend="processes", workers=2)  # all stored: read back
    assert again.equals(two)

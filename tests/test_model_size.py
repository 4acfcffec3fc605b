"""Model size on the map's record cells: the larger model against the smaller on the same records,
and reading a model installed on demand where it is not installed."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from lpes_nb.store import models
from lpes_nb.store.models import QWEN, QWEN_15B
from lpes_nb.studies import model_size, position_map
from lpes_nb.studies.lpes_at_power import SHORT
from lpes_nb.studies.profiles import PROFILES, PositionMap, RecordCell

POSITIONS = (0, 5, 10, 14, 19)


def record_frame(middle_rate: float, records, seed: int, logprob: bool = True, filler: int = 0) -> pd.DataFrame:
    """A record cell's rows (MDQA-20 at the map's positions, plus closed-book and oracle); a right answer
    is the record's gold answer after ``filler`` words on its first line, a wrong one a short guess."""
    rng = np.random.default_rng(seed)
    answers = [r["answers"][0] for r in position_map.load_records("mdqa", 20)]
    rows = []
    for r in records:
        for p in POSITIONS:
            good = rng.random() < (0.8 if p in (0, 19) else middle_rate)
            rows.append({"sample": r, "condition": "documents", "position": p, "num_items": 20, "correct": float(good),
                         "prediction": " ".join(["maybe"] * filler + [answers[r]]) if good else "nobody knows",
                         "gold_logprob": (-0.5 if good else -3.0) if logprob else np.nan, "truncated": False})
        rows += [{"sample": r, "condition": c, "position": -1, "num_items": 20, "correct": 1.0, "prediction": answers[r],
                  "gold_logprob": -0.5 if logprob else np.nan, "truncated": False} for c in ("closed_book", "oracle")]
    return pd.DataFrame(rows).assign(dtype="bfloat16")


def spec_and_records(small: pd.DataFrame, large: pd.DataFrame) -> tuple[PositionMap, dict[str, pd.DataFrame]]:
    cells = (RecordCell(QWEN, "bfloat16", items=20, n=small["sample"].nunique()),
             RecordCell(QWEN_15B, "bfloat16", items=20, n=large["sample"].nunique()))
    return replace(PROFILES["cpu"].position_map, record_cells=cells), {cells[0].name: small, cells[1].name: large}


def test_the_larger_model_is_compared_on_its_records_per_score_and_the_table_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path))
    spec, records = spec_and_records(record_frame(0.2, range(200), 0), record_frame(0.8, range(60), 1, filler=12))
    table = model_size.size_table(spec, records, "smoke")
    assert set(table.value) == {"correct", SHORT, "gold_logprob"} and (table.n == 60).all()
    # the 1.5B's right answers start after 12 words: on the first 10 it is right nowhere, so lower everywhere
    within = table[(table.value == SHORT) & (table.position == "average")].iloc[0]
    assert within.method_mean == 0 and within.verdict == "lower"
    assert set(table.method) == {QWEN_15B} and set(table.reference) == {QWEN}
    shape = table[(table.value == "correct") & (table.position == "ends − middle")].iloc[0]
    assert shape.ci_high < 0 and shape.verdict == "lower"  # the 1.5B has no dip where the 0.5B has one
    assert (tmp_path / "results" / "smoke" / "position_size_differences.csv").is_file()
    text = model_size.size_conclusion(table)
    assert "n = 60 records, paired" in text and "shallower in the larger model" in text and "unadjusted" in text
    summaries = model_size.size_summaries(model_size.size_cells(spec, records)[("bfloat16", "mdqa", 20)])
    assert [int(s[s.relative_position.notna()].n.max()) for s in summaries.values()] == [60, 60]  # both on the 1.5B's records


def test_a_withdrawn_gold_score_is_compared_on_accuracy_only_and_one_model_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path))
    spec, records = spec_and_records(record_frame(0.5, range(40), 0, logprob=False), record_frame(0.5, range(40), 1))
    assert set(model_size.size_table(spec, records, "smoke").value) == {"correct", SHORT}
    alone = replace(spec, record_cells=spec.record_cells[:1])
    with pytest.raises(ValueError, match="no record cell is held by two models"):
        model_size.size_table(alone, records, "smoke")


def test_each_model_is_its_own_holm_family_in_the_gate():
    """A second model's cell (its map still growing) leaves the first model's Holm p where it was."""
    small = {f"{QWEN} bfloat16 mdqa-20": record_frame(0.3, range(80), 0), f"{QWEN} bfloat16 mdqa-10": record_frame(0.6, range(80), 2)}
    alone = pd.concat(position_map.record_gates(small))
    both = pd.concat(position_map.record_gates({**small, f"{QWEN_15B} bfloat16 mdqa-20": record_frame(0.79, range(10), 1)}))
    mine = both[both.cell.str.startswith(QWEN + " ")]
    np.testing.assert_array_equal(mine.p_holm.to_numpy(), alone.p_holm.to_numpy())


def test_an_absent_model_installed_on_demand_is_read_by_its_recorded_key(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "cache_dir", lambda: tmp_path)  # not converted here

    def missing(name):
        raise FileNotFoundError(f"the model {name!r} needs its wheels")

    monkeypatch.setattr(models, "embedded_parts", missing)
    assert models.absent(QWEN_15B) and not models.absent(QWEN)  # the 0.5B is installed by the README's commands
    assert models.recorded_key(QWEN_15B, "bfloat16") == {"model": QWEN_15B, "dtype": "bfloat16",
                                                         "weights": dict(models.EMBEDDED_MODELS[QWEN_15B].fingerprints)["bfloat16"]}
    assert models.recorded_key(QWEN, "bfloat16") is None
    with pytest.raises(FileNotFoundError, match=r"no fingerprint of it in float32 is recorded.*requirements-qwen15b.txt"):
        models.recorded_key(QWEN_15B, "float32")
    assert models.trained_window(QWEN_15B) == 32768


def test_a_record_cell_without_its_model_reads_what_is_stored_and_refuses_to_compute(tmp_path, monkeypatch):
    from lpes_nb.store.models import load_model, load_tokenizer

    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path))
    stored = position_map.record_cell(load_model("tiny-llama"), load_tokenizer("tiny-llama"), "tiny-llama", "float32", "mdqa", 5,
                                      range(2), 4, "smoke", progress=False)
    read = position_map.record_cell(None, None, "tiny-llama", "float32", "mdqa", 5, range(2), 4, "smoke", progress=False)
    assert read.equals(stored)
    with pytest.raises(FileNotFoundError, match=r"1 record\(s\) \(first: 2\) are not stored and the model is not loaded"):
        position_map.record_cell(None, None, "tiny-llama", "float32", "mdqa", 5, range(3), 4, "smoke", progress=False)


@pytest.mark.skipif(models.absent(QWEN_15B), reason="Qwen2.5-Coder-1.5B is installed on demand only (requirements-qwen15b.txt)")
@pytest.mark.slow
def test_the_recorded_fingerprint_and_window_are_the_installed_models():
    spec = models.EMBEDDED_MODELS[QWEN_15B]
    for dtype, weights in spec.fingerprints:
        assert models.model_fingerprint(models.load_model(QWEN_15B, dtype=dtype)) == weights
    assert models.trained_window(QWEN_15B) == spec.window


def test_a_record_cells_negative_states_its_mde_in_the_unit_printed_beside_it():
    cell = RecordCell(QWEN_15B, "bfloat16", items=20, n=40)
    frame = record_frame(0.8, range(40), 3).assign(prompt_tokens=3000)  # as good in the middle as at the ends: no deficit
    gated = pd.concat(position_map.record_gates({cell.name: frame}))
    text = position_map.record_cell_conclusion(cell, frame, gated, 32768)
    mde = gated[(gated.cell == cell.name) & (gated.value == "correct")].ends_minus_middle_mde.item()
    assert f"MDE {100 * mde:.2f}, first" in text and f"**no deficit at MDE {100 * mde:.2f}**" in text
    assert f"no deficit at MDE {mde:.3f}" not in text


def test_a_nats_interval_that_excludes_zero_is_printed_so():
    """Log-prob differences print to 2 decimals: to 1, a Holm 'higher' from +0.049 read '[+0.0, +0.6]'."""
    rows = [dict(cell="mdqa-20", value="gold_logprob", method=QWEN_15B, reference=QWEN, position=position, n=199,
                 dtype="bfloat16", difference=0.346, ci_low=0.049, ci_high=0.644, mde=0.42, p_holm=0.023, verdict="higher")
            for position in ("average", "ends − middle")]
    text = model_size.size_conclusion(pd.DataFrame(rows))
    assert "+0.35 nats [+0.05, +0.64], Holm p 0.023: higher" in text and "[+0.0," not in text

"""The result store: every expensive step is found by its key, a rerun recomputes nothing, and a
cached-only run (the published-run check) fails fast, naming the step, instead of recomputing."""

import dataclasses
import hashlib
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from lpes_nb.core.ga import BezierSpace, GAConfig
from lpes_nb.evaluation.moice import RouterTraining, load_or_train, router_digest
from lpes_nb.evaluation.tasks import TaskConfig
from lpes_nb.store import results
from lpes_nb.store.results import CACHED_ONLY, CacheMiss, cached_table
from lpes_nb.studies.search import SearchRun, run_search
from lpes_nb.workbook import plots

TASK = TaskConfig("kv", 4, n=2, key_format="letters6", value_format="digits4")
SMALL = GAConfig(population=6, parents=3, mutations=2, crossovers=1, generations=2, seed=1)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path))
    return tmp_path


def test_cached_table_is_keyed_by_its_parameters_and_written_once(store):
    calls = []

    def compute():
        calls.append(1)
        return pd.DataFrame({"x": [0.1, 2 / 3]})

    first = cached_table("t", {"a": 1}, compute, "smoke")
    again = cached_table("t", {"a": 1}, compute, "smoke")
    pd.testing.assert_frame_equal(first, again)
    assert len(calls) == 1
    cached_table("t", {"a": 2}, compute, "smoke")  # a changed parameter is a new step
    assert len(calls) == 2
    names = sorted(p.name for p in (store / "results" / "smoke").iterdir())
    assert len(names) == 4 and not [n for n in names if n.startswith(".")]  # CSV + JSON each, no temporaries
    params = json.loads((store / "results" / "smoke" / f"t-{results.cache_key(a=1)}.json").read_text())
    assert params == {"a": 1}


def test_a_result_computed_with_a_model_is_refused_without_its_weights_and_dtype(store):
    with pytest.raises(ValueError, match="model 'smollm2-135m' need its dtype and weight fingerprint: build them with "
                                         "lpes_nb.store.models.model_key"):
        cached_table("t", {"model": "smollm2-135m", "a": 1}, lambda: pytest.fail("computed"), "smoke")
    with pytest.raises(ValueError, match="model_key"):
        results.RecordTable("t", {"model": "smollm2-135m", "dtype": "float32"}, "smoke")
    assert not list((store / "results").rglob("t-*"))
    cached_table("t", {"model": "m", "dtype": "float32", "weights": "0123", "a": 1}, lambda: pd.DataFrame({"x": [1]}), "smoke")


def test_a_cache_miss_in_a_cached_only_run_fails_fast_naming_the_step(store, monkeypatch):
    cached_table("t", {"a": 1}, lambda: pd.DataFrame({"x": [1]}), "smoke")
    monkeypatch.setenv(CACHED_ONLY, "1")
    assert cached_table("t", {"a": 1}, lambda: pytest.fail("recomputed a stored table"), "smoke").x.tolist() == [1]
    with pytest.raises(CacheMiss, match=r"step 'probe_masking_ppl' is not in the result store .*probe_masking_ppl-"):
        cached_table("probe_masking_ppl", {"a": 1}, lambda: pytest.fail("computed under LPES_CACHED_ONLY"), "smoke")
    assert not list((store / "results" / "smoke").glob("probe_masking_ppl*"))  # nothing half-written


def test_a_finished_search_is_read_back_and_a_changed_parameter_is_a_new_search(tiny_llama, tokenizer, tmp_path, monkeypatch):
    space, run = BezierSpace(4), SearchRun(SMALL, tmp_path, "ga")
    with monkeypatch.context() as m:
        m.setenv(CACHED_ONLY, "1")
        with pytest.raises(CacheMiss, match="step 'GA search ga' is not in the result store"):
            run_search(tiny_llama, tokenizer, TASK, space, run, model_name="tiny-llama", progress=False)
    first = run_search(tiny_llama, tokenizer, TASK, space, run, model_name="tiny-llama", progress=False)
    checkpoints = list(tmp_path.glob("ga-*.ckpt.json"))
    assert len(checkpoints) == 1

    from lpes_nb.evaluation import fitness

    monkeypatch.setattr(fitness, "evaluate_samples", lambda *a, **k: pytest.fail("a finished search scored again"))
    monkeypatch.setenv(CACHED_ONLY, "1")
    again = run_search(tiny_llama, tokenizer, TASK, space, run, model_name="tiny-llama", progress=False)
    pd.testing.assert_frame_equal(again.history, first.history)
    with pytest.raises(CacheMiss, match="GA search ga"):  # one more generation: another key, so a miss
        run_search(tiny_llama, tokenizer, TASK, space, dataclasses.replace(run, ga=dataclasses.replace(SMALL, generations=3)),
                   model_name="tiny-llama", progress=False)


def test_router_training_is_a_stored_step(tiny_llama, tokenizer, tmp_path, monkeypatch):
    samples = TASK.samples()
    monkeypatch.setenv(CACHED_ONLY, "1")
    with pytest.raises(CacheMiss, match="MoICE router training"):
        load_or_train(tiny_llama, tokenizer, samples, RouterTraining(steps=1, batch_size=2), tmp_path / "r", progress=False)
    monkeypatch.delenv(CACHED_ONLY)
    load_or_train(tiny_llama, tokenizer, samples, RouterTraining(steps=1, batch_size=2), tmp_path / "r", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.safetensors"]
    monkeypatch.setenv(CACHED_ONLY, "1")
    load_or_train(tiny_llama, tokenizer, samples, RouterTraining(steps=1, batch_size=2), tmp_path / "r", progress=False)


def test_figures_and_json_are_byte_identical_when_redrawn(store):
    plots.use_style()

    def draw():
        fig, ax = plt.subplots()
        ax.plot([1, 2, 3], [0.2, 0.5, 0.4], marker="o", label="a")
        ax.set_title("same figure"); ax.legend()
        plots.save(fig, "determinism", "smoke", plots.stamp("qwen2.5-coder-0.5b", "bfloat16", "3 points"))
        plt.close(fig)
        return [(store / "figures" / "smoke" / f"determinism.{ext}").read_bytes() for ext in ("png", "pdf")]

    assert draw() == draw()
    assert plots.stamp("qwen2.5-coder-0.5b", torch.bfloat16, "3 records", "Wilson 95 % CIs") == (
        "Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, de-quantised, bfloat16) · 3 records · Wilson 95 % CIs")
    with pytest.raises(ValueError, match="figure 'unstamped': a stamp naming model, quantisation, dtype and n is required"):
        plots.save(plt.subplots()[0], "unstamped", "smoke", " ")
    wide, _ = plt.subplots(1, 3, figsize=(13, 3.6))
    plots.save(wide, "wide", "smoke", plots.stamp("qwen2.5-coder-0.5b", "bfloat16", "3 points, " * 20))  # a long stamp wraps
    narrow, ax = plt.subplots(figsize=(4, 3))
    ax.set_title("small", fontsize=6)
    with pytest.raises(ValueError, match=r"figure 'narrow': text at \[6\.0\] pt, below the 7 pt"):
        plots.save(narrow, "narrow", "smoke", "a stamp")
    weak, _ = plt.subplots(figsize=(3, 2))
    weak.suptitle("entropy by layer")
    plots.save(weak, "weak", "smoke", plots.stamp("smollm2-135m", "float32", "one window", exploratory="one window"))
    assert weak._suptitle.get_text() == "Exploratory (one window): entropy by layer"
    sizes = {name: Image.open(store / "figures" / "smoke" / f"{name}.png").size for name in ("determinism", "wide", "weak")}
    assert sizes["weak"][0] == 660  # drawn at 3 in: a single column
    assert sizes["determinism"][0] == 1380 and sizes["wide"][0] == 1380  # 6.9 in at 200 dpi: drawn at 6 and 13 in
    payload = {"b": [1.5, 2.0], "a": {"z": 1, "y": 0.1}}
    first = results.write_json(store / "p.json", payload).read_bytes()
    assert results.write_json(store / "p.json", dict(reversed(payload.items()))).read_bytes() == first



def test_stored_router_results_need_no_weights_until_one_is_computed(tiny_llama, tokenizer, tmp_path, monkeypatch):
    """git keeps the router's JSON, not its weights: its results are keyed by the training recipe, and
    the weights are retrained only when the method actually runs."""
    from lpes_nb.studies.benchmarks import method_key

    samples = TASK.samples()
    first = load_or_train(tiny_llama, tokenizer, samples, RouterTraining(steps=1, batch_size=2), tmp_path / "r", progress=False)
    (tmp_path / "r.safetensors").unlink()
    monkeypatch.setenv(CACHED_ONLY, "1")
    budget = RouterTraining(steps=1, batch_size=2)
    again = load_or_train(tiny_llama, tokenizer, samples, budget, tmp_path / "r", progress=False)
    assert again.router is None and method_key(again) == method_key(first) and len(budget.history) == 1
    with pytest.raises(CacheMiss, match="MoICE router training"):
        again.context(tiny_llama, 8, None)
    monkeypatch.delenv(CACHED_ONLY)
    with again.context(tiny_llama, 8, None):
        pass
    assert again.router is not None and (tmp_path / "r.safetensors").is_file() and method_key(again) == method_key(first)


def test_a_router_other_than_the_one_its_results_were_made_with_is_refused(tiny_llama, tokenizer, tmp_path):
    """A retraining on other hardware need not give the same bits: results stored under a recipe would
    then mix two routers. The JSON names the weights' digest; other weights are refused, loaded or retrained."""
    samples = TASK.samples()
    first = load_or_train(tiny_llama, tokenizer, samples, RouterTraining(steps=1, batch_size=2), tmp_path / "r", progress=False)
    info_path = tmp_path / "r.json"
    info = json.loads(info_path.read_text())
    assert info["router_digest"] == router_digest(first.router)
    info_path.write_text(json.dumps(info | {"router_digest": "0123456789abcdef"}))  # as if trained on another machine
    with pytest.raises(ValueError, match=f"its weights are {info['router_digest']}, its JSON names 0123456789abcdef"):
        load_or_train(tiny_llama, tokenizer, samples, RouterTraining(steps=1, batch_size=2), tmp_path / "r", progress=False)
    (tmp_path / "r.safetensors").unlink()
    again = load_or_train(tiny_llama, tokenizer, samples, RouterTraining(steps=1, batch_size=2), tmp_path / "r", progress=False)
    with pytest.raises(RuntimeError, match=f"its weights are {info['router_digest']}, but the results stored under this recipe "
                                           "were made by weights 0123456789abcdef"):
        again.context(tiny_llama, 8, None)
    assert json.loads(info_path.read_text())["router_digest"] == "0123456789abcdef" and not (tmp_path / "r.safetensors").exists()


def test_cache_key_is_canonical_and_refuses_numpy_reprs():
    from lpes_nb.core.methods import LayerScales
    from lpes_nb.store.results import cache_key

    assert cache_key(x=np.int64(3), y=np.float32(0.5), z=np.arange(2)) == cache_key(x=3, y=0.5, z=[0, 1])
    assert repr(LayerScales(np.array([1.0, 1.25]))) == "LayerScales(scales=[1.0, 1.25], label='LPES')"
    with pytest.raises(ValueError, match=r"numpy repr \(np\.float64\("):
        cache_key(method="LayerScales(scales=[np.float64(1.25)], label='LPES')")


def test_migrate_store_rekeys_numpy_reprs_without_recomputing(tmp_path):
    from lpes_nb.store.results import cache_key, migrate_store

    old_params = {"method": "LayerScales(scales=[np.float64(1.0), np.float64(1.25)], label='LPES')", "n": 3}
    old = hashlib.sha256(json.dumps(old_params, sort_keys=True, default=repr).encode()).hexdigest()[:20]
    (tmp_path / f"study_samples-{old}.json").write_text(json.dumps(old_params))
    (tmp_path / f"study_samples-{old}.csv").write_text("sample,correct\n0,1\n")
    (tmp_path / "other-0123456789abcdef0123.json").write_text(json.dumps({"n": 1}))  # clean: left alone
    new = cache_key(method="LayerScales(scales=[1.0, 1.25], label='LPES')", n=3)
    assert migrate_store(tmp_path) == [(f"study_samples-{old}", f"study_samples-{new}")]
    assert (tmp_path / f"study_samples-{new}.csv").read_text() == "sample,correct\n0,1\n"  # moved, not recomputed
    assert json.loads((tmp_path / f"study_samples-{new}.json").read_text())["method"].startswith("LayerScales(scales=[1.0, 1.25]")
    assert not list(tmp_path.glob(f"*{old}*")) and (tmp_path / "other-0123456789abcdef0123.json").exists()
    assert migrate_store(tmp_path) == []  # idempotent
    (tmp_path / "bad-00000000000000000000.json").write_text(json.dumps({"m": "np.float64(1.0)"}))
    with pytest.raises(ValueError, match="hash to .* not to the key in its name"):
        migrate_store(tmp_path)


def _table(tmp_path, monkeypatch):
    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path))
    table = results.RecordTable("t", {"x": 1}, "smoke")
    for record in range(4):
        table.append(record, [{"record": record, "correct": 1.0}])
    return table


def test_a_record_table_refuses_a_damaged_line_before_the_last_and_keeps_every_record(tmp_path, monkeypatch):
    """Issue #99's data loss: a line torn in the middle used to drop every valid record after it, and
    the next append rewrote the file without them. Now it is refused with its line number, and the
    file is left as it was."""
    table = _table(tmp_path, monkeypatch)
    lines = table.path.read_text().splitlines(keepends=True)
    lines[1] = lines[1][:15] + "\n"
    table.path.write_text("".join(lines))
    before = table.path.read_bytes()
    with pytest.raises(ValueError, match=r"line 2 of 4: not a record's JSON"):
        table.done()
    with pytest.raises(ValueError, match=r"line 2 of 4"):
        table.append(9, [{"record": 9}])
    assert table.path.read_bytes() == before  # nothing rewritten, nothing appended


def test_a_torn_last_line_is_set_aside_reported_and_its_record_computed_again(tmp_path, monkeypatch, capsys):
    table = _table(tmp_path, monkeypatch)
    whole = table.path.read_bytes()
    table.path.write_bytes(whole + b'{"record": 4, "rows": [{"rec')  # an append killed midway
    assert table.done() == {0, 1, 2, 3}
    table.append(4, [{"record": 4, "correct": 0.0}])
    assert "set aside a torn last line" in capsys.readouterr().out
    assert table.path.read_bytes().startswith(whole)  # appended, never rewritten
    assert table.done() == {0, 1, 2, 3, 4}
    assert table.path.with_name(table.path.name + ".torn").read_text() == '{"record": 4, "rows": [{"rec\n'
    assert list(table.frame()["record"]) == [0, 1, 2, 3, 4]


def test_a_record_is_appended_once(tmp_path, monkeypatch):
    table = _table(tmp_path, monkeypatch)
    with pytest.raises(ValueError, match=r"record 2 is stored in .* already"):
        table.append(2, [{"record": 2}])



def test_paired_difference_panels_wrap_long_names_and_keep_their_rows_clear():
    """Two panels share a column's width: a long method name is wrapped (notebook 6's ran off the page),
    and the identical-row note is said under the axis, not in a legend box over the last row."""
    plots.use_style()
    names = ["MoICE (per-head router, task-trained)", "Dynamic NTK", "LPES"]
    diffs = pd.DataFrame([dict(method=m, reference=r, difference=0.1, ci_low=-0.05, ci_high=0.2, mde_80=0.1, records=30,
                               identical=(m, r) == ("Dynamic NTK", "baseline")) for r in ("baseline", "PI") for m in names])
    fig = plots.difference_intervals(diffs, "t")
    left, right = fig.axes
    labels = [t.get_text() for t in left.get_yticklabels()]
    assert labels[0] == "MoICE (per-head router,\ntask-trained)" and all(len(line) <= 24 for t in labels for line in t.split("\n"))
    assert left.get_legend() is None and "identical to the reference" in left.get_xlabel()
    assert "identical" not in right.get_xlabel()  # said only where a row is
    plt.close(fig)

def test_every_committed_figure_is_a_column_wide():
    """Printed at 3.3 or 6.9 inches, a figure's fonts keep the sizes the style gives them (>= 7 pt)."""
    widths = {p.name: Image.open(p).size[0] for p in sorted((results.project_root() / "figures").glob("*.png"))}
    assert widths and {w for w in widths.values()} <= {660, 1380}, {n: w for n, w in widths.items() if w not in (660, 1380)}


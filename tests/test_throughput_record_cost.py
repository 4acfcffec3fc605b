"""The per-record cost of two models measured side by side, stored per CPU (issue #101's cost plan)."""

import json

from lpes_nb.operations import throughput
from lpes_nb.system.machine import describe_cpu


def test_record_cost_times_both_models_on_the_same_records_and_keeps_other_cpus(tmp_path):
    out = tmp_path / "record_cost.json"
    here = describe_cpu()["cpu"]
    out.write_text(json.dumps([{"cpu": {"cpu": "another CPU"}, "dtype": "float32"}, {"cpu": {"cpu": here}, "dtype": "float32"}]))
    entry = throughput.record_cost(models=("tiny-llama", "tiny-qwen2"), dtype="float32", records=(3,), out=out, tokens=512,
                                   cells=(("mdqa", 5),))
    assert set(entry["seconds"]) == {"tiny-llama", "tiny-qwen2"}
    assert all(len(v) == 1 and v[0] > 0 for cells in entry["seconds"].values() for v in cells.values())
    assert set(entry["record_ratio"]) == {"mdqa-5"} and entry["flop_ratio"] > 0
    stored = json.loads(out.read_text())  # this CPU's old entry replaced, the other CPU's kept
    assert [e["cpu"]["cpu"] for e in stored] == ["another CPU", here] and stored[-1]["records"] == {"mdqa-5": [3]}


def test_a_cell_timed_later_joins_the_cells_this_cpu_already_has(tmp_path):
    out = tmp_path / "record_cost.json"
    models = ("tiny-llama", "tiny-qwen2")
    throughput.record_cost(models=models, dtype="float32", records=(3,), out=out, tokens=512, cells=(("mdqa", 5),))
    first = json.loads(out.read_text())[-1]
    entry = throughput.record_cost(models=models, dtype="float32", records=(4,), out=out, tokens=512, cells=(("mdqa", 10),))
    assert set(entry["record_ratio"]) == {"mdqa-5", "mdqa-10"}
    assert entry["seconds"]["tiny-qwen2"]["mdqa-5"] == first["seconds"]["tiny-qwen2"]["mdqa-5"]  # kept, not re-timed
    assert entry["records"] == {"mdqa-5": [3], "mdqa-10": [4]}
    assert len(json.loads(out.read_text())) == 1

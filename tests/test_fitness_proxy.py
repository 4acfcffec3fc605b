"""The proxy-fitness check: candidates on the search part only, both fitnesses from one generate run,
stored per (candidate, record) and resumed, a degenerate set of candidates refused."""

import pytest

from lpes_nb.store import splits
from lpes_nb.store.models import load_model, load_tokenizer
from lpes_nb.store.results import CACHED_ONLY
from lpes_nb.studies import fitness_proxy



def test_candidates_are_seeded_curves_of_the_search_space():
    model = load_model("tiny-llama")
    a, b = fitness_proxy.candidates(model, 15, seed=1), fitness_proxy.candidates(model, 15, seed=1)
    assert a == b and len({tuple(c) for c in a}) == 15 and all(len(c) == model.config.num_hidden_layers for c in a)
    assert fitness_proxy.candidates(model, 15, seed=2) != a
    assert fitness_proxy.fitness_positions(20) == (0, 10, 19) and fitness_proxy.fitness_positions(75) == (0, 37, 74)


def test_the_check_runs_on_the_search_part_stores_each_record_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path))
    model, tokenizer = load_model("tiny-llama"), load_tokenizer("tiny-llama")
    args = dict(model=model, tokenizer=tokenizer, model_name="tiny-llama", dtype="float32", dataset="mdqa20", k=15, n=2,
                items=5, batch_size=4, profile="smoke", progress=False)
    # a random model answers nothing right: every candidate's accuracy is 0, which cannot rank them
    with pytest.raises(ValueError, match="same for every candidate"):
        fitness_proxy.run(**args)
    stored = sorted(tmp_path.rglob("fitness_proxy_records-*.jsonl"))
    assert len(stored) == 15  # one record table per candidate
    search = set(splits.records("mdqa20", "search", 2))
    table = fitness_proxy.candidate_table("tiny-llama", "float32", "mdqa20", 5, fitness_proxy.candidates(model, 15)[0], 4,
                                          "smoke", fitness_proxy.PREFILL_CHUNK)
    assert table.done() == search  # the search part's records, and only those
    frame = table.frame(sorted(search))
    assert sorted(frame["position"].unique()) == [0, 2, 4] and frame["gold_logprob"].notna().all()
    monkeypatch.setenv(CACHED_ONLY, "1")  # a rerun computes nothing: every record is read back
    with pytest.raises(ValueError, match="same for every candidate"):
        fitness_proxy.run(**args)
    with pytest.raises(ValueError, match="records hold 75 pairs"):
        fitness_proxy.run(**{**args, "dataset": "kv75", "items": 20})
    with pytest.raises(ValueError, match=r"asked for n=61 records of mdqa20/search, which holds 60"):
        fitness_proxy.run(**{**args, "n": 61})


def test_the_summary_keeps_the_whole_model_name(tmp_path, monkeypatch):
    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path))
    csv, json = fitness_proxy.summary_paths("smoke", "mdqa20", 20, "qwen2.5-coder-0.5b", "bfloat16")
    assert (csv.name, json.name) == ("fitness_proxy_mdqa20_20_qwen2.5-coder-0.5b_bfloat16.csv",
                                     "fitness_proxy_mdqa20_20_qwen2.5-coder-0.5b_bfloat16.json")

"""Exported scales carry the model they were found on and the search that found them; read back on
another model they are refused (a 30-layer curve on another 30-layer model is a silent mistake)."""

import json

import pytest

from lpes_nb.core.ga import BezierSpace, GAConfig
from lpes_nb.evaluation.tasks import TaskConfig
from lpes_nb.store.models import load_model, load_tokenizer, model_identity
from lpes_nb.store.results import read_scales, save_scales
from lpes_nb.studies.search import SearchRun, run_search

TASK = TaskConfig("kv", 4, n=2, key_format="letters6", value_format="digits4")
SMALL = GAConfig(population=6, parents=3, mutations=2, crossovers=1, generations=1, seed=1)


def test_a_search_exports_its_scales_with_the_models_identity_and_its_provenance(tmp_path):
    model, tokenizer = load_model("tiny-llama"), load_tokenizer("tiny-llama")
    run_search(model, tokenizer, TASK, BezierSpace(model.config.num_hidden_layers), SearchRun(SMALL, tmp_path, "ga"),
               model_name="tiny-llama", progress=False)
    path = tmp_path / "ga_best.json"
    stored = json.loads(path.read_text())
    here = model_identity(model, "tiny-llama")
    assert stored["model"] == here and here["rope_theta"] == 10000.0 and here["layers"] == model.config.num_hidden_layers
    assert stored["task"] == repr(TASK) and stored["ga"] == repr(SMALL) and stored["checkpoint"].endswith(".ckpt.json")
    assert read_scales(path, model=here)["scales"] == pytest.approx(stored["scales"])

    other = model_identity(load_model("tiny-qwen2"), "tiny-qwen2")
    with pytest.raises(ValueError, match=r"found on another model than 'tiny-qwen2': .*rope_theta 10000.0 \(here 1000000.0\)"):
        read_scales(path, model=other)
    renamed = {**here, "name": "my-llama"}  # same shapes, another model: still refused, by name
    with pytest.raises(ValueError, match=r"name 'tiny-llama' \(here 'my-llama'\)"):
        read_scales(path, model=renamed)


def test_a_curve_that_names_no_model_is_checked_by_its_layer_count(tmp_path):
    here = model_identity(load_model("tiny-llama"), "tiny-llama")
    drawn = save_scales(tmp_path / "explorer.json", [1.5] * here["layers"], source="explorer")
    assert read_scales(drawn, model=here)["scales"] == [1.5] * here["layers"]
    short = save_scales(tmp_path / "short.json", [1.5] * (here["layers"] - 1), source="explorer")
    with pytest.raises(ValueError, match=f"holds {here['layers'] - 1} scales, the model has {here['layers']} layers"):
        read_scales(short, model=here)

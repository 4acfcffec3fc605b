"""The GA's fitness on workers (a process pool, Ray actors): the same history as in-process, each
worker loads its model once, and no model weights travel."""

import functools

import numpy as np
import pandas as pd
import pytest

from lpes_nb.core.ga import BezierSpace, GAConfig, GeneticSearch, TargetCurveFitness
from lpes_nb.evaluation.distributed import FitnessSpec, ProcessPoolFitness, RayFitness
from lpes_nb.evaluation.tasks import EvalSettings, TaskConfig
from lpes_nb.store.models import load_model, load_tokenizer
from lpes_nb.studies.search import SearchRun, run_search

L = 8
TASK = TaskConfig("kv", 4, n=2, key_format="letters6", value_format="digits4")
SMALL = GAConfig(population=6, parents=3, mutations=2, crossovers=1, generations=2, seed=1)


def test_process_pool_gives_the_in_process_history():
    target = tuple(np.linspace(1.2, 1.8, L))
    cfg = GAConfig(seed=3, generations=2)
    ref = GeneticSearch(BezierSpace(L), TargetCurveFitness(target), cfg, progress=False).run()
    with ProcessPoolFitness(functools.partial(TargetCurveFitness, target), workers=2, progress=False) as fitness:
        par = GeneticSearch(BezierSpace(L), fitness, cfg, progress=False).run()
    pd.testing.assert_frame_equal(par.history, ref.history)


def test_ray_actors_give_the_in_process_history_load_once_and_ship_no_weights(tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install lpes-nb[ray]")
    model, tokenizer = load_model("tiny-llama"), load_tokenizer("tiny-llama")
    space = BezierSpace(4)
    ref = run_search(model, tokenizer, TASK, space, SearchRun(SMALL, tmp_path / "ref", "ga"), model_name="tiny-llama",
                     progress=False)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=80 * 2**20)
    try:
        spec = FitnessSpec("tiny-llama", TASK, EvalSettings(), tie_break=1e-3, dtype="float32")
        with RayFitness(spec, actors=2, progress=False) as fitness:
            par = GeneticSearch(space, fitness, SMALL, progress=False).run()
            stats = fitness.stats()
            used = ray.cluster_resources()["object_store_memory"] - ray.available_resources()["object_store_memory"]
    finally:
        ray.shutdown()
    pd.testing.assert_frame_equal(par.history, ref.history)
    assert len({s["pid"] for s in stats}) == 2 and [s["model_loads"] for s in stats] == [1, 1]
    assert sum(s["scored"] for s in stats) == par.evaluations and all(s["scored"] > 0 for s in stats)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert used < weights / 10  # the tiny model's 6.4 MB never entered the object store


def test_run_search_on_a_process_pool_equals_in_process_and_shares_its_checkpoints(tmp_path):
    model, tokenizer = load_model("tiny-llama"), load_tokenizer("tiny-llama")
    space = BezierSpace(4)
    full = run_search(model, tokenizer, TASK, space, SearchRun(SMALL, tmp_path / "a", "ga"), model_name="tiny-llama", progress=False)
    with pytest.raises(ValueError, match="backend 'processes' needs model_name"):
        run_search(model, tokenizer, TASK, space, SearchRun(SMALL, tmp_path / "b", "ga", backend="processes"))
    pooled = run_search(model, tokenizer, TASK, space, SearchRun(SMALL, tmp_path / "b", "ga", backend="processes", workers=2),
                        model_name="tiny-llama", progress=False)
    pd.testing.assert_frame_equal(pooled.history, full.history)
    # the in-process run's checkpoint has the workers' fingerprint: the pool reloads it, scores nothing
    again = run_search(model, tokenizer, TASK, space, SearchRun(SMALL, tmp_path / "a", "ga", backend="processes", workers=1),
                       model_name="tiny-llama", progress=False)
    pd.testing.assert_frame_equal(again.history, full.history)


def test_a_logprob_fitness_search_runs_on_workers_as_in_process(tmp_path):
    """The fitness's value and prefill chunk travel to the workers (whose fitness must have this
    process's fingerprint)."""
    model, tokenizer = load_model("tiny-llama"), load_tokenizer("tiny-llama")
    space, score = BezierSpace(4), EvalSettings(mode="score")
    run = SearchRun(SMALL, tmp_path / "a", "ga", settings=score, tie_break=0.0, value="gold_logprob", prefill_chunk=5)
    local = run_search(model, tokenizer, TASK, space, run, model_name="tiny-llama", progress=False)
    assert (local.history["fitness"] < 0).all()  # a log-probability, not an accuracy
    pooled = run_search(model, tokenizer, TASK, space, SearchRun(**{**run.__dict__, "out_dir": tmp_path / "b", "backend": "processes"}),
                        model_name="tiny-llama", progress=False)
    pd.testing.assert_frame_equal(pooled.history, local.history)
    accuracy = run_search(model, tokenizer, TASK, space, SearchRun(SMALL, tmp_path / "a", "ga", settings=score, tie_break=0.0),
                          model_name="tiny-llama", progress=False)
    assert len(list((tmp_path / "a").glob("ga-*.ckpt.json"))) == 2 and not accuracy.history.equals(local.history)

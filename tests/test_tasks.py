"""Named task settings: samples, positions, disjoint search/test sets, errors."""

import pytest

from lpes_nb.evaluation.tasks import TaskConfig
from lpes_nb.store import data
from lpes_nb.studies.profiles import PROFILES, profile

def test_kv_task_has_every_record_at_every_position():
    cfg = TaskConfig("kv", 10, n=4, seed=3)
    samples = cfg.samples()
    assert cfg.gold_positions() == [0, 4, 9] and len(samples) == 12
    for s in samples:
        gold = s.answers[0]
        assert s.prompt[slice(*s.spans[s.position])].endswith(f'"{gold}"')
    assert samples == TaskConfig("kv", 10, n=4, seed=3).samples()


@pytest.mark.parametrize("name", ["smoke", "cpu"])
def test_search_and_test_sets_of_each_profile_are_disjoint(name):
    prof = PROFILES[name]
    assert not {s.prompt for s in prof.search.samples()} & {s.prompt for s in prof.test.samples()}


def test_mdqa_and_long_text_tasks():
    mdqa = TaskConfig("mdqa", 10, n=2, offset=5).samples()
    assert [s.sample_id for s in mdqa] == [5, 6] * 3 and [s.position for s in mdqa] == [0, 0, 4, 4, 9, 9]
    two = TaskConfig("two_fact", 50, n=2, seed=1).samples()
    assert len(two) == 6 and all("Question: Where is the" in s.prompt for s in two)


def test_passkey_task_positions_are_depths():
    samples = TaskConfig("passkey", 21, n=2).samples()
    assert sorted({s.position for s in samples}) == [0, 10, 20]
    first = [s for s in samples if s.position == 0][0]
    assert first.prompt.index("The pass key is") < first.prompt.index(data.PASSKEY_FILLER)


def test_bad_task_settings_are_named():
    with pytest.raises(ValueError, match="unknown task 'qa'"):
        TaskConfig("qa")
    with pytest.raises(ValueError, match=r"gold position 10 is outside \[0, 9\]"):
        TaskConfig("kv", 10, positions=(0, 10))
    with pytest.raises(ValueError, match="unknown profile 'tpu'"):
        profile("tpu")


def _import_profiles_with(old: str, new: str):
    """Import a copy of lpes_nb/studies/profiles.py with one edit, as a module of the package."""
    import importlib.util
    import inspect
    import sys

    from lpes_nb.studies import profiles

    source = inspect.getsource(profiles)
    assert source.count(old) >= 1, old
    spec = importlib.util.spec_from_loader("lpes_nb.studies._edited_profiles", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "lpes_nb.studies"
    sys.modules[spec.name] = module  # dataclasses resolve annotations through it
    try:
        exec(compile(source.replace(old, new, 1), "profiles.py", "exec"), module.__dict__)
    finally:
        del sys.modules[spec.name]
    return module


def test_profiles_are_typed_and_checked_when_the_module_loads():
    assert set(PROFILES) == {"smoke", "cpu", "gpu", "gpu-dry", "paper", "paper-dry"} and all(p.name == n for n, p in PROFILES.items())
    assert _import_profiles_with("recall_n=30", "recall_n=30").PROFILES["cpu"].probes.recall_n == 30
    with pytest.raises(TypeError, match="recal_n"):  # a misspelt key fails at import
        _import_profiles_with("recall_n=30", "recal_n=30")
    with pytest.raises(ValueError, match=r"Probes.window must be a positive int, got 0"):
        _import_profiles_with("window=512", "window=0")
    with pytest.raises(ValueError, match=r"Attention.scales must be a non-empty tuple of non-negative floats, got \[1.0\]"):
        _import_profiles_with("scales=(1.0, 1.25, 1.5, 1.75, 2.0, 3.0)", "scales=[1.0]")


def test_a_new_task_is_one_registered_entry(tiny_llama, tokenizer, monkeypatch):
    from lpes_nb.store.data import Sample
    from lpes_nb.evaluation.evaluate import evaluate_samples
    from lpes_nb.evaluation.tasks import TASKS, EvalSettings, Task

    def build(cfg, positions, data_dir):
        return [Sample("echo", i, p, cfg.num_items, f"Repeat {i}:", (str(i),)) for p in positions for i in range(cfg.n)]

    monkeypatch.setitem(TASKS, "echo", Task(build, lambda pred, answers: float(pred.strip() == answers[0]), answer_tokens=2,
                                            first_line=True))
    samples = TaskConfig("echo", 5, n=2).samples()
    assert [s.position for s in samples] == [0, 0, 2, 2, 4, 4]
    df = evaluate_samples(tiny_llama, tokenizer, samples, settings=EvalSettings(mode="generate", max_new_tokens=2), progress=False)
    assert len(df) == 6 and df.correct.isin([0.0, 1.0]).all()


def test_a_config_picks_one_part_of_the_split_by_record():
    from lpes_nb.store import splits

    parts = {part: TaskConfig.from_split("mdqa20", part, 5, num_items=6) for part in ("search", "validation", "test")}
    ids = {part: {s.sample_id for s in cfg.samples()} for part, cfg in parts.items()}
    for part, cfg in parts.items():
        assert ids[part] == set(splits.records("mdqa20", part, 5)) and cfg.n == 5 and cfg.num_items == 6
        samples = cfg.samples()
        assert len(samples) == 15 and sorted({s.position for s in samples}) == [0, 2, 5]
        # the same record as the map builds it (its id and its question), whatever part it is in
        record = data.load_mdqa()[samples[0].sample_id]
        assert samples[0].prompt == data.mdqa_sample(record, 0, 6, samples[0].sample_id).prompt
    assert not (ids["search"] & ids["validation"] or ids["search"] & ids["test"] or ids["validation"] & ids["test"])
    kv = TaskConfig.from_split("kv75", "test", 2)
    assert kv.source == "file" and {s.sample_id for s in kv.samples()} == set(splits.records("kv75", "test", 2))
    with pytest.raises(ValueError, match="hold 75 pairs"):
        TaskConfig.from_split("kv75", "test", 2, num_items=20)
    with pytest.raises(ValueError, match="60"):
        TaskConfig.from_split("mdqa20", "search", 61)


def test_records_are_checked_and_left_out_of_the_repr_while_unset():
    # stored results are keyed by this repr, from before ``records`` existed: it must not move
    assert repr(TaskConfig("mdqa", 20, n=3)) == ("TaskConfig(task='mdqa', num_items=20, n=3, positions=None, seed=0, offset=0, "
                                                 "key_format='letters6', value_format='digits4', source='generated')")
    assert repr(TaskConfig("mdqa", 20, n=2, records=(4, 9))).endswith("source='generated', records=(4, 9))")
    for bad, match in [(dict(records=(1, 1), n=2), "distinct"), (dict(records=[1], n=1), "tuple"), (dict(records=(-1,), n=1), "distinct"),
                       (dict(records=(1, 2), n=3), "n is their number"), (dict(records=(1,), n=1, offset=2), "offset 0"),
                       (dict(records=(1,), n=1, task="passkey"), "picks real records"),
                       (dict(records=(1,), n=1, task="kv"), "picks real records")]:
        with pytest.raises(ValueError, match=match):
            TaskConfig(**{"task": "mdqa", "num_items": 20, **bad})
    with pytest.raises(ValueError, match="record 441 is not in the file"):
        TaskConfig("mdqa", 5, n=1, records=(441,)).samples()

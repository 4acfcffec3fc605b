"""A sweep of bad inputs over the public API: each must raise a ValueError whose message names the
bad value (or what is wrong with it) and, where there is one, the allowed range. None may return a
result or fail with an unrelated error."""

import gzip

import numpy as np
import pandas as pd
import pytest
import torch

from lpes_nb.core import bezier, methods, rope
from lpes_nb.evaluation import evaluate, fitness, metrics, position_gate, tasks
from lpes_nb.store import data, models, results
from lpes_nb.studies import benchmarks, probes
from lpes_nb.core.ga import (
    BezierSpace,
    GAConfig,
    GeneticSearch,
    PerLayerSpace,
    TargetCurveFitness,
)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Data folders with an empty, a corrupt (invalid UTF-8) and a truncated gzip of each file kind."""
    root = tmp_path_factory.mktemp("bad")
    made = {}
    for kind, content in (("empty", b""), ("binary", b"\xff\xfe\x00garbage\xff"), ("truncated", None)):
        d = root / kind
        for rel in (data.MDQA_FILE, data.KV_FILE, data.TEXT_FILE):
            f = d / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            if content is None:
                f.write_bytes(gzip.compress(b'{"a": 1}\n' * 100)[:20])
            else:
                with gzip.open(f, "wb") as g:
                    g.write(content)
        made[kind] = d
    ckpt = root / "ckpt"
    ckpt.mkdir()
    (ckpt / "empty.json").write_text("")
    (ckpt / "truncated.json").write_text('{"fingerprint": "ab')
    (ckpt / "other.json").write_text('{"something": 1}')
    (ckpt / "scales.json").write_text('{"scales": [1.5, NaN]}')
    (ckpt / "scales_string.json").write_text('{"scales": "2222"}')
    made["ckpt"] = ckpt
    return made


# an MDQA-shaped record (a gold document and 19 distractors) for the argument checks that need no file
_MDQA_RECORD = {"question": "q?", "answers": ["a"],
                "ctxs": [{"title": f"t{i}", "text": "x", "isgold": i == 0} for i in range(20)]}


def _search(checkpoint):
    return GeneticSearch(BezierSpace(6), TargetCurveFitness((1.5,) * 6), GAConfig(generations=1), checkpoint=checkpoint,
                         progress=False)


CASES = {
    # RoPE specs and patches
    "scale 0": (lambda f: rope.RopeSpec(scale=0), r"RoPE scale must be a finite number > 0, got 0"),
    "scale nan": (lambda f: rope.RopeSpec(scale=float("nan")), r"got nan"),
    "scale string": (lambda f: rope.RopeSpec(scale="1.5"), r"got '1.5'"),
    "base 1": (lambda f: rope.RopeSpec(base=1.0), r"RoPE base must be > 1, got 1.0"),
    "base -5": (lambda f: rope.RopeSpec(base=-5), r"got -5"),
    "coarsen 0": (lambda f: rope.RopeSpec(coarsen=0), r"integer >= 1, got 0"),
    "coarsen 2.5": (lambda f: rope.RopeSpec(coarsen=2.5), r"got 2.5"),
    "mask string": (lambda f: rope.RopeSpec(mask="False"), r"mask must be True or False, got 'False'"),
    "remap not callable": (lambda f: rope.RopeSpec(remap=3), r"remap must be callable.*got 3"),
    "heads empty": (lambda f: rope.RopeSpec(heads=()), r"one scale per key/value head"),
    "heads negative": (lambda f: rope.RopeSpec(heads=(1.0, -1.0)), r"head scale .* got -1.0"),
    "scale_specs string": (lambda f: rope.scale_specs("1.5"), r"sequence of numbers, one per layer, got '1.5'"),
    "scale_specs number": (lambda f: rope.scale_specs(1.5), r"got 1.5"),
    "specs count": (lambda f: rope.normalize_specs([rope.IDENTITY] * 3, 4), r"got 3 RoPE specs .* 4 layers"),
    "spec layer index": (lambda f: rope.normalize_specs({7: rope.IDENTITY}, 4), r"layer index 7 is out of range \[0, 3\]"),
    "spec not a spec": (lambda f: rope.normalize_specs([1.5, None], 2), r"RopeSpec or None, got 1.5"),
    # Bézier curves and the GA
    "control point x": (lambda f: bezier.validate_control_points([[0, 1.5], [40, 1.5]], 30), r"x\[1\] = 40 .* \[0, 29\]"),
    "control point y": (lambda f: bezier.validate_control_points([[0, 1.5], [29, 2.5]], 30), r"y\[1\] = 2.5 .* \[1, 2\]"),
    "control x order": (lambda f: bezier.validate_control_points([[5, 1.5], [3, 1.5]], 30), r"strictly increasing"),
    "control nan": (lambda f: bezier.validate_control_points([[0, float("nan")], [3, 1.5]], 30), r"finite"),
    "num_layers 1": (lambda f: bezier.validate_control_points([[0, 1.5], [1, 1.5]], 1), r"num_layers must be an integer >= 2, got 1"),
    "curve type": (lambda f: BezierSpace(30, curve="spline"), r"unknown curve type 'spline'"),
    "per-layer y_step 0.3": (lambda f: PerLayerSpace(6, y_step=0.3), r"y_range end 1 is not a multiple of y_step=0.3"),
    "bezier y_step 0.3": (lambda f: BezierSpace(6, y_step=0.3), r"y_range end 1 is not a multiple of y_step=0.3"),
    "y_range reversed": (lambda f: PerLayerSpace(6, y_range=(2.0, 1.0)), r"0 < low < high, got \(2.0, 1.0\)"),
    "y_range zero": (lambda f: BezierSpace(6, y_range=(0.0, 2.0)), r"0 < low < high, got \(0.0, 2.0\)"),
    "per-layer num_layers": (lambda f: PerLayerSpace(0), r"num_layers must be an integer >= 1, got 0"),
    "GA my below step": (lambda f: GAConfig(my=0.04), r"my must be 0 or a positive multiple of y_step=0.1, got 0.04"),
    "GA my off grid": (lambda f: GAConfig(my=0.25), r"got 0.25"),
    "GA mx fraction": (lambda f: GAConfig(mx=1.5), r"GAConfig.mx .* integer >= 0, got 1.5"),
    "GA population": (lambda f: GAConfig(population=30), r"12 \+ 16 \+ 4 != 30"),
    "GA parents": (lambda f: GAConfig(parents=1, mutations=27), r"crossover needs at least 2 parents, got parents=1"),
    "GA generations": (lambda f: GAConfig(generations=-1), r"GAConfig.generations .* got -1"),
    "GA y_step": (lambda f: GAConfig(y_step=0), r"y_step must be a finite number > 0, got 0"),
    "GA step mismatch": (lambda f: GeneticSearch(BezierSpace(6), TargetCurveFitness((1.5,) * 6), GAConfig(y_step=0.5, my=0.5)),
                         r"y_step=0.5 differs from the space's y_step=0.1"),
    "checkpoint empty": (lambda f: _search(f["ckpt"] / "empty.json").run(), r"checkpoint .*empty.json is unreadable"),
    "checkpoint truncated": (lambda f: _search(f["ckpt"] / "truncated.json").run(), r"truncated.json is unreadable"),
    "checkpoint foreign": (lambda f: _search(f["ckpt"] / "other.json").run(), r"other.json is unreadable"),
    "checkpoint anonymous fitness": (lambda f: GeneticSearch(BezierSpace(6), lambda s: -np.abs(s - 1.5).mean(axis=1),
                                                             GAConfig(generations=1), checkpoint=f["ckpt"] / "anon.json"),
                                     r"checkpointed search needs a fitness it can identify: .*lambda.* has no fingerprint"),
    "GA seed": (lambda f: GAConfig(seed=-1), r"GAConfig.seed must be an integer >= 0, got -1"),
    "control points strings": (lambda f: bezier.layer_scales([["a", "b"], ["c", "d"]], 30),
                               r"control points must be numbers \(x, y\), shape \(n, 2\), got \[\['a'"),
    # tasks and data
    "unknown task": (lambda f: tasks.TaskConfig("qa"), r"unknown task 'qa'"),
    "kv source": (lambda f: tasks.TaskConfig("kv", 4, source="fle"), r"unknown KV source 'fle'"),
    "file source on mdqa": (lambda f: tasks.TaskConfig("mdqa", 10, source="file"), r"KV task only, got task='mdqa'"),
    "task n 0": (lambda f: tasks.TaskConfig("kv", 4, n=0), r"n=0"),
    "gold position": (lambda f: tasks.TaskConfig("kv", 4, positions=(5,)), r"gold position 5 is outside \[0, 3\]"),
    "kv formats": (lambda f: data.generate_kv(4, 1, key_format="hex"), r"unknown KV format 'hex'"),
    "kv key space": (lambda f: data.generate_kv(9001, 1, key_format="digits4"), r"num_pairs=9001 .* \[2, 4500\]"),
    "kv num_pairs 1": (lambda f: data.generate_kv(1, 1), r"num_pairs must be an integer >= 2, got 1"),
    "kv n 0": (lambda f: data.generate_kv(4, 0), r"n must be an integer >= 1, got 0"),
    "mdqa gold index float": (lambda f: data.mdqa_sample(_MDQA_RECORD, 2.5), r"gold_index must be an integer in \[0, 9\], got 2.5"),
    "mdqa num_docs 0": (lambda f: data.mdqa_sample(_MDQA_RECORD, 0, num_docs=0), r"num_docs must be an integer in \[2, 20\] .* got 0"),
    "mdqa num_docs too many": (lambda f: data.mdqa_sample(_MDQA_RECORD, 0, num_docs=21), r"\[2, 20\] .* got 21"),
    "kv prompt no pairs": (lambda f: data.kv_prompt([], "abc"), r"at least one \(key, value\) pair, got \[\]"),
    "kv prompt unknown key": (lambda f: data.kv_prompt([("abc", "1234")], "xyz"), r"key 'xyz' is not among the prompt's 1 keys"),
    "passkey negative fillers": (lambda f: data.passkey_sample(-3, 0.5), r"num_fillers must be an integer >= 0, got -3"),
    "kv gold index": (lambda f: data.kv_sample(data.generate_kv(4, 1)[0], 9), r"gold_index 9 is outside \[0, 3\]"),
    "mdqa empty file": (lambda f: data.load_mdqa(data_dir=f["empty"]), r"nq-open.*holds no records"),
    "kv empty gzip": (lambda f: data.load_kv(data_dir=f["empty"]), r"kv-retrieval.*holds no records"),
    "mdqa invalid utf-8": (lambda f: data.load_mdqa(data_dir=f["binary"]), r"cannot read .*nq-open.* as gzipped JSON lines"),
    "kv truncated gzip": (lambda f: data.load_kv(data_dir=f["truncated"]), r"cannot read .*kv-retrieval.* as gzipped JSON lines"),
    "text invalid utf-8": (lambda f: data.long_text(data_dir=f["binary"]), r"cannot read .*kjv.txt.gz as gzipped text"),
    "text windows length 0": (lambda f: data.text_windows(list(range(100)), 0, 2), r"length must be an integer >= 1, got 0"),
    "text windows too many": (lambda f: data.text_windows(list(range(100)), 30, 4), r"room for 3 windows of 30 tokens, asked for 4"),
    # metrics
    "mdqa answers string": (lambda f: metrics.mdqa_correct("Berlin is big", "Paris"), r"list of gold answers, got the string 'Paris'"),
    "mdqa answers empty": (lambda f: metrics.mdqa_correct("Paris", []), r"at least one gold answer"),
    "mdqa answer empty": (lambda f: metrics.mdqa_correct("Paris", [""]), r"non-empty string, got ''"),
    "kv empty value": (lambda f: metrics.kv_correct("anything", ""), r"gold value must be a non-empty string, got ''"),
    "kv value number": (lambda f: metrics.kv_correct("7219", 7219), r"gold value must be a string, got 7219"),
    "passkey negative": (lambda f: metrics.passkey_correct("12345", -5), r"non-negative integer or a string of digits, got -5"),
    "passkey letters": (lambda f: metrics.passkey_correct("12345", "abc"), r"got 'abc'"),
    "subspan prediction None": (lambda f: metrics.best_subspan_em(None, ["Paris"]), r"prediction must be a string, got None"),
    "subspan answers string": (lambda f: metrics.best_subspan_em("Paris", "Paris"), r"list of gold answers, got the string 'Paris'"),
    "prediction None": (lambda f: metrics.kv_correct(None, "7219"), r"prediction must be a string, got None"),
    "bootstrap nan": (lambda f: metrics.bootstrap_ci([1.0, float("nan")]), r"non-finite values at indices \[1\]"),
    "bootstrap empty": (lambda f: metrics.bootstrap_ci([]), r"non-empty 1-D"),
    "bootstrap confidence": (lambda f: metrics.bootstrap_ci([1.0], confidence=95), r"0 < confidence < 1 .* got confidence=95"),
    "perplexity tokens": (lambda f: metrics.perplexity(3.0, 0), r"at least one token, got 0"),
    "rho lengths": (lambda f: metrics.u_shape_rho([0, 1], [0.5, 0.5]), r"at least 3 samples; got 2 positions and 2 outcomes"),
    "rho positions": (lambda f: metrics.u_shape_rho([0, 5, 9], [1.0, 0.0, 1.0]), r"relative positions must be finite numbers in \[0, 1\]"),
    "proportion k > n": (lambda f: metrics.proportion_ci(31, 30), r"0 <= k <= n and n >= 1, got k=31, n=30"),
    "mde negative se": (lambda f: metrics.minimum_detectable_effect(-0.1), r"standard_error must be a finite number >= 0, got -0.1"),
    "two-fact gap": (lambda f: data.two_fact_sample(["A long filler sentence."] * 4, 0.5, gap=9), r"gap must be None or an integer in \[0, 4\]"),
    # evaluation settings and results
    "batch size 0": (lambda f: evaluate.EvalSettings(batch_size=0), r"batch_size must be an integer >= 1, got 0"),
    "max new tokens": (lambda f: evaluate.EvalSettings(max_new_tokens=-1), r"max_new_tokens must be an integer >= 1, got -1"),
    # a UUID value (35 tokens here) cut at 32 new tokens would be judged wrong for want of tokens
    "answer budget": (lambda f: evaluate.evaluate_samples(
        models.load_model("tiny-llama"), models.load_tokenizer("tiny-llama"),
        tasks.TaskConfig("kv", 4, n=1, key_format="uuid", value_format="uuid").samples(),
        settings=evaluate.EvalSettings(mode="generate", max_new_tokens=32), progress=False),
        r"max_new_tokens=32 cannot hold the gold answer of 3 of 3 samples \(the longest: kv sample 0, '[0-9a-f-]{36}', 3\d tokens\); allow at least 3\d new tokens"),
    "mode": (lambda f: evaluate.EvalSettings(mode="sample"), r"mode must be 'score' or 'generate', got 'sample'"),
    "on_overflow": (lambda f: evaluate.EvalSettings(on_overflow="truncate"), r"on_overflow must be 'error' or 'skip', got 'truncate'"),
    "chat string": (lambda f: evaluate.EvalSettings(chat="yes"), r"chat must be True or False, got 'yes'"),
    "fitness positions": (lambda f: fitness.weighted_fitness(__import__("pandas").DataFrame({"position": [0, 1], "correct": [1, 0]})),
                          r"exactly 3 gold positions .* got \[0, 1\]"),
    "save scales nan": (lambda f: results.save_scales(f["ckpt"] / "s.json", [1.5, float("nan")]), r"finite numbers > 0, one per layer, got \[1.5, nan\]"),
    "save scales zero": (lambda f: results.save_scales(f["ckpt"] / "s.json", [1.5, 0.0]), r"got \[1.5, 0.0\]"),
    "load scales nan": (lambda f: results.read_scales(f["ckpt"] / "scales.json"), r"scales.json has non-finite or non-positive"),
    "load scales layers": (lambda f: results.read_scales(results.save_scales(f["ckpt"] / "ok.json", [1.5] * 3), 4),
                           r"holds 3 scales, the model has 4 layers"),
    "load scales not json": (lambda f: results.read_scales(f["ckpt"] / "truncated.json"), r"truncated.json is not a scales JSON"),
    # methods and models
    "dynamic ntk factor": (lambda f: methods.DynamicNTK(factor=-1), r"factor must be a number >= 1, got -1"),
    "dynamic ntk window": (lambda f: methods.DynamicNTK(original_max_positions=0), r"integer >= 1, got 0"),
    "ms-poe order": (lambda f: methods.MsPoE(min_scale=2.0, max_scale=1.5), r"min_scale <= max_scale, got 2.0 > 1.5"),
    "caliope without segments": (lambda f: methods.Caliope().context(models.load_model("tiny-llama"), 64, None),
                                 r"CALIOPE-Moses needs each token's document segment .* got segments=None"),
    "tail perplexity tail": (lambda f: benchmarks.tail_perplexity(
        models.load_model("tiny-llama"), list(range(10)), 10), r"tail must be an integer in \[1, 9\] .* got 10"),
    "window perplexity ragged": (lambda f: probes.window_perplexity(
        models.load_model("tiny-llama"), [list(range(10)), list(range(8))]), r"one length >= 2, got lengths \[8, 10\]"),
    "caliope kind": (lambda f: methods.Caliope(kind="moon"), r"unknown CALIOPE calibrator 'moon'"),
    "lasp kind": (lambda f: methods.LASP("all"), r"unknown LASP variant 'all'"),
    "buckets base": (lambda f: methods.AttentionBuckets(bases=(10000.0, 0.5)), r"RoPE base must be > 1, got 0.5"),
    "buckets string": (lambda f: methods.AttentionBuckets(bases="10000"), r"non-empty sequence of RoPE bases, got '10000'"),
    "model dtype string": (lambda f: models.load_model("tiny-llama", dtype="float64"), r"dtype must be 'auto' or one of .* got 'float64'"),
    "model name": (lambda f: models.load_model("llama-7b"), r"unknown model 'llama-7b'"),
    "tiny name": (lambda f: models.tiny_config("tiny-gpt"), r"unknown tiny model 'tiny-gpt'"),
    "paired on no common record": (lambda f: fitness.paired_fitness_difference(pd.DataFrame(
        [{"method": m, "sample": s, "position": p, "correct": 1} for m, ids in (("a", (0, 1)), ("b", (2, 3)))
         for s in ids for p in (0, 4, 9)]), "a", "b"), r"'a' and 'b' have no record in common .* \{'a': 2, 'b': 2\}"),
    "map cell without middle": (lambda f: position_gate.gate({"kv-10": pd.DataFrame(
        [{"record": i, "relative_position": r, "correct": 1.0} for i in range(3) for r in (0.0, 1.0)])}),
        r"no middle position 0.5 \(positions: \[0.0, 1.0\]\); the gate needs first, middle and last"),
    # issue #99's hidden cases
    "fitness nan log-prob": (lambda f: fitness.weighted_fitness(pd.DataFrame(
        {"sample": [0, 1, 0, 1, 0, 1], "position": [0, 0, 5, 5, 9, 9], "gold_logprob": [-1.0, float("nan"), -2, -2, -3, -3]}),
        value="gold_logprob"), r"weighted_fitness: 1 non-finite 'gold_logprob' value\(s\) \(first: nan at sample 1, position 0\)"),
    "gate -inf log-prob": (lambda f: position_gate.gate({"c": pd.DataFrame(
        [{"record": i, "relative_position": r, "gold_logprob": -np.inf if (i, r) == (2, 0.5) else -1.0 - i * r}
         for i in range(4) for r in (0.0, 0.5, 1.0)])}, "gold_logprob"),
        r"the position gate: 1 non-finite 'gold_logprob' .* \(first: -inf at record 2, relative_position 0.5\)"),
    "method differences nan": (lambda f: position_gate.method_differences({m: pd.DataFrame(
        [{"sample": i, "position": p, "gold_logprob": float("nan") if (m, i) == ("a", 1) else -1.0} for i in range(3) for p in (0, 9)])
        for m in ("a", "b")}, [("a", "b")], value="gold_logprob"), r"a: 2 non-finite 'gold_logprob' .* \(first: nan at sample 1"),
    "load scales string": (lambda f: results.read_scales(f["ckpt"] / "scales_string.json"),
                           r"'scales' must be a list of numbers, one per layer, got '2222'"),
    "prefill extras mismatch": (lambda f: __import__("lpes_nb.evaluation.prefix", fromlist=["x"]).prefill_many(
        models.load_model("tiny-llama"), [[[1, 2, 3], [1, 2, 4]]], [[[5]]]),
        r"one list of extra tokens per prompt of each group: 1 groups of \[2\] prompts, got 1 groups of \[1\]"),
    "caliope length none": (lambda f: methods.Caliope().context(models.load_model("tiny-llama"), None, 10),
                            r"the batch length, an integer >= 1, got None"),
    "caliope segments int": (lambda f: methods.Caliope().context(models.load_model("tiny-llama"), 10, 10),
                             r"segments must be None or one list of non-negative segment ids per prompt, got 10"),
    "GA zero moves": (lambda f: GAConfig(mx=0, my=0), r"mx=0 and my=0 make every mutation a copy of its parent"),
    "caliope past the window": (lambda f: methods.Caliope("moses").specs(models.load_model("tiny-llama"), 64, [[0, 1, 2, 3]]),
                                r"CALIOPE-Moses \(gap=10000\) .* trained window of 2048 positions"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_raises_a_clear_value_error(case, files):
    call, message = CASES[case]
    with pytest.raises(ValueError, match=message):
        call(files)


def test_the_sweep_covers_at_least_sixty_cases():
    assert len(CASES) >= 60


def test_float16_names_a_dtype_but_tiny_models_still_load_in_it():
    """'float16' is accepted by name (the issue's example of an obscure failure was the string)."""
    assert models.load_model("tiny-llama", dtype="float16").dtype == torch.float16


def test_two_models_sharing_a_result_cache_do_not_share_tables(tmp_path, tokenizer):
    samples = tasks.TaskConfig("kv", 4, n=2, key_format="letters6", value_format="digits4").samples()
    cache = results.ResultCache(tmp_path)
    a = fitness.PositionFitness(models.load_model("tiny-llama", seed=0), tokenizer, samples, cache=cache)
    b = fitness.PositionFitness(models.load_model("tiny-llama", seed=1), tokenizer, samples, cache=cache)
    assert a.fingerprint() != b.fingerprint()
    a(np.ones((1, 4)))
    b(np.ones((1, 4)))
    assert len(list(tmp_path.glob("*.csv"))) == 2


def test_the_fitness_keys_its_tables_and_checkpoints_with_the_model_key(tokenizer):
    """The GA's per-scales tables and checkpoints carry the model part every cached result carries."""
    samples = tasks.TaskConfig("kv", 4, n=2, key_format="letters6", value_format="digits4").samples()
    model = models.load_model("tiny-llama")
    f = fitness.PositionFitness(model, tokenizer, samples, model_name="tiny-llama")
    assert models.model_key("tiny-llama", model).items() <= f._task_key.items()


def test_ga_resume_refuses_a_checkpoint_of_another_fitness(tmp_path, tokenizer):
    model = models.load_model("tiny-llama")
    kv = tasks.TaskConfig("kv", 4, n=1, key_format="letters6", value_format="digits4")
    first = fitness.PositionFitness(model, tokenizer, kv.samples())
    other = fitness.PositionFitness(model, tokenizer, tasks.TaskConfig("kv", 4, n=1, seed=3).samples())
    cfg, ckpt = GAConfig(population=4, parents=2, mutations=1, crossovers=1, generations=0), tmp_path / "ga.json"
    GeneticSearch(BezierSpace(4), first, cfg, checkpoint=ckpt, progress=False).run()
    with pytest.raises(ValueError, match="belongs to another search configuration or fitness"):
        GeneticSearch(BezierSpace(4), other, cfg, checkpoint=ckpt, progress=False).run()
    GeneticSearch(BezierSpace(4), first, cfg, checkpoint=ckpt, progress=False).run()  # the same fitness resumes


@pytest.mark.parametrize("method", [methods.DynamicNTK(original_max_positions=8), methods.AttentionBuckets(),
                                    methods.LASP("base")])
def test_methods_relative_to_one_base_refuse_a_model_with_a_base_per_attention_type(method):
    model = models.load_model("tiny-gemma3")
    with pytest.raises(rope.UnsupportedModel, match="needs a single RoPE base; model type 'gemma3_text' has one per"):
        method.bucket_bases(model) if isinstance(method, methods.AttentionBuckets) else method.specs(model, 64, None)


def test_moice_refuses_a_model_with_a_base_per_attention_type():
    from lpes_nb.evaluation.moice import MoICE

    with pytest.raises(rope.UnsupportedModel, match="MoICE needs a single RoPE base"):
        MoICE().model_bases(models.load_model("tiny-gemma3"))


def test_a_fitness_whose_every_prompt_was_skipped_says_so(tokenizer):
    """on_overflow='skip' with prompts all longer than the model's window: not 'got []' positions."""
    model = models.load_model("tiny-llama")
    model.config.max_position_embeddings = 16  # every KV prompt of 4 pairs is longer
    try:
        samples = tasks.TaskConfig("kv", 4, n=1, key_format="letters6", value_format="digits4").samples()
        fit = fitness.PositionFitness(model, tokenizer, samples, evaluate.EvalSettings(on_overflow="skip"))
        with pytest.raises(ValueError, match=r"no evaluated samples to score \(3 skipped as longer than the model's positions\)"):
            fit(np.ones((1, 4)))
    finally:
        model.config.max_position_embeddings = 2048


def test_resume_refuses_a_checkpoint_of_another_target_curve(tmp_path):
    """The issue's silent case: the old run's best fitness reported for a genome the new fitness scores differently."""
    cfg, ckpt = GAConfig(population=4, parents=2, mutations=1, crossovers=1, generations=1), tmp_path / "ga.json"
    GeneticSearch(BezierSpace(6), TargetCurveFitness((1.5,) * 6), cfg, checkpoint=ckpt, progress=False).run()
    with pytest.raises(ValueError, match="belongs to another search configuration or fitness"):
        GeneticSearch(BezierSpace(6), TargetCurveFitness((1.1,) * 6), cfg, checkpoint=ckpt, progress=False).run()

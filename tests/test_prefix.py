"""Shared-prefix evaluation is the plain path, computed once per common prefix: float32 last-token
logits within 1e-4 and identical answers for every method that shares, on tiny and both embedded
models; every registered method declares whether it shares."""

import itertools
import weakref

import numpy as np
import pytest
import torch
from transformers.cache_utils import DynamicLayer

from lpes_nb.core.methods import LASP, Baseline, Method, MsPoE, lpes
from lpes_nb.evaluation import prefix
from lpes_nb.evaluation.evaluate import encode, evaluate_samples
from lpes_nb.evaluation.tasks import TASKS, EvalSettings, TaskConfig
from lpes_nb.store.models import QWEN, load_model, load_tokenizer
from lpes_nb.studies.benchmarks import METHODS


def test_the_plan_shares_the_longest_prefixes():
    prompts = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 9, 9], [1, 2, 7, 7, 7, 7], [1, 2, 3, 4, 5, 8]]
    plan = prefix.PrefixPlan.of(prompts)
    assert plan.anchor == 0 and plan.shared == (0, 3, 2, 5)
    assert prefix.token_ratio([prompts]) == pytest.approx((24 - 10) / 24)
    # a prompt equal to the anchor still computes its last token (its logits start the answer)
    assert prefix.PrefixPlan.of([[1, 2, 3], [1, 2, 3]]).shared[1] == 2


def _padded(widths, batches, overhead):
    return sum(len(b) * max(widths[r][1] for r in b) + overhead for b in batches)


def test_batches_are_cut_where_padding_costs_least():
    # a KV fitness's continuations: two runs of lengths; filling batches of 8 greedily pads the two
    # short rows left over to the long run's length
    widths = [(150, n) for n in (143, 143, 144, 146, 147, 147, 148, 150, 151, 151, 269, 269, 271, 271, 274, 276, 279, 280, 280, 281)]
    batches = prefix.partition(widths, max_batch=8)
    assert sorted(r for b in batches for r in b) == list(range(len(widths)))
    assert all(b == list(range(b[0], b[-1] + 1)) and len(b) <= 8 for b in batches)
    assert not any(widths[b[0]][1] < 200 < widths[b[-1]][1] for b in batches)  # no batch spans both runs
    greedy = [list(range(k, min(k + 8, len(widths)))) for k in range(0, len(widths), 8)]
    assert _padded(widths, batches, 48) < _padded(widths, greedy, 48) - 200
    # the fewest tokens over every cut into consecutive batches (brute force), within the limits
    rng = np.random.default_rng(0)
    for _ in range(30):
        widths = sorted([(int(rng.integers(0, 50)), int(rng.integers(1, 60))) for _ in range(7)], key=lambda w: w[1])
        batches = prefix.partition(widths, max_batch=3, token_budget=200, overhead=10)
        cuts = [[list(range(a, b)) for a, b in zip((0, *c), (*c, 7))]
                for k in range(7) for c in itertools.combinations(range(1, 7), k)]
        feasible = [c for c in cuts if all(len(b) == 1 or (len(b) <= 3 and len(b) * (max(widths[r][0] for r in b)
                                                                                     + max(widths[r][1] for r in b)) <= 200)
                                           for b in c)]
        assert batches in feasible
        assert _padded(widths, batches, 10) == min(_padded(widths, c, 10) for c in feasible)


def test_every_registered_method_declares_whether_it_shares():
    for name, make in METHODS.items():
        method = make([1.0] * 4, None)
        declared = [c for c in type(method).__mro__ if c is not Method and "shares_prefix" in vars(c)]
        assert declared, f"{name} ({type(method).__name__}) does not declare shares_prefix"
        assert isinstance(method.shares_prefix, bool)
    # what follows the whole prompt cannot share
    assert not MsPoE().shares_prefix and not METHODS["Dynamic NTK"]([], None).shares_prefix
    assert not METHODS["CALIOPE-Moses"]([], None).shares_prefix and not METHODS["Attention Buckets"]([], None).shares_prefix


def _kv_samples(num_items: int, n: int = 2):
    return TaskConfig("kv", num_items, n=n, positions=(0, num_items // 2, num_items - 1), seed=5).samples()


def _compare(model, tokenizer, samples, methods):
    """Shared (in one pass, and in 7-token pieces: a remainder piece, several full ones) vs plain:
    last-token logits of every prompt, generate-mode answers, score-mode results."""
    prompts = [encode(tokenizer, s) for s in samples]
    generate, score = TASKS["kv"].settings(batch_size=4), EvalSettings(mode="score", batch_size=4)
    for method in methods:
        plain_gen = evaluate_samples(model, tokenizer, samples, settings=generate, method=method, shared_prefix=False, progress=False)
        plain_score = evaluate_samples(model, tokenizer, samples, settings=score, method=method, shared_prefix=False, progress=False)
        assert not plain_gen.attrs["shared_prefix"]
        for chunk in (None, 7):
            with torch.inference_mode(), method.context(model, max(map(len, prompts)), None):
                logits, _ = prefix.prefill(model, prompts, chunk=chunk)
                for p, shared in zip(prompts, logits):
                    plain = model(input_ids=torch.tensor([p]), logits_to_keep=1).logits[0, -1]
                    assert (shared[-1] - plain).abs().max() < 1e-4, (method.name, chunk)
            b = evaluate_samples(model, tokenizer, samples, settings=generate, method=method, progress=False, prefill_chunk=chunk)
            assert b.attrs["shared_prefix"]
            assert plain_gen["prediction"].tolist() == b["prediction"].tolist(), (method.name, chunk)
            assert plain_gen["truncated"].tolist() == b["truncated"].tolist()
            b = evaluate_samples(model, tokenizer, samples, settings=score, method=method, progress=False, prefill_chunk=chunk)
            assert plain_score["correct"].tolist() == b["correct"].tolist()
            assert np.abs(plain_score["gold_logprob"] - b["gold_logprob"]).max() < 1e-4


def test_pieces_cover_the_continuation_and_end_with_the_kept_logits():
    calls = []

    class Recorder:
        def __call__(self, input_ids, position_ids, past_key_values, use_cache, attention_mask, logits_to_keep):
            calls.append((position_ids[0, 0].item(), position_ids[0, -1].item() + 1, logits_to_keep,
                          None if attention_mask is None else attention_mask.shape[1]))
            return type("Out", (), {"past_key_values": past_key_values})()

    ids, positions = torch.zeros(1, 20, dtype=torch.long), torch.arange(30, 50)[None]
    prefix._pieces(Recorder(), ids, positions, None, keep=3, chunk=8, mask=torch.ones(1, 50))
    # 20 new tokens after 30 cached: 8, a 4-token remainder and the last 8 holding the 3 kept logits; the
    # mask grows with the cache
    assert calls == [(30, 38, 1, 38), (38, 42, 1, 42), (42, 50, 3, 50)]
    calls.clear()
    prefix._pieces(Recorder(), ids, positions, None, keep=12, chunk=8)  # the last piece holds all kept logits
    assert calls == [(30, 38, 1, None), (38, 50, 12, None)]
    calls.clear()
    prefix._pieces(Recorder(), ids, positions, None, keep=1, chunk=None)
    assert calls == [(30, 50, 1, None)]
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="prefill_chunk must be None"):
            prefix._pieces(Recorder(), ids, positions, None, keep=1, chunk=bad)


def test_a_chunk_on_the_plain_path_is_refused(tokenizer):
    model = load_model("tiny-llama")
    with pytest.raises(ValueError, match="prefill_chunk=64 applies to the shared-prefix path"):
        evaluate_samples(model, tokenizer, _kv_samples(8), method=MsPoE(), prefill_chunk=64, progress=False)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_shared_equals_plain_on_tiny_models(name, tokenizer):
    model = load_model(name)
    layers = model.config.num_hidden_layers
    _compare(model, tokenizer, _kv_samples(8), [Baseline(), lpes(np.linspace(1.0, 3.0, layers)), LASP("both")])


def test_shared_equals_plain_on_smollm2(smollm2, tokenizer):
    _compare(smollm2, tokenizer, _kv_samples(12), [Baseline(), lpes(np.linspace(1.0, 2.0, smollm2.config.num_hidden_layers))])


@pytest.mark.slow
def test_shared_equals_plain_on_qwen(qwen):
    _compare(qwen, load_tokenizer(QWEN), _kv_samples(10, n=1), [lpes(np.linspace(1.0, 2.0, qwen.config.num_hidden_layers))])


def test_a_repeated_prompt_continues_from_its_own_keys_and_values():
    """Several targets after one prompt (MDQA's answer aliases): each repeat computes only its last
    prompt token and its target, not the prompt's suffix again from the anchor; logits as the plain path."""
    model = load_model("tiny-llama")
    a, b = list(range(5, 45)), list(range(5, 25)) + list(range(60, 80))  # share 20 tokens
    groups = [[a, b, b, b, a]]
    extras = [[[7, 8], [9], [10, 11, 12], [13], [14]]]
    computed = []
    hook = model.register_forward_pre_hook(lambda _, args, kwargs: computed.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    try:
        with torch.inference_mode():
            logits = prefix.prefill_many(model, groups, extras, max_batch=1)
    finally:
        hook.remove()
    # anchor a (42 tokens with its target), b from the 20 shared (20 + 1), the repeats: last token + target
    assert sorted(computed) == sorted([42, 21, 1 + 3, 1 + 1, 1 + 1])
    with torch.inference_mode():
        for p, e, got in zip(groups[0], extras[0], logits[0]):
            plain = model(input_ids=torch.tensor([p + e]), logits_to_keep=len(e) + 1).logits[0]
            assert (got - plain).abs().max() < 1e-4
    # distinct prompts keep their plan: the anchor is chosen among them, not for its repeats
    assert prefix.PrefixPlan.of([a, b]).anchor in (0, 1)


def test_score_mode_with_answer_aliases_equals_the_plain_path(tokenizer):
    model = load_model("tiny-llama")
    samples = TaskConfig.from_split("mdqa20", "search", 4, num_items=5).samples()
    assert max(len(set(s.answers)) for s in samples) >= 3  # several aliases per prompt
    score = EvalSettings(mode="score", batch_size=4)
    for method in (Baseline(), lpes(np.linspace(1.0, 3.0, model.config.num_hidden_layers))):
        plain = evaluate_samples(model, tokenizer, samples, method, score, shared_prefix=False, progress=False)
        shared = evaluate_samples(model, tokenizer, samples, method, score, progress=False)
        assert shared.attrs["shared_prefix"] and plain["correct"].tolist() == shared["correct"].tolist()
        assert np.abs(plain["gold_logprob"] - shared["gold_logprob"]).max() < 1e-4


def test_decoding_holds_one_copy_of_the_prompts_keys_and_values(tokenizer):
    """Each prompt's cache is released into the batch's before the first decoding step: holding both
    doubled decoding's memory (a 7B-shaped model at batch 16 ran out of an 80 GB H100's memory)."""
    model = load_model("tiny-llama")
    samples = _kv_samples(8)
    prompts = [encode(tokenizer, s) for s in samples]
    with torch.inference_mode():
        logits, kvs = prefix.prefill(model, prompts)
    # each prompt's keys and values are views of its own cache tensors: watch those
    held = [weakref.ref(t if t._base is None else t._base) for kv in kvs for pair in kv for t in pair]
    alive_at_steps = []
    hook = model.register_forward_pre_hook(lambda *_: alive_at_steps.append(sum(r() is not None for r in held)))
    try:
        with torch.inference_mode():
            answers = prefix.greedy_decode(model, tokenizer, kvs, [len(p) for p in prompts], logits, 4, False)
    finally:
        hook.remove()
    assert len(alive_at_steps) == 3 and alive_at_steps == [0, 0, 0]  # 4 tokens: 3 decoding forwards
    assert all(kv == [None] * model.config.num_hidden_layers for kv in kvs) and len(answers) == len(prompts)
    # that the answers are the plain path's is test_shared_equals_plain_on_tiny_models'


def _sources_alive_while_caching(monkeypatch, run) -> list[int]:
    """Per layer copied into a batch's cache while ``run()`` runs: how many earlier layers' source
    tensors (what the cache copied from) were still alive."""
    update, sources, alive = DynamicLayer.update, [], []

    def watched(self, keys, values, *args, **kwargs):
        alive.append(sum(r() is not None for r in sources))
        sources.append(weakref.ref(keys if keys._base is None else keys._base))  # a slice's storage is its base's
        return update(self, keys, values, *args, **kwargs)

    monkeypatch.setattr(DynamicLayer, "update", watched)
    with torch.no_grad():  # not inference_mode, whose views do not name their base
        run()
    return alive


def test_a_batch_cache_is_built_without_a_second_copy(monkeypatch, tokenizer):
    """transformers copies each layer into a cache: a batch's padded layers are freed as they are
    copied, not held beside the whole cache (measured on an H200: a 7B shape at batch 16 peaked at
    70.9 GiB, 29 GiB of it that second copy). The layer being copied and the one before it (still
    named by the loop that feeds the cache) may be alive, no more."""
    model = load_model("tiny-llama")
    layers = model.config.num_hidden_layers
    prompts = [encode(tokenizer, s) for s in _kv_samples(8)]
    with torch.no_grad():
        logits, kvs = prefix.prefill(model, prompts)
    alive = _sources_alive_while_caching(
        monkeypatch, lambda: prefix.greedy_decode(model, tokenizer, kvs, [len(p) for p in prompts], logits, 1, False))
    assert layers >= 4 and len(alive) == layers and max(alive) <= 1, alive
    a, b = list(range(5, 45)), list(range(5, 25)) + list(range(60, 80))  # b continues from a's cache
    alive = _sources_alive_while_caching(monkeypatch, lambda: prefix.prefill_many(model, [[a, b]], max_batch=1))
    batch_cache = alive[layers:2 * layers]  # the anchor's forward fills its cache first, b's batch cache next
    assert len(batch_cache) == layers and max(batch_cache) <= 1, alive


def test_the_gold_logprob_of_generate_mode_is_the_score_modes(smollm2, tokenizer):
    samples = _kv_samples(10)
    gen = evaluate_samples(smollm2, tokenizer, samples, settings=TASKS["kv"].settings(4), gold_logprob=True, progress=False)
    score = evaluate_samples(smollm2, tokenizer, samples, settings=EvalSettings(mode="score"), progress=False)
    assert np.abs(gen["gold_logprob"] - score["gold_logprob"]).max() < 1e-4
    assert (gen["gold_first"] == score["correct"]).all()


def test_methods_that_cannot_share_and_sliding_windows_take_the_plain_path(smollm2, tokenizer):
    samples = _kv_samples(6, n=1)
    out = evaluate_samples(smollm2, tokenizer, samples, settings=EvalSettings(mode="score"), method=MsPoE(), progress=False)
    assert not out.attrs["shared_prefix"]
    gemma = load_model("tiny-gemma3")
    assert not prefix.supports_sharing(gemma)
    assert not evaluate_samples(gemma, tokenizer, samples, settings=EvalSettings(mode="score"), progress=False).attrs["shared_prefix"]
    penalised = load_model("tiny-llama")
    penalised.generation_config.repetition_penalty = 1.1  # model.generate would apply it; greedy_decode does not
    assert not prefix.supports_sharing(penalised)
    with pytest.raises(ValueError, match="gold_logprob comes with generate mode"):
        evaluate_samples(smollm2, tokenizer, samples, settings=EvalSettings(mode="score"), gold_logprob=True, progress=False)


def test_the_throughput_comparison_reports_ratios_and_agreement(tokenizer):
    from lpes_nb.operations.throughput import flop_ratio, forward_flops, padded_tokens, sweep_comparison

    model = load_model("tiny-llama")
    row, pieces = sweep_comparison(model, tokenizer, _kv_samples(8), EvalSettings(mode="score"), pieces=(None, 16))
    assert (row["pieces"], pieces["pieces"]) == (None, 16) and pieces["identical"] and pieces["plain_s"] == row["plain_s"]
    assert row["identical"] and 0 < row["token_ratio"] < 1 and row["plain_s"] > 0 and row["shared_s"] > 0
    assert row["token_ratio_vs_padded_plain"] <= row["token_ratio"]  # padding only adds to what the plain path computes
    assert row["token_ratio"] <= row["flop_ratio"] < 1  # cached prefix keys are still attended to
    assert padded_tokens([[1] * 3, [1] * 5, [1] * 4], 2, "generate") == 2 * 4 + 1 * 5  # batches (3, 4) and (5)
    # score mode: two rows of 3000 and 2000 exceed the token budget, each runs alone
    assert padded_tokens([[1] * 3000, [1] * 2000], 8, "score") == 5000
    assert padded_tokens([[1] * 3000, [1] * 2000], 8, "generate") == 6000
    assert flop_ratio(model, [[[1, 2, 3, 4], [5, 6]]]) == 1.0  # nothing in common: nothing saved
    assert flop_ratio(model, [[[1, 2, 3, 4], [1, 2, 3, 5]]]) < 1.0
    # FLOPs of a forward: 2 x the layers' matmul parameters x tokens, the head once per kept logit, causal attention
    cfg, head = model.config, model.get_output_embeddings().weight.numel()
    layers = sum(p.numel() for n, p in model.named_parameters() if "layers" in n and p.dim() == 2)
    attention = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * (cfg.hidden_size // cfg.num_attention_heads) * 200**2 / 2
    assert forward_flops(model, 200) == pytest.approx(2 * 200 * layers + 2 * head + attention)
    assert forward_flops(model, 200, logits=3) - forward_flops(model, 200) == pytest.approx(4 * head)


def test_a_partial_throughput_rerun_replaces_only_its_parts(tmp_path, monkeypatch):
    import json

    from lpes_nb.operations import throughput

    out = tmp_path / "throughput.json"
    here = {"cpu": "CPU A", "isa_flags": ["avx2"], "bf16": {"safe": False}, "native_bf16": False}
    stored = [{"what": "MDQA-20 sweep", "mode": "score", "old": True}, {"what": "MDQA-20 sweep", "mode": "generate", "old": True},
              {"what": "one fitness evaluation", "mode": "score", "old": True}]
    out.write_text(json.dumps({"cpu": here, "sweeps": stored}))
    monkeypatch.setattr(throughput, "describe_cpu", lambda: here)
    monkeypatch.setattr(throughput, "load_model", lambda *a, **k: None)
    monkeypatch.setattr(throughput, "load_tokenizer", lambda *a, **k: None)
    monkeypatch.setattr(throughput, "load_mdqa", lambda n: [])
    monkeypatch.setattr(throughput, "sweep_comparison", lambda model, tok, samples, settings, *a, **k: [{"mode": settings.mode}])
    throughput.run(out=out, parts=("generate-sweep",), progress=False)
    rows = json.loads(out.read_text())["sweeps"]
    # the MDQA sweeps first (score, generate), the fitness call last
    assert [("fitness" in r["what"], r["mode"], r.get("old", False)) for r in rows] == [
        (False, "score", True), (False, "generate", False), (True, "score", True)]


def test_a_partial_throughput_rerun_on_another_cpu_is_refused(tmp_path, monkeypatch):
    import json

    from lpes_nb.operations import throughput

    out = tmp_path / "throughput.json"
    here = {"cpu": "CPU B", "isa_flags": ["avx2"], "bf16": {"safe": False}, "native_bf16": False}
    out.write_text(json.dumps({"cpu": {**here, "cpu": "CPU A"}, "sweeps": []}))
    monkeypatch.setattr(throughput, "describe_cpu", lambda: here)
    with pytest.raises(ValueError, match="measured on CPU A .* this is CPU B"):
        throughput.run(out=out, parts=("fitness",), progress=False)
    assert json.loads(out.read_text())["cpu"]["cpu"] == "CPU A"  # nothing half-written


def test_the_stored_throughput_reads_as_tables_with_their_bars():
    from lpes_nb.operations import throughput
    from lpes_nb.workbook import plots

    sweep = {"plain_s": 10.0, "shared_s": 6.0, "time_ratio": 0.6, "token_ratio": 0.7, "flop_ratio": 0.72, "identical": True,
             "prompts": 50, "model": "m", "dtype": "bfloat16", "what": "MDQA-20 sweep, 10 records x gold (0, 5, 10, 15, 19)"}
    report = {"cpu": {"cpu": "CPU A", "cores": 2, "native_bf16": True, "advertises_amx": False}, "torch_threads": 2,
              "gemm_gflops": {"float32": 400.0}, "forward": [{"model": "m", "dtype": "float32", "tokens": 1024, "seconds": 1.0,
                                                              "tokens_per_s": 1024.0, "gflops": 300.0, "percent_of_gemm_peak": 75.0}],
              "sweeps": [{**sweep, "mode": "score"}, {**sweep, "mode": "score", "pieces": 512, "time_ratio": 0.5},
                         {**sweep, "mode": "generate", "time_ratio": 0.78},
                         {**sweep, "mode": "score", "what": "one fitness evaluation of the search", "time_ratio": 0.76, "rounds": 5,
                          "time_ratio_min_max": [0.7, 0.8]}]}
    t = throughput.tables(report)["comparisons"]
    assert t["bar"].tolist() == pytest.approx([0.75] * 4)  # every mode: its token ratio + 0.05
    assert t["meets_bar"].tolist() == [True, True, False, False]
    assert t["comparison"].iloc[1] == "MDQA-20 sweep, score mode, shared in 512-token pieces"
    assert t[["ratio_low", "ratio_high"]].iloc[3].tolist() == [0.7, 0.8] and t["rounds"].tolist() == [1, 1, 1, 5]
    text = throughput.conclusion(report)
    assert "CPU A" in text and text.count("**met**") == 2 and text.count("**missed**") == 2 and "75 % of peak" in text
    # another CPU's file, the sweeps alone, read under its own CPU after this one's
    other = {"cpu": {**report["cpu"], "cpu": "CPU B", "advertises_amx": True}, "torch_threads": 2,
             "gemm_gflops": {"float32": 900.0}, "sweeps": [{**sweep, "mode": "generate", "time_ratio": 0.5}]}
    both = throughput.conclusion(report, others=[other])
    assert both.startswith(text) and "The same sweeps on **CPU B**" in both and "AMX advertised" in both
    assert both.removeprefix(text).count("**met**") == 1 and "  - MDQA-20 sweep, generate mode" in both
    fig = plots.throughput(**throughput.tables(report), title="t", cpu="CPU A",
                           others={"CPU B": throughput.tables(other)["comparisons"]})
    assert len(fig.axes) == 2
    legend = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert legend[:2] == ["time ratio on CPU A", "time ratio on CPU B"]
    (b,) = [c for c in fig.axes[1].collections if c.get_label() == "time ratio on CPU B"]
    assert b.get_offsets().tolist() == [[0.5, 2.22]]  # CPU B's generate sweep, just below CPU A's (row 2)
    with pytest.raises(FileNotFoundError, match="lpes throughput"):
        throughput.load(throughput.STORED.with_name("absent.json"))

"""MoICE (router over RoPE bases) and the gradient-based scale search, on a tiny model."""

import json

import numpy as np
import pytest
import torch

from lpes_nb.core.methods import Baseline
from lpes_nb.evaluation.evaluate import evaluate_samples
from lpes_nb.store.data import Sample, kv_prompt
from lpes_nb.evaluation.moice import (
    ATTENTION_NAME,
    MoICE,
    RouterTraining,
    load_or_train,
    load_router,
    router_digest,
    router_files,
    save_router,
    train_router,
)
from lpes_nb.core.rope import RopePatch, RopeSpec, scale_specs
from lpes_nb.studies.search import _LearnedScale, gradient_search
from tests.test_methods import SAMPLES


def _kv_samples():
    out = []
    for i in range(2):
        pairs = [(f"k{i}{j}", f"{1000 + 7 * j + i}") for j in range(4)]
        for pos in (0, 1, 3):
            prompt, spans = kv_prompt(pairs, pairs[pos][0])
            out.append(Sample("kv", i, pos, 4, prompt, (pairs[pos][1],), spans))
    return out


def _logprobs(model, tokenizer, method):
    return evaluate_samples(model, tokenizer, SAMPLES, method=method, progress=False)["gold_logprob"].to_numpy()


def test_moice_with_equal_bases_is_the_baseline_and_restores_the_model(tiny_llama, tokenizer):
    base = _logprobs(tiny_llama, tokenizer, Baseline())
    theta = tiny_llama.config.rope_parameters["rope_theta"]
    assert np.abs(_logprobs(tiny_llama, tokenizer, MoICE(bases=[theta] * 7)) - base).max() <= 1e-5
    assert np.abs(_logprobs(tiny_llama, tokenizer, MoICE()) - base).max() > 1e-6  # the reference bases differ
    assert tiny_llama.config._attn_implementation == "sdpa"
    assert not any(hasattr(layer.self_attn, "_lpes_moice") for layer in tiny_llama.model.layers)
    assert np.array_equal(_logprobs(tiny_llama, tokenizer, Baseline()), base)


def test_moice_decoding_with_the_cache_equals_full_forwards(tiny_llama):
    method = MoICE(bases=[10000.0, 20000.0, 40000.0])
    method.router = method.new_router(tiny_llama, seed=3)
    torch.nn.init.normal_(method.router.gate_2, std=1.0)  # a non-uniform mixture
    prompt = torch.randint(0, 49152, (1, 25), generator=torch.Generator().manual_seed(0))
    with method.context(tiny_llama, 25, None), torch.no_grad():
        assert tiny_llama.config._attn_implementation == ATTENTION_NAME
        out = tiny_llama.generate(prompt, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
        seq = prompt
        for _ in range(6):
            seq = torch.cat([seq, tiny_llama(seq).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, seq)


def test_router_training_changes_only_the_router_and_round_trips(tiny_llama, tokenizer, tmp_path):
    before = {k: v.clone() for k, v in tiny_llama.state_dict().items()}
    budget = RouterTraining(steps=4, batch_size=3, lr=0.05)
    method = train_router(tiny_llama, tokenizer, _kv_samples(), budget, progress=False)
    assert len(budget.history) == 4 and method.router.gate_2.abs().sum() > 0  # the router moved
    assert all(torch.equal(before[k], v) for k, v in tiny_llama.state_dict().items())
    assert all(p.requires_grad for p in tiny_llama.parameters())  # training state restored
    save_router(method, tmp_path / "router", budget, task="kv")
    loaded = load_router(tiny_llama, tmp_path / "router")
    assert np.array_equal(_logprobs(tiny_llama, tokenizer, loaded), _logprobs(tiny_llama, tokenizer, method))


def test_a_saved_router_is_reused_only_for_the_same_budget(tiny_llama, tokenizer, tmp_path, monkeypatch):
    first = load_or_train(tiny_llama, tokenizer, _kv_samples(), RouterTraining(steps=2, batch_size=2), tmp_path / "r",
                          {"model_name": "tiny-llama"}, progress=False)
    from lpes_nb.evaluation import moice

    monkeypatch.setattr(moice, "train_router", lambda *a, **k: pytest.fail("retrained a router that was saved"))
    again = load_or_train(tiny_llama, tokenizer, _kv_samples(), RouterTraining(steps=2, batch_size=2), tmp_path / "r",
                          {"model_name": "tiny-llama"}, progress=False)
    assert all(torch.equal(a, b) for a, b in zip(first.router.parameters(), again.router.parameters()))
    with pytest.raises(pytest.fail.Exception, match="retrained"):
        load_or_train(tiny_llama, tokenizer, _kv_samples(), RouterTraining(steps=3, batch_size=2), tmp_path / "r",
                      {"model_name": "tiny-llama"}, progress=False)


def _stopped_at_step(monkeypatch, stop: int) -> list:
    """Make router training stop (as if killed) when it reaches step ``stop``; returns the steps run."""
    from lpes_nb.evaluation import moice

    real, steps = moice.backward_answer_nll, []

    def step(*args, **kwargs):
        steps.append(len(steps) + 1)
        if steps[-1] == stop:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(moice, "backward_answer_nll", step)
    return steps


def test_a_stopped_router_training_resumes_step_for_step(tiny_llama, tokenizer, tmp_path, monkeypatch):
    budget, meta = RouterTraining(steps=3, batch_size=2, lr=0.05), {"model_name": "tiny-llama"}
    whole = load_or_train(tiny_llama, tokenizer, _kv_samples(), budget, tmp_path / "whole", meta, progress=False)
    stem = tmp_path / "router_qwen2.5-coder-0.5b_float32"  # a dotted name keeps all of itself in its files' names
    weights, info, checkpoint = router_files(stem)
    _stopped_at_step(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        load_or_train(tiny_llama, tokenizer, _kv_samples(), budget, stem, meta, progress=False)
    assert not weights.exists() and not info.exists() and len(torch.load(checkpoint, weights_only=True)["history"]) == 2
    steps = _stopped_at_step(monkeypatch, 0)
    resumed = load_or_train(tiny_llama, tokenizer, _kv_samples(), budget, stem, meta, progress=False)
    assert len(steps) == 1  # only the step the stop lost
    assert router_digest(resumed.router) == router_digest(whole.router)
    assert json.loads(info.read_text())["loss"] == json.loads(router_files(tmp_path / "whole")[1].read_text())["loss"]
    assert weights.exists() and not checkpoint.exists()  # removed once the weights are saved


def test_a_checkpoint_of_another_recipe_is_refused(tiny_llama, tokenizer, tmp_path, monkeypatch):
    _stopped_at_step(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        load_or_train(tiny_llama, tokenizer, _kv_samples(), RouterTraining(steps=3, batch_size=2), tmp_path / "r", progress=False)
    with pytest.raises(ValueError, match=r"checkpoint .*r\.ckpt\.pt was made for .*\"lr\": 0\.003.*\"lr\": 0\.01"):
        load_or_train(tiny_llama, tokenizer, _kv_samples(), RouterTraining(steps=3, batch_size=2, lr=0.01), tmp_path / "r",
                      progress=False)


def test_learned_scale_remap_is_positional_interpolation(tiny_llama):
    raw = torch.zeros(4)  # s = 1 + sigmoid(0) = 1.5
    ids = torch.randint(0, 49152, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        with RopePatch(tiny_llama, [RopeSpec(remap=_LearnedScale(raw, l)) for l in range(4)]):
            learned = tiny_llama(ids).logits
        with RopePatch(tiny_llama, scale_specs([1.5] * 4)):
            pi = tiny_llama(ids).logits
    assert (learned - pi).abs().max().item() <= 1e-5


def test_gradient_search_moves_the_scales_by_the_answer_loss(tiny_llama, tokenizer):
    before = {k: v.clone() for k, v in tiny_llama.state_dict().items()}
    scales, history = gradient_search(tiny_llama, tokenizer, _kv_samples(), steps=3, batch_size=4, lr=0.5, progress=False)
    assert len(scales) == 4 and all(1.0 < s < 2.0 for s in scales)
    assert not np.allclose(scales, 1.5)  # the gradient reached the scales
    assert list(history.columns[:2]) == ["step", "loss"] and len(history) == 3
    assert all(torch.equal(before[k], v) for k, v in tiny_llama.state_dict().items())
    with pytest.raises(ValueError, match="exactly 3 gold positions"):
        gradient_search(tiny_llama, tokenizer, _kv_samples()[:2], steps=1, progress=False)


def test_micro_batches_give_the_full_batch_gradient_and_loss(tiny_llama, tokenizer):
    from lpes_nb.evaluation.training import answer_batch, backward_answer_nll

    prompts, targets, pad = answer_batch(tokenizer, _kv_samples())
    weights = [0.2, 0.3, 0.5, 0.2, 0.3, 0.5]
    raw = torch.zeros(4, requires_grad=True)
    grads, losses = [], []
    with RopePatch(tiny_llama, [RopeSpec(remap=_LearnedScale(raw, l)) for l in range(4)]):
        for micro in (None, 1, 4):  # whole batch, one prompt at a time, uneven chunks (4 + 2)
            raw.grad = None
            losses.append(backward_answer_nll(tiny_llama, prompts, targets, pad, weights, micro))
            grads.append(raw.grad.clone())
    assert np.allclose(losses, losses[0], rtol=1e-5)
    for g in grads[1:]:
        assert torch.allclose(g, grads[0], rtol=1e-4, atol=1e-7)
    assert grads[0].abs().sum() > 0
    with pytest.raises(ValueError, match="micro_batch must be None"):
        backward_answer_nll(tiny_llama, prompts, targets, pad, micro_batch=0)


def test_router_training_with_micro_batches_matches_the_full_batch(tiny_llama, tokenizer):
    runs = [RouterTraining(steps=2, batch_size=4, lr=0.05, micro_batch=m) for m in (None, 1)]
    for budget in runs:
        train_router(tiny_llama, tokenizer, _kv_samples(), budget, progress=False)
    # the same losses step by step (Adam turns float-rounding differences of near-zero gradients into
    # visible parameter differences, so the parameters are not compared; the gradient test above is exact)
    assert len(runs[1].history) == 2 and np.allclose(runs[0].history, runs[1].history, rtol=1e-5)


def test_a_router_without_weights_is_trained_when_the_evaluator_first_needs_it(tiny_llama, tokenizer, tmp_path):
    """Git keeps only a router's recipe: the weights are rebuilt inside the evaluator, which runs under
    inference mode; training must still get its gradients there."""
    budget = RouterTraining(steps=2, batch_size=2)
    load_or_train(tiny_llama, tokenizer, _kv_samples(), budget, tmp_path / "r", {"model_name": "tiny-llama"}, progress=False)
    for weights in tmp_path.glob("r*.safetensors"):
        weights.unlink()
    lazy = load_or_train(tiny_llama, tokenizer, _kv_samples(), budget, tmp_path / "r", {"model_name": "tiny-llama"}, progress=False)
    assert lazy.router is None and lazy.train is not None
    scored = evaluate_samples(tiny_llama, tokenizer, _kv_samples()[:2], method=lazy, progress=False)
    assert lazy.router is not None and np.isfinite(scored.gold_logprob).all()

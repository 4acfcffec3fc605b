"""The per-layer RoPE mechanism against transformers' own RoPE and against a hand-run reference."""

import copy

import pytest
import torch
from zoo import with_rope_parameters

from lpes_nb.store.models import model_from_config
from lpes_nb.core.rope import (
    IDENTITY,
    RopePatch,
    RopeSpec,
    dynamic_ntk_base,
    find_rope_stack,
    normalize_specs,
    scale_specs,
)

VOCAB = 49152


def _ids(batch=2, length=48, seed=0):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _logits(model, ids, **kw):
    with torch.no_grad():
        return model(ids, **kw).logits


def test_identity_specs_are_bit_identical(tiny):
    ids = _ids()
    ref = _logits(tiny, ids)
    with RopePatch(tiny, [IDENTITY] * tiny.config.num_hidden_layers):
        assert torch.equal(_logits(tiny, ids), ref)


@pytest.mark.parametrize("scale", [1.5, 2.0, 2.5])
def test_uniform_scale_equals_transformers_linear(tiny, scale):
    ids = _ids()
    linear = with_rope_parameters(tiny, lambda p: {**p, "rope_type": "linear", "factor": scale})
    expected = _logits(linear, ids)
    with RopePatch(tiny, scale_specs([scale] * tiny.config.num_hidden_layers)):
        got = _logits(tiny, ids)
    assert (got - expected).abs().max().item() <= 1e-5
    # the comparison has teeth: scaling really changes the output of this model
    assert (_logits(tiny, ids) - expected).abs().max().item() > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("embedded", ["smollm2", "qwen"])
def test_uniform_scale_equals_linear_and_identity_is_exact_on_the_embedded_models(embedded, request):
    model = request.getfixturevalue(embedded)
    ids = _ids(batch=1, length=300)
    n = model.config.num_hidden_layers
    plain = _logits(model, ids)
    with RopePatch(model, [IDENTITY] * n):
        assert torch.equal(_logits(model, ids), plain)
    linear = with_rope_parameters(model, lambda p: {**p, "rope_type": "linear", "factor": 2.0})
    expected = _logits(linear, ids)
    del linear
    with RopePatch(model, scale_specs([2.0] * n)):
        got = _logits(model, ids)
    assert (got - expected).abs().max().item() <= 1e-5 < (plain - expected).abs().max().item()


def test_per_layer_base_equals_dynamic_ntk_at_prefill(tiny_llama):
    """Dynamic NTK for one long prefill is a plain base change; the mechanism expresses it exactly."""
    cfg = tiny_llama.config
    factor, length = 2.0, cfg.max_position_embeddings + 100
    ids = _ids(batch=1, length=length)
    dynamic = with_rope_parameters(tiny_llama, lambda p: {**p, "rope_type": "dynamic", "factor": factor})
    expected = _logits(dynamic, ids)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    base = dynamic_ntk_base(cfg.rope_parameters["rope_theta"], factor, length, cfg.max_position_embeddings, head_dim)
    with RopePatch(tiny_llama, [RopeSpec(base=base)] * cfg.num_hidden_layers):
        got = _logits(tiny_llama, ids)
    assert (got - expected).abs().max().item() <= 1e-5
    assert (_logits(tiny_llama, ids) - expected).abs().max().item() > 1e-4


# --- per-layer specs against a reference that runs the layers by hand -------------------------


def _reference_logits(model, ids, layer_setups):
    """Run the decoder layers one by one; layer l gets cos/sin from a *fresh* transformers rotary module
    built for its rope parameters, evaluated at its own modified position ids."""
    decoder = model.model
    hidden = decoder.embed_tokens(ids)
    positions = torch.arange(ids.shape[1])[None]
    for layer, (rope_parameters_for, position_fn) in zip(decoder.layers, layer_setups):
        config = copy.deepcopy(model.config)
        config.rope_parameters = rope_parameters_for(config.rope_parameters)
        rotary = type(decoder.rotary_emb)(config)
        cos_sin = rotary(hidden, position_fn(positions))
        hidden = layer(hidden, attention_mask=None, position_embeddings=cos_sin, position_ids=positions)
    return model.lm_head(decoder.norm(hidden))


KEEP = (lambda p: p, lambda pos: pos)


@pytest.fixture(params=["tiny-llama", "tiny-qwen2", "tiny-mistral"])
def tiny_no_window(request):
    from lpes_nb.store.models import load_model

    return load_model(request.param)


def test_reference_loop_reproduces_unpatched_model(tiny_no_window):
    ids = _ids(batch=1)
    with torch.no_grad():
        ref = _reference_logits(tiny_no_window, ids, [KEEP] * tiny_no_window.config.num_hidden_layers)
    assert (ref - _logits(tiny_no_window, ids)).abs().max().item() <= 1e-5


def test_mixed_per_layer_specs_equal_reference_loop(tiny_no_window):
    model = tiny_no_window
    theta = model.config.rope_parameters["rope_theta"]
    specs = [RopeSpec(scale=1.7), RopeSpec(mask=True), RopeSpec(coarsen=3), RopeSpec(base=theta * 4, scale=1.3)]
    setups = [
        (lambda p: {**p, "rope_type": "linear", "factor": 1.7}, lambda pos: pos),
        (lambda p: p, lambda pos: torch.zeros_like(pos)),
        (lambda p: p, lambda pos: pos // 3),
        (lambda p: {**p, "rope_theta": theta * 4, "rope_type": "linear", "factor": 1.3}, lambda pos: pos),
    ]
    ids = _ids(batch=1)
    with torch.no_grad():
        expected = _reference_logits(model, ids, setups)
        with RopePatch(model, specs):
            got = _logits(model, ids)
    assert (got - expected).abs().max().item() <= 1e-5
    assert (_logits(model, ids) - expected).abs().max().item() > 1e-4


def test_remap_with_segment_ids_equals_reference_loop(tiny_llama):
    """A document-aware remap (CALIOPE-like): add a gap of 100 positions per segment boundary crossed."""
    length = 40
    segments = torch.tensor([0] * 10 + [1] * 15 + [2] * 15)

    def gap(position_ids, segment_ids):
        return position_ids + 100 * segment_ids

    ids = _ids(batch=1, length=length)
    remapped = torch.arange(length)[None] + 100 * segments[None]
    setups = [(lambda p: p, lambda pos: remapped)] * 2 + [KEEP] * 2
    with torch.no_grad():
        expected = _reference_logits(tiny_llama, ids, setups)
        patch = RopePatch(tiny_llama, {0: RopeSpec(remap=gap), 1: RopeSpec(remap=gap)})
        with patch, patch.segments(segments):
            got = _logits(tiny_llama, ids)
    assert (got - expected).abs().max().item() <= 1e-5


def test_segment_ids_past_the_prompt_take_the_last_segment(tiny_llama):
    patch = RopePatch(tiny_llama, {0: IDENTITY})
    with patch.segments(torch.tensor([0, 0, 1, 2])):
        got = patch._segments_for(torch.tensor([[0, 3, 4, 9]]))
    assert got.tolist() == [[0, 2, 2, 2]]


# --- head-wise specs (Ms-PoE) ---------------------------------------------------------------------


def test_unit_head_scales_are_bit_identical_and_equal_head_scales_equal_the_layer_scale(tiny):
    ids = _ids()
    heads = tiny.config.num_key_value_heads
    n = tiny.config.num_hidden_layers
    base = _logits(tiny, ids)
    with RopePatch(tiny, [RopeSpec(heads=(1.0,) * heads)] * n):
        assert torch.equal(_logits(tiny, ids), base)
    with RopePatch(tiny, [RopeSpec(heads=(1.7,) * heads)] * n):
        headwise = _logits(tiny, ids)
    with RopePatch(tiny, scale_specs([1.7] * n)):
        assert (headwise - _logits(tiny, ids)).abs().max().item() <= 1e-5
    assert (headwise - base).abs().max().item() > 1e-4


def _reference_headwise_layer(model, layer, hidden, positions, factors):
    """One Llama decoder layer written out by hand: key/value head j and its query heads rotated by a
    fresh transformers rotary module with linear factor ``factors[j]``; eager causal attention."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

    attn, (B, T, _) = layer.self_attn, hidden.shape
    h = layer.input_layernorm(hidden)
    q, k, v = (proj(h).view(B, T, -1, attn.head_dim).transpose(1, 2) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    g = attn.num_key_value_groups
    qs, ks = [], []
    for j, factor in enumerate(factors):
        config = copy.deepcopy(model.config)
        config.rope_parameters = {**config.rope_parameters, "rope_type": "linear", "factor": factor}
        cos, sin = type(model.model.rotary_emb)(config)(h, positions)
        qj, kj = apply_rotary_pos_emb(q[:, j * g : (j + 1) * g], k[:, j : j + 1], cos, sin)
        qs.append(qj), ks.append(kj)
    q, k, v = torch.cat(qs, 1), repeat_kv(torch.cat(ks, 1), g), repeat_kv(v, g)
    scores = (q @ k.transpose(-1, -2)) * attn.scaling
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    out = attn.o_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1))
    hidden = hidden + out
    return hidden + layer.mlp(layer.post_attention_layernorm(hidden))


def test_head_wise_scales_equal_a_hand_written_attention(tiny_llama):
    model, factors = tiny_llama, (1.0, 2.5)
    ids = _ids(batch=1)
    with torch.no_grad():
        decoder, positions = model.model, torch.arange(ids.shape[1])[None]
        hidden = decoder.embed_tokens(ids)
        cos_sin = decoder.rotary_emb(hidden, positions)
        for i, layer in enumerate(decoder.layers):
            if i == 1:
                hidden = _reference_headwise_layer(model, layer, hidden, positions, factors)
            else:
                hidden = layer(hidden, attention_mask=None, position_embeddings=cos_sin, position_ids=positions)
        expected = model.lm_head(decoder.norm(hidden))
        with RopePatch(model, {1: RopeSpec(heads=factors)}):
            got = _logits(model, ids)
    assert (got - expected).abs().max().item() <= 1e-5
    assert (_logits(model, ids) - expected).abs().max().item() > 1e-4


def test_head_scaler_runs_on_the_prefill_and_its_scales_are_kept_for_decoding(tiny_llama):
    calls = []

    def scaler(q_last, keys, valid, scaling):
        calls.append((tuple(q_last.shape), tuple(keys.shape), int(valid.sum()), scaling))
        return torch.tensor([[1.3, 2.2]]).expand(q_last.shape[0], -1)

    prompt = _ids(batch=1, length=30)
    seq, reference, diff = _patched_generate_matches_stepwise(
        tiny_llama, {2: RopeSpec(heads=scaler), 3: RopeSpec(heads=(1.3, 2.2))}, prompt, steps=6)
    assert torch.equal(seq, reference) and diff <= 1e-4
    # shapes: last query [B, H_q, D], keys [B, H_kv, T, D]; in generate() only the prefill calls it
    assert calls[0] == ((1, 4, 16), (1, 2, 30, 16), 30, 16**-0.5)  # the attention module's own scaling
    with RopePatch(tiny_llama, {2: RopeSpec(heads=scaler)}):
        calls.clear()
        tiny_llama.generate(prompt, max_new_tokens=5, min_new_tokens=5, do_sample=False, pad_token_id=0)
    assert len(calls) == 1


def test_a_continuation_of_any_length_keeps_the_prompts_head_scales(tiny_llama):
    """A teacher-forced target fed after the prompt's cache in one forward must see the scales the
    prompt chose, as token-by-token decoding does; a cache filled outside the patch is refused (the
    scales would come from the continuation's last query)."""
    calls = []

    def scaler(q_last, keys, valid, scaling):  # follows the query closely, so recomputed scales would show
        calls.append(tuple(q_last.shape))
        return 1.0 + 3.0 * torch.sigmoid(300 * q_last.float().reshape(q_last.shape[0], keys.shape[1], -1).mean(-1))

    prompt, target = _ids(batch=1, length=30), _ids(batch=1, length=5, seed=1)
    with torch.no_grad(), RopePatch(tiny_llama, {1: RopeSpec(heads=scaler), 2: RopeSpec(heads=scaler)}):
        filled = tiny_llama(prompt, use_cache=True).past_key_values
        whole = tiny_llama(target, past_key_values=copy.deepcopy(filled), use_cache=True).logits
        steps = []
        for t in range(target.shape[1]):
            out = tiny_llama(target[:, t:t + 1], past_key_values=filled, use_cache=True)
            filled, steps = out.past_key_values, steps + [out.logits]
    assert calls == [(1, 4, 16)] * 2  # the prompt's forward, once per head-wise layer
    assert (whole - torch.cat(steps, dim=1)).abs().max().item() <= 1e-4
    with torch.no_grad():
        foreign = tiny_llama(prompt, use_cache=True).past_key_values
        with RopePatch(tiny_llama, {2: RopeSpec(heads=scaler)}), \
                pytest.raises(RuntimeError, match="layer 2: a forward continues a cache this patch did not prefill"):
            tiny_llama(target, past_key_values=foreign, use_cache=True)


def test_head_scales_must_match_the_key_value_heads(tiny_llama):
    with pytest.raises(ValueError, match="got 3 head scales, the model has 2 key/value heads"):
        RopePatch(tiny_llama, {0: RopeSpec(heads=(1.0, 1.0, 1.0))}).apply()
    with pytest.raises(ValueError, match="head scale must be a finite number > 0, got 0"):
        RopeSpec(heads=(1.0, 0))


# --- generation with the KV cache ---------------------------------------------------------------


def _stepwise_greedy(model, prompt, steps):
    """Greedy decoding without any cache: a full forward over the whole prefix at every step."""
    seq = prompt
    for _ in range(steps):
        nxt = _logits(model, seq)[:, -1].argmax(-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    return seq


def _patched_generate_matches_stepwise(model, specs, prompt, steps):
    with RopePatch(model, specs):
        with torch.no_grad():
            out = model.generate(
                prompt, max_new_tokens=steps, do_sample=False, min_new_tokens=steps,
                output_logits=True, return_dict_in_generate=True, pad_token_id=0,
            )
        reference = _stepwise_greedy(model, prompt, steps)
        # per-step logits of the cached decode equal a full uncached forward at that step
        full = _logits(model, out.sequences)[:, prompt.shape[1] - 1 : -1]
    cached = torch.stack(out.logits, dim=1)
    return out.sequences, reference, (cached - full).abs().max().item()


def test_generate_under_patch_equals_stepwise_decode_tiny(tiny_llama):
    specs = [RopeSpec(scale=1.9), RopeSpec(mask=True), RopeSpec(coarsen=4), RopeSpec(scale=1.2)]
    prompt = _ids(batch=1, length=30)
    seq, reference, diff = _patched_generate_matches_stepwise(tiny_llama, specs, prompt, steps=12)
    assert torch.equal(seq, reference)
    assert diff <= 1e-4


@pytest.mark.slow
def test_generate_under_patch_equals_stepwise_decode_smollm2(smollm2):
    from lpes_nb.store.models import load_tokenizer

    tok = load_tokenizer()
    text = "The Eiffel Tower is in Paris. The Colosseum is in Rome. Big Ben is in London. The Colosseum is in"
    prompt = tok(text, return_tensors="pt").input_ids
    specs = scale_specs([1.0 + i / 29 for i in range(30)])
    specs[3] = RopeSpec(coarsen=2)
    seq, reference, diff = _patched_generate_matches_stepwise(smollm2, specs, prompt, steps=8)
    assert torch.equal(seq, reference)
    assert diff <= 1e-3


# --- exact restoration and bad input -------------------------------------------------------------


def test_remove_restores_bit_identical_logits_even_after_an_exception(tiny_llama):
    ids = _ids()
    ref = _logits(tiny_llama, ids)
    specs = scale_specs([2.0, 1.5, 1.1, 3.0])
    with pytest.raises(KeyError):
        with RopePatch(tiny_llama, specs):
            assert not torch.equal(_logits(tiny_llama, ids), ref)
            raise KeyError("boom")
    assert torch.equal(_logits(tiny_llama, ids), ref)
    assert all(not layer._forward_pre_hooks for layer in tiny_llama.model.layers)
    assert not tiny_llama.model._forward_pre_hooks

    patch = RopePatch(tiny_llama, specs).apply()
    assert patch.active and not torch.equal(_logits(tiny_llama, ids), ref)
    with pytest.raises(RuntimeError, match="already applied"):
        RopePatch(tiny_llama, specs).apply()
    patch.remove()
    assert not patch.active and torch.equal(_logits(tiny_llama, ids), ref)


def test_identical_specs_share_one_cos_sin_per_forward(tiny_llama):
    patch = RopePatch(tiny_llama, scale_specs([2.0, 2.0, 3.0, 2.0]))
    with patch:
        _logits(tiny_llama, _ids(length=20))
        assert len(patch._cache) == 2
        _logits(tiny_llama, _ids(length=30))  # a new forward must not reuse the old positions
        assert {v[0].shape[1] for v in patch._cache.values()} == {30}


def test_bad_input_raises_value_error_naming_the_value(tiny_llama):
    with pytest.raises(ValueError, match=r"got 3 RoPE specs .* 4 layers"):
        RopePatch(tiny_llama, scale_specs([1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match=r"out of range \[0, 3\]"):
        RopePatch(tiny_llama, {4: IDENTITY})
    for bad in (0, -1.5, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match=r"RoPE scale must be a finite number > 0, got"):
            RopeSpec(scale=bad)
    for bad in (0, -2, 1.5):
        with pytest.raises(ValueError, match=rf"coarsening factor k must be an integer >= 1, got {bad}"):
            RopeSpec(coarsen=bad)
    with pytest.raises(ValueError, match="RoPE base must be > 1, got 0.5"):
        RopeSpec(base=0.5)
    with pytest.raises(ValueError, match="must be a RopeSpec or None"):
        normalize_specs([1.5, None, None, None], 4)


def test_non_rope_model_is_rejected():
    from transformers import GPT2Config

    with pytest.raises(ValueError, match="model type 'gpt2' has no rotary position embedding"):
        model_from_config(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100))


def test_find_rope_stack_reads_per_layer_type_tables():
    from lpes_nb.store.models import load_model

    stack = find_rope_stack(load_model("tiny-gemma3"))
    full, _ = stack.native(3)
    sliding, _ = stack.native(0)
    assert stack.layer_types[3] == "full_attention" and not torch.equal(full, sliding)

"""The mechanism on every RoPE decoder architecture of the installed transformers that builds from a
tiny config: each check is exact or refused with a clear error naming the model type and feature."""

import copy

import pytest
import torch
from zoo import VOCAB, build, rope_types, tiny_model, with_rope_parameters

from lpes_nb.core.rope import (
    IDENTITY,
    RopePatch,
    RopeSpec,
    UnsupportedModel,
    find_rope_stack,
    scale_specs,
)

# model type -> what is refused on it, and why ("all": the per-layer patch itself)
REFUSED = {
    "beam": {"all": "its decoder layers get no position_embeddings keyword"},
    "deepseek_v4": {"all": "rotary modules inside its attention, no shared one"},
    "hrm_text": {"all": "rotary modules inside its blocks, no shared one"},
    "moshi": {"all": "rotary modules inside its attention, no shared one"},
    "olmo_hybrid": {"all": "its decoder layers get no position_embeddings keyword"},
    "zaya": {"all": "its decoder layers get no position_embeddings keyword"},
    "gemma4_unified_text": {"all": "head_dim differs between its layers (per-layer config)"},
}
HEADWISE_REFUSED = {"falcon", "minimax", "gpt_neox", "gpt_neox_japanese", "jetmoe", "llama4_text", "modernbert-decoder"}
ARCHITECTURES = [
    "afmoe", "apertus", "arcee", "aria_text", "beam", "bitnet", "cohere", "cohere2", "cohere2_moe", "cwm",
    "deepseek_v4", "diffllama", "doge", "ernie4_5", "ernie4_5_moe", "exaone4", "exaone_moe", "falcon", "falcon_h1",
    "flex_olmo", "flint", "fuyu", "gemma", "gemma2", "gemma3_text", "gemma4_unified_text", "glm", "glm4",
    "gpt_neox", "gpt_neox_japanese", "gpt_oss", "granite", "granite_swa", "granitemoe", "granitemoe_swa",
    "granitemoeshared", "helium", "hrm_text", "hunyuan_v1_dense", "hunyuan_v1_moe", "hyperclovax", "internlm3",
    "iquestcoder", "jais2", "jetmoe", "lfm2", "llama", "llama4_text", "minimax", "minimax_m2",
    "minimax_m3_vl_text", "ministral", "ministral3", "mistral", "mixtral", "modernbert-decoder", "moshi",
    "nanochat", "nemotron", "olmo", "olmo2", "olmo3", "olmo_hybrid", "olmoe", "persimmon", "phi", "phi3",
    "phimoe", "qwen2", "qwen3", "seed_oss", "smollm3", "stablelm", "starcoder2", "vaultgemma", "zaya",
]
# identity is exact, every other table is refused
TABLES_REFUSED = {"phimoe": "its rotary module rebuilds its table from the config on every call"}
SUPPORTED = [a for a in ARCHITECTURES if a not in REFUSED]
SCALABLE = [a for a in SUPPORTED if a not in TABLES_REFUSED]
TOL = 1e-6  # fp32, max |delta logit|
IDS = torch.randint(3, VOCAB, (2, 24), generator=torch.Generator().manual_seed(0))


def _layers(model):
    return find_rope_stack(model).num_layers


def _kv_heads(model):
    config = model.config.get_text_config()
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


def _logits(model):
    with torch.no_grad():
        return model(IDS).logits.float()


def _default_rope(model):
    """The model with its RoPE type set to plain RoPE (same weights), or the model itself."""
    stack = find_rope_stack(model)
    if all(stack.rope_type(l) == "default" for l in range(stack.num_layers)):
        return model
    return with_rope_parameters(model, lambda p: {**p, "rope_type": "default"})


def _linear(p, factor):
    # PhiMoE's rotary module reads these three for every non-default type (mscale 1: no change)
    return {**p, "rope_type": "linear", "factor": factor, "original_max_position_embeddings": 256,
            "short_mscale": 1.0, "long_mscale": 1.0}


def test_the_architecture_list_is_every_rope_decoder_that_builds_tiny():
    assert rope_types() == ARCHITECTURES
    assert len(SUPPORTED) >= 20


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_unsupported_architectures_are_refused_naming_the_model_type(model_type):
    model = tiny_model(model_type)
    with pytest.raises(UnsupportedModel, match=repr(model_type)):
        with RopePatch(model, [IDENTITY] * _layers(model)):
            _logits(model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("model_type", SUPPORTED)
def test_identity_specs_are_bit_identical(model_type, dtype):
    model = tiny_model(model_type)
    if dtype != torch.float32:
        model = build(model.config, dtype)
        model.load_state_dict(tiny_model(model_type).state_dict())
    ref = _logits(model)
    with RopePatch(model, [IDENTITY] * _layers(model)):
        assert torch.equal(_logits(model), ref)


def _reference_logits(model, scales):
    """Layer l gets the tables of a fresh rotary module of the model's own class, built from a
    config with transformers' linear factor s_l."""
    stack = find_rope_stack(model)
    handles = []
    for layer, kind, s in zip(stack.layers, stack.layer_types, scales):
        config = with_rope_parameters(model, lambda p, s=s: _linear(p, s)).config.get_text_config()
        rotary = type(stack.rotary)(config)

        def hook(module, args, kwargs, rotary=rotary, kind=kind):
            hidden = args[0] if args else kwargs["hidden_states"]
            extra = () if kind is None else (kind,)
            kwargs["position_embeddings"] = rotary(hidden, kwargs["position_ids"], *extra)
            return args, kwargs

        handles.append(layer.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        return _logits(model)
    finally:
        for h in handles:
            h.remove()


@pytest.mark.parametrize("model_type", SCALABLE)
def test_uniform_scale_equals_transformers_linear(model_type):
    model = _default_rope(tiny_model(model_type))
    n = _layers(model)
    expected = _logits(with_rope_parameters(model, lambda p: _linear(p, 1.7)))
    with RopePatch(model, scale_specs([1.7] * n)):
        assert (_logits(model) - expected).abs().max().item() <= TOL
    if model_type != "flint":  # flint's tiny config has full-attention layers only, which it runs without RoPE
        assert (_logits(model) - expected).abs().max().item() > 1e-3


@pytest.mark.parametrize("model_type", SCALABLE)
def test_per_layer_scales_equal_the_models_own_rotary_module_per_layer(model_type):
    model = _default_rope(tiny_model(model_type))
    scales = [1.3 + 0.8 * l for l in range(_layers(model))]
    expected = _reference_logits(model, scales)
    with RopePatch(model, scale_specs(scales)):
        assert (_logits(model) - expected).abs().max().item() <= TOL


@pytest.mark.parametrize("model_type", [a for a in SCALABLE if a not in HEADWISE_REFUSED])
def test_head_wise_scales_equal_layer_wise_scales(model_type):
    model = tiny_model(model_type)
    n, heads = _layers(model), _kv_heads(model)
    ref = _logits(model)
    with RopePatch(model, [RopeSpec(heads=(1.0,) * heads)] * n):
        assert torch.equal(_logits(model), ref)
    with RopePatch(model, [RopeSpec(heads=(1.7,) * heads)] * n):
        headwise = _logits(model)
    with RopePatch(model, scale_specs([1.7] * n)):
        assert (headwise - _logits(model)).abs().max().item() <= TOL


@pytest.mark.parametrize("model_type", sorted(HEADWISE_REFUSED))
def test_head_wise_specs_are_refused_where_the_attention_cannot_take_them(model_type):
    model = tiny_model(model_type)
    heads = _kv_heads(model)
    with pytest.raises(UnsupportedModel, match=rf"head-wise RoPE spec .* model type {model_type!r}"):
        with RopePatch(model, [RopeSpec(heads=(1.5,) * heads)] * _layers(model)):
            pass
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


@pytest.mark.parametrize("model_type", SCALABLE)
def test_the_models_own_base_reproduces_the_model(model_type):
    model = tiny_model(model_type)
    stack = find_rope_stack(model)
    params = stack.rotary.config.rope_parameters
    bases = [(params if kind is None else params[kind])["rope_theta"] for kind in stack.layer_types]
    ref = _logits(model)
    with RopePatch(model, [RopeSpec(base=b) for b in bases]):
        assert torch.equal(_logits(model), ref)


@pytest.mark.parametrize("model_type", sorted(TABLES_REFUSED))
def test_models_whose_rotary_ignores_the_table_refuse_every_non_identity_spec(model_type):
    model = tiny_model(model_type)
    n, heads = _layers(model), _kv_heads(model)
    for specs in (scale_specs([1.5] * n), [RopeSpec(base=5000.0)] * n, [RopeSpec(heads=(1.5,) * heads)] * n):
        with pytest.raises(UnsupportedModel, match=rf"model type {model_type!r}: its rotary module ignores"):
            with RopePatch(model, specs):
                _logits(model)


ROPE_TYPES = {
    "default": {},
    "linear": {"factor": 2.0},
    "dynamic": {"factor": 2.0},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": 64},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
}


@pytest.mark.parametrize("length", [24, 300])
@pytest.mark.parametrize("rope_type", sorted(ROPE_TYPES))
def test_base_spec_keeps_the_models_rope_type(rope_type, length):
    """RopeSpec(base=own base) reproduces a Llama with every rebuildable rope_type (also a dynamic
    one past its window), and another base changes the table through that type's own formula."""
    model = with_rope_parameters(tiny_model("llama"), lambda p: {**p, "rope_type": rope_type, **ROPE_TYPES[rope_type]})
    theta = model.config.rope_parameters["rope_theta"]
    ids = torch.randint(3, VOCAB, (1, length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits
        with RopePatch(model, [RopeSpec(base=theta)] * 2):
            assert torch.equal(model(ids).logits, ref)
        other = with_rope_parameters(model, lambda p: {**p, "rope_theta": theta * 3})
        with RopePatch(model, [RopeSpec(base=theta * 3)] * 2):
            assert (model(ids).logits - other(ids).logits).abs().max().item() <= TOL


def test_base_spec_on_longrope_is_refused():
    model = tiny_model("phi3")
    config = copy.deepcopy(model.config)
    config.rope_parameters = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 64,
                              "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    longrope = build(config)
    with pytest.raises(UnsupportedModel, match="model type 'phi3': its rope_type 'longrope' cannot be rebuilt"):
        with RopePatch(longrope, [RopeSpec(base=20000.0)] * 2):
            _logits(longrope)

"""Tiny random-weight models of every decoder architecture in the installed transformers that has a
rotary position embedding: the set the per-layer RoPE mechanism is tested on."""

from __future__ import annotations

import copy
import functools
import warnings

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

VOCAB = 128
# initializer_range 0.2 (not the usual 0.02) so that RoPE changes move the logits visibly
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=256, tie_word_embeddings=False,
              initializer_range=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=2)
OVERRIDES = {"persimmon": dict(num_key_value_heads=None), "fuyu": dict(num_key_value_heads=None),
             "falcon": dict(head_dim=None, num_key_value_heads=None, num_kv_heads=2, new_decoder_architecture=True)}
MAX_PARAMETERS = 20e6  # configs whose other defaults stay large (vision towers, huge MoE) are left out


def tiny_config(model_type: str):
    fields = {**COMMON, **OVERRIDES.get(model_type, {})}
    fields = {k: v for k, v in fields.items() if v is not None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoConfig.for_model(model_type, **fields)


def build(config, dtype=torch.float32, seed: int = 0, attn_implementation: str = "eager"):
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=dtype).eval()


def with_rope_parameters(model, change):
    """The same weights under a config whose rope_parameters (per layer type too) are ``change(p)``."""
    config = copy.deepcopy(model.config)
    text = config.get_text_config()
    params = text.rope_parameters
    if all(isinstance(v, dict) for v in params.values()):
        text.rope_parameters = {k: change(v) for k, v in params.items()}
    else:
        text.rope_parameters = change(params)
    other = build(config, model.dtype, attn_implementation=model.config._attn_implementation)
    other.load_state_dict(model.state_dict())
    return other


def rope_types() -> list[str]:
    """Every causal-LM model type that builds from the tiny config, runs, and has a rotary module."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    found = []
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        try:
            config = tiny_config(model_type)
            with torch.device("meta"):
                meta = build(config)
            if sum(p.numel() for p in meta.parameters()) > MAX_PARAMETERS:
                continue
            if not any(name.endswith("rotary_emb") for name, _ in meta.named_modules()):
                continue
            with torch.no_grad():
                build(config)(torch.randint(3, VOCAB, (1, 12)))
        except Exception:  # not buildable from a generic tiny config: out of the set
            continue
        found.append(model_type)
    return found


@functools.lru_cache(maxsize=None)
def tiny_model(model_type: str):
    return build(tiny_config(model_type))

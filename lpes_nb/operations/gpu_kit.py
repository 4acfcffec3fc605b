"""The GPU kit: what a researcher runs first on a CUDA machine, as one prepared, resumable command.

``bash scripts/gpu_kit.sh --out DIR [--dry] [--steps ...] [--budget-s S]`` (``lpes gpu-kit``).
Every step writes ``OUT/<step>.json`` when it has finished and is skipped when that file exists, so
a kit cut off by a call's time limit resumes where it stopped:

* ``carry``: packs what the GPU machine lacks (the converted embedded weights, the data) into parts
  of at most 60 MiB with SHA-256 checksums (:mod:`lpes_nb.operations.carry`) and proves the round trip; on the
  GPU machine ``lpes carry unpack`` reassembles them (see docs/gpu.md).
* ``parity``: the per-layer RoPE patch in bf16 and fp16 under ``sdpa`` and ``flash_attention_2``
  against a float32 eager reference with the same weights and the same per-layer scales (relative
  L2 error of the logits within the dtype's tolerance), the (cos, sin) tables every layer's attention
  receives equal to float64 ones for its scale, and a deliberately wrong scale (one layer left at 1,
  as a patch that missed it) detected in those tables. Any mismatch stops the kit with the numbers.
* ``latency``: the paper's Table 4 methods on MDQA prompts (batch 1, fixed decode length),
  interleaved per prompt: median and IQR over the prompts after a warm-up, per-prompt ratios to the
  baseline with a bootstrap interval of their median; device, driver and CUDA recorded; stored
  prompt by prompt, so a call cut off by the budget resumes.
* ``ga``: the search's fitness evaluations at the paper's settings (MDQA, λ-weighted begin /
  middle / end, the decode length of the judge) timed, with peak memory, against the cost model's
  prediction (:mod:`lpes_nb.operations.cost_model`) as a ratio.
* ``regime``: notebook 9 under the ``gpu`` profile (the map, the record cell on all 441 MDQA-20
  records, the search at the paper's budget), its store under ``OUT/regime``; every part of it
  resumes from that store, so a call cut off by its time limit loses at most one record or one GA
  generation.

``--dry`` runs every step on the CPU with tiny random models (regime: the ``gpu-dry`` profile) in
under two minutes, in the same schema; the test command runs it.

The 7B-shaped models are random weights in Llama-2-7B / Vicuna and Qwen2-7B shapes (the Vicuna shape
takes SmolLM2's 49,152-token vocabulary so that real prompts tokenise, instead of 32,000; this moves
its FLOPs by under 1 %). A random model's accuracy means nothing; its speed and memory do, and its
answers run to the full decode length (an upper bound on time).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch
from scipy import stats
from transformers import AutoConfig

from . import carry, cost_model

from ..core.bezier import layer_scales
from ..core.ga import GAConfig
from ..core.rope import RopePatch, find_rope_stack, scale_specs
from ..evaluation.evaluate import evaluate_samples
from ..evaluation.fitness import PositionFitness
from ..evaluation.tasks import TASKS, EvalSettings, TaskConfig
from ..store.data import data_dir
from ..store.models import QWEN_15B, TINY_MODELS, ensure_embedded, load_model, load_tokenizer, model_from_config, tiny_config
from ..store.results import write_csv, write_json
from ..studies.benchmarks import compared_methods, latency_samples
from ..system import machine

STEPS = ("carry", "parity", "latency", "ga", "regime")

# random-weight models in 7B shapes (tokenised by the tokenizer named beside them)
SHAPED = {
    "vicuna-7b-shape": ("llama", "smollm2-135m", dict(
        hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
        vocab_size=49152, max_position_embeddings=4096, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "qwen2-7b-shape": ("qwen2", "qwen2.5-coder-0.5b", dict(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
        vocab_size=152064, max_position_embeddings=32768, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
}
# The patched model may add no error beyond what the dtype's rounding already gives the unpatched
# model against the float32 eager reference: allowed = SLACK x that floor + ABS_SLACK (relative L2 of
# the logits). Measured on CPU (tiny models, 64 tokens): floor ~1 % in bf16, ~0.13 % in fp16; the
# patched error 0.9-1.1x its floor.
SLACK, ABS_SLACK = 1.5, 0.002
# Whether every layer's attention receives its own scale is checked where it happens, on the cos/sin
# tables each attention module is called with, against tables computed independently in float64:
# the end-to-end logits cannot see one missed layer in a random 7B shape (measured on an H200 at
# 1,024 tokens: a layer left at 1 moves the float32 logits by 3-5 %, bf16's own rounding moves them
# 6-7 %), the layer's tables show it at once. A table may differ by its dtype's rounding (2 ulp
# of a value in [-1, 1]) plus the float32 angle's error at these positions (ANGLE_SLACK: at 1,024
# positions an angle's rounding is below 3e-5).
ANGLE_SLACK = 1e-4
# a wrong scale counts as detected when its table error is this many times the allowed error
DETECT = 3.0


@dataclass(frozen=True)
class KitPlan:
    parity_models: tuple[str, ...]
    parity_tokens: int
    dtypes: tuple[str, ...]
    attentions: tuple[str, ...]
    latency_model: str
    latency_docs: int
    latency_prompts: int
    latency_new_tokens: int
    ga_model: str
    ga_docs: int
    ga_records: int  # per position (begin, middle, end)
    ga_candidates: int
    ga_batch_size: int
    regime_profile: str
    carry_models: tuple[str, ...]


# the paper's settings: Table 4 on 500 MDQA samples with Vicuna (we time 50 prompts); the GA on
# MDQA-20 with the judge's 100 new tokens and batches of 16
REAL = KitPlan(("vicuna-7b-shape", "qwen2-7b-shape", "smollm2-135m", "qwen2.5-coder-0.5b"), 1024,
               ("bfloat16", "float16"), ("sdpa", "flash_attention_2"),
               "vicuna-7b-shape", 20, 50, 16, "vicuna-7b-shape", 20, 8, 4, 16, "gpu",
               ("smollm2-135m", "qwen2.5-coder-0.5b"))
DRY = KitPlan(("tiny-llama", "tiny-qwen2"), 64, ("bfloat16", "float16"), ("sdpa", "flash_attention_2"),
              "tiny-llama", 3, 10, 4, "tiny-llama", 3, 2, 2, 4, "gpu-dry", ())  # 10 prompts: the real run times 50


class ParityFailure(RuntimeError):
    """The patch's logits left the dtype's tolerance, or a wrong scale went unnoticed."""


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def describe_device() -> dict:
    """What a timing came from: GPU name, driver, CUDA, torch (or the CPU)."""
    out = {"torch": torch.__version__, "python": platform.python_version()}
    if not torch.cuda.is_available():
        return {**out, "device": "cpu", "cpu": machine.describe_cpu()["cpu"]}
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        driver = f"unknown ({e})"
    return {**out, "device": torch.cuda.get_device_name(), "driver": driver, "cuda": torch.version.cuda,
            "memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)}


def kit_model(name: str, dtype: str, attn: str, dry: bool = False):
    """A model for the kit on this machine's device: a tiny or 7B-shaped random one (built in place,
    seed 0) or an embedded one; the tiny ones get a larger weight scale in the dry run so that their
    attention depends on position (at the usual 0.02 a 64-wide model attends almost uniformly and a
    wrong scale would hide in the rounding)."""
    if name in SHAPED or name in TINY_MODELS:
        if name in SHAPED:
            model_type, _, fields = SHAPED[name]
            config = AutoConfig.for_model(model_type, **fields)
        else:
            config = tiny_config(name, initializer_range=0.1 if dry else 0.02)
        with torch.device(device()):
            return model_from_config(config, attn_implementation=attn, dtype=getattr(torch, dtype))
    return load_model(name, dtype=dtype, attn_implementation=attn).to(device())


def tokenizer_for(name: str):
    return load_tokenizer(SHAPED[name][1] if name in SHAPED else "smollm2-135m" if name in TINY_MODELS else name)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


def parity_scales(num_layers: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-layer scales rising from 1 to 3 over depth, and the same with the middle layer left at 1."""
    right = np.linspace(1.0, 3.0, num_layers)
    wrong = right.copy()
    wrong[num_layers // 2] = 1.0
    return right, wrong


def _received_tables(model) -> tuple[list, Callable[[], None]]:
    """Record the (cos, sin) each decoder layer's attention is called with; returns the list (one
    entry per layer per forward) and the function that removes the hooks."""
    seen, handles = [], []
    for layer, module in enumerate(find_rope_stack(model).layers):
        def hook(_, args, kwargs, layer=layer):
            seen.append((layer, kwargs["position_embeddings"]))
        handles.append(module.self_attn.register_forward_pre_hook(hook, with_kwargs=True))
    return seen, lambda: [h.remove() for h in handles]


def table_error(model, received: list, scales: np.ndarray, tokens: int) -> tuple[float, int]:
    """The largest deviation of the received (cos, sin) from ``cos/sin(p * inv_freq / s_l)`` computed
    in float64 from the model's own frequency table, and the layer where it is largest."""
    stack = find_rope_stack(model)
    positions = torch.arange(tokens, dtype=torch.float64)
    worst, where = 0.0, -1
    for layer, (cos, sin) in received:
        inv_freq, scaling = stack.native(layer)
        angles = positions[:, None] * (inv_freq.double().cpu() / float(scales[layer]))[None]
        emb = torch.cat([angles, angles], dim=-1)  # the rotate-half layout of Llama and Qwen2
        for got, want in ((cos, emb.cos() * scaling), (sin, emb.sin() * scaling)):
            err = float((got[0].double().cpu() - want).abs().max())
            if err > worst:
                worst, where = err, layer
    return worst, where


@torch.inference_mode()
def parity_case(model, reference, tokens: int, wrong_scales: bool = False) -> dict:
    """One model under one dtype and attention against its float32 eager ``reference``: the relative
    error of the unpatched logits (the dtype's floor) and of the patched ones, and the (cos, sin)
    tables every layer's attention received against the intended per-layer scales (with
    ``wrong_scales`` the patch is given the middle layer at 1, as a patch that missed it)."""
    layers = find_rope_stack(model).num_layers
    right, wrong = parity_scales(layers)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, model.config.vocab_size, (2, tokens), generator=g).to(model.device)

    def logits(m, scales):
        with RopePatch(m, scale_specs(scales)):
            return m(input_ids=ids).logits

    floor = relative_error(model(input_ids=ids).logits, reference(input_ids=ids).logits)
    expected = logits(reference, right)
    received, unhook = _received_tables(model)
    try:
        error = relative_error(logits(model, wrong if wrong_scales else right), expected)
        given = list(received)
        if not wrong_scales:  # with wrong scales the forward above already recorded the missed layer's tables
            received.clear()
            logits(model, wrong)
        missed = list(received)
    finally:
        unhook()
    allowed = SLACK * floor + ABS_SLACK
    table_allowed = 2 * torch.finfo(model.dtype).eps + ANGLE_SLACK
    given_error, worst_layer = table_error(model, given, right, tokens)
    wrong_error, _ = table_error(model, missed, right, tokens)
    return {"unpatched_error": floor, "error": error, "allowed": allowed, "matches": error <= allowed,
            "table_error": given_error, "table_allowed": table_allowed, "worst_layer": worst_layer,
            "tables_match": given_error <= table_allowed, "wrong_scale_table_error": wrong_error,
            "wrong_scale_detected": wrong_error > DETECT * table_allowed}


def run_parity(out: Path, plan: KitPlan, dry: bool, inject_wrong_scale: bool = False) -> dict:
    rows = []
    for name in plan.parity_models:
        for dtype in plan.dtypes:
            for attn in plan.attentions:
                row = {"model": name, "dtype": dtype, "attention": attn}
                try:
                    model = kit_model(name, dtype, attn, dry)
                except (ImportError, ValueError, OSError) as e:  # flash-attn not installed; weights not carried
                    rows.append({**row, "status": f"unavailable: {str(e).splitlines()[0][:200]}"})
                    continue
                reference = kit_model(name, "float32", "eager", dry)
                reference.load_state_dict(model.state_dict())  # the same (rounded) weights, computed in float32
                case = parity_case(model, reference, plan.parity_tokens, inject_wrong_scale)
                ok = case["matches"] and case["tables_match"] and case["wrong_scale_detected"]
                rows.append({**row, **case, "status": "ok" if ok else "MISMATCH"})
                del model, reference
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
    table = pd.DataFrame(rows)
    write_csv(out / "parity.csv", table)
    bad = table[table["status"] == "MISMATCH"]
    if len(bad):
        raise ParityFailure("the RoPE patch does not reach the attention as in the float32 reference:\n"
                            + bad.to_string(index=False))
    if dry or torch.cuda.is_available():
        checked = table[table["status"] == "ok"]
        if checked.empty:
            raise ParityFailure("no parity case could run on this machine:\n" + table.to_string(index=False))
    return {"cases": len(table), "ok": int((table["status"] == "ok").sum()),
            "unavailable": table.loc[table["status"].str.startswith("unavailable"), ["model", "dtype", "attention", "status"]]
            .to_dict("records")}


def timing_attention(dry: bool) -> tuple[str, str | None]:
    """The attention kernel the timing steps use, and why if it is not the paper's: flash-attention-2
    where the ``flash_attn`` package is installed, else ``sdpa`` (PyTorch's fused kernel) with a note
    that travels into the step's result, so a timing always names the kernel it measured."""
    if dry:
        return "sdpa", None
    if importlib.util.find_spec("flash_attn") is None:
        note = "flash-attn is not installed in this python: timed with sdpa instead of flash_attention_2"
        print(f"[gpu_kit] {note}", file=sys.stderr)
        return "sdpa", note
    return "flash_attention_2", None


def _lpes_scales(num_layers: int) -> np.ndarray:
    """A fixed LPES-like curve for timing (any per-layer scales cost the same)."""
    return layer_scales(np.array([[0.0, 1.0], [0.33, 1.8], [0.66, 1.2], [1.0, 1.5]]), num_layers)


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_latency(out: Path, plan: KitPlan, dry: bool, seconds: float | None = None) -> dict:
    """Per prompt, every method once in a rotating order (batch 1, exactly ``latency_new_tokens``).
    Each prompt's times are stored as it finishes (``OUT/latency_times.csv``; a line per prompt
    printed with every method's seconds) and a later call times only the prompts not stored yet;
    after ``seconds`` (None: no limit) it stops at the end of a prompt and reports itself incomplete."""
    begun = time.perf_counter()
    dtype = "float32" if dry else "bfloat16"
    attn, attn_note = timing_attention(dry)
    model, tokenizer = kit_model(plan.latency_model, dtype, attn, dry), tokenizer_for(plan.latency_model)
    methods = compared_methods(_lpes_scales(find_rope_stack(model).num_layers))
    table4 = ["baseline", "PI", "LPES", "Ms-PoE", "Attention Buckets", "MoICE (untrained)"]
    methods = {name: methods[name] for name in table4}
    samples = latency_samples(TaskConfig("mdqa", plan.latency_docs), plan.latency_prompts + 1)
    settings = EvalSettings(mode="generate", max_new_tokens=plan.latency_new_tokens, batch_size=1, stop_at_newline=False)
    names = list(methods)

    def timed(sample, name):
        _sync()
        start = time.perf_counter()
        evaluate_samples(model, tokenizer, [sample], method=methods[name], settings=settings, progress=False, fixed_length=True)
        _sync()
        return time.perf_counter() - start

    stored = out / "latency_times.csv"
    rows = pd.read_csv(stored).to_dict("records") if stored.exists() else []
    done = {r["prompt"] for r in rows}
    for name in names:  # warm-up: kernels, caches, allocator
        timed(samples[0], name)
    todo = [i for i in range(len(samples) - 1) if i not in done]
    for k, i in enumerate(todo):
        new = [{"prompt": i, "method": name, "seconds": timed(samples[i + 1], name)}
               for name in names[i % len(names):] + names[: i % len(names)]]
        rows += new
        write_csv(stored, pd.DataFrame(rows))
        print(f"[gpu_kit] latency prompt {i + 1}/{len(samples) - 1}: "
              + ", ".join(f"{r['method']} {r['seconds']:.2f} s" for r in new), file=sys.stderr, flush=True)
        if seconds is not None and k + 1 < len(todo) and time.perf_counter() - begun > seconds:
            return {"complete": False}  # at least one prompt per call, so every call makes progress
    times = pd.DataFrame(rows)
    wide = times.pivot(index="prompt", columns="method", values="seconds")
    summary = []
    for name in names:
        ratio = (wide[name] / wide["baseline"]).to_numpy()
        ci = stats.bootstrap((ratio,), np.median, n_resamples=2000, random_state=0, method="percentile").confidence_interval
        summary.append({"method": name, "median_s": wide[name].median(), "q25_s": wide[name].quantile(0.25),
                        "q75_s": wide[name].quantile(0.75), "median_ratio": float(np.median(ratio)),
                        "ratio_ci_low": float(ci.low), "ratio_ci_high": float(ci.high)})
    write_csv(out / "latency.csv", pd.DataFrame(summary))
    tokens = [len(tokenizer(s.prompt)["input_ids"]) for s in samples[1:]]
    return {"complete": True, "model": plan.latency_model, "dtype": dtype, "attention": attn, "attention_note": attn_note,
            "prompts": len(samples) - 1,
            "prompt_tokens_median": int(np.median(tokens)), "new_tokens": plan.latency_new_tokens,
            "methods": summary}


def _peak_memory_gib() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB; the process's resident peak


def run_ga(out: Path, plan: KitPlan, dry: bool) -> dict:
    """``ga_candidates`` fitness evaluations (random Bézier curves, the paper's fitness in generate
    mode) timed against :func:`lpes_nb.operations.cost_model.prompt_cost`'s prediction for the same prompts."""
    dtype = "float32" if dry else "bfloat16"
    attn, attn_note = timing_attention(dry)
    model, tokenizer = kit_model(plan.ga_model, dtype, attn, dry), tokenizer_for(plan.ga_model)
    layers = find_rope_stack(model).num_layers
    task = TaskConfig("mdqa", plan.ga_docs, n=plan.ga_records)
    samples = task.samples()
    settings = EvalSettings(mode="generate", max_new_tokens=TASKS["mdqa"].answer_tokens, batch_size=plan.ga_batch_size)
    fitness = PositionFitness(model, tokenizer, samples, settings)
    rng = np.random.default_rng(0)
    candidates = [layer_scales(np.column_stack([[0, 1 / 3, 2 / 3, 1], rng.uniform(1, 2, 4)]), layers) for _ in range(plan.ga_candidates)]
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    fitness(candidates[0][None])  # warm-up
    _sync()
    start = time.perf_counter()
    fitness(np.stack(candidates[1:] or candidates))
    _sync()
    per_candidate = (time.perf_counter() - start) / max(len(candidates) - 1, 1)
    tokens = float(np.mean([len(tokenizer(s.prompt)["input_ids"]) for s in samples]))
    shape = cost_model.Shape.of(model.config)
    gpu = cost_model.H100 if shape.hidden >= 2048 else cost_model.H100_SMALL_MODELS
    _, predicted = cost_model.prompt_cost(shape, gpu, len(samples), tokens, settings.max_new_tokens, settings.batch_size)
    paper = GAConfig()
    full = per_candidate * cost_model.ga_evaluations(paper) * (200 / plan.ga_records)  # the paper searched on 200 records per position
    return {"model": plan.ga_model, "dtype": dtype, "attention": attn, "attention_note": attn_note,
            "records_per_position": plan.ga_records,
            "prompts_per_candidate": len(samples), "prompt_tokens_mean": round(tokens, 1),
            "new_tokens": settings.max_new_tokens, "batch_size": settings.batch_size,
            "seconds_per_candidate": per_candidate, "predicted_seconds_per_candidate": predicted,
            "measured_over_predicted": per_candidate / predicted, "cost_model_gpu": gpu.name,
            "peak_memory_gib": _peak_memory_gib(),
            "paper_search_hours": full / 3600, "paper_search": f"{cost_model.ga_evaluations(paper)} evaluations x 200 records per position",
            "note": None if torch.cuda.is_available() else "CPU dry run: the prediction is an H100's, the ratio is not meaningful"}


def run_carry(out: Path, plan: KitPlan, dry: bool) -> dict:
    """Pack the data, both embedded tokenizers and the bf16 weights of ``carry_models`` (dry: a tiny
    model's) into ``OUT/carry/parts``, unpack them into a scratch folder and compare byte for byte.
    On the GPU machine: ``lpes carry unpack OUT/carry/parts DEST``, then point
    ``LPES_DATA_DIR`` at ``DEST/data`` and ``LPES_CACHE_DIR`` at ``DEST/models``. bf16 halves what
    travels (the float32 conversions are 0.5 and 2.4 GB); an embedded model whose weights did not
    travel is reported unavailable by the parity step, never passed."""
    stage = out / "carry" / "stage"
    shutil.rmtree(out / "carry", ignore_errors=True)
    shutil.copytree(data_dir(), stage / "data")
    for name in ("smollm2-135m", "qwen2.5-coder-0.5b"):
        shutil.copytree(ensure_embedded(name=name), stage / "models" / name, ignore=shutil.ignore_patterns("*.safetensors"))
    for name in plan.carry_models:
        load_model(name, dtype="float32").to(torch.bfloat16).save_pretrained(stage / "models" / name)
    if dry:
        kit_model("tiny-llama", "float32", "sdpa").save_pretrained(stage / "models" / "tiny-llama")
    manifest = carry.pack([stage], out / "carry" / "parts", root=stage)
    check = out / "carry" / "check"
    written = carry.unpack(out / "carry" / "parts", check)
    identical = all((stage / p.relative_to(check)).read_bytes() == p.read_bytes() for p in written)
    if not identical:
        raise RuntimeError("carry: a reassembled file differs from the packed one")
    shutil.rmtree(check)
    shutil.rmtree(stage)
    return {"files": len(manifest["files"]), "parts": len(manifest["parts"]),
            "bytes": sum(f["bytes"] for f in manifest["files"]), "round_trip_identical": identical,
            "weights": list(plan.carry_models) + (["tiny-llama"] if dry else []), "parts_dir": str(out / "carry" / "parts")}


def run_regime(out: Path, plan: KitPlan, dry: bool, seconds: float | None) -> dict:
    """Notebook 9 under the plan's profile, its store and executed notebook under ``OUT/regime``;
    stopped after ``seconds`` (None: no limit) and then reported incomplete (call the kit again)."""
    missing = [m for m in ("papermill", "ipykernel", "matplotlib", "statsmodels") if importlib.util.find_spec(m) is None]
    if missing:
        raise RuntimeError(f"the regime step runs notebook 9 and needs {missing} in this python; install them "
                           "(on a machine without network: wheels from `pip download`, carried like the weights)")
    env = {**os.environ, "LPES_OUTPUT_ROOT": str(out / "regime")}
    cmd = [sys.executable, "-m", "lpes_nb", "run", "--profile", plan.regime_profile, "--only", "09", "--out", str(out / "regime" / "runs")]
    try:
        subprocess.run(cmd, env=env, check=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        return {"complete": False}
    return {"complete": True, "profile": plan.regime_profile, "store": str(out / "regime")}


RUNNERS = {"carry": run_carry, "ga": run_ga}
RESUMABLE = {"latency": run_latency, "regime": run_regime}  # these take the budget left and resume from OUT


def check_mode(out: Path, dry: bool) -> None:
    """An output folder holds one kind of run: a dry run's steps (tiny random models on the CPU) are
    never reported as a real run's, nor the other way round. The folder's first run records its mode
    (a folder from before the record: the mode its finished steps name)."""
    marker = out / "kit.json"
    steps = [out / f"{step}.json" for step in STEPS if (out / f"{step}.json").exists()]
    modes = {json.loads(path.read_text()).get("dry") for path in ([marker] if marker.exists() else steps)}
    if not modes:
        write_json(marker, {"dry": dry})
        return
    stored = modes.pop() if len(modes) == 1 else "mixed"
    if stored != dry:
        kinds = {True: "a --dry run (tiny random models on the CPU)", False: "a real run"}
        raise ValueError(f"{out} holds {kinds.get(stored, f'a run of unknown mode {stored!r}')}; this is {kinds[dry]}: "
                         "give the kit another output folder")


def run_kit(out: Path | str, dry: bool = False, steps=STEPS, budget_s: float | None = None,
            inject_wrong_scale: bool = False, carry_models: tuple[str, ...] | None = None,
            ga_batch_size: int | None = None) -> dict:
    """Run the kit's ``steps`` (skipping those already done under ``out``) within ``budget_s`` seconds;
    the status of each step, by name. ``carry_models`` replaces the plan's models whose weights the
    carry step packs (``()``: data and tokenizers only, one part, for the shaped models' steps);
    ``ga_batch_size`` the ga step's batch (the paper's 16 by default; its result records the one used)."""
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        raise ValueError(f"unknown kit step(s) {unknown}; choose from {list(STEPS)}")
    if ga_batch_size is not None and (isinstance(ga_batch_size, bool) or not isinstance(ga_batch_size, int) or ga_batch_size < 1):
        raise ValueError(f"ga_batch_size must be an integer >= 1, got {ga_batch_size!r}")
    if not dry and set(steps) - {"carry"} and not torch.cuda.is_available():
        raise RuntimeError("the kit's real run needs a CUDA GPU (none is visible): on a CPU run it with --dry, "
                           "or only its carry step (--steps carry) to pack what a GPU machine without network needs")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    check_mode(out, dry)
    plan = DRY if dry else REAL
    if carry_models is not None:
        plan = replace(plan, carry_models=tuple(carry_models))
    if ga_batch_size is not None:
        plan = replace(plan, ga_batch_size=ga_batch_size)
    start, status = time.perf_counter(), {}
    for step in steps:
        done = out / f"{step}.json"
        if done.exists():
            status[step] = "done before"
            continue
        left = None if budget_s is None else budget_s - (time.perf_counter() - start)
        if left is not None and left <= 0:
            status[step] = "not started: budget spent (call again)"
            continue
        t0 = time.perf_counter()
        if step in RESUMABLE:
            result = RESUMABLE[step](out, plan, dry, left)
            if not result["complete"]:
                status[step] = "incomplete: budget spent (call again; it resumes from its store)"
                continue
        elif step == "parity":
            result = run_parity(out, plan, dry, inject_wrong_scale)
        else:
            result = RUNNERS[step](out, plan, dry)
        write_json(done, {"step": step, "dry": dry, "plan": asdict(plan), "machine": describe_device(),
                          "seconds": round(time.perf_counter() - t0, 1), "result": result})
        status[step] = "done"
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lpes gpu-kit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder (the kit resumes from what it holds)")
    parser.add_argument("--dry", action="store_true", help="every step on the CPU with tiny random models (< 2 min)")
    parser.add_argument("--steps", nargs="+", default=list(STEPS), choices=STEPS)
    parser.add_argument("--budget-s", type=float, default=None, help="stop starting steps after this many seconds")
    parser.add_argument("--carry-models", nargs="*", choices=(*REAL.carry_models, QWEN_15B), default=None,
                        help=f"carry: only these models' weights (none: data and tokenizers only; {QWEN_15B}, ~3 GB in "
                             "bf16, only when named and installed: requirements-qwen15b.txt)")
    parser.add_argument("--ga-batch-size", type=int, default=None, help="ga: prompts per batch (default: the paper's 16)")
    parser.add_argument("--inject-wrong-scale", action="store_true", help="parity: patch one layer wrongly (the kit must stop)")
    args = parser.parse_args(argv)
    try:
        status = run_kit(args.out, args.dry, args.steps, args.budget_s, args.inject_wrong_scale,
                         None if args.carry_models is None else tuple(args.carry_models), args.ga_batch_size)
    except ParityFailure as e:
        print(f"[gpu_kit] PARITY FAILED: {e}", file=sys.stderr)
        return 2
    print(json.dumps(status, indent=1))
    return 0

"""The LPES search on a model: the GA over Bézier control points (or per-layer scales) with the
λ-weighted position accuracy as fitness, resumable, and the evaluation of the scales it finds."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .data import Sample
from .evaluate import (
    LAMBDAS,
    EvalSettings,
    PositionFitness,
    ResultCache,
    answer_nll,
    cache_key,
    encode,
    evaluate_samples,
    target_ids,
    weighted_fitness,
)
from .ga import BezierSpace, GAConfig, GAResult, GeneticSearch, PerLayerSpace
from .metrics import accuracy_table, u_shape_rho
from .rope import RopePatch, RopeSpec, scale_specs


def run_search(model, tokenizer, samples: Sequence[Sample], space, config: GAConfig, out_dir: Path, name: str,
               settings: EvalSettings = EvalSettings(), lambdas: Sequence[float] = LAMBDAS, model_name: str = "",
               tie_break: float = 1e-3, progress: bool = True) -> GAResult:
    """Run (or resume, or reload) a GA search; results land in ``out_dir/<name>_*``.

    Fitness evaluations are cached on disk by scales, so reruns and ablations that meet the same
    scales never recompute them; the GA checkpoints after every generation."""
    out_dir = Path(out_dir)
    fitness = PositionFitness(model, tokenizer, samples, settings, lambdas, ResultCache(out_dir / "fitness_cache"),
                              model_name, tie_break)
    checkpoint = out_dir / f"{name}.ckpt.json"
    search = GeneticSearch(space, fitness, config, checkpoint=checkpoint, progress=progress)
    result = search.run()
    result.save(out_dir, name)
    return result


class _LearnedScale:
    """Position remap p -> p / s_l with s_l = 1 + sigmoid(u_l), a differentiable scale in (1, 2)."""

    def __init__(self, raw: torch.Tensor, layer: int):
        self.raw, self.layer = raw, layer

    def __call__(self, position_ids, segment_ids):
        return position_ids.float() / (1.0 + torch.sigmoid(self.raw[self.layer]))


def gradient_search(model, tokenizer, samples: Sequence[Sample], steps: int = 30, batch_size: int = 6, lr: float = 0.1,
                    lambdas: Sequence[float] = LAMBDAS, seed: int = 0, progress: bool = True) -> tuple[list[float], pd.DataFrame]:
    """The gradient-based baseline: per-layer scales as parameters (s_l = 1 + sigmoid(u_l), starting
    at 1.5 like the GA's first individual), optimised with Adam on the answer loss of the search set,
    each sample weighted by its position's λ (begin / middle / end). Returns the final scales and the
    per-step history (loss and scales)."""
    positions = sorted({s.position for s in samples})
    if len(positions) != 3:
        raise ValueError(f"the gradient search needs samples at exactly 3 gold positions, got {positions}")
    weight = dict(zip(positions, lambdas))
    layers = model.config.num_hidden_layers
    raw = torch.zeros(layers, requires_grad=True)
    optimiser = torch.optim.Adam([raw], lr=lr)
    prompts = [encode(tokenizer, s) for s in samples]
    targets = [target_ids(tokenizer, s.answers[0]) for s in samples]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    specs = [RopeSpec(remap=_LearnedScale(raw, l)) for l in range(layers)]
    rng = np.random.default_rng(seed)
    frozen = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    rows = []
    try:
        with RopePatch(model, specs):
            for step in tqdm(range(steps), desc="gradient search", disable=not progress):
                batch = rng.choice(len(samples), size=min(batch_size, len(samples)), replace=False)
                loss = answer_nll(model, [prompts[i] for i in batch], [targets[i] for i in batch], pad,
                                  [weight[samples[i].position] for i in batch])
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
                rows.append({"step": step, "loss": float(loss.detach()), **{f"s{l}": float(1 + torch.sigmoid(raw[l].detach())) for l in range(layers)}})
    finally:
        for p, flag in zip(model.parameters(), frozen):
            p.requires_grad_(flag)
    scales = [float(v) for v in (1 + torch.sigmoid(raw.detach()))]
    return scales, pd.DataFrame(rows)


def bezier_space(model, degree: int = 3, curve: str = "bezier") -> BezierSpace:
    return BezierSpace(model.config.num_hidden_layers, degree=degree, curve=curve)


def per_layer_space(model) -> PerLayerSpace:
    return PerLayerSpace(model.config.num_hidden_layers)


def evaluate_scales(model, tokenizer, samples: Sequence[Sample], scales: Mapping[str, Sequence[float] | None],
                    settings: EvalSettings = EvalSettings(), progress: bool = False) -> pd.DataFrame:
    """Accuracy by gold position (n, mean, 95 % CI, ρ, λ-fitness) for named per-layer scales
    (``None`` = the unmodified model)."""
    tables = []
    for label, s in scales.items():
        df = evaluate_samples(model, tokenizer, samples, None if s is None else scale_specs(s), settings, progress=progress)
        table = accuracy_table(df, by="position")
        table.insert(0, "method", label)
        table["rho"] = u_shape_rho(table["position"], table["mean"])
        table["fitness"] = weighted_fitness(df) if df["position"].nunique() == 3 else np.nan
        tables.append(table)
    return pd.concat(tables, ignore_index=True)


def uniform_like(scales: Sequence[float]) -> list[float]:
    """Positional interpolation with the same average scale (the PI baseline of LPES)."""
    return [float(np.mean(scales))] * len(scales)


def save_scales(path: Path, scales: Sequence[float], **meta) -> Path:
    """The scales JSON every method and the explorer load: ``{"scales": [...], ...}``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"scales": [round(float(s), 10) for s in scales], **meta}, indent=2) + "\n")
    return path


def load_scales(path: Path, num_layers: int | None = None) -> list[float]:
    """Scales from a JSON written by :func:`save_scales` or ``GAResult.save``; checks the layer count."""
    payload = json.loads(Path(path).read_text())
    if "scales" not in payload:
        raise ValueError(f"{path} has no 'scales' list")
    scales = [float(s) for s in payload["scales"]]
    if num_layers is not None and len(scales) != num_layers:
        raise ValueError(f"{path} holds {len(scales)} scales, the model has {num_layers} layers")
    if any(not s > 0 for s in scales):
        raise ValueError(f"{path} has non-positive scales; every RoPE scale must be > 0")
    return scales


def search_key(**parts) -> str:
    """A short name suffix for a search configuration (for file names of ablation runs)."""
    return cache_key(**{k: asdict(v) if hasattr(v, "__dataclass_fields__") else v for k, v in parts.items()})

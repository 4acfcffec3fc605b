"""The LPES search on a model: the GA over Bézier control points (or per-layer scales) with the
λ-weighted position accuracy as fitness, resumable, and the evaluation of the scales it finds."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

from .data import Sample
from .evaluate import LAMBDAS, EvalSettings, PositionFitness, ResultCache, cache_key, evaluate_samples, weighted_fitness
from .ga import BezierSpace, GAConfig, GAResult, GeneticSearch, PerLayerSpace
from .metrics import accuracy_table, u_shape_rho
from .rope import scale_specs


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

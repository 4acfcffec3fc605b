"""The calibration study (notebook 1): the unmodified model's accuracy by gold position for each
task setting, to choose settings where the baseline has a position effect."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from .evaluate import evaluate_samples
from .fitness import position_table
from .tasks import EvalSettings, TaskConfig


def calibrate(model, tokenizer, configs: list[TaskConfig], settings: EvalSettings = EvalSettings(),
              data_dir: str | Path | None = None) -> pd.DataFrame:
    """Baseline accuracy by gold position (n, mean, 95 % CI) for each task setting, with ρ(δ, a)."""
    tables = []
    for cfg in tqdm(configs, desc="calibration settings"):
        df = evaluate_samples(model, tokenizer, cfg.samples(data_dir), settings=settings, progress=False)
        tables.append(position_table(df, task=cfg.task, num_items=cfg.num_items, mode=settings.mode))
    return pd.concat(tables, ignore_index=True)

"""The calibration study (notebook 1): the unmodified model's accuracy by gold position for each
task setting, to choose settings where the baseline has a position effect."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from ..evaluation.evaluate import evaluate_samples
from ..evaluation.fitness import position_table
from ..evaluation.tasks import EvalSettings, TaskConfig


def calibrate(model, tokenizer, configs: list[TaskConfig], settings: EvalSettings = EvalSettings(),
              data_dir: str | Path | None = None) -> pd.DataFrame:
    """Baseline accuracy by gold position (n, mean, 95 % CI) for each task setting, with ρ(δ, a)."""
    tables = []
    for cfg in tqdm(configs, desc="calibration settings"):
        df = evaluate_samples(model, tokenizer, cfg.samples(data_dir), settings=settings, progress=False)
        tables.append(position_table(df, task=cfg.task, num_items=cfg.num_items, mode=settings.mode))
    return pd.concat(tables, ignore_index=True)


def shape(rows: pd.DataFrame) -> str:
    """The shape of one setting's first / middle / last accuracies, read from their Wilson intervals
    (unpaired and conservative: an end counts as above another position only where the intervals do
    not overlap): U, primacy, recency, or no clear position effect."""
    first, middle, last = (rows.sort_values("position").iloc[i] for i in (0, 1, 2))

    def above(a, b):
        return a["ci_low"] > b["ci_high"]

    if above(first, middle) and above(last, middle):
        return "U"
    if above(first, middle) or above(first, last):
        return "primacy"
    if above(last, middle) or above(last, first):
        return "recency"
    return "no clear position effect"


def curve_text(rows: pd.DataFrame) -> str:
    """One setting's first / middle / last accuracy with Wilson intervals and the shape they support."""
    rows = rows.sort_values("position")
    cells = " / ".join(f"{100 * r['mean']:.0f} [{100 * r['ci_low']:.0f}, {100 * r['ci_high']:.0f}]" for _, r in rows.iterrows())
    return f"{cells} % → **{shape(rows)}**"


def conclusion(kv: pd.DataFrame, mdqa: pd.DataFrame, chosen_pairs: int, window: int) -> str:
    """Notebook 1's reading, every number from its two calibration tables: per KV size and for MDQA
    the first / middle / last accuracy with Wilson intervals, the shape those intervals support and
    CALIOPE's ρ; the size the profile's search uses; the prompts' share of the trained window."""
    lines = [f"**KV retrieval** (first / middle / last, n = {int(kv['n'].min())} per position, Wilson 95 % intervals):"]
    for items, rows in kv.groupby("num_items"):
        mark = " ← the profile's search and test size" if items == chosen_pairs else ""
        lines.append(f"- {items} pairs (~{int(rows['prompt_tokens'].iloc[0]):,} tokens): {curve_text(rows)}, ρ = {rows['rho'].iloc[0]:+.0f}{mark}")
    docs = int(mdqa["num_items"].iloc[0])
    lines.append(f"\n**MDQA**, {docs} documents with the real retrieved distractors (n = {int(mdqa['n'].min())} per position): "
                 f"{curve_text(mdqa)}, ρ = {mdqa['rho'].iloc[0]:+.0f}.")
    tokens = pd.concat([kv, mdqa])["prompt_tokens"]
    lines.append(f"\n**Regime.** The prompts are {int(tokens.min()):,}–{int(tokens.max()):,} tokens, "
                 f"{100 * tokens.min() / window:.0f}–{100 * tokens.max() / window:.0f} % of the {window:,}-token window.")
    return "\n".join(lines)

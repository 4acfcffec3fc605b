"""Named task settings (per profile) and the calibration study that chose the `cpu` ones."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
from tqdm.auto import tqdm

from .data import (
    Sample,
    book_sentences,
    filler_sentences,
    generate_kv,
    kv_sample,
    load_kv,
    load_mdqa,
    long_text,
    mdqa_sample,
    passkey_sample,
    positions_for,
    two_fact_sample,
)
from .evaluate import EvalSettings, evaluate_samples
from .fitness import position_table

TASKS = ("kv", "mdqa", "passkey", "two_fact")


@dataclass(frozen=True)
class TaskConfig:
    """A task at several gold positions. ``n`` samples per position; ``offset`` skips the first
    records (keep search and test sets disjoint: different ``seed`` for generated tasks, different
    ``offset`` for MDQA)."""

    task: str = "kv"
    num_items: int = 20  # KV pairs / MDQA documents / passkey filler blocks / two-fact filler sentences
    n: int = 20
    positions: tuple[int, ...] | None = None  # default: begin, middle, end
    seed: int = 0
    offset: int = 0
    key_format: str = "letters6"
    value_format: str = "digits4"
    source: str = "generated"  # KV only: "generated" or "file" (the original 75-pair UUID records)

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; choose one of {TASKS}")
        if self.source not in ("generated", "file"):
            raise ValueError(f"unknown KV source {self.source!r}; choose 'generated' or 'file'")
        if self.source == "file" and self.task != "kv":
            raise ValueError(f"source='file' is for the KV task only, got task={self.task!r}")
        if self.n < 1 or self.num_items < 2:
            raise ValueError(f"need n >= 1 and num_items >= 2, got n={self.n}, num_items={self.num_items}")
        for p in self.positions or ():
            if not 0 <= p < self.num_items:
                raise ValueError(f"gold position {p} is outside [0, {self.num_items - 1}]")

    def gold_positions(self) -> list[int]:
        return list(self.positions) if self.positions else positions_for(self.num_items, 3)

    def samples(self, data_dir: str | Path | None = None) -> list[Sample]:
        positions = self.gold_positions()
        if self.task == "kv":
            if self.source == "file":
                records = load_kv(self.offset + self.n, data_dir)[self.offset :]
                if any(len(r["ordered_kv_records"]) != self.num_items for r in records):
                    raise ValueError(f"the original KV file has 75 pairs per record, not num_items={self.num_items}")
            else:
                records = generate_kv(self.num_items, self.n, self.seed, self.key_format, self.value_format)
            return [kv_sample(r, p, i) for p in positions for i, r in enumerate(records)]
        if self.task == "mdqa":
            records = load_mdqa(self.offset + self.n, data_dir)[self.offset :]
            if len(records) < self.n:
                raise ValueError(f"only {len(records)} MDQA questions after offset {self.offset}, asked for n={self.n}")
            return [mdqa_sample(r, p, self.num_items, self.offset + i) for p in positions for i, r in enumerate(records)]
        depths = [p / (self.num_items - 1) for p in positions]
        if self.task == "passkey":
            return [replace(passkey_sample(self.num_items, d, self.seed + i, i), position=p)
                    for p, d in zip(positions, depths) for i in range(self.n)]
        sentences = book_sentences(long_text(data_dir))
        return [replace(two_fact_sample(filler_sentences(sentences, self.num_items, self.seed + i), d, self.seed + i, i), position=p)
                for p, d in zip(positions, depths) for i in range(self.n)]


def calibrate(model, tokenizer, configs: list[TaskConfig], settings: EvalSettings = EvalSettings(),
              data_dir: str | Path | None = None) -> pd.DataFrame:
    """Baseline accuracy by gold position (n, mean, 95 % CI) for each task setting, with ρ(δ, a)."""
    tables = []
    for cfg in tqdm(configs, desc="calibration settings"):
        df = evaluate_samples(model, tokenizer, cfg.samples(data_dir), settings=settings, progress=False)
        tables.append(position_table(df, task=cfg.task, num_items=cfg.num_items, mode=settings.mode))
    return pd.concat(tables, ignore_index=True)

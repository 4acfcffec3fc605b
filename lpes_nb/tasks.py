"""The tasks: a registry of task kinds (build samples, judge an answer) and :class:`TaskConfig`, one
setting of a task at several gold positions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

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
from .metrics import kv_correct, mdqa_correct, passkey_correct


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
            raise ValueError(f"unknown task {self.task!r}; choose one of {tuple(TASKS)}")
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
        return TASKS[self.task].build(self, self.gold_positions(), data_dir)


def _kv(cfg: TaskConfig, positions: list[int], data_dir) -> list[Sample]:
    if cfg.source == "file":
        records = load_kv(cfg.offset + cfg.n, data_dir)[cfg.offset :]
        if any(len(r["ordered_kv_records"]) != cfg.num_items for r in records):
            raise ValueError(f"the original KV file has 75 pairs per record, not num_items={cfg.num_items}")
    else:
        records = generate_kv(cfg.num_items, cfg.n, cfg.seed, cfg.key_format, cfg.value_format)
    return [kv_sample(r, p, i) for p in positions for i, r in enumerate(records)]


def _mdqa(cfg: TaskConfig, positions: list[int], data_dir) -> list[Sample]:
    records = load_mdqa(cfg.offset + cfg.n, data_dir)[cfg.offset :]
    if len(records) < cfg.n:
        raise ValueError(f"only {len(records)} MDQA questions after offset {cfg.offset}, asked for n={cfg.n}")
    return [mdqa_sample(r, p, cfg.num_items, cfg.offset + i) for p in positions for i, r in enumerate(records)]


def _passkey(cfg: TaskConfig, positions: list[int], data_dir) -> list[Sample]:
    depths = [p / (cfg.num_items - 1) for p in positions]
    return [replace(passkey_sample(cfg.num_items, d, cfg.seed + i, i), position=p)
            for p, d in zip(positions, depths) for i in range(cfg.n)]


def _two_fact(cfg: TaskConfig, positions: list[int], data_dir) -> list[Sample]:
    depths = [p / (cfg.num_items - 1) for p in positions]
    sentences = book_sentences(long_text(data_dir))
    return [replace(two_fact_sample(filler_sentences(sentences, cfg.num_items, cfg.seed + i), d, cfg.seed + i, i), position=p)
            for p, d in zip(positions, depths) for i in range(cfg.n)]


@dataclass(frozen=True)
class Task:
    """A kind of task: how a :class:`TaskConfig` builds its samples (at the given gold positions) and
    whether a generated answer is correct (the task's metric)."""

    build: Callable[[TaskConfig, list[int], str | Path | None], list[Sample]]
    correct: Callable[[str, tuple[str, ...]], float]


# A new task is one entry here.
TASKS: dict[str, Task] = {
    "kv": Task(_kv, lambda pred, answers: kv_correct(pred, answers[0])),
    "mdqa": Task(_mdqa, mdqa_correct),
    "passkey": Task(_passkey, lambda pred, answers: passkey_correct(pred, answers[0])),
    "two_fact": Task(_two_fact, lambda pred, answers: kv_correct(pred, answers[0])),
}

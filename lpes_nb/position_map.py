"""Where lost-in-the-middle lives: the unmodified model's accuracy by relative gold position × prompt
length (notebook 9).

Every cell (model, dtype, task, length) is one stored per-sample table (``position_map_samples``,
keyed by its parameters), so a long map resumes cell by cell and a longer ladder computes only its new
cells. Each task is judged as its original evaluation judges it (``TASKS[task].settings()``: KV
looks for the value anywhere in up to 32 new tokens; MDQA takes the first line of up to 100; the
two-fact task the first line of up to 16), and every answer carries the copy control (does it hold
the first / last context item, whatever the gold position) and whether it ran out of tokens.

Run it from the command line (resumable, progress per cell):
``python -m lpes_nb.position_map --profile cpu [--model smollm2-135m]``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from .evaluate import encode, evaluate_samples
from .fitness import relative_positions
from .metrics import proportion_ci, u_shape_rho
from .models import load_model, load_tokenizer, resolve_dtype
from .results import cached_table, output_dir, write_csv
from .tasks import TASKS, TaskConfig

RELATIVE_POSITIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
LENGTH_TASKS = ("kv", "two_fact_block")  # their length is set by the number of items; MDQA's by its documents
VERSION = 1  # bump when the code behind a stored cell changes
MDQA_TOKENS_PER_DOC = 160  # about, for ordering the cells by cost


@dataclass(frozen=True)
class MapModel:
    """One model of the map: its dtype, the prompt lengths (tokens) of the length-set tasks, and the
    MDQA document counts (each count fixes its own length)."""

    model: str
    dtype: str
    lengths: tuple[int, ...]
    mdqa_docs: tuple[int, ...]

    def __post_init__(self):
        if not self.lengths or any(not isinstance(x, int) or x < 64 for x in self.lengths):
            raise ValueError(f"MapModel.lengths must be integers >= 64 tokens, got {self.lengths!r}")
        if any(not isinstance(d, int) or not 5 <= d <= 20 for d in self.mdqa_docs):
            raise ValueError(f"MapModel.mdqa_docs must be integers in [5, 20] (the records hold 20), got {self.mdqa_docs!r}")


@dataclass(frozen=True)
class PositionMap:
    """The map's settings: models, records per cell and position (``n``), batch size."""

    models: tuple[MapModel, ...]
    n: int
    batch_size: int = 8
    seed: int = 300  # generated tasks: records disjoint from the other studies' seeds
    mdqa_offset: int = 200  # MDQA: questions after those the other studies use

    def __post_init__(self):
        if not self.models or self.n < 1 or self.batch_size < 1:
            raise ValueError(f"PositionMap needs models, n >= 1 and batch_size >= 1, got {self!r}")

    def cells(self, m: MapModel, tokenizer) -> list[TaskConfig]:
        """The task settings of model ``m``'s cells, cheapest first (``tokenizer``: ``m``'s, which
        sizes the length-set tasks)."""
        cfgs = [(length, items_for_length(task, length, tokenizer, self.n, self.seed)) for length in m.lengths for task in LENGTH_TASKS]
        cfgs += [(docs * MDQA_TOKENS_PER_DOC, _at_positions(TaskConfig("mdqa", docs, n=self.n, offset=self.mdqa_offset)))
                 for docs in m.mdqa_docs]
        # shortest (cheapest) first, so that an interrupted map holds every short cell; two short
        # lengths can need the same minimum of items
        return list(dict.fromkeys(c for _, c in sorted(cfgs, key=lambda lc: lc[0])))


def _at_positions(cfg: TaskConfig) -> TaskConfig:
    positions = tuple(sorted({round(r * (cfg.num_items - 1)) for r in RELATIVE_POSITIONS}))
    return replace(cfg, positions=positions)


def items_for_length(task: str, tokens: int, tokenizer, n: int, seed: int, data_dir=None) -> TaskConfig:
    """The task setting whose prompts are about ``tokens`` long (number of KV pairs or filler
    sentences, from the measured tokens per item of this tokenizer), at the map's positions."""
    def length(items: int) -> float:
        cfg = TaskConfig(task, items, n=3, seed=seed)
        return float(np.mean([len(encode(tokenizer, s, False)) for s in cfg.samples(data_dir)]))

    lo, hi = 8, 64
    at_lo, at_hi = length(lo), length(hi)
    items = max(5, round(hi + (tokens - at_hi) * (hi - lo) / (at_hi - at_lo)))
    return _at_positions(TaskConfig(task, items, n=n, seed=seed))


def cell_samples(model, tokenizer, model_name: str, dtype: str, cfg: TaskConfig, batch_size: int, profile: str,
                 progress: bool = True) -> pd.DataFrame:
    """The per-sample table of one cell (computed once, then read from the store)."""
    settings = TASKS[cfg.task].settings(batch_size)
    params = {"model": model_name, "dtype": dtype, "task": repr(cfg), "settings": repr(settings), "version": VERSION}
    return cached_table("position_map_samples", params,
                        lambda: evaluate_samples(model, tokenizer, cfg.samples(), settings=settings, progress=progress),
                        profile)


def summarize(per_sample: pd.DataFrame) -> pd.DataFrame:
    """The map's table: one row per (model, dtype, task, length, relative position) with n, accuracy,
    its Wilson 95 % interval, the copy-control rates, the truncated rate, and CALIOPE's ρ of the cell
    (over its samples at all positions)."""
    rows = []
    keys = ["model", "dtype", "task", "num_items"]
    for (model, dtype, task, num_items), cell in per_sample.groupby(keys, sort=False):
        rel = relative_positions(cell)
        rho = u_shape_rho(rel, cell["correct"])
        length = int(round(cell["prompt_tokens"].mean()))
        # the nominal relative position whose gold index this is (round(r (N - 1)) is not exactly r (N - 1))
        nominal = np.asarray(RELATIVE_POSITIONS)[np.abs(rel[:, None] - np.asarray(RELATIVE_POSITIONS)).argmin(axis=1)]
        for (r, index), group in cell.assign(relative_position=nominal).groupby(["relative_position", "position"]):
            k, n = int(group["correct"].sum()), len(group)
            low, high = proportion_ci(k, n)
            rows.append({"model": model, "dtype": dtype, "task": task, "num_items": num_items, "length_tokens": length,
                         "relative_position": r, "gold_index": index, "n": n, "accuracy": k / n, "ci_low": low, "ci_high": high,
                         "copies_first": group["copies_first"].mean() if "copies_first" in group else np.nan,
                         "copies_last": group["copies_last"].mean() if "copies_last" in group else np.nan,
                         "truncated": group["truncated"].mean(), "rho": rho})
    return pd.DataFrame(rows)


def middle_deficits(table: pd.DataFrame, points: float = 0.10, require_clear: bool = True) -> pd.DataFrame:
    """Per cell: accuracy at the first, middle and last position and whether the middle is below
    both ends by at least ``points`` with its interval clear of both ends' intervals (the issue's
    criterion for a middle deficit worth a search). ``require_clear=False`` drops the interval
    condition: only for dry runs on random models, which must reach the search without a real deficit."""
    rows = []
    keys = ["model", "dtype", "task", "num_items", "length_tokens"]
    for key, cell in table.groupby(keys, sort=False):
        cell = cell.set_index("relative_position")
        first, middle, last = cell.loc[0.0], cell.loc[0.5], cell.loc[1.0]
        gap = min(first["accuracy"], last["accuracy"]) - middle["accuracy"]
        clear = middle["ci_high"] < min(first["ci_low"], last["ci_low"])
        rows.append({**dict(zip(keys, key)), "first": first["accuracy"], "middle": middle["accuracy"], "last": last["accuracy"],
                     "middle_deficit": gap, "deficit": bool(gap >= points and (clear or not require_clear)), "rho": middle["rho"]})
    return pd.DataFrame(rows)


def run_map(spec: PositionMap, profile: str, models: tuple[str, ...] | None = None, progress: bool = True) -> pd.DataFrame:
    """Compute (or read) every cell, write ``position_length_map.csv`` and the per-sample table, and
    return the map's table. One model is loaded at a time."""
    frames = []
    chosen = [m for m in spec.models if models is None or m.model in models]
    for m in chosen:
        model, tokenizer = load_model(m.model, dtype=m.dtype), load_tokenizer(m.model)
        dtype = str(resolve_dtype(m.dtype)).removeprefix("torch.")
        cells = spec.cells(m, tokenizer)
        for cfg in tqdm(cells, desc=f"map cells, {m.model}", disable=not progress):
            df = cell_samples(model, tokenizer, m.model, dtype, cfg, spec.batch_size, profile, progress)
            frames.append(df.assign(model=m.model, dtype=dtype, num_items=cfg.num_items))
        del model
    per_sample = pd.concat(frames, ignore_index=True)
    table = summarize(per_sample)
    if models is None:  # the whole map: the published table
        write_csv(output_dir("results", profile) / "position_length_map.csv", table.round(4))
    return table


def main(argv: list[str] | None = None) -> None:
    from .profiles import profile as named_profile

    parser = argparse.ArgumentParser(prog="python -m lpes_nb.position_map", description=__doc__)
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--model", action="append", help="only this model's cells (repeatable)")
    args = parser.parse_args(argv)
    spec = named_profile(args.profile).position_map
    table = run_map(spec, args.profile, tuple(args.model) if args.model else None)
    print(middle_deficits(table).round(3).to_string(index=False))


if __name__ == "__main__":
    main()

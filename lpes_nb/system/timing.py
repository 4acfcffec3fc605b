"""Interleaved wall-clock timing, so that slow drift of the machine hits every variant alike."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import pandas as pd
from tqdm.auto import tqdm


def interleaved_times(variants: Mapping[str, Callable[[], object]], rounds: int, warmup: int = 1) -> pd.DataFrame:
    """Time every variant once per round, rotating the order each round; one row per (round, variant)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    rows = []
    for r in tqdm(range(rounds), desc="timing rounds", leave=False):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            start = time.perf_counter()
            variants[name]()
            rows.append({"round": r, "variant": name, "seconds": time.perf_counter() - start})
    return pd.DataFrame(rows)


def ratio_to_baseline(times: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Median seconds per variant and the per-round ratios to ``baseline``: their median, interquartile
    range (what a figure draws) and range."""
    wide = times.pivot(index="round", columns="variant", values="seconds")
    if baseline not in wide:
        raise ValueError(f"baseline {baseline!r} is not among the timed variants {list(wide)}")
    ratios = wide.div(wide[baseline], axis=0)
    return pd.DataFrame(
        {"median_s": wide.median(), "median_ratio": ratios.median(), "q25_ratio": ratios.quantile(0.25),
         "q75_ratio": ratios.quantile(0.75), "min_ratio": ratios.min(), "max_ratio": ratios.max()}
    ).rename_axis("variant").reset_index()

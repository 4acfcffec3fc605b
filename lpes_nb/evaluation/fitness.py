"""The λ-weighted position fitness: accuracy by gold position with CIs and ρ, the weighted score of
begin / middle / end accuracy, and the GA's fitness of per-layer scales on a search set."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace

import numpy as np
import pandas as pd
from scipy.stats import spearmanr
from tqdm.auto import tqdm

from ..core.methods import LayerScales
from ..store.data import Sample
from ..store.models import model_key
from ..store.results import ResultCache, cache_key
from .evaluate import evaluate_samples
from .metrics import accuracy_table, check_finite, minimum_detectable_effect, proportion_ci, rank_agreement, spearman_interval, u_shape_rho
from .prefix import check_chunk
from .tasks import EvalSettings, scoring_key

LAMBDAS = (0.2, 0.3, 0.5)  # fitness weights of begin / middle / end accuracy


def relative_positions(df: pd.DataFrame) -> np.ndarray:
    """Each sample's gold position relative to its context: position / (num_items − 1), 0 = first, 1 = last."""
    return df["position"].to_numpy(dtype=float) / (df["num_items"].to_numpy(dtype=float) - 1)


def position_table(df: pd.DataFrame, lambdas: Sequence[float] = LAMBDAS, **labels) -> pd.DataFrame:
    """The summary every study reports for one evaluated setting: accuracy by gold position (n, mean,
    Wilson 95 % CI), CALIOPE's ρ(δ, a) over the samples, the λ-fitness (NaN unless there are exactly 3
    positions), mean prompt tokens, and the ``labels`` (method, task, ...) as leading columns."""
    table = accuracy_table(df, by="position")
    for i, (name, value) in enumerate(labels.items()):
        table.insert(i, name, value)
    table["prompt_tokens"] = df.groupby("position")["prompt_tokens"].mean().to_numpy().round()
    table["rho"] = u_shape_rho(relative_positions(df), df["correct"]) if len(table) >= 3 else np.nan
    table["fitness"] = weighted_fitness(df, lambdas) if len(table) == 3 else np.nan
    return table


def position_tables(per_sample: pd.DataFrame) -> pd.DataFrame:
    """:func:`position_table` of each method of a per-sample table with a ``method`` column."""
    return pd.concat([position_table(g.drop(columns="method"), method=label)
                      for label, g in per_sample.groupby("method", sort=False)], ignore_index=True)


def weighted_fitness(df: pd.DataFrame, lambdas: Sequence[float] = LAMBDAS, value: str = "correct") -> float:
    """λ_B·acc(begin) + λ_M·acc(middle) + λ_E·acc(end): positions sorted, the first / median / last.
    ``value="gold_logprob"``: the same weights over the gold answer's mean log-probability (the
    cheaper fitness :func:`proxy_agreement` validates)."""
    if df.empty:
        raise ValueError(f"no evaluated samples to score ({df.attrs.get('skipped', 0)} skipped as longer than the model's "
                         "positions): shorten the task (num_items) or use a model with a longer window")
    if value not in df:
        raise ValueError(f"no column {value!r} to weight; have {list(df.columns)}")
    check_finite(df, value, "weighted_fitness")
    acc = df.groupby("position")[value].mean().sort_index()
    if len(acc) != 3:
        raise ValueError(f"the fitness needs exactly 3 gold positions (begin, middle, end), got {list(acc.index)}")
    return float(np.dot(lambdas, acc.to_numpy()))


def fitness_se(df: pd.DataFrame, lambdas: Sequence[float] = LAMBDAS) -> float:
    """Standard error of :func:`weighted_fitness` from its samples: sqrt(Σ λ² p (1 − p) / n) over the
    three positions. How finely a search set of this size can tell two individuals apart."""
    g = df.groupby("position")["correct"].agg(["mean", "count"]).sort_index()
    return float(np.sqrt(np.sum(np.square(lambdas) * g["mean"] * (1 - g["mean"]) / g["count"])))


def paired_fitness_difference(per_sample: pd.DataFrame, method: str, reference: str, lambdas: Sequence[float] = LAMBDAS,
                              n_boot: int = 4000, seed: int = 0, unchanged: str | None = None) -> dict:
    """λ-fitness of ``method`` minus ``reference`` on the same records, with a 95 % bootstrap interval
    clustered by record: a record (``sample``) is drawn with all its gold positions and both methods'
    outcomes, since the same record appears at every position. Also the bootstrap SE, the minimum
    detectable effect at 80 % power (two-sided 5 %), and the number of records. Where no record's
    outcome differs the bootstrap has nothing to resample; the interval is then ±(the Wilson upper
    bound on the share of records that could differ, 0 of n), never [0, 0]. ``identical``: besides
    every outcome, every gold log-probability and answer text the tables hold is the same, which
    :func:`difference_text` reports as such, without an interval. ``unchanged``: why the method leaves
    every prompt as ``reference`` reads it, known from its definition (:func:`lpes_nb.studies.benchmarks.unchanged`:
    Dynamic NTK inside the trained window); its rows, evaluated by another path, may differ from the
    reference's by that path's rounding alone, so it is identical where every outcome is the same."""
    wide = per_sample.pivot_table(index=["sample", "position"], columns="method", values="correct").astype(float)
    missing = {method, reference} - set(wide.columns)
    if missing:
        raise ValueError(f"no per-sample results for {sorted(missing)}; have {list(wide.columns)}")
    diff = (wide[method] - wide[reference]).unstack("position").sort_index(axis=1)  # records × positions
    if diff.shape[1] != 3:
        raise ValueError(f"the fitness needs exactly 3 gold positions, got {list(diff.columns)}")
    d = diff.dropna().to_numpy()  # paired: only the records both methods answered at every position
    if not len(d):
        counts = {m: int(wide[m].dropna().index.get_level_values("sample").nunique()) for m in (method, reference)}
        raise ValueError(f"{method!r} and {reference!r} have no record in common at all 3 positions (records: {counts}); "
                         "a paired comparison needs the same records under both")
    rng = np.random.default_rng(seed)
    draws = d[rng.integers(0, len(d), size=(n_boot, len(d)))]  # (boot, records, positions)
    boot = np.nanmean(draws, axis=1) @ np.asarray(lambdas, dtype=float)
    point = float(np.nanmean(d, axis=0) @ np.asarray(lambdas, dtype=float))
    if np.nansum(np.abs(d)) == 0:
        bound = proportion_ci(0, len(d))[1]
        low, high, se = -bound, bound, bound / 1.96
    else:
        low, high, se = float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975)), float(np.std(boot, ddof=1))
    same = [c for c in ("correct", "gold_logprob", "prediction") if c in per_sample]
    both = per_sample[per_sample["method"].isin([method, reference])]
    sides = both.pivot_table(index=["sample", "position"], columns="method", values=same, aggfunc="first")
    identical = all(sides[(c, method)].equals(sides[(c, reference)]) for c in same)
    if unchanged is not None and not identical:
        identical = bool(np.nansum(np.abs(d)) == 0)
    return {"method": method, "reference": reference, "difference": point, "ci_low": low, "ci_high": high,
            "se": se, "mde_80": minimum_detectable_effect(se), "records": len(d), "identical": identical,
            "unchanged": unchanged if identical else None}


def paired_differences(per_sample: pd.DataFrame, references: Sequence[str] = ("baseline", "PI"),
                       lambdas: Sequence[float] = LAMBDAS, unchanged: Mapping[str, str] | None = None) -> pd.DataFrame:
    """:func:`paired_fitness_difference` of every other method against each reference present;
    ``unchanged``: the methods that leave every prompt as the baseline reads it, with why
    (:func:`lpes_nb.studies.benchmarks.unchanged`), for their comparison with the baseline."""
    methods = list(dict.fromkeys(per_sample["method"]))
    refs = [r for r in references if r in methods]
    unchanged = unchanged or {}
    # each pair once: a method compared with an earlier reference is not compared again the other way
    rows = [paired_fitness_difference(per_sample, m, ref, lambdas, unchanged=unchanged.get(m) if ref == "baseline" else None)
            for k, ref in enumerate(refs) for m in methods if m != ref and m not in refs[:k]]
    return pd.DataFrame(rows)


def proxy_agreement(tables: Sequence[pd.DataFrame], proxy_tables: Sequence[pd.DataFrame] | None = None,
                    proxy_value: str = "gold_logprob", lambdas: Sequence[float] = LAMBDAS) -> dict:
    """Rank agreement (:func:`lpes_nb.evaluation.metrics.rank_agreement`) of a cheaper fitness with the real one
    over candidates: per candidate, the real λ-accuracy of its per-sample table in ``tables`` and
    the proxy, the λ-weighted ``proxy_value`` of ``proxy_tables`` (a shorter task, fewer records;
    default the same tables: generate mode with ``gold_logprob`` yields both in one run)."""
    proxy_tables = tables if proxy_tables is None else proxy_tables
    if len(proxy_tables) != len(tables):
        raise ValueError(f"one proxy table per candidate: {len(tables)} real, {len(proxy_tables)} proxy")
    return rank_agreement([weighted_fitness(t, lambdas) for t in tables],
                          [weighted_fitness(t, lambdas, proxy_value) for t in proxy_tables])


def _per_record(tables: Sequence[pd.DataFrame], value: str) -> np.ndarray:
    """[candidate, record, position] of ``value`` over the records every table holds (the ``sample``
    column), positions sorted: a fitness on any set of records is then a mean and a dot product."""
    records = sorted(set.intersection(*(set(t["sample"]) for t in tables)))
    cubes = [t.pivot_table(index="sample", columns="position", values=value, aggfunc="mean").reindex(records).sort_index(axis=1)
             for t in tables]
    if any(c.shape[1] != 3 or c.isna().any().any() for c in cubes):
        raise ValueError("every candidate needs every shared record at exactly 3 gold positions (begin, middle, end)")
    return np.stack([c.to_numpy(dtype=float) for c in cubes])


def subset_agreement(tables: Sequence[pd.DataFrame], size: int, value: str = "correct", lambdas: Sequence[float] = LAMBDAS,
                     splits: int = 200, seed: int = 0) -> tuple[float, int]:
    """How alike a fitness on ``size`` records ranks the candidates on other records: over ``splits``
    random draws of two disjoint sets of ``size`` records (the ``sample`` column, shared by every
    candidate's table), Spearman's ρ between the candidates' fitness on one set and on the other,
    averaged; and how many draws could rank at all (a set where every candidate scores alike ranks
    nothing and is left out)."""
    return _subset_agreement(_per_record(tables, value), size, np.asarray(lambdas, dtype=float), splits, seed)


def _subset_agreement(cube: np.ndarray, size: int, lambdas: np.ndarray, splits: int, seed: int) -> tuple[float, int]:
    n = cube.shape[1]
    if not 1 <= size <= n // 2:
        raise ValueError(f"size must be in [1, {n // 2}] (two disjoint sets of the {n} shared records), got {size}")
    rng, rhos = np.random.default_rng(seed), []
    for _ in range(splits):
        drawn = rng.permutation(n)
        fa, fb = (cube[:, drawn[i * size:(i + 1) * size]].mean(axis=1) @ lambdas for i in (0, 1))
        if np.ptp(fa) > 0 and np.ptp(fb) > 0:
            rhos.append(float(spearmanr(fa, fb)[0]))
    return (float(np.mean(rhos)) if rhos else float("nan")), len(rhos)


def split_half_reliability(tables: Sequence[pd.DataFrame], value: str = "correct", lambdas: Sequence[float] = LAMBDAS,
                           splits: int = 200, seed: int = 0) -> dict:
    """Whether a fitness on these records ranks candidates as it would on other records: the mean
    Spearman ρ between random halves of the records (:func:`subset_agreement`) with its interval over
    the candidates (:func:`lpes_nb.evaluation.metrics.spearman_interval`), stepped up to all the records by
    Spearman–Brown, 2ρ / (1 + ρ), and the same agreement at every smaller set size
    (``by_records``: how few records a search could use). Near 0, the candidates' differences are
    sampling noise at this record count: a search on it chases noise, and no fitness predicts it on
    other records (that correlation is bounded by the square root of the two reliabilities' product;
    on the same records a proxy can agree more, through the records' shared noise)."""
    cube, weights = _per_record(tables, value), np.asarray(lambdas, dtype=float)
    n = cube.shape[1]
    if n < 4:
        raise ValueError(f"split-half reliability needs >= 4 records shared by every candidate, got {n}")
    rho, ranked = _subset_agreement(cube, n // 2, weights, splits, seed)
    if not ranked:
        raise ValueError(f"every halving of the {n} records gives every candidate the same {value!r} fitness")
    by_records = {size: _subset_agreement(cube, size, weights, splits, seed)[0] for size in range(1, n // 2 + 1)}
    low, high = spearman_interval(rho, cube.shape[0])  # the candidates are the items ranked
    return {"value": value, "half_rho": rho, "ci_low": low, "ci_high": high,
            "reliability": 2 * rho / (1 + rho) if rho > -1 else float("nan"), "candidates": cube.shape[0],
            "records": n, "splits": splits, "ranked_splits": ranked, "by_records": by_records}


class PositionFitness:
    """The GA's fitness: per-layer scales (B, L) -> λ-weighted accuracy at begin / middle / end.

    ``tie_break`` adds a tiny multiple of the mean gold log-probability so that individuals with the
    same accuracy are ordered by confidence (0 reproduces the paper's pure accuracy fitness). Generate
    mode judges text and yields no log-probability, so there it costs one extra scoring pass of the
    gold answers per individual. ``value="gold_logprob"`` (score mode, no tie-break) weights the gold
    answer's teacher-forced log-probability instead of accuracy: the cheaper fitness that
    :mod:`lpes_nb.studies.fitness_proxy` checks against the real one before a search may use it.
    ``prefill_chunk``: continuations in pieces of this many tokens (:func:`lpes_nb.evaluation.prefix._pieces`),
    faster for long prompts; part of the fingerprint. ``progress``: a bar inside each evaluation (its
    records or batches), for callers that score few curves on many records (a validation call runs for
    most of an hour on a CPU); a GA's thousands of evaluations stay quiet."""

    VALUES = ("correct", "gold_logprob")

    def __init__(self, model, tokenizer, samples: Sequence[Sample], settings: EvalSettings = EvalSettings(),
                 lambdas: Sequence[float] = LAMBDAS, cache: ResultCache | None = None, model_name: str = "",
                 tie_break: float = 0.0, value: str = "correct", prefill_chunk: int | None = None, progress: bool = False):
        if len({s.position for s in samples}) != 3:
            raise ValueError("PositionFitness needs samples at exactly 3 gold positions (begin, middle, end)")
        if len(lambdas) != 3 or any(l < 0 for l in lambdas):
            raise ValueError(f"lambdas must be 3 non-negative weights, got {lambdas!r}")
        if value not in self.VALUES:
            raise ValueError(f"value must be one of {self.VALUES}, got {value!r}")
        if value == "gold_logprob" and (settings.mode != "score" or tie_break):
            raise ValueError(f"value='gold_logprob' is scored by teacher forcing: it needs settings.mode='score' (got "
                             f"{settings.mode!r}) and tie_break=0 (got {tie_break!r}; it orders equal accuracies by that log-prob)")
        self.model, self.tokenizer, self.samples = model, tokenizer, list(samples)
        self.settings, self.lambdas, self.cache, self.tie_break = settings, tuple(lambdas), cache, tie_break
        self.value, self.prefill_chunk, self.progress = value, prefill_chunk, progress
        check_chunk(prefill_chunk)
        self._task_key = dict(**model_key(model_name, model), settings=asdict(settings),
                              samples=hashlib.sha256("".join(s.prompt + "|".join(s.answers) for s in samples).encode()).hexdigest(),
                              **scoring_key(s.task for s in samples))

    def fingerprint(self) -> str:
        """What this fitness measures (model weights and dtype, samples, settings, weights of the
        positions): a GA checkpoint resumes only under the same fingerprint."""
        # the accuracy fitness's key predates ``value``: its stored checkpoints keep their names
        extra = {} if self.value == "correct" else {"value": self.value}
        return cache_key(**self._task_key, lambdas=self.lambdas, tie_break=self.tie_break, **extra, **self._chunk_key())

    def _chunk_key(self) -> dict:
        # pieces are not bitwise the one-pass result in bf16 (lpes_nb.evaluation.prefix._pieces); one pass keeps its old keys
        return {} if self.prefill_chunk is None else {"prefill_chunk": self.prefill_chunk}

    def _key(self, scales: Sequence[float], settings: EvalSettings) -> str:
        return cache_key(scales=[round(float(s), 10) for s in scales], **{**self._task_key, "settings": asdict(settings)},
                         **self._chunk_key())

    def _evaluate(self, scales: Sequence[float], settings: EvalSettings) -> pd.DataFrame:
        key = self._key(scales, settings)
        if self.cache is not None and (hit := self.cache.get(key)) is not None:
            return hit
        start = time.perf_counter()
        df = evaluate_samples(self.model, self.tokenizer, self.samples, LayerScales(scales), settings, progress=self.progress,
                              prefill_chunk=self.prefill_chunk)
        # the evaluation's wall time travels with its rows: a resumed search's cost counts what it read back
        df = df.assign(eval_seconds=round(time.perf_counter() - start, 3))
        if self.cache is not None:
            self.cache.put(key, df)
        return df

    def seconds(self, scales: Sequence[float]) -> float:
        """Wall seconds the evaluation of ``scales`` took where it was computed (read from the cache,
        whichever process or sitting computed it; NaN if not cached or cached before it was recorded).
        With a tie-break in generate mode, its scoring pass is added."""
        if self.cache is None:
            return float("nan")
        passes = [self.settings] + ([replace(self.settings, mode="score")] if self.tie_break and self.settings.mode == "generate" else [])
        tables = [self.cache.get(self._key(scales, s)) for s in passes]
        if any(t is None or "eval_seconds" not in t for t in tables):
            return float("nan")
        return float(sum(t["eval_seconds"].iloc[0] for t in tables))

    def table(self, scales: Sequence[float]) -> pd.DataFrame:
        df = self._evaluate(scales, self.settings)
        if self.tie_break and self.settings.mode == "generate":
            scored = self._evaluate(scales, replace(self.settings, mode="score"))
            df = df.assign(gold_logprob=scored["gold_logprob"].to_numpy())
        return df

    def __call__(self, scales_batch: np.ndarray) -> np.ndarray:
        out, batch = [], np.atleast_2d(scales_batch)
        # a bar over one candidate counts nothing, and a notebook keeps it as an output
        for scales in tqdm(batch, desc="fitness", leave=False, disable=len(batch) < 2):
            df = self.table(scales)
            fit = weighted_fitness(df, self.lambdas, self.value)
            if self.tie_break and "gold_logprob" in df:
                fit += self.tie_break * float(df["gold_logprob"].mean())
            out.append(fit)
        return np.array(out)


def difference_text(row) -> str:
    """One paired comparison (a row of :func:`paired_differences`) as Markdown: the difference with its
    record-clustered interval, the minimum detectable effect and the verdict the interval supports;
    a method identical to its reference on every record (``identical``) is said to be, without one."""
    if row.get("identical", False):
        head = f"{row['method']} vs {row['reference']}: **identical to the {row['reference']}**"
        if isinstance(row.get("unchanged"), str):
            return (f"{head} ({row['unchanged']}): it changes nothing on these prompts, and every outcome of the "
                    f"{int(row['records'])} records is the same (evaluated by another path, its rows differ at most by its rounding), so no interval")
        return f"{head}: every answer and gold log-probability of the {int(row['records'])} records is the same, so no interval"
    verdict = ("better" if row["ci_low"] > 0 else "worse" if row["ci_high"] < 0
               else f"no effect of ≥ {row['mde_80']:.2f} resolved")
    return (f"{row['method']} vs {row['reference']}: Δλ {row['difference']:+.3f} [{row['ci_low']:+.3f}, {row['ci_high']:+.3f}], "
            f"MDE {row['mde_80']:.2f}, {int(row['records'])} records → **{verdict}**")

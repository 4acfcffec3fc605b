"""Metrics: the original task metrics, CALIOPE's U-shape score, exact intervals for accuracies, the bootstrap
for other means, and the smallest effect a comparison can detect."""

from __future__ import annotations

import math
import re
import string
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd
from scipy.stats import binomtest, norm, spearmanr

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def check_finite(df: pd.DataFrame, value: str, where: str, record: str = "sample", position: str = "position") -> None:
    """Refuse a table whose ``value`` holds a NaN or an infinity, naming the first such record and
    position: a mean over the rest, or an infinite estimate, would be a number about other records."""
    values = pd.to_numeric(df[value], errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(values)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        at = ", ".join(f"{c} {_plain(df[c].iloc[first])!r}" for c in (record, position) if c in df) or f"row {df.index[first]!r}"
        raise ValueError(f"{where}: {int(bad.sum())} non-finite {value!r} value(s) (first: {float(values[first])!r} at {at}); "
                         "every record must be scored at every position")


def _plain(value):
    """A numpy scalar as the Python number it holds (a message names 1, not np.int64(1))."""
    return value.item() if isinstance(value, np.generic) else value


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower-case, drop punctuation, drop a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def first_line(prediction: str) -> str:
    """The answer up to its first newline, then stripped, exactly as the original evaluation script
    does (so an answer that starts with a newline is empty: models cannot copy the context)."""
    return prediction.split("\n")[0].strip()


def best_subspan_em(prediction: str, answers: Iterable[str]) -> float:
    """1.0 if any normalised gold answer is a substring of the normalised prediction."""
    pred = normalize_answer(_text(prediction, "prediction"))
    if isinstance(answers, str):  # a string would be taken as a list of one-character answers
        raise ValueError(f"answers must be a list of gold answers, got the string {answers!r}")
    return float(any(normalize_answer(a) in pred for a in answers))


def _text(value, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {value!r}")
    return value


def _gold(value, what: str) -> str:
    if not _text(value, what).strip():
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return value


def mdqa_correct(prediction: str, answers: Iterable[str]) -> float:
    if isinstance(answers, str):  # a string would be taken as a list of one-character answers
        raise ValueError(f"answers must be a list of gold answers, got the string {answers!r}")
    answers = [_gold(a, "a gold answer") for a in answers]
    if not answers:
        raise ValueError("answers must hold at least one gold answer, got none")
    return best_subspan_em(first_line(_text(prediction, "prediction")), answers)


def mdqa_correct_within(prediction: str, answers: Iterable[str], words: int) -> float:
    """:func:`mdqa_correct` judged on the first ``words`` words of the (normalised) first line: a gold
    answer found only further along a long line (a run of names) does not count. The original metric
    rewards length; this one, beside it, shows how much of a difference between methods is the length
    of their answers."""
    if isinstance(words, bool) or not isinstance(words, int) or words < 1:
        raise ValueError(f"words must be a whole number >= 1, got {words!r}")
    kept = " ".join(normalize_answer(first_line(_text(prediction, "prediction"))).split()[:words])
    return mdqa_correct(kept, answers)


def kv_correct(prediction: str, value: str) -> float:
    return float(_gold(value, "the gold value").lower() in _text(prediction, "prediction").lower())


def passkey_correct(prediction: str, key: str | int) -> float:
    """Exact number: the first integer in the prediction equals the pass key (a string of digits or an int)."""
    if isinstance(key, int) and not isinstance(key, bool) and key >= 0:
        key = str(key)
    if not isinstance(key, str) or not key.isdigit():
        raise ValueError(f"the pass key must be a non-negative integer or a string of digits, got {key!r}")
    match = re.search(r"\d+", _text(prediction, "prediction"))
    return float(match is not None and match.group() == key)


def perplexity(total_nll: float, num_tokens: int) -> float:
    if num_tokens <= 0:
        raise ValueError(f"perplexity needs at least one token, got {num_tokens}")
    return math.exp(total_nll / num_tokens)


def relative_distance_from_middle(relative_positions) -> np.ndarray:
    """CALIOPE's Eq. 1, δ = |t − 0.5T| / 0.5T, for positions given relative to the context (t / T in
    [0, 1]): 0 in the middle, 1 at either border."""
    rel = np.asarray(relative_positions, dtype=float)
    if rel.ndim != 1 or not np.isfinite(rel).all() or ((rel < 0) | (rel > 1)).any():
        raise ValueError(f"relative positions must be finite numbers in [0, 1] (0 = first, 1 = last), got {rel.tolist()[:10]}")
    return np.abs(rel - 0.5) / 0.5


def u_shape_rho(relative_positions: Sequence[float], outcomes: Sequence[float]) -> float:
    """CALIOPE's ρ(δ, a) × 100 (Sec. 3, Eq. 1, Table 2): the Pearson correlation over *samples* between
    each sample's distance of its gold item from the middle, δ, and its own outcome (1/0 or a score).
    Positive: the middle is worst (a U); near 0: no position bias of that shape; negative: an inverted U.
    A primacy or recency curve gives a small |ρ| — ρ measures the U, not a position effect in general.
    NaN where it is undefined (all samples at one distance, or every outcome equal)."""
    out = np.asarray(outcomes, dtype=float)
    delta = relative_distance_from_middle(relative_positions)
    if len(delta) != len(out) or len(out) < 3:
        raise ValueError(f"need one outcome per sample and at least 3 samples; got {len(delta)} positions and {len(out)} outcomes")
    if not np.isfinite(out).all():
        raise ValueError("outcomes must be finite numbers")
    if np.ptp(delta) == 0 or np.ptp(out) == 0:
        return float("nan")
    return float(np.corrcoef(delta, out)[0, 1] * 100)


def proportion_ci(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """(low, high): the Wilson score interval of a proportion k/n (scipy's binomtest). Never of zero
    width, also at 0/n and n/n (0/30 gives [0, 11.4 %]), unlike a percentile bootstrap."""
    for name, value in (("k", k), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"proportion_ci: {name} must be an integer, got {value!r}")
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"proportion_ci needs 0 <= k <= n and n >= 1, got k={k}, n={n}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def minimum_detectable_effect(standard_error: float, power: float = 0.8, alpha: float = 0.05) -> float:
    """The smallest true difference a two-sided test at level ``alpha`` detects with probability
    ``power``, given the standard error of the estimated difference: (z_{1−α/2} + z_power) · SE."""
    if not (np.isfinite(standard_error) and standard_error >= 0):
        raise ValueError(f"standard_error must be a finite number >= 0, got {standard_error!r}")
    if not 0 < power < 1 or not 0 < alpha < 1:
        raise ValueError(f"power and alpha must be in (0, 1), got power={power!r}, alpha={alpha!r}")
    return float((norm.ppf(1 - alpha / 2) + norm.ppf(power)) * standard_error)


def planned_lambda_se(n_per_position: int, discordance: float = 0.3, lambdas: Sequence[float] = (0.2, 0.3, 0.5)) -> float:
    """For planning a test set before it exists: the SE of a paired λ-score difference with
    ``n_per_position`` records, when each record's outcome differs between the two methods with
    probability ``discordance`` at every position (so Var(d) ≤ discordance), positions independent."""
    if isinstance(n_per_position, bool) or not isinstance(n_per_position, (int, np.integer)) or n_per_position < 1:
        raise ValueError(f"n_per_position must be an integer >= 1, got {n_per_position!r}")
    if not 0 < discordance <= 1:
        raise ValueError(f"discordance must be in (0, 1], got {discordance!r}")
    return float(np.sqrt(discordance * np.sum(np.square(lambdas)) / n_per_position))


def bootstrap_ci(values: Sequence[float], n_boot: int = 2000, confidence: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): percentile bootstrap interval of the mean."""
    v = np.asarray(values, dtype=float)
    if v.ndim != 1 or len(v) == 0:
        raise ValueError(f"bootstrap_ci needs a non-empty 1-D sequence of values, got shape {v.shape}")
    if not np.isfinite(v).all():
        raise ValueError(f"bootstrap_ci got non-finite values at indices {np.flatnonzero(~np.isfinite(v)).tolist()[:10]}")
    if not 0 < confidence < 1 or n_boot < 1:
        raise ValueError(f"need 0 < confidence < 1 and n_boot >= 1, got confidence={confidence!r}, n_boot={n_boot!r}")
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), size=(n_boot, len(v)))].mean(axis=1)
    alpha = (1 - confidence) / 2
    return float(v.mean()), float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha))


PROXY_CANDIDATES = 15  # the fewest candidates a cheaper fitness is validated on (LPES issue: "over >= 15")


def rank_agreement(real: Sequence[float], proxy: Sequence[float], confidence: float = 0.95,
                   minimum: int = PROXY_CANDIDATES) -> dict:
    """How well a cheaper fitness ranks candidates as the real one does: Spearman's ρ over the
    candidates, its interval from Fisher's z with the Fieller–Hartley–Pearson variance 1.06 / (n − 3)
    (the rank correlation's, wider than Pearson's 1 / (n − 3)), its p-value, and n. A search may use
    the proxy only where the interval's lower end is high enough for the purpose: at n = 15 a
    measured ρ of 0.9 gives about [0.71, 0.97]."""
    a, b = np.asarray(real, dtype=float), np.asarray(proxy, dtype=float)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"real and proxy need one value per candidate each, got shapes {a.shape} and {b.shape}")
    if len(a) < minimum:
        raise ValueError(f"rank_agreement needs >= {minimum} candidates, got {len(a)}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("rank_agreement got non-finite fitness values")
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        raise ValueError(f"a fitness is the same for every candidate (real spread {np.ptp(a):g}, proxy spread {np.ptp(b):g}): "
                         "ranks cannot agree or disagree; draw candidates that differ")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    rho, p = spearmanr(a, b)
    low, high = spearman_interval(rho, len(a), confidence)
    return {"rho": float(rho), "ci_low": low, "ci_high": high, "p": float(p), "candidates": len(a)}


def spearman_interval(rho: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The interval of a Spearman ρ over ``n`` items: Fisher's z with the Fieller–Hartley–Pearson
    variance 1.06 / (n − 3)."""
    if n < 4:
        raise ValueError(f"a Spearman interval needs n >= 4 items, got {n}")
    z, half = np.arctanh(np.clip(rho, -0.999999, 0.999999)), norm.ppf(0.5 + confidence / 2) * np.sqrt(1.06 / (n - 3))
    return float(np.tanh(z - half)), float(np.tanh(z + half))


def is_binary(values) -> bool:
    v = np.asarray(values, dtype=float)
    return bool(np.isin(v, (0.0, 1.0)).all())


def accuracy_table(df: pd.DataFrame, by: str | list[str] = "position", value: str = "correct", seed: int = 0) -> pd.DataFrame:
    """n, mean and 95 % CI of ``value`` per group: the Wilson interval where the values are 0/1
    (accuracies), the percentile bootstrap of the mean otherwise."""
    rows = []
    for key, group in df.groupby(by, sort=True):
        values = group[value].to_numpy(dtype=float)
        if is_binary(values):
            mean = float(values.mean())
            lo, hi = proportion_ci(int(values.sum()), len(values))
        else:
            mean, lo, hi = bootstrap_ci(values, seed=seed)
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip([by] if isinstance(by, str) else by, key)), "n": len(group), "mean": mean, "ci_low": lo, "ci_high": hi})
    return pd.DataFrame(rows)

"""Metrics: the original task metrics, the U-shape score and bootstrap confidence intervals."""

from __future__ import annotations

import math
import re
import string
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


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


def u_shape_rho(positions: Sequence[float], accuracies: Sequence[float]) -> float:
    """CALIOPE's ρ(δ, a) × 100: Pearson correlation between the distance of each gold position from
    the middle of the context and the accuracy there. Positive: the middle is worst (U-shape)."""
    pos, acc = np.asarray(positions, float), np.asarray(accuracies, float)
    if len(pos) != len(acc) or len(pos) < 3:
        raise ValueError(f"need matching positions and accuracies, at least 3; got {len(pos)} and {len(acc)}")
    delta = np.abs(pos - (pos.min() + pos.max()) / 2)
    if np.std(delta) == 0 or np.std(acc) == 0:
        return 0.0  # flat accuracy (or a single distance): no U-shape to speak of
    return float(np.corrcoef(delta, acc)[0, 1] * 100)


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


def accuracy_table(df: pd.DataFrame, by: str | list[str] = "position", value: str = "correct", seed: int = 0) -> pd.DataFrame:
    """n, mean and 95 % bootstrap CI of ``value`` per group."""
    rows = []
    for key, group in df.groupby(by, sort=True):
        mean, lo, hi = bootstrap_ci(group[value].to_numpy(), seed=seed)
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip([by] if isinstance(by, str) else by, key)), "n": len(group), "mean": mean, "ci_low": lo, "ci_high": hi})
    return pd.DataFrame(rows)

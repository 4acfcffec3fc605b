"""Is the middle lost? A paired test of one map cell's position curve.

The map asks every record at every gold position, so each record carries its own contrast; pairing
removes the between-record variance (which question, how hard) that an unpaired comparison of three
accuracies keeps. Per cell, per record r:

* ``ends_minus_middle`` = (y_first + y_last) / 2 − y_middle  (the U's depth; the gated contrast)
* ``first_minus_middle``, ``last_minus_middle``, ``first_minus_last``  (which shape: U, primacy, recency)

Each contrast: the mean over records, a 95 % interval clustered by record (one difference per record:
a t interval on the differences; for a 0/1 outcome the two-position contrasts take Newcombe's paired
Wilson interval, never of zero width), the minimum detectable effect at 80 % power (two-sided, α =
0.05: 2.80 · SE), and a two-sided p. Every contrast's p is Holm-adjusted over the family of gated
cells (``gate``: ``p_holm`` for ends − middle, ``<contrast>_p_holm`` for the others), and every shape
word comes from the adjusted tests alone (the intervals printed beside them are unadjusted, and say so):

* ``U``: ends − middle > 0 after Holm, and each end above the middle after Holm;
* ``primacy`` / ``recency``: ends − middle > 0 after Holm but only one end above the middle after
  Holm, or ends − middle not significant while first − last is after Holm (a monotone curve);
* ``U (the ends jointly …)``: ends − middle > 0 after Holm, neither end alone above the middle;
* ``inverted``: ends − middle < 0 after Holm;
* ``no deficit at MDE x``: nothing significant after Holm; a negative is stated with the smallest
  effect it could have seen;
* ``undetermined``: every record has the same difference (all right or all wrong everywhere): no
  variance, no test.

Method comparisons (:func:`method_differences`) and every other paired verdict take their word from
:func:`verdict_word`: the one rule of the workbook.

The same pairing compares methods (:func:`method_differences`): a method and a reference answered
the same records at the same gold positions, so each record carries its own difference.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.stats.multitest import multipletests

from .metrics import check_finite, is_binary, minimum_detectable_effect, proportion_ci

CONTRASTS = {
    "ends_minus_middle": lambda f, m, l: (f + l) / 2 - m,
    "first_minus_middle": lambda f, m, l: f - m,
    "last_minus_middle": lambda f, m, l: l - m,
    "first_minus_last": lambda f, m, l: f - l,
}
PAIRS = {"first_minus_middle": ("first", "middle"), "last_minus_middle": ("last", "middle"), "first_minus_last": ("first", "last")}


def paired_wide(cell: pd.DataFrame, value: str = "correct", record: str = "record", position: str = "relative_position",
                first: float = 0.0, middle: float = 0.5, last: float = 1.0) -> pd.DataFrame:
    """One row per record with its ``value`` at the first, middle and last position (columns first,
    middle, last). Refuses input that is not paired: a missing position, or records absent at some
    position, is a clear error (never a NaN result)."""
    for col in (value, record, position):
        if col not in cell:
            raise ValueError(f"the cell has no column {col!r} (columns: {list(cell.columns)})")
    found = set(cell[position].round(6))
    for name, where in (("first", first), ("middle", middle), ("last", last)):
        if round(where, 6) not in found:
            raise ValueError(f"the cell has no {name} position {where} (positions: {sorted(found)}); the gate needs "
                             "first, middle and last")
    picked = cell[cell[position].round(6).isin({round(first, 6), round(middle, 6), round(last, 6)})]
    check_finite(picked, value, "the position gate", record, position)
    if picked.duplicated([record, position]).any():
        raise ValueError("a record appears twice at one position: the gate takes one outcome per record and position")
    wide = picked.pivot(index=record, columns=position, values=value)
    wide = wide.rename(columns={c: n for c in wide.columns for n, w in (("first", first), ("middle", middle), ("last", last))
                                if round(c, 6) == round(w, 6)})[["first", "middle", "last"]]
    complete = wide.dropna()
    if len(complete) == 0:
        raise ValueError("no record is present at all three positions: the comparison is not paired")
    if len(complete) < len(wide):
        missing = wide.index[wide.isna().any(axis=1)]
        raise ValueError(f"{len(missing)} record(s) lack a position (first: {missing[0]!r}); a paired comparison needs "
                         "every record at first, middle and last")
    return complete.astype(float)


def newcombe_paired(x: np.ndarray, y: np.ndarray, confidence: float = 0.95) -> tuple[float, float]:
    """Newcombe's (1998, method 10) interval for the difference of two paired proportions, built from
    the Wilson intervals of each: never of zero width, also with few discordant records."""
    n = len(x)
    z = stats.norm.ppf(0.5 + confidence / 2)

    def wilson(k):
        p = k / n
        centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return centre - half, centre + half

    a, b = x.mean(), y.mean()
    (l1, u1), (l2, u2) = wilson(x.sum()), wilson(y.sum())
    # the correlation of the paired outcomes (phi), 0 where a margin is constant
    both, only_x, only_y, neither = [float(np.sum(c)) for c in ((x == 1) & (y == 1), (x == 1) & (y == 0),
                                                                 (x == 0) & (y == 1), (x == 0) & (y == 0))]
    denom = (both + only_x) * (neither + only_y) * (both + only_y) * (neither + only_x)
    phi = (both * neither - only_x * only_y) / np.sqrt(denom) if denom > 0 else 0.0
    d = a - b
    low = d - np.sqrt(max((a - l1) ** 2 - 2 * phi * (a - l1) * (u2 - b) + (u2 - b) ** 2, 0.0))
    high = d + np.sqrt(max((u1 - a) ** 2 - 2 * phi * (u1 - a) * (b - l2) + (b - l2) ** 2, 0.0))
    return float(max(low, -1.0)), float(min(high, 1.0))


def contrasts(wide: pd.DataFrame) -> pd.DataFrame:
    """The four paired contrasts of one cell (one row each): n, mean, SE, 95 % interval, MDE, p."""
    n = len(wide)
    binary = is_binary(wide.to_numpy().ravel())
    rows = []
    for name, fn in CONTRASTS.items():
        d = fn(wide["first"].to_numpy(), wide["middle"].to_numpy(), wide["last"].to_numpy())
        pair = tuple(wide[c].to_numpy() for c in PAIRS[name]) if name in PAIRS and binary else None
        # every record with the same difference: no interval can be claimed from these data
        se, low, high, p = _paired_test(d, pair, no_variance=(-1.0, 1.0))
        mde = minimum_detectable_effect(se) if se > 0 else float("nan")
        rows.append({"contrast": name, "n": n, "estimate": float(d.mean()), "se": se, "ci_low": float(low),
                     "ci_high": float(high), "mde": mde, "p": p})
    return pd.DataFrame(rows)


def _paired_test(d: np.ndarray, pair: tuple[np.ndarray, np.ndarray] | None, no_variance: tuple[float, float]):
    """SE, 95 % interval and two-sided p of the mean of per-record differences ``d``: for two paired 0/1
    outcomes (``pair``), Newcombe's interval and McNemar's exact p; otherwise a t interval; where no
    record's difference varies, the interval ``no_variance`` and p = 1."""
    n = len(d)
    se = float(d.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
    if pair is not None:
        x, y = pair
        low, high = newcombe_paired(x, y)
        discordant = int(np.sum(x != y))
        return se, low, high, float(stats.binomtest(int(np.sum(x > y)), discordant).pvalue) if discordant else 1.0
    if se > 0:
        half = stats.t.ppf(0.975, n - 1) * se
        return se, d.mean() - half, d.mean() + half, float(stats.ttest_1samp(d, 0.0).pvalue)
    return (se, *no_variance, 1.0)


def verdict_word(difference: float, ci_low: float, ci_high: float, p_holm: float, mde: float, alpha: float = 0.05,
                 unit: float = 1.0, digits: int = 3, suffix: str = "") -> str:
    """The workbook's one verdict rule for a paired difference: ``higher`` / ``lower`` where the
    Holm-adjusted p < ``alpha``; else ``no difference at MDE x`` (x in ``unit`` with ``digits``
    decimals and ``suffix``), saying why where the unadjusted 95 % interval printed beside it excludes
    0 (only Holm keeps it from a verdict); ``undetermined`` where no record differs (no MDE)."""
    if not np.isfinite(mde):
        return "undetermined: no record differs"
    if p_holm < alpha:
        return "higher" if difference > 0 else "lower"
    word = f"no difference at MDE {unit * mde:.{digits}f}{suffix}"
    if ci_low > 0 or ci_high < 0:
        word += f" (after Holm, p = {p_holm:.2g}; the unadjusted interval excludes 0)"
    return word


def verdict(row: dict, alpha: float = 0.05) -> str:
    """The shape of one gated cell from its Holm-adjusted contrasts (see the module docstring)."""
    if not np.isfinite(row["ends_minus_middle_mde"]):
        return "undetermined: every record has the same difference (ceiling or floor)"

    def above(name):  # this end above the middle after Holm
        return row[f"{name}_p_holm"] < alpha and row[name] > 0

    significant = row["p_holm"] < alpha
    first_last_clear = row["first_minus_last_p_holm"] < alpha
    if significant and row["ends_minus_middle"] < 0:
        return "inverted"
    if significant:
        if above("first_minus_middle") and above("last_minus_middle"):
            return "U"
        if above("first_minus_middle") != above("last_minus_middle"):
            return "primacy" if above("first_minus_middle") else "recency"
        return "U (the ends jointly; neither end alone clear of the middle)"
    if first_last_clear:
        return "primacy" if row["first_minus_last"] > 0 else "recency"
    return f"no deficit at MDE {row['ends_minus_middle_mde']:.3f}"


def gate(cells: dict[str, pd.DataFrame], value: str = "correct", alpha: float = 0.05, **columns) -> pd.DataFrame:
    """The deficit table: one row per cell (``cells``: name -> long per-record table), each contrast's
    estimate, interval, MDE and p, the ends − middle p Holm-adjusted over the cells, and the verdict."""
    if not cells:
        raise ValueError("gate needs at least one cell")
    rows = []
    for name, cell in cells.items():
        table = contrasts(paired_wide(cell, value, **columns))
        row = {"cell": name, "value": value, "n": int(table["n"].iloc[0])}
        for r in table.itertuples():
            row.update({r.contrast: r.estimate, f"{r.contrast}_ci_low": r.ci_low, f"{r.contrast}_ci_high": r.ci_high,
                        f"{r.contrast}_mde": r.mde, f"{r.contrast}_p": r.p})
        rows.append(row)
    out = pd.DataFrame(rows)
    out["p_holm"] = multipletests(out["ends_minus_middle_p"], method="holm")[1]
    for name in CONTRASTS:
        if name != "ends_minus_middle":
            out[f"{name}_p_holm"] = multipletests(out[f"{name}_p"], method="holm")[1]
    out["verdict"] = [verdict(r, alpha) for r in out.to_dict(orient="records")]
    return out


def differences_to_ends(cell: pd.DataFrame, value: str = "correct", record: str = "record",
                        position: str = "relative_position") -> pd.DataFrame:
    """Per position: the paired difference of each record's ``value`` there to the mean of its first
    and last, with a 95 % t interval clustered by record (one difference per record) — the curve the
    gate tests, drawn with its own uncertainty."""
    wide_all = cell.pivot(index=record, columns=position, values=value).dropna().astype(float)
    if wide_all.empty:
        raise ValueError("no record is present at every position: the differences are not paired")
    first, last = wide_all.columns.min(), wide_all.columns.max()
    ends = (wide_all[first] + wide_all[last]) / 2
    rows = []
    for pos in wide_all.columns:
        d = (wide_all[pos] - ends).to_numpy()
        n = len(d)
        se = float(d.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
        half = stats.t.ppf(0.975, n - 1) * se if se > 0 else float("nan")
        rows.append({"relative_position": float(pos), "n": n, "difference": float(d.mean()),
                     "ci_low": float(d.mean() - half), "ci_high": float(d.mean() + half)})
    return pd.DataFrame(rows)


def method_differences(cells: dict[str, pd.DataFrame], pairs, value: str = "correct", record: str = "sample",
                       position: str = "position", alpha: float = 0.05, on_method_records: bool = False) -> pd.DataFrame:
    """Methods against references on the same records (``cells``: method -> long table with one
    ``value`` per record and gold position; ``pairs``: (method, reference) names). Per pair, the
    difference at each gold position and ``"average"`` over the positions (per record, the mean of its
    positions: one number per record, so the interval is clustered by record): n, both means, the
    difference, SE, a 95 % interval (a 0/1 outcome at one position: Newcombe's paired interval and
    McNemar's exact p; otherwise a t interval and p), the MDE at 80 % power, the p Holm-adjusted over
    the family (the pairs' averages form one family, the per-position differences another) and a
    verdict: ``higher`` / ``lower`` where the Holm p < ``alpha``, else ``no difference at MDE x``. A
    record or position missing from one side is refused, never dropped silently; with
    ``on_method_records`` the reference may hold more records than the method (a baseline on the
    whole test part, a method on its first n) and is compared on the method's."""
    rows = []
    for method, reference in pairs:
        missing = [m for m in (method, reference) if m not in cells]
        if missing:
            raise ValueError(f"no cell for {missing}; have {sorted(cells)}")
        wide = {}
        for name in (method, reference):
            cell = cells[name]
            for col in (value, record, position):
                if col not in cell:
                    raise ValueError(f"{name}: no column {col!r} (columns: {list(cell.columns)})")
            if cell.duplicated([record, position]).any():
                raise ValueError(f"{name}: a record appears twice at one position")
            check_finite(cell, value, name, record, position)
            wide[name] = cell.pivot(index=record, columns=position, values=value).sort_index().sort_index(axis=1).astype(float)
        a, b = wide[method], wide[reference]
        if on_method_records:
            b = b[b.index.isin(a.index)]
        if list(a.columns) != list(b.columns) or list(a.index) != list(b.index) or a.isna().any().any() or b.isna().any().any():
            only = sorted(set(a.index) ^ set(b.index))
            raise ValueError(f"{method} and {reference} are not paired: records only on one side {only[:5]} "
                             f"({len(only)}), positions {list(a.columns)} vs {list(b.columns)}; compare the same records "
                             "at the same positions (a missing answer is not dropped silently)")
        binary = is_binary(np.concatenate([a.to_numpy().ravel(), b.to_numpy().ravel()]))
        for pos in [*a.columns, "average"]:
            x, y = (a[pos], b[pos]) if pos != "average" else (a.mean(axis=1), b.mean(axis=1))
            x, y = x.to_numpy(), y.to_numpy()
            d, n = x - y, len(x)
            # no record differs: at most the Wilson bound on the share that could (never [0, 0]); a
            # continuous value alike on every record has no interval
            bound = proportion_ci(0, n)[1]
            se, low, high, p = _paired_test(d, (x, y) if pos != "average" and binary else None,
                                            (-bound, bound) if binary else (float("nan"), float("nan")))
            rows.append({"method": method, "reference": reference, "value": value, "position": pos, "n": n,
                         "method_mean": float(x.mean()), "reference_mean": float(y.mean()), "difference": float(d.mean()),
                         "se": se, "ci_low": float(low), "ci_high": float(high),
                         "mde": minimum_detectable_effect(se) if se > 0 else float("nan"), "p": p})
    out = pd.DataFrame(rows)
    out["p_holm"] = np.nan
    for family in (out["position"] == "average", out["position"] != "average"):
        if family.any():
            out.loc[family, "p_holm"] = multipletests(out.loc[family, "p"], method="holm")[1]
    out["verdict"] = [verdict_word(r.difference, r.ci_low, r.ci_high, r.p_holm, r.mde, alpha) for r in out.itertuples()]
    return out



def size_differences(cells: dict[str, pd.DataFrame], pairs, value: str = "correct", record: str = "record",
                     position: str = "relative_position", alpha: float = 0.05) -> pd.DataFrame:
    """Model against model on the same records of one map cell (``cells``: model label -> its long table;
    ``pairs``: (larger, smaller) labels): :func:`method_differences` at each position, on the average
    over positions and on ends − middle (each record's own contrast, so every interval is clustered by
    record), compared on the larger model's records (it may hold fewer while its map grows); one Holm
    family per pair over all of these, the verdict from it."""
    rows = []
    for larger, smaller in pairs:
        both = {k: cells[k] for k in (larger, smaller)}
        per_position = method_differences(both, [(larger, smaller)], value, record, position, alpha, on_method_records=True)
        shape = {}
        for name, cell in both.items():
            wide = paired_wide(cell, value, record, position)
            shape[name] = pd.DataFrame({record: wide.index, position: 0.5,
                                        value: CONTRASTS["ends_minus_middle"](wide["first"], wide["middle"], wide["last"]).to_numpy()})
        contrast = method_differences(shape, [(larger, smaller)], value, record, position, alpha, on_method_records=True)
        contrast = contrast[contrast["position"] != "average"].assign(position="ends − middle")
        family = pd.concat([per_position, contrast], ignore_index=True)
        family["p_holm"] = multipletests(family["p"], method="holm")[1]
        family["verdict"] = [verdict_word(r.difference, r.ci_low, r.ci_high, r.p_holm, r.mde, alpha) for r in family.itertuples()]
        rows.append(family)
    return pd.concat(rows, ignore_index=True)

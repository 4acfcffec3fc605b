"""The claims ledger: each claim of the seed papers, one row, against our number from the stored tables.

``results/claims.csv`` (:func:`write`) holds, per claim, the paper, where it says so, the paper's model
and setting and number, ours (model with quantisation and dtype, setting, estimate with its interval,
n, MDE), a verdict in one vocabulary (:data:`VERDICTS`) and the notebook that shows it. Every number
comes from a stored table named in ``source`` and the paper's from ``data/papers/``; nothing is typed
here but the claims and the reasons a claim is not run. ``tests/test_claims.py`` re-derives every
row from its source and keeps the README's findings table equal to the ledger.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..store.models import QWEN, model_label
from ..store.results import output_dir, project_root, write_csv
from .lpes_at_power import MS_POE_PARTS, WITHDRAWN

COLUMNS = ["claim", "paper", "where", "paper_setting", "paper_value", "ours_setting", "ours", "ci_low", "ci_high", "interval",
           "unit", "n", "mde", "verdict", "notebook", "source"]
NUMBERS = ("ours", "ci_low", "ci_high", "n", "mde")
PAIRED = "95 % CI, paired, clustered by record (unadjusted)"
# a verdict starts with one of these words; a row that is not "reproduced" or "opposite" says why
VERDICTS = ("reproduced", "opposite", "not reproduced", "not comparable", "not run", "withdrawn")

LPES, LPES_2024, LASP, CALIOPE = ("LPES (2026)", "LPES (2024 version)", "LASP", "CALIOPE")
QWEN_7B = "Qwen2.5-7B, 130k window, MDQA 20 documents (~3k tokens), 500 samples per position"
OUR_MDQA20 = "MDQA-20 (the 441 lost-in-the-middle records), gold at 0/5/10/15/19"
LPES_TABLE1_METHODS = {"LPES": "LPES (Ours)", "PI": "Positional Interpolation", "Ms-PoE": "Ms-PoE",
                       "Attention Buckets": "Attention Buckets", "MoICE": "MoICE"}


def paper_table1() -> pd.DataFrame:
    return pd.read_csv(project_root() / "data" / "papers" / "lpes_table1.csv")


def paper_average(model: str, method: str, task: str) -> float:
    """A Table 1 row's accuracy averaged over its positions (%), as the paper's "Avg." column."""
    t = paper_table1()
    rows = t[(t.model == model) & (t.method == method) & (t.task == task)]
    if rows.empty:
        raise KeyError(f"LPES Table 1 has no row {model} / {method} / {task}")
    return float(rows.accuracy_percent.mean())


def paper_gain(model: str, method: str, task: str, reference: str = "Baseline") -> float:
    return paper_average(model, method, task) - paper_average(model, reference, task)


def paper_ends_minus_middle(model: str, task: str) -> float:
    """The paper's baseline curve: the mean of its first and last positions minus its middle one (points)."""
    t = paper_table1()
    rows = t[(t.model == model) & (t.method == "Baseline") & (t.task == task)].sort_values("relative_position")
    acc = rows.accuracy_percent.to_numpy()
    return float((acc[0] + acc[-1]) / 2 - acc[len(acc) // 2])


def _row(**fields) -> dict:
    row = {c: fields.get(c, np.nan if c in NUMBERS else "") for c in COLUMNS}
    if not row["verdict"].startswith(VERDICTS):
        raise ValueError(f"verdict {row['verdict']!r} starts with none of {VERDICTS}")
    return row


def _verdict(text: str) -> str:
    """A comparison's verdict in the ledger's words (the LPES study's "no paper figure" is "not comparable")."""
    if text.startswith("no paper figure"):
        return "not comparable — no paper figure for this comparison in this setting; ours: " + text.split("ours: ", 1)[1]
    return text


def lpes_test_rows(results: Path, dtype: str = "bfloat16") -> list[dict]:
    """LPES Table 1 (Qwen, MDQA) and the baselines, from the LPES-at-power test's claims table."""
    source = Path("lpes_at_power") / f"claims_mdqa20_{QWEN}_{dtype}.csv"
    rows = []
    for r in pd.read_csv(results / source).itertuples():
        method = r.method
        if method in MS_POE_PARTS or r.reference in MS_POE_PARTS:
            continue  # issue #100's diagnostic of Ms-PoE's loss: a question of ours, no paper's claim
        if method in LPES_TABLE1_METHODS:
            ref = "Baseline" if r.reference == "baseline" else LPES_TABLE1_METHODS[r.reference]
            paper, where = LPES, "Table 1 (Avg., Qwen MDQA)"
            paper_value = f"{paper_gain('Qwen2.5-7B', LPES_TABLE1_METHODS[method], 'mdqa', ref):+.1f} points"
            setting = QWEN_7B
        elif method.startswith(("Ms-PoE (", "MoICE (")):  # a variant that is not the authors' code (methods.MsPoE, moice)
            paper, where, paper_value, setting = LPES, "Table 1 (Avg., Qwen MDQA)", "", QWEN_7B
            r = r._replace(verdict=f"not comparable — ours ran {method}, not the authors' code's {method.split(' (')[0]}; ours: "
                                   + r.verdict.split("ours: ", 1)[-1])
        elif method.startswith("CALIOPE"):
            paper, where, paper_value = CALIOPE, "Tables 3, 6 (calibrators, NQ needle at 100 chunks)", ""
            setting = "Llama-3.1-8B and Qwen-2.5-14B, 128k windows; no MDQA-20 figure"
        else:
            raise ValueError(f"{source}: no paper claim is known for method {method!r}")
        rows.append(_row(claim=f"{method} − {r.reference}, accuracy averaged over gold positions", paper=paper, where=where,
                         paper_setting=setting, paper_value=paper_value,
                         ours_setting=f"{model_label(QWEN, dtype)}; {OUR_MDQA20}, test records, paired",
                         ours=r.points, ci_low=r.ci_low, ci_high=r.ci_high, interval=PAIRED, unit="points", n=r.n,
                         mde=r.mde_points,
                         verdict=_verdict(r.verdict), notebook="10", source=str(source)))
    return rows


def withdrawn_rows(results: Path, dtype: str = "bfloat16") -> list[dict]:
    """The transfer claims of the withdrawn searches, with their reason and without their numbers."""
    rows = []
    for dataset, reason in WITHDRAWN.items():
        source = Path("lpes_at_power") / "withdrawn" / f"claims_{dataset}_{QWEN}_{dtype}.csv"
        if (results / source).exists():
            for r in pd.read_csv(results / source).itertuples():
                rows.append(_row(claim=f"{r.method} − {r.reference} on MDQA-20 (a curve searched on {dataset.upper()})",
                                 paper=LPES, where="Sec. 4 (transfer of searched factors; Table 2 for other benchmarks)",
                                 paper_setting="factors searched on MDQA, applied to ZeroSCROLLS / L-Eval",
                                 ours_setting=f"{model_label(QWEN, dtype)}; {OUR_MDQA20}, test records", n=r.n,
                                 verdict=f"withdrawn — {reason}", notebook="10", source=str(source)))
    return rows


# the map's record cells against the paper's baseline curves: (cell, value) -> (paper model, paper task, paper setting)
SHAPE_CELLS = {
    ("mdqa-20", "correct"): ("Qwen2.5-7B", "mdqa", QWEN_7B),
    ("mdqa-20", "gold_logprob"): ("Qwen2.5-7B", "mdqa", QWEN_7B + " (accuracy; the paper reports no log-probability)"),
    ("mdqa-10", "correct"): ("Vicuna-7B-v1.5", "mdqa", "Vicuna-7B-v1.5, 4k window, MDQA 10 documents"),
    ("kv-75", "correct"): ("Qwen2.5-7B", "kv", "Qwen2.5-7B, 130k window, KV 150 pairs"),
    ("kv-140", "correct"): ("Qwen2.5-7B", "kv", "Qwen2.5-7B, 130k window, KV 150 pairs"),
}


def shape_rows(results: Path, dtype: str = "bfloat16") -> list[dict]:
    """The unmodified model's position curve (lost-in-the-middle's U, LPES Table 1's baseline rows):
    ends − middle from the map's paired gate, record cells only (the papers' data, record by record)."""
    source = Path("position_deficits.csv")
    table = pd.read_csv(results / source)
    rows = []
    for r in table[table.source == "record cells"].itertuples():
        cell = r.cell.split()[-1]
        if not r.cell.startswith(f"{QWEN} {dtype} ") or (cell, r.value) not in SHAPE_CELLS:
            continue
        model, task, setting = SHAPE_CELLS[(cell, r.value)]
        logprob = r.value == "gold_logprob"
        scale, unit = (1.0, "nats") if logprob else (100.0, "points")
        shape = "U" if r.verdict == "U" else r.verdict
        verdict = ("reproduced: a U (both ends above the middle, after Holm)" if shape == "U"
                   else f"not reproduced at MDE {scale * r.ends_minus_middle_mde:.1f} {unit}: no deficit" if shape.startswith("no deficit")
                   else f"not reproduced: {shape} (the first position above the middle, the last not)" if shape == "primacy"
                   else f"not reproduced: {shape}")
        paper_value = f"{paper_ends_minus_middle(model, task):+.1f} points" + (" (its accuracy)" if logprob else "")
        rows.append(_row(claim=f"{cell.upper()}: the unmodified model's {'gold log-prob' if logprob else 'accuracy'} is U-shaped "
                               "in the gold position (ends − middle)", paper=LPES, where="Table 1 (Baseline rows)",
                         paper_setting=setting, paper_value=paper_value,
                         ours_setting=f"{model_label(QWEN, dtype)}; {cell.upper()}, every record at every position",
                         ours=scale * r.ends_minus_middle, ci_low=scale * r.ends_minus_middle_ci_low,
                         ci_high=scale * r.ends_minus_middle_ci_high, interval=PAIRED, unit=unit, n=r.n,
                         mde=scale * r.ends_minus_middle_mde,
                         verdict=verdict, notebook="09", source=str(source)))
    return rows


def paper_table4() -> pd.DataFrame:
    return pd.read_csv(project_root() / "data" / "papers" / "lpes_table4.csv").set_index("method").seconds_per_sample


def the_stored(results: Path, step: str) -> Path:
    """The one stored table of ``step`` (``<step>-<key>.csv``); more than one is an error naming them."""
    found = sorted(results.glob(f"{step}-*.csv"))
    if len(found) != 1:
        raise ValueError(f"expected one stored {step} table in {results}, found {[p.name for p in found]}")
    return found[0]


RSM_SOURCE = "structure_deviation_paired.csv"  # notebook 4's paired table


def rsm_rows(results: Path) -> list[dict]:
    """LPES Fig. 3: the smooth Bézier scales disturb the layer-wise representation structure (D, Eq. 12–13)
    less than the other scalings, from notebook 4's paired table (per input, the ratio D(Bézier) / D(other))."""
    params = pd.read_json(the_stored(results, "structure_deviation").with_suffix(".json"), typ="series")
    rows = []
    for r in pd.read_csv(results / RSM_SOURCE).itertuples():
        verdict = ("reproduced" if r.ci_high < 1 else "opposite" if r.ci_low > 1 else
                   f"not reproduced — no difference resolved on {r.inputs} inputs (no MDE for a median ratio)")
        rows.append(_row(claim=f"smooth Bézier scales disturb the layer-wise RSM less than {r.variant} scales (D, Eq. 13)",
                         paper=LPES, where="Sec. 3, Eq. 12–13, Fig. 3", paper_value="lower (a figure, no number)",
                         paper_setting="Vicuna-v1.5-7B, 500 MDQA examples, 16 seeds",
                         ours_setting=f"{model_label(params['model'], params['dtype'])}; {r.inputs} MDQA inputs, "
                                      f"seeds {list(params['seeds'])}; lower on {r.reference_lower} of {r.inputs}",
                         ours=r.median_ratio, ci_low=r.ci_low, ci_high=r.ci_high,
                         interval="95 % bootstrap CI over inputs (median per-input ratio)", unit="× (D ratio)", n=r.inputs,
                         verdict=verdict, notebook="04", source=RSM_SOURCE))
    return rows


SMOOTHNESS_SOURCE = "search_smoothness.csv"  # notebook 5's per-layer GA, first against last generation


def smoothness_rows(results: Path) -> list[dict]:
    """LPES Fig. 4: a brute-force (per-layer) GA's population evolves toward smoother scales."""
    rows = []
    for r in pd.read_csv(results / SMOOTHNESS_SOURCE).itertuples():
        verdict = ("reproduced" if r.ci_high < 0 else "opposite" if r.ci_low > 0 else
                   f"not reproduced — no change resolved over {r.generations} generations")
        rows.append(_row(claim="a brute-force per-layer GA's population evolves toward smoother scales (S, last − first generation)",
                         paper=LPES, where="Sec. 3, Fig. 4", paper_value="decreasing (a figure, no number)",
                         paper_setting="brute-force GA on 200 MDQA inputs, individuals from U(1, 2)",
                         ours_setting=f"{model_label(r.model, r.dtype)}; notebook 5's per-layer GA, "
                                      f"{r.generations} generations of {r.individuals}; S {r.first_mean:.2f} → {r.last_mean:.2f}",
                         ours=r.difference, ci_low=r.ci_low, ci_high=r.ci_high,
                         interval="95 % bootstrap CI over individuals (approximate: survivors carry over)", unit="S",
                         n=r.individuals, verdict=verdict, notebook="05", source=SMOOTHNESS_SOURCE))
    return rows


DEPTH_SOURCE = "probe_depth_contrast.csv"  # notebook 2's shallow-against-deep table
LASP_FIGURES = {  # probe -> (where, the paper's setting, what the figure shows)
    "masking": ("Sec. 3, Fig. 1 (masking RoPE in one layer)",
                "Llama-1/2/3, Qwen, Phi, DeepSeek (1B–24B); PG19 windows of 8,192 tokens",
                "shallow layers: perplexity from < 10 to > 100; deep layers: the baseline's (a figure)"),
    "coarsening": ("Sec. 3, Fig. 2 (coarsening positions ⌊p/k⌋ in one layer)", "Llama-3-8B, k from 2 to 4,096",
                   "shallow layers degrade even at k = 2; deep layers stable at k = 4,096 (a figure)"),
}


def lasp_rows(results: Path) -> list[dict]:
    """LASP Figs. 1–2: a probe of one shallow layer (first third) raises perplexity more than a probe of one
    deep layer (last third), paired per window; masking, and coarsening at the smallest k measured (the
    paper: "even minor coarsening (e.g., k = 2)" hurts shallow layers; at k = the window it is masking)."""
    table = pd.read_csv(results / DEPTH_SOURCE)
    smallest = table[table.probe.str.startswith("coarsening")].probe.iloc[0]
    rows = []
    for r in table[table.probe.isin(["masking", smallest])].itertuples():
        where, setting, shown = LASP_FIGURES[r.probe.split()[0]]
        direction = ("reproduced in direction" if r.ci_low > 0 else "opposite" if r.ci_high < 0 else
                     f"not reproduced at MDE {r.mde_pct:.1f} %")
        rows.append(_row(claim=f"{r.probe}: a shallow layer's probe raises perplexity more than a deep layer's "
                               "(one layer at a time, first third against last third of the layers)",
                         paper=LASP, where=where, paper_setting=setting, paper_value=shown,
                         ours_setting=f"{model_label(r.model, r.dtype)}; {r.windows} windows of {r.window} tokens of the "
                                      f"book text; layers {r.shallow_layers} raise perplexity by {r.shallow_pct:.1f} %, "
                                      f"layers {r.deep_layers} by {r.deep_pct:.1f} % (geometric means)",
                         ours=r.contrast_pct, ci_low=r.ci_low, ci_high=r.ci_high,
                         interval="95 % t interval over windows, paired per window", unit="% (shallow over deep)",
                         n=r.windows, mde=r.mde_pct,
                         verdict=direction + (f"; not in size: {r.shallow_pct:.1f} % where the paper shows a tenfold "
                                              "rise (settings apart: model size, window length)"
                                              if r.ci_low > 0 and r.probe == "masking" else ""),
                         notebook="02", source=DEPTH_SOURCE))
    return rows


def latency_rows(results: Path) -> list[dict]:
    """LPES Table 4: each method's inference time over the baseline's, against the paper's."""
    source = the_stored(results, "benchmark_latency")
    params = pd.read_json(source.with_suffix(".json"), typ="series")
    ours, paper = pd.read_csv(source).set_index("variant"), paper_table4()
    setting = (f"{model_label(params['model'], params['dtype'])}; {params['samples']} MDQA prompt(s), {params['new_tokens']} new "
               f"tokens, {params['rounds']} interleaved rounds on a 2-core CPU")
    rows = []
    for method, named in LPES_TABLE1_METHODS.items():
        # the method, or the variant of it that was timed (notebook 6 times MoICE with its per-head router)
        variant = method if method in ours.index else next((v for v in ours.index if v.startswith(f"{method} (")), None)
        if method == "PI" or variant is None:
            continue
        r = ours.loc[variant]
        rows.append(_row(claim=f"{variant} inference time over the baseline's", paper=LPES, where="Table 4",
                         paper_setting="Vicuna-7B, one H100, FlashAttention-2, 500 MDQA samples",
                         paper_value=f"{paper[named] / paper['Baseline']:.2f}×", ours_setting=setting, ours=r.median_ratio,
                         ci_low=r.q25_ratio, ci_high=r.q75_ratio, interval="median and IQR over rounds (no CI)", unit="×",
                         n=params["samples"],
                         verdict=f"not comparable — {params['samples']} prompt(s) timed on a CPU, not 500 on a GPU (exploratory); "
                                 f"ours: {r.median_ratio:.2f}× (IQR {r.q25_ratio:.2f}–{r.q75_ratio:.2f})",
                         notebook="06", source=source.name))
    return rows


# claims no stored table answers (not run, or withdrawn until rerun), and why: a reason, never a number
def unanswered() -> list[dict]:
    vicuna = {task: paper_gain("Vicuna-7B-v1.5", "LPES (Ours)", task) for task in ("mdqa", "kv")}
    qwen_kv = paper_gain("Qwen2.5-7B", "LPES (Ours)", "kv")
    return [
        dict(claim="LPES − baseline on Vicuna-7B (MDQA-10 and KV-50)", paper=LPES, where="Table 1 (Vicuna rows)",
            paper_setting="Vicuna-7B-v1.5-16k, 4k window, 500 samples per position",
            paper_value=f"{vicuna['mdqa']:+.1f} points (MDQA), {vicuna['kv']:+.1f} (KV)",
            verdict="not run — a 7B model's search does not fit a 2-core CPU; the `paper` profile costs it "
            "(results/costs/) and the GPU kit runs it where a GPU is lent", notebook="10"),
        dict(claim="LPES − baseline on Qwen KV retrieval (150 pairs)", paper=LPES, where="Table 1 (Qwen KV)",
            paper_setting="Qwen2.5-7B, 130k window, KV 150 pairs", paper_value=f"{qwen_kv:+.1f} points",
            verdict="withdrawn — the KV-75 search scored the gold value without its quotes; it is to be searched again "
            "under the answer forms (issue #99)", notebook="10"),
        dict(claim="searched factors transfer to open- and closed-ended long-text benchmarks", paper=LPES, where="Table 2",
            paper_setting="ZeroSCROLLS and L-Eval, Vicuna-7B and Qwen2.5-7B",
            verdict="not run — ZeroSCROLLS and L-Eval cannot be had offline", notebook=""),
        dict(claim="LPES preserves general capabilities", paper=LPES, where="Table 3", paper_setting="MMLU and C-Eval, 7B models",
            verdict="not run — the general-capability benchmarks cannot be had offline", notebook=""),
        dict(claim="scaling RoPE raises the attention paid to the middle third of the context", paper=LPES,
            where="App. A, Fig. 7", paper_setting="Vicuna-7B-v1.5 and Llama-2-7B, QMSum validation set",
            paper_value="higher (a figure, no number)",
            verdict="not comparable — exploratory: one text window, no interval (notebook 3 shows the change per layer "
            "and scale)", notebook="03"),
        dict(claim="attention entropy rises beyond the trained window and first rises then falls as the scale grows",
            paper=LPES_2024, where="Sec. 5, Fig. 8", paper_setting="Vicuna-7B-v1.5 and Llama-2-7B",
            paper_value="a figure, no number",
            verdict="not comparable — exploratory: one text window per length, no interval (notebook 3)", notebook="03"),
        dict(claim="without RoPE in early layers, later tokens' states grow more like the first tokens' (causal attention "
                  "favours the beginning)",
            paper=LPES_2024, where="Sec. 3.1, Fig. 3", paper_setting="Vicuna-7B-v1.5 and Llama-2-7B, 50 QMSum items, RoPE "
                                                                   "removed from layers 2–4, cosine at layer 4",
            paper_value="a figure, no number",
            verdict="not comparable — exploratory: one text window, no interval (notebook 3)", notebook="03"),
        dict(claim="layer-specific scales extrapolate perplexity past the trained window better than uniform PI",
            paper=LPES_2024, where="Sec. 4.2, Table 3", paper_setting="Vicuna-7B-v1.5 and Llama-2-7B, 100 PG19 samples",
            verdict="not comparable — exploratory: one text window per length, no interval (notebook 6)", notebook="06"),
        dict(claim="the ablations of the search (curve family, control points, fitness weights, population)", paper=LPES,
            where="Tables 5, 6, 11, 12", paper_setting="Qwen2.5-7B and Vicuna-7B, 500 samples per position",
            verdict="not comparable — exploratory: the cpu profile's ablation searches are too short to leave their start "
            "(notebook 5)", notebook="05"),
        dict(claim="a gradient search of the per-layer scales does worse than the GA", paper=LPES, where="Table 10",
            paper_setting="7B models, MDQA",
            verdict="not comparable — notebook 5 stores the gradient search's accuracy by position, not per record, so it "
            "cannot be paired with the GA's", notebook="05"),
        dict(claim="the searched curves' shapes: larger scales in the earlier and middle layers, smaller in the later",
            paper=LPES_2024, where="Sec. 5, Figs. 9–10", paper_setting="Vicuna-7B-v1.5, MDQA and KV retrieval",
            verdict="not comparable — no curve searched here beat the unmodified model on validation (notebook 10), so "
            "their shapes say nothing of a better curve", notebook="10"),
        dict(claim="cross-chunk reasoning improves with calibration", paper=CALIOPE, where="Sec. 6.2, Fig. 3, Table 4 (Babilong-QA)",
            paper_setting="Llama-3.1-8B, Qwen-2.5-14B, 128k windows",
            verdict="not run — only a two-fact proxy exists (notebook 9's map), not the paper's reasoning benchmark", notebook="09"),
    ]


def ledger(results: Path | None = None) -> pd.DataFrame:
    """Every claim's row (see the module docstring), from the stored tables under ``results``."""
    results = output_dir("results", "cpu") if results is None else Path(results)
    rows = [*shape_rows(results), *lpes_test_rows(results), *withdrawn_rows(results), *rsm_rows(results), *smoothness_rows(results), *lasp_rows(results),
            *latency_rows(results), *(_row(**r) for r in unanswered())]
    return pd.DataFrame(rows, columns=COLUMNS)


def read(path: Path) -> pd.DataFrame:
    """A stored ledger as :func:`ledger` builds it: empty text stays text, empty numbers are NaN."""
    return pd.read_csv(path, keep_default_na=False, na_values={c: [""] for c in NUMBERS})


def write(results: Path | None = None) -> Path:
    results = output_dir("results", "cpu") if results is None else Path(results)
    return write_csv(results / "claims.csv", ledger(results))


def _signed(x: float, digits: int = 1) -> str:
    return f"{round(x, digits) + 0.0:+.{digits}f}".replace("-", "−")  # + 0.0: a -0.0 prints as +0.0


def findings_table(table: pd.DataFrame) -> str:
    """The README's findings: the ledger's rows with a confidence interval, as Markdown."""
    lines = ["| claim | paper (where) | paper | ours [95 % CI], n | verdict |", "|---|---|---|---|---|"]
    for r in table[table.interval.str.startswith("95 %")].itertuples():
        if r.unit.startswith("×"):  # a ratio: no sign, two decimals
            ours = f"{r.ours:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}] {r.unit}, n = {int(r.n)}"
        else:  # points to one decimal, the smaller units (nats, S) to two
            d = 1 if r.unit == "points" else 2
            ours = f"{_signed(r.ours, d)} [{_signed(r.ci_low, d)}, {_signed(r.ci_high, d)}] {r.unit}, n = {int(r.n)}"
        lines.append(f"| {r.claim} | {r.paper}, {r.where} | {r.paper_value or '—'} | {ours} | {r.verdict} |")  # '—': no figure
    return "\n".join(lines)

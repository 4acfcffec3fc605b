"""The second model (notebook 8): Qwen2.5-Coder-0.5B, a model with headroom at every gold position:
its calibration over the profile's task settings, whether bf16 judges a task like float32 does (the
evidence behind running a study in bf16, see :func:`lpes_nb.store.models.resolve_dtype`), and the
reading of the whole notebook."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pandas as pd

from ..evaluation.evaluate import evaluate_samples
from ..evaluation.fitness import difference_text
from ..evaluation.metrics import proportion_ci
from ..evaluation.tasks import EvalSettings
from ..store.data import Sample
from .calibration import calibrate, curve_text


def calibration(model, tokenizer, sm) -> pd.DataFrame:
    """The unmodified model on each of the profile's calibration settings (``sm``: the profile's
    :class:`~lpes_nb.studies.profiles.SecondModel`); MDQA answers are short phrases and get the 16 new tokens
    notebook 1 gives them."""
    return pd.concat([calibrate(model, tokenizer, [c], dataclasses.replace(sm.settings, max_new_tokens=16)
                                if c.task == "mdqa" else sm.settings) for c in sm.calibration], ignore_index=True)


def conclusion(agreement: pd.DataFrame, calibrated: pd.DataFrame, reference: tuple[float, float], searches: pd.DataFrame,
               test_table: pd.DataFrame, diffs: pd.DataFrame, bench_diffs: pd.DataFrame, dtype: str) -> str:
    """Notebook 8's reading, every number from its tables: the dtype agreement, the calibration
    curves with the shape their intervals support, the search against the unmodified model's
    search-set fitness, the test set's accuracies and paired differences, and the training-free
    methods on the first test records."""
    a = agreement.iloc[0]
    same = int(round(a["same correctness"] * a["n"]))
    lines = [f"- **{dtype} against float32** on {int(a['n'])} test records: the same judgement on {same} of {int(a['n'])} "
             f"({100 * a['ci_low']:.0f}–{100 * a['ci_high']:.0f} %, Wilson 95 %), the same answer text on "
             f"{100 * a.get('same prediction', float('nan')):.0f} %."]
    lines.append("- **Calibration** (first / middle / last, Wilson 95 % intervals):")
    for (task, items), rows in calibrated.groupby(["task", "num_items"], sort=False):
        lines.append(f"  - {task}, {items} items (n = {int(rows['n'].min())}): {curve_text(rows)}")
    fitness, se = reference
    lines.append(f"- **The searches** on the search set, where the unmodified model scores {fitness:.3f} ± {se:.3f} (SE): "
                 + "; ".join(f"{name} ended at {r['search fitness']:.3f} after {int(r['evaluations'])} evaluations"
                             for name, r in searches.T.iterrows()) + ".")
    acc = test_table.pivot(index="method", columns="position", values="mean")
    fit = test_table.groupby("method").fitness.first()
    lines.append(f"- **Test set** (n = {int(test_table['n'].min())} per position; first / middle / last, λ-score): "
                 + "; ".join(f"{m} {' / '.join(f'{100 * v:.0f}' for v in acc.loc[m])} % ({fit[m]:.3f})"
                             for m in dict.fromkeys(test_table["method"])) + ".")
    lines += [f"  - {difference_text(r)}" for _, r in diffs.iterrows()]
    lines.append(f"- **The training-free methods** on the first {int(bench_diffs['records'].min())} test records per position "
                 "(a sanity check at this n):")
    lines += [f"  - {difference_text(r)}" for _, r in bench_diffs.iterrows()]
    return "\n".join(lines)


def agreement(models: dict[str, object], tokenizer, samples: Sequence[Sample], settings: EvalSettings) -> pd.DataFrame:
    """Per sample and dtype: correctness (and the prediction in generate mode), one column per dtype
    name of ``models`` (e.g. ``{"float32": ..., "bfloat16": ...}``), the first being the reference."""
    if len(models) != 2:
        raise ValueError(f"compare exactly two dtypes (reference first), got {list(models)}")
    tables = []
    for name, model in models.items():
        df = evaluate_samples(model, tokenizer, samples, settings=settings, progress=False)
        tables.append(df.set_index(["position", "sample"]).add_suffix(f"_{name}"))
    return tables[0].join(tables[1]).reset_index()


def agreement_summary(per_sample: pd.DataFrame) -> pd.DataFrame:
    """Accuracy in each dtype, and the share of samples judged the same (with its Wilson 95 % CI) and, where
    there are predictions, answered with the same text."""
    dtypes = [c.removeprefix("correct_") for c in per_sample.columns if c.startswith("correct_")]
    a, b = (per_sample[f"correct_{d}"] for d in dtypes)
    same = (a == b).astype(float)
    low, high = proportion_ci(int(same.sum()), len(same))
    row = {"n": len(per_sample), **{f"accuracy {d}": per_sample[f"correct_{d}"].mean() for d in dtypes},
           "same correctness": same.mean(), "ci_low": low, "ci_high": high}
    if all(f"prediction_{d}" in per_sample for d in dtypes):
        row["same prediction"] = (per_sample[f"prediction_{dtypes[0]}"] == per_sample[f"prediction_{dtypes[1]}"]).mean()
    return pd.DataFrame([row])

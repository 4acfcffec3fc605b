"""Whether a cheaper dtype judges a task like float32 does: the evidence behind running a study in
bf16 (see :func:`lpes_nb.store.models.resolve_dtype`)."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from ..store.data import Sample
from ..evaluation.evaluate import evaluate_samples
from ..evaluation.metrics import proportion_ci
from ..evaluation.tasks import EvalSettings


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

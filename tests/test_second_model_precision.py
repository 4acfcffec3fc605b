"""bf16 against float32: the per-sample comparison and its summary; the second model's settings."""

import dataclasses

import pandas as pd
import pytest

from lpes_nb.evaluation.tasks import EvalSettings, TaskConfig
from lpes_nb.store.models import load_model, load_tokenizer
from lpes_nb.studies.second_model import agreement, agreement_summary
from lpes_nb.studies.profiles import PROFILES, SecondModel


def test_agreement_pairs_each_sample_across_dtypes():
    tok = load_tokenizer("tiny-qwen2")
    samples = TaskConfig("two_fact", 4, n=2, seed=3).samples()
    settings = EvalSettings(mode="generate", max_new_tokens=3)
    per = agreement({"float32": load_model("tiny-qwen2"), "bfloat16": load_model("tiny-qwen2", dtype="bfloat16")},
                    tok, samples, settings)
    assert len(per) == len(samples) and {"correct_float32", "correct_bfloat16", "prediction_bfloat16"} <= set(per.columns)
    with pytest.raises(ValueError, match="exactly two dtypes"):
        agreement({"float32": None}, tok, samples, settings)


def test_agreement_summary_counts_same_judgements_and_texts():
    per = pd.DataFrame({"correct_float32": [True, True, False, False], "correct_bfloat16": [True, False, False, False],
                        "prediction_float32": ["a", "b", "c", "d"], "prediction_bfloat16": ["a", "x", "c", "y"]})
    row = agreement_summary(per).iloc[0]
    assert (row["accuracy float32"], row["accuracy bfloat16"]) == (0.5, 0.25)
    assert row["same correctness"] == 0.75 and row["same prediction"] == 0.5
    assert row["ci_low"] <= 0.75 <= row["ci_high"]


def test_second_model_settings_are_checked():
    sm = PROFILES["cpu"].second
    with pytest.raises(ValueError, match="dtype must be"):
        dataclasses.replace(sm, dtype="fp16")
    with pytest.raises(ValueError, match="0 < low < high"):
        dataclasses.replace(sm, ranges=((1.3, 1.0, 0.05),))
    with pytest.raises(ValueError, match="agreement_n must be a positive int"):
        dataclasses.replace(sm, agreement_n=0)
    assert isinstance(sm, SecondModel) and sm.settings.mode == "generate"  # score mode misjudges quoted answers

"""The benchmark study's helpers: method registry, cached per-method tables, extrapolation specs."""

import numpy as np
import pytest
import torch

from lpes_nb.studies import benchmarks
from lpes_nb.studies.benchmarks import (
    EXTRAPOLATION_VARIANTS,
    compared_methods,
    extrapolation_specs,
    method_key,
    method_samples,
)
from lpes_nb.core.methods import Caliope
from lpes_nb.core.rope import dynamic_ntk_base
from lpes_nb.evaluation.fitness import position_tables
from lpes_nb.evaluation.moice import PER_HEAD_MOICE, UNTRAINED_MOICE, MoICE
from tests.test_methods import SAMPLES


def test_every_compared_method_is_listed_once():
    methods = compared_methods([1.0, 1.5, 2.0, 1.5])
    assert list(methods) == ["baseline", "PI", "Dynamic NTK", "Attention Buckets", "Ms-PoE", "Ms-PoE (rank, endpoints grid)",
                             "MoICE (untrained)",
                             "CALIOPE-Moses", "CALIOPE-Hourglass", "CALIOPE-Decay", "LASP", "LPES"]
    assert methods["PI"].scales == [1.5] * 4 and methods["LPES"].scales == [1.0, 1.5, 2.0, 1.5]
    # cache keys are stable across runs (no object addresses)
    assert all(" at 0x" not in method_key(m) for m in methods.values())
    assert method_key(methods["baseline"]) == method_key(compared_methods([1.0])["baseline"]) == "Baseline()"


def test_a_trained_router_changes_the_cache_key(tiny_llama):
    a = MoICE()
    a.router = a.new_router(tiny_llama, seed=0)
    b = MoICE()
    b.router = b.new_router(tiny_llama, seed=1)
    assert method_key(a) != method_key(b) and method_key(a).startswith("MoICE(")


def test_a_moice_row_names_the_router_that_ran(tiny_llama):
    """Only the published router carries the paper's name (issue #100): this workbook's per-head router and
    the uniform mixture say what they are, and a stored reference recipe does before its weights load."""
    per_head = MoICE(router=MoICE().new_router(tiny_llama))
    reference = MoICE(router=MoICE().new_reference_router(tiny_llama))
    stored = MoICE(train=lambda: None, reference=True)
    assert [m.label for m in (per_head, reference, stored, MoICE())] == [PER_HEAD_MOICE, "MoICE", "MoICE", UNTRAINED_MOICE]
    labels = list(compared_methods([1.0] * 4, per_head))
    assert PER_HEAD_MOICE in labels and "MoICE" not in labels
    assert "MoICE" in compared_methods([1.0] * 4, reference)


def test_benchmark_tables_are_cached_per_method(tiny_llama, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path))
    methods = {k: v for k, v in compared_methods([1.0, 1.5, 2.0, 1.5]).items() if k in ("baseline", "LPES", "CALIOPE-Hourglass")}
    methods["CALIOPE-Hourglass"] = Caliope("hourglass", delta_max=100)  # the default layout overflows tiny-llama's 2k window
    first = position_tables(method_samples(tiny_llama, tokenizer, SAMPLES, methods, "bench", {"task": "t"}, "smoke", progress=False))
    assert list(first.method.unique()) == list(methods) and first["mean"].between(0, 1).all()
    assert {"rho", "fitness", "ci_low", "ci_high"} <= set(first.columns)
    monkeypatch.setattr(benchmarks, "evaluate_samples", lambda *a, **k: pytest.fail("recomputed a cached method"))
    again = position_tables(method_samples(tiny_llama, tokenizer, SAMPLES, methods, "bench", {"task": "t"}, "smoke", progress=False))
    assert again.equals(first)
    summary = benchmarks.summary_table(first.assign(task="KV"), list(methods))
    assert list(summary.index) == list(methods) and "fitness KV" in summary.columns
    row = first[first.method == "LPES"].iloc[0]
    assert summary.loc["LPES", f"KV gold@{row.position}"].startswith(f"{round(100 * row['mean'])} [")


def test_extrapolation_specs_keep_the_mean_stretch(tiny_llama):
    window = tiny_llama.config.max_position_embeddings  # 2048
    relative = [1.0, 2.0, 1.0, 2.0]
    assert extrapolation_specs(tiny_llama, "baseline", 4096, relative) is None
    pi = [s.scale for s in extrapolation_specs(tiny_llama, "PI", 4096, relative)]
    layered = [s.scale for s in extrapolation_specs(tiny_llama, "PI + layer-specific", 4096, relative)]
    assert pi == [2.0] * 4 and np.mean(layered) == pytest.approx(2.0) and layered[1] / layered[0] == pytest.approx(2.0)
    assert [s.scale for s in extrapolation_specs(tiny_llama, "PI", window // 2, relative)] == [1.0] * 4  # inside the window
    ntk = extrapolation_specs(tiny_llama, "NTK + layer-specific", 4096, relative)
    assert ntk[0].base == pytest.approx(dynamic_ntk_base(10000.0, 2.0, 4096, window, 16)) and ntk[1].scale == pytest.approx(4 / 3)
    with pytest.raises(ValueError, match="unknown variant 'YaRN'"):
        extrapolation_specs(tiny_llama, "YaRN", 4096, relative)


def test_tail_perplexity_equals_the_full_forward_on_the_tail(tiny_llama):
    ids = torch.randint(0, 49152, (1, 64), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        logits = tiny_llama(ids).logits[0, -17:-1]
    nll = torch.nn.functional.cross_entropy(logits, ids[0, -16:])
    assert benchmarks.tail_perplexity(tiny_llama, ids[0].tolist(), 16) == pytest.approx(float(nll.exp()), rel=1e-5)
    table = benchmarks.perplexity_extrapolation(tiny_llama, {64: [ids[0].tolist()]}, [1.0, 1.2, 1.4, 1.6], tail=16, progress=False)
    assert list(table.variant) == list(EXTRAPOLATION_VARIANTS) and np.isfinite(table.ppl).all()


def test_extrapolation_table_orders_variants_and_averages_windows():
    import pandas as pd

    ppl = pd.DataFrame({"length": [64, 64, 64, 128], "variant": ["NTK", "baseline", "baseline", "baseline"],
                        "window": [0, 0, 1, 0], "ppl": [3.0, 2.0, 4.0, 5.0]})
    table = benchmarks.extrapolation_table(ppl)
    assert list(table.index) == ["baseline", "NTK"] and list(table.columns) == [64, 128]
    assert table.loc["baseline", 64] == 3.0 and table.loc["baseline", 128] == 5.0 and np.isnan(table.loc["NTK", 128])


def test_latency_prompts_have_the_gold_document_in_the_middle():
    from lpes_nb.evaluation.tasks import TaskConfig

    samples = benchmarks.latency_samples(TaskConfig("mdqa", 10, n=20, offset=100), 2)
    assert len(samples) == 2 and {s.position for s in samples} == {4} and [s.sample_id for s in samples] == [300, 301]


def test_methods_past_the_window_are_left_out_loudly(tiny_llama, tokenizer, capsys):
    """tiny-llama's 2,048 positions: CALIOPE-Moses (10,000) and -Decay (7,025 at 10 documents) cannot
    run on a 10-item prompt; Hourglass at small gaps and the baseline can."""
    from lpes_nb.core.methods import Baseline
    from lpes_nb.evaluation.tasks import TaskConfig

    samples = TaskConfig("kv", 10, n=1, key_format="letters6", value_format="digits4").samples()
    methods = {"baseline": Baseline(), "CALIOPE-Moses": Caliope("moses"), "CALIOPE-Decay": Caliope("decay"),
               "small hourglass": Caliope("hourglass", delta_max=100)}
    kept = benchmarks.runnable(tiny_llama, tokenizer, samples, methods)
    assert list(kept) == ["baseline", "small hourglass"]
    printed = capsys.readouterr().out
    assert "CALIOPE-Moses left out" in printed and "CALIOPE-Decay left out" in printed and "window of 2048" in printed



def test_a_method_that_is_the_baseline_on_these_prompts_is_named_with_why(tiny_llama, tokenizer):
    """Dynamic NTK inside the window it grows from keeps the trained base (issue #99): named, with the
    longest prompt and the window; below that window, and for every other method, not."""
    from lpes_nb.core.methods import Baseline, DynamicNTK, pi
    from lpes_nb.evaluation.tasks import TaskConfig

    samples = TaskConfig("kv", 10, n=1, key_format="letters6", value_format="digits4").samples()
    longest = max(len(tokenizer(s.prompt).input_ids) for s in samples)
    methods = {"baseline": Baseline(), "PI": pi([1.5] * 4), "Dynamic NTK": DynamicNTK(), "short window": DynamicNTK(original_max_positions=16)}
    why = benchmarks.unchanged(tiny_llama, tokenizer, samples, methods)
    assert why == {"Dynamic NTK": f"the longest prompt, {longest:,} tokens, is inside the 2,048-token window it grows from, "
                                  "where transformers' dynamic RoPE keeps the trained base"}

def test_method_tables_on_two_local_workers_equal_one_process(tiny_llama, tokenizer, tmp_path, monkeypatch):
    """A benchmark's per-method tables computed by two spawned workers (each building the model and
    the task's samples once, whole records per item) equal the in-process tables, row for row."""
    from lpes_nb.studies.benchmarks import SampleWorker
    from lpes_nb.evaluation.distributed import distributed_fitness
    from lpes_nb.evaluation.tasks import TaskConfig

    task = TaskConfig("kv", 6, n=5, positions=(0, 3, 5), seed=3)
    methods = {k: v for k, v in compared_methods([1.0, 1.5, 2.0, 1.5]).items() if k in ("baseline", "LPES")}
    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path / "one"))
    one = method_samples(tiny_llama, tokenizer, task.samples(), methods, "bench", {"task": repr(task)}, "smoke", progress=False)
    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path / "two"))
    with distributed_fitness(SampleWorker("tiny-llama", task), "processes", workers=2, progress=False) as pool:
        two = method_samples(None, None, task.samples(), methods, "bench", {"task": repr(task)}, "smoke", progress=False, pool=pool)
        with pytest.raises(ValueError, match="other samples than this process holds"):
            benchmarks._on_workers(pool, TaskConfig("kv", 6, n=5, positions=(0, 3, 5), seed=4).samples(), methods["LPES"],
                                   benchmarks.EvalSettings())
    assert one[["method", "position", "sample", "correct"]].equals(two[["method", "position", "sample", "correct"]])
    np.testing.assert_allclose(two["gold_logprob"], one["gold_logprob"], rtol=1e-5, atol=1e-5)

"""The paper-dry profile, the footprint recorder and the cost model built on them."""

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from lpes_nb.operations.cost_model import VICUNA_7B, Gpu, Shape
from lpes_nb.operations.costs import MEMORY_OPERATIONS, cost_table, memory_fit, work_units
from lpes_nb.store.models import tiny_config
from lpes_nb.store.results import cached_table, project_root
from lpes_nb.studies.profiles import PROFILES
from lpes_nb.system import footprint


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_paper_dry_keeps_the_papers_lengths_batches_and_positions():
    paper, dry = PROFILES["paper"], PROFILES["paper-dry"]
    assert dry.settings == paper.settings
    for name in ("search", "test", "mdqa"):
        a, b = getattr(paper, name), getattr(dry, name)
        assert dataclasses.replace(b, n=a.n) == a, name  # only the sample count differs
    assert dry.probes.window == paper.probes.window and dry.probes.ks == paper.probes.ks
    assert dataclasses.replace(dry.attention, range_n=paper.attention.range_n) == paper.attention
    assert dry.gradient.batch_size == paper.gradient.batch_size and dry.calibration.kv_sizes == paper.calibration.kv_sizes
    b, p = dry.benchmarks, paper.benchmarks
    assert b.extrapolation.lengths == p.extrapolation.lengths and b.extrapolation.tail == p.extrapolation.tail
    assert b.router.batch_size == p.router.batch_size and b.latency.new_tokens == p.latency.new_tokens
    assert dataclasses.replace(b.mdqa, n=p.mdqa.n) == p.mdqa
    # and the model keeps Vicuna-7B-16k's trained window and RoPE scaling
    config = tiny_config(dry.model)
    assert config.max_position_embeddings == 16384
    assert config.rope_parameters["rope_type"] == "linear" and config.rope_parameters["factor"] == 4.0


def test_footprint_is_off_without_its_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(footprint.ENV, raising=False)
    with footprint.study("nothing"):
        torch.ones(10)
    assert list(tmp_path.iterdir()) == []


def test_footprint_records_largest_tensor_and_attention_flops(tmp_path, monkeypatch):
    target = tmp_path / "fp.jsonl"
    monkeypatch.setenv(footprint.ENV, str(target))
    b, h, t, d = 2, 3, 50, 8
    q = torch.randn(b, h, t, d)
    with footprint.study("probe", extra=1):
        big = torch.zeros(1000, 1000)  # 3.81 MiB, the largest fresh allocation
        torch.zeros(1000, 1).expand(1000, 5000)  # a view that looks larger (19 MiB) allocates 4 KB
        big.add_(1)  # neither is an in-place result
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
        F.scaled_dot_product_attention(q[:, :, -1:], q, q)  # a decoding step
        with footprint.study("inner"):  # belongs to the outer study
            torch.ones(2, 3) @ torch.ones(3, 4)
            with torch.inference_mode():  # where a linear layer is one operator, not a view and a product
                torch.nn.functional.linear(torch.ones(5, 3), torch.ones(7, 3))
    (rec,) = records(target)
    assert rec["study"] == "probe" and rec["extra"] == 1
    assert rec["largest_tensor_mib"] == pytest.approx(1e6 * 4 / 2**20, abs=0.01)
    assert rec["largest_tensor_shape"] == [1000, 1000]
    assert rec["attention_flops"] == 4 * b * h * d * (t * (t + 1) // 2) + 4 * b * h * d * t
    assert rec["decode_attention_calls"] == 1
    assert rec["matmul_flops_by_width"] == {"4": 2 * 2 * 3 * 4, "7": 2 * 5 * 3 * 7}  # the inner study's, counted once, here
    assert rec["peak_rss_mib"] >= rec["rss_before_mib"] > 0


def test_cached_tables_are_recorded_as_studies(tmp_path, monkeypatch):
    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path))
    monkeypatch.setenv(footprint.ENV, str(tmp_path / "fp.jsonl"))
    monkeypatch.setenv(footprint.NOTEBOOK_ENV, "05_search")
    compute = lambda: pd.DataFrame({"x": [float((torch.ones(4, 4) @ torch.ones(4, 4)).sum())]})  # noqa: E731
    cached_table("study_x", {"a": 1}, compute, "smoke")
    cached_table("study_x", {"a": 1}, compute, "smoke")  # read back: nothing computed, nothing recorded
    (rec,) = records(tmp_path / "fp.jsonl")
    assert (rec["notebook"], rec["study"], rec["matmul_flops_by_width"]) == ("05_search", "study_x", {"4": 2 * 4 * 4 * 4})


def _record(study, **flops):
    base = dict(notebook="nb", study=study, seconds=1.0, rss_before_mib=100.0, peak_rss_mib=150.0,
                largest_tensor_mib=1.0, largest_tensor_shape=[1], largest_tensor_op="aten::mm",
                matmul_flops_by_width={}, attention_flops=0, decode_attention_calls=0)
    return {**base, **flops}


def test_cost_model_scales_each_part_by_its_own_factor():
    dry = Shape(layers=2, hidden=8, intermediate=16, heads=2, head_dim=4, vocab=10)
    big = Shape(layers=4, hidden=16, intermediate=32, heads=4, head_dim=4, vocab=20)
    gpu = Gpu("test", memory_gib=80, sustained_flops=1e12, bandwidth=1e9)
    rows = pd.DataFrame([_record("calibration_kv", matmul_flops_by_width={"16": 10**12}),
                         _record("calibration_kv", matmul_flops_by_width={"10": 10**12}),  # as wide as the vocabulary: the head
                         _record("calibration_kv", attention_flops=10**12),
                         _record("calibration_kv", decode_attention_calls=2 * dry.layers)])
    table = cost_table(rows, dry, big, gpu)
    ratio = PROFILES["paper"].calibration.n / PROFILES["paper-dry"].calibration.n  # no layer loop
    assert (table.work_ratio == round(ratio, 1)).all()
    expected = [big.matmul_parameters / dry.matmul_parameters, (20 * 16) / (10 * 8), (4 * 4 * 4) / (2 * 2 * 4), 0]
    assert table.paper_pflop.tolist() == pytest.approx([round(ratio * e * 1e-3, 2) for e in expected])
    decode_seconds = ratio * 2 * 2 * big.parameters / gpu.bandwidth  # two steps, each reads the bf16 weights
    assert table.paper_gpu_hours.iloc[3] == pytest.approx(round(decode_seconds / 3600, 3))
    assert (table.dry_activation_mib == 50).all()


def test_memory_fit_extrapolates_the_measured_line_to_the_big_width():
    measured = pd.DataFrame([{"operation": op, "width": w, "activation_mib": 100 + 3 * w}
                             for op in MEMORY_OPERATIONS for w in (16, 32, 64)])
    fit = memory_fit(measured, VICUNA_7B, Gpu("test", memory_gib=24, sustained_flops=1, bandwidth=1))
    assert fit.mib_at_width_0.tolist() == [100] * 4 and fit.mib_per_width.tolist() == [3] * 4
    activations = (100 + 3 * 4096) / 1024
    assert fit.activations_7b_gib.iloc[0] == pytest.approx(round(activations, 1))
    assert fit.peak_7b_gib.iloc[0] == pytest.approx(round(2 * VICUNA_7B.parameters / 2**30 + activations, 1))
    assert not fit.fits.any()  # 12.6 GiB of weights + 12.1 GiB of activations > 24 GiB
    assert memory_fit(measured, VICUNA_7B, Gpu("test", memory_gib=25, sustained_flops=1, bandwidth=1)).fits.all()
    flat = measured.assign(activation_mib=2500 - measured.width)  # noise around a width-independent peak
    unresolved = memory_fit(flat, VICUNA_7B)
    assert not unresolved.slope_resolved.any() and unresolved.peak_7b_gib.isna().all()  # no extrapolation from noise


def test_the_committed_memory_line_is_the_fit_of_the_committed_measurements():
    """docs/gpu.md shows `paper_memory_fit.csv`; `lpes costs memory` writes it beside its measurements."""
    costs_dir = project_root() / "results" / "costs"
    fit = memory_fit(pd.read_csv(costs_dir / "paper_memory_scaling.csv"))
    assert fit.to_csv(index=False) == (costs_dir / "paper_memory_fit.csv").read_text()


def test_cost_model_refuses_a_study_it_has_no_units_for():
    with pytest.raises(KeyError, match="no work units for study 'mystery'"):
        cost_table(pd.DataFrame([_record("mystery")]), VICUNA_7B)


def test_work_units_cover_both_profiles_and_scale_layer_loops():
    paper, dry = work_units(PROFILES["paper"], 32), work_units(PROFILES["paper-dry"], 8)
    assert paper.keys() == dry.keys() and all(v > 0 for v in dry.values())
    assert all(paper[k] >= dry[k] for k in paper)
    # one masked layer at a time, plus the unpatched pass: 33 passes on 32 layers, 9 on 8
    assert paper["probe_masking_ppl"] / dry["probe_masking_ppl"] == PROFILES["paper"].probes.windows * 33 / 9


def test_embedded_shapes_are_the_converted_configs():
    from transformers import AutoConfig

    from lpes_nb.operations.cost_model import SHAPES
    from lpes_nb.store.models import EMBEDDED, QWEN, QWEN_15B, absent, ensure_embedded

    for name in (EMBEDDED, QWEN, *(() if absent(QWEN_15B) else (QWEN_15B,))):  # the 1.5B: installed on demand
        assert SHAPES[name] == Shape.of(AutoConfig.from_pretrained(ensure_embedded(name=name))), name


def test_prefill_flops_count_products_causal_attention_and_head():
    s = Shape(layers=2, hidden=8, intermediate=16, heads=2, head_dim=4, vocab=10)
    per_token = 2 * 2 * (4 * 8 * 8 + 3 * 8 * 16)
    assert s.prefill_flops(5) == per_token * 5 + 2 * 2 * 2 * 4 * 25 + 2 * 10 * 8


def test_notebook9_plan_counts_every_cell_and_the_paper_ga_budget():
    from lpes_nb.operations.cost_model import ga_evaluations
    from lpes_nb.operations.costs import notebook9_plan
    from lpes_nb.studies.position_map import LENGTH_TASKS

    p = PROFILES["gpu"]
    plan = notebook9_plan(p)
    spec, rs = p.position_map, p.regime_search
    cells = sum(len(m.lengths) * len(LENGTH_TASKS) + len(m.mdqa_docs) for m in spec.models)
    assert (plan.stage == "map").sum() == cells and plan[plan.stage == "map"].prompts.eq(spec.n * 5).all()
    assert ga_evaluations(rs.ga) == 32 + 20 * (16 + 2 * 4)  # the paper's budget: 16 mutations, both children of 4 crossovers
    ga = plan[(plan.stage == "search: GA") & (plan.task == "kv")]
    assert ga.prompts.eq(ga_evaluations(rs.ga) * len(rs.seeds) * 3 * rs.search_n).all()
    # the plan grows with the prompt: the search at 28k tokens costs more per prompt than at 7k
    per_prompt = ga.set_index("model").gpu_hours / ga.set_index("model").prompts
    assert per_prompt["qwen2.5-coder-0.5b"] > per_prompt["smollm2-135m"]


def test_committed_gpu_plan_is_what_the_code_computes():
    """The cost table of docs/gpu.md of the gpu profile comes from results/costs/gpu_notebook9_plan.csv."""
    from lpes_nb.operations.costs import COSTS_DIR, notebook9_plan
    from lpes_nb.store.results import project_root

    committed = pd.read_csv(project_root() / COSTS_DIR / "gpu_notebook9_plan.csv")
    pd.testing.assert_frame_equal(committed, notebook9_plan(PROFILES["gpu"]), check_dtype=False)


def test_notebook9_plan_of_a_found_regime_plans_its_transfer_at_the_closest_length():
    from lpes_nb.operations.costs import notebook9_plan

    plan = notebook9_plan(PROFILES["gpu"], regimes={"smollm2-135m": ("mdqa", 3200)})
    search = plan[(plan.model == "smollm2-135m") & (plan.stage == "search: GA")]
    assert search[["task", "prompt_tokens"]].values.tolist() == [["mdqa", 3200], ["kv", 4096]]  # 4,096: the closest KV length


def test_ga_evaluations_bound_what_a_search_scores():
    """The plan's count of GA evaluations is what a search scores at most, and near it: a GA scores both
    children of every crossover (counting one per crossover planned the paper's search 16 % short)."""
    from lpes_nb.operations.cost_model import ga_evaluations
    from lpes_nb.core.ga import BezierSpace, GAConfig, GeneticSearch

    target = np.linspace(1.0, 2.0, 32)
    for cfg in (GAConfig(seed=0), PROFILES["cpu"].lpes_at_power.ga):
        res = GeneticSearch(BezierSpace(32), lambda s: -np.abs(s - target).mean(axis=1), cfg, progress=False).run()
        assert cfg.population + cfg.generations * (cfg.population - cfg.parents) < res.evaluations <= ga_evaluations(cfg)


def test_notebook10_plan_counts_the_search_validation_and_every_test_method():
    from lpes_nb.operations.cost_model import ga_evaluations
    from lpes_nb.operations.costs import PASSES, lpes_at_power_plan

    for name in ("cpu", "gpu", "paper"):
        s = PROFILES[name].lpes_at_power
        plan = lpes_at_power_plan(PROFILES[name]).set_index("stage")
        assert plan.loc["search: GA", "prompts"] == len(s.seeds) * (ga_evaluations(s.ga) + 1) * 3 * s.search_records
        assert plan.loc["validation", "prompts"] == (len(s.seeds) * s.finalists + 1) * 3 * s.validation_records
        sizes = dict(s.test_records)
        assert plan.loc["test: baseline", "prompts"] == 5 * max(sizes.values())
        for method, n in sizes.items():
            assert plan.loc[f"test: {method}", "prompts"] == PASSES.get(method, 1) * 5 * n
            assert plan.loc[f"test: {method}", "new_tokens"] == 100
        # the other curve families at the Bézier search's budget; the transfer searched on KV-75's longer prompts
        for space in ("linear", "free"):
            assert plan.loc[f"search: GA ({space})", "prompts"] == plan.loc["search: GA", "prompts"]
            assert plan.loc[f"validation: {space}", "prompts"] == plan.loc["validation", "prompts"]
        assert plan.loc["search: GA on kv75", "prompts"] == plan.loc["search: GA", "prompts"]
        assert plan.loc["search: GA on kv75", "prompt_tokens"] == 75 * 70 > plan.loc["search: GA", "prompt_tokens"]
        for method in ("LPES", "PI"):
            assert plan.loc[f"test: {method} (searched on kv75)", "prompts"] == 5 * sizes[method]
        assert (plan.gpu_hours > 0).all()
    # the 7B costs more per prompt than the embedded Qwen
    small, big = (lpes_at_power_plan(PROFILES[n]).set_index("stage") for n in ("gpu", "paper"))
    assert (big.gpu_hours / big.prompts)["test: LPES"] > 3 * (small.gpu_hours / small.prompts)["test: LPES"]


def test_notebook10_cpu_plan_prices_each_stage_on_the_path_it_takes():
    """CPU hours from a throughput report's measured seconds per prompt: shared-prefix scoring for the
    search, shared decoding for the methods that share, plain decoding plus a plain scoring pass for
    the others (times their passes); a report measured on another model is refused, naming both."""
    from lpes_nb.operations.costs import PASSES, lpes_at_power_plan

    s = PROFILES["cpu"].lpes_at_power
    sweep = {"what": "MDQA-20 sweep", "model": s.model, "dtype": s.dtype, "prompts": 10}
    report = {"cpu": {"cpu": "CPU A"}, "sweeps": [
        {**sweep, "mode": "score", "pieces": None, "plain_s": 100.0, "shared_s": 60.0},
        {**sweep, "mode": "score", "pieces": 512, "plain_s": 100.0, "shared_s": 50.0},  # 5 s shared, 10 s plain
        {**sweep, "mode": "generate", "plain_s": 300.0, "shared_s": 200.0},  # 20 s shared, 30 s plain
        {"what": "one fitness evaluation", "model": "smollm2-135m", "dtype": "float32", "mode": "score", "prompts": 30,
         "plain_s": 1.0, "shared_s": 1.0}]}
    plan = lpes_at_power_plan(PROFILES["cpu"], cpu=report).set_index("stage")
    hours = plan.cpu_hours * 3600 / plan.prompts
    assert hours["search: GA"] == pytest.approx(5, rel=1e-2) and hours["validation"] == pytest.approx(5, rel=1e-2)
    for method in ("baseline", "LPES", "PI", "PI at the mean Ms-PoE ratio from layer 2"):  # share prefixes
        assert hours[f"test: {method}"] == pytest.approx(20, rel=1e-2)
    for method in ("Ms-PoE", "Ms-PoE, fixed head order", "Ms-PoE (rank, endpoints grid)", "CALIOPE-Moses", "MoICE",
                   "MoICE (per-head router, task-trained)", "MoICE (untrained)", "Attention Buckets"):  # decode and score plain
        assert hours[f"test: {method}"] == pytest.approx(30 + 10, rel=1e-2)
    # both routers' training priced: the per-head one on MDQA prompts, MoICE's own on its general-text sequences
    assert plan.loc["test: MoICE's router (as published)", "prompt_tokens"] == 1024
    assert plan.loc["test: MoICE's router (as published)", "prompts"] == 3 * 7 * 128
    assert np.isfinite(hours["test: MoICE (per-head router, task-trained)'s router"])
    assert plan.loc["test: Attention Buckets", "prompts"] == PASSES["Attention Buckets"] * plan.loc["test: MoICE", "prompts"]
    assert hours["search: GA (free)"] == pytest.approx(5, rel=1e-2) and hours["test: PI (searched on kv75)"] == pytest.approx(20, rel=1e-2)
    assert plan.loc[["search: GA on kv75", "validation: kv75"], "cpu_hours"].isna().all()  # no rate measured on KV prompts
    assert "cpu_hours" not in lpes_at_power_plan(PROFILES["cpu"])
    with pytest.raises(ValueError, match=r"ran \[\('qwen2.5-coder-0.5b', 'bfloat16'\)\] on CPU A; no per-prompt rate for paper-dry-llama"):
        lpes_at_power_plan(PROFILES["smoke"], cpu=report)


def test_notebook10_plan_here_prices_cpu_hours_only_where_the_committed_sweeps_ran_the_model(monkeypatch):
    """A throughput report that measured the cpu profile's Qwen in bf16: its plan has CPU hours
    and names that CPU; the smoke profile's tiny model was never measured: GPU hours only, no CPU."""
    from lpes_nb.operations import costs

    sweep = {"what": "MDQA-20 sweep", "model": "qwen2.5-coder-0.5b", "dtype": "bfloat16", "prompts": 10}
    report = {"cpu": {"cpu": "CPU A"}, "sweeps": [{**sweep, "mode": "score", "pieces": 512, "plain_s": 100.0, "shared_s": 50.0},
                                                  {**sweep, "mode": "generate", "plain_s": 300.0, "shared_s": 200.0}]}
    monkeypatch.setattr(costs, "load_throughput", lambda: report)
    plan, cpu = costs.lpes_at_power_plan_here(PROFILES["cpu"])
    assert cpu == "CPU A" and plan.set_index("stage").loc["validation", "cpu_hours"] == pytest.approx(1620 * 5 / 3600)
    plan, cpu = costs.lpes_at_power_plan_here(PROFILES["smoke"])
    assert cpu is None and "cpu_hours" not in plan


def test_the_larger_model_plan_scales_the_measured_records_and_the_small_models_plan():
    from lpes_nb.operations.costs import LARGER_STAGES, larger_model_plan, lpes_at_power_plan
    from lpes_nb.operations.throughput import load

    report = load()
    cost = {"cpu": {"cpu": "a CPU"}, "record_ratio": {"mdqa-20": 3.0, "kv-75": 2.5},
            "seconds": {"qwen2.5-coder-0.5b": {"mdqa-20": [50.0, 60.0], "kv-75": [100.0, 120.0]},
                        "qwen2.5-coder-1.5b": {"mdqa-20": [150.0, 170.0], "kv-75": [250.0, 350.0]}}}
    plan = larger_model_plan(PROFILES["cpu"], cost, report).set_index("stage")
    assert plan.loc["map: mdqa-20", "cpu_hours"] == round(441 * 160.0 / 3600, 1)  # median of the measured seconds
    assert plan.loc["map: kv-75", "cpu_hours"] == round(100 * 300.0 / 3600, 1)
    small = lpes_at_power_plan(PROFILES["cpu"], cpu=report).set_index("stage")
    for stage in LARGER_STAGES:
        assert plan.loc[stage, "cpu_hours"] == round(small.loc[stage, "cpu_hours"] * 3.0, 1)
    partial = {**cost, "seconds": {k: {"mdqa-20": v["mdqa-20"]} for k, v in cost["seconds"].items()}}
    with pytest.raises(ValueError, match=r"no measured seconds per \['kv-75'\] record of qwen2.5-coder-1.5b on a CPU"):
        larger_model_plan(PROFILES["cpu"], partial, report)
    with pytest.raises(ValueError, match="measured against 'smollm2-135m'"):
        larger_model_plan(PROFILES["cpu"], {**cost, "seconds": {"smollm2-135m": {}, "x": {}}}, report)


def test_the_larger_plan_takes_the_record_cost_of_the_rates_cpu(tmp_path, monkeypatch):
    """Two CPUs' record costs stored: the plan uses the one measured where the per-prompt rates were, not the last."""
    from lpes_nb.operations import costs
    from lpes_nb.operations.throughput import load

    report = load()
    stored = json.loads((costs.project_root() / "results" / "bench" / "record_cost.json").read_text())
    here = next(e for e in stored if e["cpu"]["cpu"] == report["cpu"]["cpu"])
    elsewhere = {**here, "cpu": {**here["cpu"], "cpu": "another CPU"}}
    (tmp_path / "results" / "bench").mkdir(parents=True)
    (tmp_path / "results" / "bench" / "record_cost.json").write_text(json.dumps([here, elsewhere]))
    monkeypatch.setattr(costs, "project_root", lambda: tmp_path)
    costs.main(["larger-plan"])
    plan = pd.read_csv(tmp_path / "results" / "costs" / "qwen2.5-coder-1.5b_plan.csv")
    assert plan.basis.str.contains(report["cpu"]["cpu"], regex=False).all() and not plan.basis.str.contains("another").any()
    (tmp_path / "results" / "bench" / "record_cost.json").write_text(json.dumps([elsewhere]))
    with pytest.raises(SystemExit, match="no record cost measured on"):
        costs.main(["larger-plan"])


def test_notebook9_plan_prices_every_record_cell_with_its_controls():
    from lpes_nb.operations.costs import notebook9_plan

    p = PROFILES["gpu"]
    cells = notebook9_plan(p).query("stage == 'map: record cells'")
    assert len(cells) == len(p.position_map.record_cells) and "qwen2.5-coder-1.5b" in set(cells.model)
    mdqa20 = cells[(cells.model == "qwen2.5-coder-1.5b") & (cells.task == "mdqa-20")].iloc[0]
    assert mdqa20.prompts == 441 * (5 + 2) and mdqa20.new_tokens == 100  # 5 gold positions, closed-book and oracle

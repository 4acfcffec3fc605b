"""What the ``paper`` profile costs on one GPU, from a measured dry run.

``lpes costs dry-run`` executes every notebook under the ``paper-dry`` profile (the
paper's lengths, batch sizes and studies on ``paper-dry-llama``, fewer samples and a smaller GA)
with :mod:`lpes_nb.system.footprint` on, into an output folder of its own (nothing is read from the
committed result store, so everything is measured), and copies the records to ``results/costs/``.
``lpes costs table`` turns the committed records into the cost table of docs/gpu.md.

The model, per study:

* **work**: the dry run's FLOPs, split as the footprint records them, each part scaled to the 7B
  shape (the decoder's matrix products by its matmul parameters, the output head by vocabulary x
  width, attention by layers x heads x head size: each is linear in its factor at fixed token
  counts; eager attention's products, used by the attention probes, are scaled like the decoder's,
  an overestimate), times the ratio of the study's samples (or GA evaluations, steps) in ``paper`` to
  ``paper-dry`` (:func:`work_units`). Both profiles tokenise with the embedded SmolLM2 tokenizer;
  Vicuna's differs by some percent on the same text, which this does not model.
* **time**: work / sustained throughput, plus, for decoding, one read of the bf16 weights per
  decoding step at the stated memory bandwidth (decoding a batch is memory-bound).
* **memory** (:func:`memory_scaling`, :func:`memory_fit`): not from the studies' records, whose
  peaks hold width-independent tensors (a batch of 16 prompts of 5.5k tokens gets a 456 MB boolean
  attention mask, as large at width 32 as at 4096), but from the operations that set the peaks, at
  the paper's batch sizes and lengths, measured at three widths of the dry model and extrapolated
  along the fitted line to width 4096 (float32 activations: an upper bound for bf16), plus the bf16
  weights.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ..evaluation.moice import PER_HEAD_MOICE, MoICE, ReferenceTraining
from ..evaluation.tasks import ORIGINAL_ANSWER_TOKENS, TASKS
from ..evaluation.training import frozen
from ..store import splits
from ..store.models import model_from_config, tiny_config
from ..store.results import project_root, write_csv, write_json
from ..studies.lpes_at_power import TRAINED_MOICE, method_for_test
from ..studies.position_map import KV_TOKENS_PER_PAIR, LENGTH_TASKS, MDQA_TOKENS_PER_DOC, RELATIVE_POSITIONS, record_settings
from ..studies.profiles import Profile, profile
from ..studies.regime_search import TRANSFER
from ..system.footprint import reset_peak_rss, rss_kib
from ..workbook.run import discover, run, select
from .cost_model import H100, H100_SMALL_MODELS, SHAPES, VICUNA_7B, Gpu, Shape, ga_evaluations, prompt_cost
from .throughput import has_rates, seconds_per_prompt
from .throughput import load as load_throughput

COSTS_DIR = "results/costs"
FOOTPRINT_FILE = "paper_dry_footprint.jsonl"
NOTEBOOKS_FILE = "paper_dry_notebooks.json"
TABLE_FILE = "paper_cost_model.csv"
MEMORY_FILE = "paper_memory_scaling.csv"
MEMORY_FIT_FILE = "paper_memory_fit.csv"  # memory_fit of MEMORY_FILE, for docs/gpu.md


def shape_of(model: str) -> Shape:
    """A known model's shape, or a tiny random model's (from its config)."""
    return SHAPES[model] if model in SHAPES else Shape.of(tiny_config(model))


def work_units(p: Profile, layers: int) -> dict[str, float]:
    """Per study, the count its work is proportional to (samples, GA scorings, steps, windows, and
    for the probes that patch one layer or block at a time, the model's ``layers``), so that
    ``units(paper) / units(paper-dry)`` scales a dry-run measurement to the paper."""
    b = p.benchmarks
    blocks = -(-layers // p.attention.range_width) + 1  # every block of range_width layers, and none

    def ga(cfg, n):  # scorings of a whole search: every individual of every generation, n prompts per position
        return cfg.population * (cfg.generations + 1) * n

    return {
        "calibration_kv": p.calibration.n, "calibration_mdqa": p.mdqa.n,
        "probe_masking_ppl": p.probes.windows * (layers + 1), "probe_noise_ppl": p.probes.windows * layers,
        "probe_coarsening_ppl": p.probes.windows * layers * len(p.probes.ks),
        "probe_masking_recall": p.probes.recall_n * (layers + 1),
        "attention_entropy_length": 1, "attention_by_scale": 1, "attention_rope_removal": 1,
        "attention_layer_ranges": p.attention.range_n * blocks, "rsm_deviation": p.rsm.prompts * len(p.rsm.seeds),
        "structure_deviation": p.rsm.prompts * len(p.rsm.seeds),  # rsm_deviation's successor (same forwards)
        "GA search": ga(p.ga, p.search.n), "second GA search": ga(p.second.ga, p.second.search.n),
        "search_test_eval": p.test.n, "search_test_samples": p.test.n,  # the second: per-sample successor
        # the gradient search's steps dominate its test-set evaluation (a single method)
        "search_gradient": p.gradient.steps * p.gradient.batch_size,
        "search_ablations": ga(p.ablation.ga, p.ablation.n),
        "benchmark_kv_samples": b.kv_n, "benchmark_mdqa_samples": b.mdqa.n if b.mdqa else 0,
        "MoICE router training": b.router.steps * b.router.batch_size,
        "benchmark_latency": b.latency.n * b.latency.rounds, "benchmark_extrapolation": b.extrapolation.windows,
        "second_dtype_agreement": p.second.agreement_n, "second_calibration": p.second.calibration[0].n,
        "second_test_samples": p.second.test.n, "second_benchmark_samples": p.second.bench_n,
    }


def _units_key(study: str, units: dict[str, float]) -> str:
    key = "GA search" if study.startswith("GA search") else study
    if key == "GA search" and "second_" in study:  # notebook 8's searches run on its own search set
        key = "second GA search"
    if key not in units:
        raise KeyError(f"the cost model has no work units for study {study!r}; add it to lpes_nb.operations.costs.work_units")
    return key


def cost_table(records: pd.DataFrame, dry: Shape, big: Shape = VICUNA_7B, gpu: Gpu = H100,
               paper: str = "paper", dry_profile: str = "paper-dry") -> pd.DataFrame:
    """One row per study of the dry run: its measurements and the paper's estimated GPU time (see the
    module's docstring for the model)."""
    paper_units, dry_units = work_units(profile(paper), big.layers), work_units(profile(dry_profile), dry.layers)
    rows = []
    for r in records.itertuples(index=False):
        key = _units_key(r.study, dry_units)
        ratio = paper_units[key] / dry_units[key]
        by_width = {int(w): f for w, f in r.matmul_flops_by_width.items()}
        head = by_width.pop(dry.vocab, 0)  # the output head is the only product as wide as the vocabulary
        flops = ratio * (sum(by_width.values()) * big.matmul_parameters / dry.matmul_parameters
                         + head * (big.vocab * big.hidden) / (dry.vocab * dry.hidden)
                         + r.attention_flops * (big.layers * big.heads * big.head_dim) / (dry.layers * dry.heads * dry.head_dim))
        decode_steps = ratio * r.decode_attention_calls / dry.layers
        seconds = flops / gpu.sustained_flops + decode_steps * 2 * big.parameters / gpu.bandwidth
        rows.append({
            "notebook": r.notebook, "study": r.study, "dry_seconds": r.seconds,
            "dry_activation_mib": round(max(r.peak_rss_mib - r.rss_before_mib, 0)),
            "dry_largest_tensor_mib": r.largest_tensor_mib, "dry_largest_tensor": f"{r.largest_tensor_op} {r.largest_tensor_shape}",
            "work_ratio": round(ratio, 1), "paper_pflop": round(flops / 1e15, 2), "paper_decode_steps": round(decode_steps),
            "paper_gpu_hours": round(seconds / 3600, 3),
        })
    return pd.DataFrame(rows)


# The operations that set the paper profile's memory, at its lengths and batch sizes (the longest
# prompts: 75 UUID pairs ~5.5k tokens, 50 pairs ~3.7k, MDQA with 20 documents ~3k; the longest
# extrapolation window 32k), and the studies whose peak each one is.
MEMORY_OPERATIONS = {
    "score 16 x 5.5k": "KV calibration, test set, GA fitness, masking recall, benchmarks (score mode)",
    "generate 16 x 3k, 16 tokens": "MDQA calibration and benchmarks, notebook 8 (generate mode)",
    "backward 1 x 5.5k": "gradient search and MoICE router (micro-batch 1)",
    "forward 1 x 32k, 2k logits": "perplexity extrapolation",
}


def _operation(model, name: str) -> None:
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    ids = lambda b, t: torch.randint(0, vocab, (b, t), generator=gen)  # noqa: E731
    if name.startswith("score"):
        x = ids(16, 5500)
        mask = torch.ones_like(x)
        mask[1:, :100] = 0  # left padding, as in a real batch: the model builds its 4-D mask
        with torch.no_grad():
            model(input_ids=x, attention_mask=mask, logits_to_keep=9)
    elif name.startswith("generate"):
        with torch.no_grad():
            model.generate(ids(16, 3000), attention_mask=torch.ones(16, 3000, dtype=torch.long), max_new_tokens=16,
                           min_new_tokens=16, do_sample=False)
    elif name.startswith("backward"):
        with frozen(model):
            emb = model.get_input_embeddings()(ids(1, 5500)).detach().requires_grad_()
            model(inputs_embeds=emb, logits_to_keep=9).logits.float().sum().backward()
    else:
        with torch.no_grad():
            model(input_ids=ids(1, 32768), logits_to_keep=2049)


def memory_scaling(widths=(16, 32, 64), big: Shape = VICUNA_7B) -> pd.DataFrame:
    """Peak resident memory above the loaded model of each :data:`MEMORY_OPERATIONS` entry on
    ``paper-dry-llama`` with the 7B's depth at several widths (head size 16, MLP ratio 2.6875,
    float32); :func:`memory_fit` extrapolates it to the 7B's width."""
    rows = []
    for width in widths:
        config = tiny_config("paper-dry-llama", hidden_size=width, num_attention_heads=width // 16, num_hidden_layers=big.layers,
                             num_key_value_heads=width // 16, intermediate_size=round(width * 11008 / 4096))
        model = model_from_config(config)
        for name in MEMORY_OPERATIONS:
            reset_peak_rss()
            before = rss_kib("VmRSS")
            _operation(model, name)
            rows.append({"operation": name, "width": width, "activation_mib": round((rss_kib("VmHWM") - before) / 1024, 1)})
        del model
    return pd.DataFrame(rows)


def memory_fit(measured: pd.DataFrame, big: Shape = VICUNA_7B, gpu: Gpu = H100) -> pd.DataFrame:
    """Per operation: the fitted line (MiB at width 0, MiB per unit of width), the extrapolated
    activation memory at the 7B's width (float32, so an upper bound for bf16), plus the bf16 weights."""
    rows = []
    for name, g in measured.groupby("operation", sort=False):
        slope, intercept = np.polyfit(g.width, g.activation_mib, 1)
        activation_gib = (intercept + slope * big.hidden) / 1024
        total = 2 * big.parameters / 2**30 + activation_gib
        # the width-proportional part is measured only if it grows by more than a tenth of the rest
        # over the widths tried; otherwise it is below the allocator's noise and must be worked out by hand
        resolved = bool(slope * (g.width.max() - g.width.min()) > 0.1 * abs(intercept))
        rows.append({"operation": name, "studies": MEMORY_OPERATIONS[name], "mib_at_width_0": round(intercept),
                     "mib_per_width": round(slope, 2), "slope_resolved": resolved,
                     "activations_7b_gib": round(activation_gib, 1) if resolved else np.nan,
                     "peak_7b_gib": round(total, 1) if resolved else np.nan, "fits": total <= gpu.memory_gib if resolved else None})
    return pd.DataFrame(rows)


def read_records(directory: Path | None = None) -> pd.DataFrame:
    directory = directory or project_root() / COSTS_DIR
    return pd.read_json(directory / FOOTPRINT_FILE, lines=True)


def dry_run(out: Path, start: str | None = None) -> None:
    """Execute the notebooks under ``paper-dry`` with the footprint recorder on, into ``out`` (the
    executed notebooks, an empty result store of their own, the records); ``start`` resumes at a
    notebook after a failure (studies already measured are read back, not measured twice). Then
    copy the records and the per-notebook wall times to ``results/costs/`` and write the table."""
    root = project_root()
    out.mkdir(parents=True, exist_ok=True)
    footprint, timings_file = out / FOOTPRINT_FILE, out / NOTEBOOKS_FILE
    if start is None:  # a fresh run measures everything: nothing may be read from an earlier one
        footprint.unlink(missing_ok=True)
        timings_file.unlink(missing_ok=True)
        shutil.rmtree(out / "store", ignore_errors=True)
    os.environ["LPES_FOOTPRINT"] = str(footprint)
    os.environ["LPES_OUTPUT_ROOT"] = str(out / "store")
    done = json.loads(timings_file.read_text())["notebooks"] if timings_file.exists() else []
    for nb in select(discover(root / "notebooks"), start=start):
        done = [t for t in done if t["notebook"] != nb.name] + run([nb], "paper-dry", out)
        write_json(timings_file, {"threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "notebooks": done})
    costs = root / COSTS_DIR
    costs.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(footprint, costs / FOOTPRINT_FILE)
    shutil.copyfile(timings_file, costs / NOTEBOOKS_FILE)


def write_table() -> pd.DataFrame:
    table = cost_table(read_records(), Shape.of(tiny_config("paper-dry-llama")))
    write_csv(project_root() / COSTS_DIR / TABLE_FILE, table)
    return table


# --- the plan of notebook 9 (map and regime search) ---------------------------------------------


def notebook9_plan(p: Profile, gpu: Gpu = H100_SMALL_MODELS, regimes: dict[str, tuple[str, int]] | None = None) -> pd.DataFrame:
    """What notebook 9 costs under profile ``p`` before it starts: one row per map cell and per stage
    of the regime search (prompts, tokens, new tokens, PFLOP, estimated GPU hours on ``gpu``).

    The search's regime is known only once the map has run: ``regimes`` maps a model to its (task,
    prompt tokens); by default each model's KV at its longest length, the dearest regime. The transfer
    task is planned at the length closest to the regime's, as :func:`lpes_nb.studies.regime_search.search_tasks`
    picks it."""
    spec, rs = p.position_map, p.regime_search
    rows = []

    def add(stage, model, task, tokens, prompts, new_tokens):
        flops, seconds = prompt_cost(shape_of(model), gpu, prompts, tokens, new_tokens, spec.batch_size)
        rows.append({"stage": stage, "model": model, "task": task, "prompt_tokens": int(tokens), "prompts": int(prompts),
                     "new_tokens": new_tokens, "pflop": round(flops / 1e15, 2), "gpu_hours": round(seconds / 3600, 3)})

    for m in spec.models:
        cells = [(t, length) for length in m.lengths for t in LENGTH_TASKS] + [("mdqa", d * MDQA_TOKENS_PER_DOC) for d in m.mdqa_docs]
        for task, tokens in cells:
            add("map", m.model, task, tokens, spec.n * len(RELATIVE_POSITIONS), TASKS[task].answer_tokens)
        regime = (regimes or {}).get(m.model, ("kv", max(m.lengths)))
        tasks = [regime]
        if rs.transfer and (other := TRANSFER.get(regime[0])):  # the other task at the length closest to the regime's
            lengths = [d * MDQA_TOKENS_PER_DOC for d in m.mdqa_docs] if other == "mdqa" else list(m.lengths)
            if lengths:
                tasks.append((other, min(lengths, key=lambda t: abs(t - regime[1]))))
        curves = 2 * len(rs.seeds) * len(tasks)  # every LPES curve and its PI twin
        for task, tokens in tasks:
            search_n, test_n = rs.sizes(task)
            search_prompts = 3 * search_n
            evaluations = ga_evaluations(rs.ga) * len(rs.seeds)
            add("search: reference", m.model, task, tokens, search_prompts, TASKS[task].answer_tokens)
            add("search: GA", m.model, task, tokens, evaluations * search_prompts, TASKS[task].answer_tokens)
            if rs.tie_break:  # generate mode's tie-break: one scoring pass per individual
                add("search: GA tie-break", m.model, task, tokens, evaluations * search_prompts, 0)
            add("search: test", m.model, task, tokens, 3 * test_n * (1 + curves), TASKS[task].answer_tokens)
    for cell in spec.record_cells:  # the papers' settings record by record: every gold position, MDQA's two controls
        tokens = cell.items * (MDQA_TOKENS_PER_DOC if cell.task == "mdqa" else KV_TOKENS_PER_PAIR)
        prompts = cell.n * (len(RELATIVE_POSITIONS) + (2 if cell.task == "mdqa" else 0))
        add("map: record cells", cell.model, f"{cell.task}-{cell.items}", tokens, prompts, record_settings(cell.task, spec.batch_size).max_new_tokens)
    return pd.DataFrame(rows)


# --- the plan of notebook 10 (LPES at power) ------------------------------------------------------

PASSES = {"Attention Buckets": 7}  # forward passes per prompt (one per RoPE base); every other method: one


def lpes_at_power_plan(p: Profile, gpu: Gpu | None = None, cpu: dict | None = None) -> pd.DataFrame:
    """What notebook 10 costs under profile ``p`` on one GPU before it starts (:class:`lpes_nb.studies.profiles.LpesAtPower`):
    one row per stage (prompts of ~``items`` x 160 tokens, new tokens, PFLOP, estimated GPU hours; ``gpu``
    by default the H100 at the share of its peak a model of this size sustains). The search and the
    validation score (no new tokens) 3 gold positions per record, every GA individual at most once
    (:func:`lpes_nb.operations.cost_model.ga_evaluations`); the MoICE router's steps cost a forward and a backward
    (~3 forwards) per prompt; the test answers 5 positions per record with the original 100 new tokens.
    Shared prefixes, which the CPU path uses, are not counted: an upper bound.

    ``cpu``: a throughput report (:func:`lpes_nb.operations.throughput.load`) measured on the profile's model and
    dtype adds ``cpu_hours``: prompts x that CPU's measured seconds per prompt on the path each stage
    takes (:func:`lpes_nb.operations.throughput.seconds_per_prompt`): shared-prefix scoring for the search and
    validation; for the test, shared-prefix decoding for the methods that share, else plain decoding
    plus a plain scoring pass for the gold log-probability (:func:`lpes_nb.studies.position_map.record_rows`);
    the router's steps ~3 plain scorings per prompt. The rates come from records at 5 gold positions:
    a 3-position fitness shares less and costs more per prompt (the validation: 6.0 s measured, 4.5 s
    the rate), so the search and validation rows are low by about a quarter."""
    s = p.lpes_at_power
    shape = shape_of(s.model)
    gpu = gpu or (H100 if shape.parameters > 1e9 else H100_SMALL_MODELS)
    rate = None if cpu is None else seconds_per_prompt(cpu, s.model, s.dtype)
    mdqa_tokens = (s.items or 20) * MDQA_TOKENS_PER_DOC
    rows = []

    def add(stage, prompts, new_tokens, cpu_seconds=None, tokens=mdqa_tokens):
        flops, seconds = prompt_cost(shape, gpu, prompts, tokens, new_tokens, s.batch_size)
        rows.append({"stage": stage, "model": s.model, "prompt_tokens": tokens, "prompts": int(prompts), "new_tokens": new_tokens,
                     "pflop": round(flops / 1e15, 3), "gpu_hours": round(seconds / 3600, 3)}
                    | ({} if rate is None else {"cpu_hours": np.nan if cpu_seconds is None else round(prompts * cpu_seconds / 3600, 2)}))

    def per_prompt(*paths):  # (shared?, mode) of each pass a prompt takes
        return None if rate is None else sum(rate[path] for path in paths)

    search = len(s.seeds) * (ga_evaluations(s.ga) + 1) * 3 * s.search_records  # + the unmodified model's line
    validation = (len(s.seeds) * s.finalists + 1) * 3 * s.validation_records
    add("search: GA", search, 0, per_prompt((True, "score")))
    add("validation", validation, 0, per_prompt((True, "score")))
    for space in s.spaces[1:]:  # the other curve families, at the same budget
        add(f"search: GA ({space})", search, 0, per_prompt((True, "score")))
        add(f"validation: {space}", validation, 0, per_prompt((True, "score")))
    for dataset in s.transfer:  # KV prompts: no CPU rate measured on them (the sweeps ran MDQA-20)
        add(f"search: GA on {dataset}", search, 0, tokens=splits.FILES[dataset][1] * KV_TOKENS_PER_PAIR)
        add(f"validation: {dataset}", validation, 0, tokens=splits.FILES[dataset][1] * KV_TOKENS_PER_PAIR)
    sizes = dict(s.test_records)
    if PER_HEAD_MOICE in sizes:
        add(f"test: {PER_HEAD_MOICE}'s router", 3 * s.router.steps * s.router.batch_size, 0, per_prompt((False, "score")))
    if "MoICE" in sizes:  # as published: general-text sequences of its own length, no CPU rate measured on them
        reference = ReferenceTraining()
        add("test: MoICE's router (as published)", 3 * reference.steps * reference.batch_size, 0, tokens=reference.tokens)
    untrained = {name: MoICE() for name in TRAINED_MOICE}  # for the path each takes (MoICE never shares a prefix)
    for method, n in {"baseline": max(sizes.values()), **sizes}.items():
        shares = method == "baseline" or method_for_test(method, list(np.ones(shape.layers)), untrained).shares_prefix
        add(f"test: {method}", PASSES.get(method, 1) * n * len(RELATIVE_POSITIONS), ORIGINAL_ANSWER_TOKENS,
            per_prompt((True, "generate")) if shares else per_prompt((False, "generate"), (False, "score")))
    for dataset in s.transfer:  # the transferred curve and its PI twin on LPES's test records
        for method in ("LPES", "PI"):
            add(f"test: {method} (searched on {dataset})", sizes[method] * len(RELATIVE_POSITIONS), ORIGINAL_ANSWER_TOKENS,
                per_prompt((True, "generate")))
    for dataset, n in s.in_domain:  # the curve on its own dataset's test part (KV prompts: no CPU rate measured on them)
        for method in ("baseline", "LPES", "PI"):
            add(f"test on {dataset}: {method}", n * len(RELATIVE_POSITIONS), ORIGINAL_ANSWER_TOKENS,
                tokens=splits.FILES[dataset][1] * KV_TOKENS_PER_PAIR)
    return pd.DataFrame(rows)


def lpes_at_power_plan_here(p: Profile) -> tuple[pd.DataFrame, str | None]:
    """:func:`lpes_at_power_plan` with CPU hours where the committed throughput report's sweeps ran the
    profile's model and dtype; and the name of that CPU (None: GPU hours only)."""
    report = load_throughput()
    if not has_rates(report, p.lpes_at_power.model, p.lpes_at_power.dtype):
        return lpes_at_power_plan(p), None
    return lpes_at_power_plan(p, cpu=report), report["cpu"]["cpu"]


# the 1.5B's protocol (issue #101): the map's record cells as the 0.5B's, then LPES (Bézier) searched,
# validated and tested against the baseline and its PI twin
LARGER_MAP = (("mdqa-20", 441), ("kv-75", 100))
LARGER_STAGES = ("search: GA", "validation", "test: baseline", "test: LPES", "test: PI")


def larger_model_plan(p: Profile, cost: dict, report: dict) -> pd.DataFrame:
    """CPU hours of the map and of LPES for the larger model of a record-cost measurement
    (:func:`lpes_nb.operations.throughput.record_cost` entry ``cost``, on one CPU): the map's records at their
    measured seconds per record; each LPES stage at what :func:`lpes_at_power_plan` plans for profile
    ``p``'s model (from the throughput ``report``'s per-prompt rates) times the measured 1.5B / 0.5B
    per-record ratio on MDQA-20. The rates and the ratio come from the CPUs named in their files."""
    small, large = list(cost["seconds"])[0], list(cost["seconds"])[-1]
    if p.lpes_at_power.model != small:
        raise ValueError(f"the record cost was measured against {small!r}, profile {p.name!r} plans {p.lpes_at_power.model!r}")
    missing = [cell for cell, _ in LARGER_MAP if cell not in cost["seconds"][large]]
    if missing:
        raise ValueError(f"no measured seconds per {missing} record of {large} on {cost['cpu']['cpu']}: run "
                         "`lpes throughput --record-cost` (both cells) first")
    rows = [{"stage": f"map: {cell}", "model": large, "units": n, "unit": "record",
             "cpu_hours": round(n * float(np.median(cost["seconds"][large][cell])) / 3600, 1),
             "basis": f"measured seconds per record ({cost['cpu']['cpu']})"} for cell, n in LARGER_MAP]
    ratio = cost["record_ratio"]["mdqa-20"]
    plan = lpes_at_power_plan(p, cpu=report).set_index("stage")
    for stage in LARGER_STAGES:
        rows.append({"stage": stage, "model": large, "units": int(plan.loc[stage, "prompts"]), "unit": "prompt",
                     "cpu_hours": round(float(plan.loc[stage, "cpu_hours"]) * ratio, 1),
                     "basis": f"{small}'s planned hours ({report['cpu']['cpu']}) x the measured MDQA-20 ratio {ratio:.2f}"})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="lpes costs", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["dry-run", "memory", "table", "plan", "larger-plan"],
                        help="larger-plan: the 1.5B's map and LPES in CPU hours, from results/bench/record_cost.json")
    parser.add_argument("--profile", default="gpu", help="plan: the profile whose notebook to plan")
    parser.add_argument("--notebook", type=int, choices=(9, 10), default=9, help="plan: notebook 9 (map, regime search) or 10 (LPES at power)")
    parser.add_argument("--out", type=Path, default=Path("runs/paper-dry"), help="executed notebooks and store (dry-run)")
    parser.add_argument("--from", dest="start", help="dry-run: resume at this notebook")
    args = parser.parse_args(argv)
    if args.command == "dry-run":
        dry_run(args.out, args.start)
    if args.command == "memory":
        measured = memory_scaling()
        write_csv(project_root() / COSTS_DIR / MEMORY_FILE, measured)
        fit = write_csv(project_root() / COSTS_DIR / MEMORY_FIT_FILE, memory_fit(measured))
        print(pd.read_csv(fit).to_string(index=False))
        return
    if args.command == "larger-plan":
        report = load_throughput()
        # the record cost measured on the CPU the per-prompt rates came from, so that both bases name one machine
        same = [e for e in json.loads((project_root() / "results" / "bench" / "record_cost.json").read_text())
                if e["cpu"]["cpu"] == report["cpu"]["cpu"]]
        if not same:
            raise SystemExit(f"no record cost measured on {report['cpu']['cpu']} (the CPU of results/bench/throughput.json): "
                             "run `lpes throughput --record-cost` there")
        cost = same[-1]
        plan = larger_model_plan(profile("cpu"), cost, report)
        write_csv(project_root() / COSTS_DIR / f"{list(cost['seconds'])[-1]}_plan.csv", plan)
        print(plan.to_string(index=False))
        print(f"total: {plan.cpu_hours.sum():.0f} CPU hours")
        return
    if args.command == "plan":
        p = profile(args.profile)
        if args.notebook == 9:
            plan = notebook9_plan(p)
        else:
            plan, _ = lpes_at_power_plan_here(p)
        write_csv(project_root() / COSTS_DIR / f"{args.profile}_notebook{args.notebook}_plan.csv", plan)
        print(plan.to_string(index=False))
        print(plan.groupby(["model", plan.stage.str.split(":").str[0]], sort=False).gpu_hours.sum().round(2).to_string())
        return
    table = write_table()
    print(table.to_string(index=False))

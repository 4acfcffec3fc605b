"""How fast this CPU evaluates, and what shared prefixes save: ``results/bench/throughput.json``.

* the CPU's GEMM peak (a 2048³ matmul, float32 and bf16 where bf16 is safe);
* one forward per model, dtype and length (1k / 3k / 6k tokens, the last token's logits): tokens/s,
  GFLOP/s and % of that dtype's GEMM peak (:func:`forward_flops`);
* the MDQA-20 sweep (gold 0 / 5 / 10 / 15 / 19 on ``records`` real records): plain vs shared-prefix
  wall time for prefill only (score mode: one teacher-forced pass) and for the full generate mode
  (prefill + up to 100 new tokens), beside the token-count ratio the shared prefixes allow, and
  whether the answers are identical;
* one fitness evaluation of the search (per-layer scales, score mode on the search's samples).

Every timing names the CPU it came from (:func:`lpes_nb.system.machine.describe_cpu`).
Run: ``lpes throughput [--records 10] [--out results/bench/throughput.json] [--parts score-sweep generate-sweep fitness]``.

:func:`record_cost` (``--record-cost``) times what one record of the map costs for two models of one
family on the same records, interleaved in one run (``results/bench/record_cost.json``, one entry per
CPU): the per-record cost ratio that plans a larger model's map and search.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile

from ..evaluation import prefix

from ..core.methods import lpes
from ..evaluation.evaluate import encode, evaluate_samples, plain_batches, record_groups
from ..evaluation.tasks import TASKS, EvalSettings, TaskConfig
from ..store.data import load_mdqa, mdqa_sample
from ..store.models import QWEN, QWEN_15B, load_model, load_tokenizer
from ..store.results import output_dir, write_json
from ..studies.lpes_at_power import PREFILL_CHUNK as LPES_AT_POWER_CHUNK
from ..studies.position_map import load_records, record_rows
from ..system import bf16_gemm
from ..system.footprint import interleaved_times, ratio_to_baseline
from ..system.machine import describe_cpu

MDQA_GOLD = (0, 5, 10, 15, 19)


def gemm_gflops(dtype: torch.dtype, sizes=(2048, 4096), repeats: int = 5) -> float:
    """The CPU's matmul peak for ``dtype``: the best over square sizes of the median of ``repeats``
    timed products, after three untimed ones (the first product of a shape builds oneDNN's kernel)."""
    best = 0.0
    for size in sizes:
        a = torch.randn(size, size).to(dtype)
        for _ in range(3):
            a @ a
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            a @ a
            times.append(time.perf_counter() - start)
        best = max(best, 2 * size**3 / float(np.median(times)) / 1e9)
    return best


def _decoder_matmul(model) -> int:
    """Parameters of the decoder layers' matrix products (each used once per token): not the
    embedding (a lookup) nor the output head (used once per kept logit)."""
    head = model.get_output_embeddings().weight
    return sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n and p is not head)


def forward_flops(model, tokens: int, logits: int = 1) -> float:
    """One forward of ``tokens`` tokens keeping ``logits`` logits: 2 · decoder matmul parameters · T,
    2 · head parameters · logits, and causal attention 4 · layers · heads · head size · T² / 2."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    attention = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim * tokens**2 / 2
    return 2 * _decoder_matmul(model) * tokens + 2 * model.get_output_embeddings().weight.numel() * logits + attention


@torch.inference_mode()
def forward_speed(model, tokens: int) -> dict:
    ids = torch.randint(100, 1000, (1, tokens))
    model(input_ids=ids, logits_to_keep=1)  # untimed: builds the kernels of these shapes
    start = time.perf_counter()
    model(input_ids=ids, logits_to_keep=1)
    seconds = time.perf_counter() - start
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "gflops": forward_flops(model, tokens) / seconds / 1e9}


@torch.inference_mode()
def forward_profile(model, tokens: int, top: int = 8) -> list[dict]:
    """Where one forward's time goes: the operators with the largest self CPU time (torch.profiler),
    each with its share of the total."""
    ids = torch.randint(100, 1000, (1, tokens))
    model(input_ids=ids, logits_to_keep=1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model(input_ids=ids, logits_to_keep=1)
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    return [{"op": e.key, "share": e.self_cpu_time_total / total, "calls": e.count} for e in events[:top]]


def padded_tokens(prompts, batch_size: int, mode: str) -> int:
    """Prompt tokens the plain path computes: its batches (:func:`lpes_nb.evaluation.evaluate.plain_batches`)
    padded to their longest."""
    lengths = [len(p) for p in prompts]
    return sum(len(b) * max(lengths[i] for i in b) for b in plain_batches(lengths, batch_size, mode))


def flop_ratio(model, groups) -> float:
    """FLOPs a shared-prefix pass computes ÷ the plain path's (unpadded), over groups of prompts: per
    prompt of T tokens of which s come from the cache, the matrix products of T − s tokens and the
    causal attention of those queries over all earlier keys, (T² − s²) / 2 query-key pairs: the
    continuation's queries still attend to the whole prefix, so attention shrinks by less than the
    token count and this ratio lies above :func:`lpes_nb.evaluation.prefix.token_ratio`."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_pair = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim
    per_token = 2 * _decoder_matmul(model)  # the head's kept logits are the same on both paths

    def flops(total, cached):
        return per_token * (total - cached) + per_pair * (total**2 - cached**2) / 2

    plain = sum(flops(len(p), 0) for g in groups for p in g)
    shared = sum(flops(len(p), s) for g in groups for p, s in zip(g, prefix.PrefixPlan.of(g).shared))
    return shared / plain


def sweep_comparison(model, tokenizer, samples, settings: EvalSettings, method=None, rounds: int = 1,
                     pieces: Sequence[int | None] = (None,)) -> list[dict]:
    """Plain vs shared wall time of one evaluation (with ``rounds`` > 1: interleaved rounds after a
    warm-up, medians and the median per-round ratio), one row per shared variant (``pieces``: its
    continuations in one pass, None, or in pieces of that many tokens), whether its results agree
    with the plain path's, and what the time ratio is to be read against: shared ÷ plain prompt
    tokens, the same against the plain path's padded batches, and shared ÷ plain FLOPs
    (:func:`flop_ratio`)."""
    results = {}

    def variant(name, **options):
        def run():
            results[name] = evaluate_samples(model, tokenizer, samples, settings=settings, method=method, progress=False,
                                             **options)
        return run

    names = {chunk: "shared" if chunk is None else f"shared, {chunk}-token pieces" for chunk in pieces}
    variants = {"plain": variant("plain", shared_prefix=False),
                **{names[c]: variant(names[c], shared_prefix=True, prefill_chunk=c) for c in pieces}}
    times = interleaved_times(variants, rounds, warmup=int(rounds > 1))
    table = ratio_to_baseline(times, "plain").set_index("variant")
    prompts = [encode(tokenizer, s) for s in samples]
    groups = [[prompts[i] for i in g] for g in record_groups(samples)]
    ratio = prefix.token_ratio(groups)
    shared_tokens = ratio * sum(len(p) for p in prompts)
    column = "prediction" if settings.mode == "generate" else "correct"
    return [{"prompts": len(samples), "mode": settings.mode, "pieces": chunk, "rounds": rounds,
             "plain_s": float(table.loc["plain", "median_s"]), "shared_s": float(table.loc[name, "median_s"]),
             "time_ratio": float(table.loc[name, "median_ratio"]),
             "time_ratio_min_max": [float(table.loc[name, "min_ratio"]), float(table.loc[name, "max_ratio"])],
             "token_ratio": ratio,
             "token_ratio_vs_padded_plain": shared_tokens / padded_tokens(prompts, settings.batch_size, settings.mode),
             "flop_ratio": flop_ratio(model, groups),
             "identical": bool((results["plain"][column].to_numpy() == results[name][column].to_numpy()).all())}
            for chunk, name in names.items()]


def _sweep_order(row: dict) -> tuple:
    """The MDQA sweeps first (score, then generate; one pass before pieces), the fitness call last."""
    return "fitness" in row["what"], row["mode"] != "score", row.get("pieces") or 0


PARTS = ("gemm", "forward", "score-sweep", "generate-sweep", "fitness")
# the committed measurement, read where the repository is (not under $LPES_OUTPUT_ROOT): a fact about
# the machine it names, shown by notebook 1 under every profile
STORED = Path(__file__).resolve().parents[2] / "results" / "bench" / "throughput.json"
# what shared prefixes are held to, in every mode: the savings not eaten by overhead, the time ratio at most this
# much above the token ratio (the shared path computes that fraction of the plain path's prompt tokens)
SLACK = 0.05


def load(path: Path = STORED) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"no throughput measurement at {path}: run lpes throughput (~40 min, machine to itself)")
    return json.loads(path.read_text())


def others(path: Path = STORED) -> list[dict]:
    """The sweeps measured on other CPUs beside ``path``: ``throughput-<cpu>.json``, one file per CPU
    (``lpes throughput --parts gemm score-sweep generate-sweep fitness --out results/bench/throughput-<cpu>.json``),
    since a file names one CPU for all its parts."""
    return [json.loads(f.read_text()) for f in sorted(path.parent.glob(f"{path.stem}-*.json"))]


def tables(report: dict) -> dict[str, pd.DataFrame]:
    """A stored report (:func:`run`) as tables: ``forward`` (per model, dtype and length) and
    ``comparisons`` (plain vs shared: time ratio, its rounds' range, the token and FLOP ratios,
    whether the answers agree and whether the time ratio meets its bar)."""
    forward = pd.DataFrame(report.get("forward", []))  # another CPU's file may hold the sweeps alone (:func:`others`)
    rows = []
    for r in report["sweeps"]:
        fitness = "fitness" in r["what"]
        what = "One fitness call of a search" if fitness else f"MDQA-20 sweep, {r['mode']} mode"
        if r.get("pieces"):  # rows stored before pieces were timed ran in one pass
            what += f", shared in {r['pieces']}-token pieces"
        low, high = r.get("time_ratio_min_max", [r["time_ratio"]] * 2)
        bar = r["token_ratio"] + SLACK
        rows.append({"comparison": what, "model": r["model"], "dtype": r["dtype"], "prompts": r["prompts"],
                     "rounds": r.get("rounds", 1), "plain_s": r["plain_s"], "shared_s": r["shared_s"],
                     "time_ratio": r["time_ratio"], "ratio_low": low, "ratio_high": high, "token_ratio": r["token_ratio"],
                     "flop_ratio": r.get("flop_ratio", np.nan), "identical": r["identical"], "bar": bar,
                     "meets_bar": r["time_ratio"] <= bar})
    return {"forward": forward, "comparisons": pd.DataFrame(rows)}


def has_rates(report: dict, model: str, dtype: str) -> bool:
    """Whether the report's MDQA-20 sweeps ran ``model`` in ``dtype`` (:func:`seconds_per_prompt`)."""
    return {(r["model"], r["dtype"]) for r in report["sweeps"] if "MDQA" in r["what"]} == {(model, dtype)}


def seconds_per_prompt(report: dict, model: str, dtype: str) -> dict[tuple[bool, str], float]:
    """Wall seconds per MDQA-20 prompt on the report's CPU, by (shared prefixes?, mode), from its
    MDQA-20 sweeps (5 gold positions a record; score mode shared as ``lpes_at_power`` runs it, in
    pieces): what a plan of that study on this CPU multiplies. Refused for another model or dtype
    than the sweeps ran (a rate of one does not transfer to another)."""
    rows = [r for r in report["sweeps"] if "MDQA" in r["what"]]
    if not has_rates(report, model, dtype):
        measured = sorted({(r["model"], r["dtype"]) for r in rows})
        raise ValueError(f"the throughput report's MDQA-20 sweeps ran {measured} on {report['cpu']['cpu']}; "
                         f"no per-prompt rate for {model} {dtype}: measure it (lpes throughput) on that model")
    score = next((r for r in rows if r["mode"] == "score" and r.get("pieces") == LPES_AT_POWER_CHUNK), None)
    generate = next((r for r in rows if r["mode"] == "generate"), None)
    if score is None or generate is None:
        raise ValueError(f"the throughput report lacks the score sweep in {LPES_AT_POWER_CHUNK}-token pieces or the generate "
                         "sweep: lpes throughput --parts score-sweep generate-sweep")
    return {(shared, r["mode"]): (r["shared_s"] if shared else r["plain_s"]) / r["prompts"]
            for r in (score, generate) for shared in (True, False)}


def _cpu_text(report: dict) -> str:
    cpu = report["cpu"]
    return (f"**{cpu['cpu']}** ({cpu['cores']} cores, {report['torch_threads']} threads; bf16 "
            f"{'native' if cpu['native_bf16'] else 'emulated'}, AMX {'advertised' if cpu['advertises_amx'] else 'absent'}). "
            "GEMM peak " + ", ".join(f"{d} {v:,.0f} GFLOP/s" for d, v in report["gemm_gflops"].items()) + ".")


def _comparison_lines(report: dict, indent: str = "") -> list[str]:
    lines = []
    for r in tables(report)["comparisons"].itertuples():
        spread = f" (rounds {r.ratio_low:.2f}–{r.ratio_high:.2f}, median of {r.rounds})" if r.rounds > 1 else ""
        lines.append(f"{indent}- {r.comparison} ({r.model} {r.dtype}, {r.prompts} prompts): plain {r.plain_s:.1f} s, shared "
                     f"{r.shared_s:.1f} s, **{r.time_ratio:.2f}×**{spread}; token ratio {r.token_ratio:.2f}, FLOP ratio "
                     f"{r.flop_ratio:.2f}; answers {'identical' if r.identical else 'not all identical (bf16 rounding follows batch and piece shapes)'}; "
                     f"bar ≤ {r.bar:.3f}: **{'met' if r.meets_bar else 'missed'}**.")
    return lines


def conclusion(report: dict, others: Sequence[dict] = ()) -> str:
    """Notebook 1's reading of the stored report, every number from it; then the shared-prefix sweeps
    of ``others`` (:func:`others`), each under its CPU."""
    lines = ["- Measured on " + _cpu_text(report)]
    for (model, dtype), f in tables(report)["forward"].groupby(["model", "dtype"], sort=False):
        lines.append(f"- One forward, {model} {dtype}: " + ", ".join(
            f"{int(r.tokens)} tokens {r.seconds:.2f} s ({r.percent_of_gemm_peak:.0f} % of peak)" for r in f.itertuples()) + ".")
    prof = report.get("profile")
    if prof:
        lines.append(f"- Where a {prof['model']} {prof['dtype']} forward of {prof['tokens']} tokens spends its time (torch.profiler, "
                     "self time): " + ", ".join(f"`{o['op']}` {100 * o['share']:.0f} %" for o in prof["ops"]) + ".")
    lines += _comparison_lines(report)
    for other in others:
        lines += ["- The same sweeps on " + _cpu_text(other), *_comparison_lines(other, indent="  ")]
    return "\n".join(lines)


def run(records: int = 10, lengths=(1024, 3072, 6144), out: Path | None = None, progress: bool = True,
        parts=PARTS) -> dict:
    """Measure ``parts`` and write them into ``out`` (the parts not measured keep their stored values,
    each with the CPU it came from)."""
    out = out or output_dir("results", "cpu") / "bench" / "throughput.json"
    cpu = describe_cpu()
    dtypes = ["float32"] + (["bfloat16"] if cpu["bf16"]["safe"] and cpu["native_bf16"] else [])
    report: dict = json.loads(out.read_text()) if out.exists() else {}
    stored = report.get("cpu")
    if set(parts) != set(PARTS) and stored and (stored["cpu"], stored["isa_flags"]) != (cpu["cpu"], cpu["isa_flags"]):
        # the file names one CPU for all its parts: mixing machines would mislabel the parts kept
        raise ValueError(f"{out} was measured on {stored['cpu']} ({len(stored['isa_flags'])} ISA flags); this is "
                         f"{cpu['cpu']} ({len(cpu['isa_flags'])} ISA flags): measure all parts {PARTS} here, or "
                         f"write --parts {' '.join(parts)} to another file with --out")
    report.update(cpu=cpu, torch_threads=torch.get_num_threads(), bf16_gemm=asdict(bf16_gemm.decide()))
    if "gemm" in parts:
        report["gemm_gflops"] = {d: gemm_gflops(getattr(torch, d)) for d in dtypes}
    if "forward" in parts:
        report["forward"] = []
        for name in ("smollm2-135m", QWEN):
            for dtype in dtypes:
                model = load_model(name, dtype=dtype)
                for tokens in lengths:
                    # a bf16 model routed through float32 GEMMs (lpes_nb.system.bf16_gemm) is held to float32's peak
                    gemm = "float32" if bf16_gemm.routed(model) else dtype
                    row = {"model": name, "dtype": dtype, "gemm": gemm, **forward_speed(model, tokens)}
                    row["percent_of_gemm_peak"] = 100 * row["gflops"] / report["gemm_gflops"][gemm]
                    report["forward"].append(row)
                    if progress:
                        print(row)
    def remeasured(row):
        return f"{row['mode']}-sweep" in parts if "MDQA" in row["what"] else "fitness" in parts

    sweeps = [row for row in report.get("sweeps", []) if not remeasured(row)]
    modes = [settings for settings in (EvalSettings(mode="score", batch_size=8), TASKS["mdqa"].settings(8))
             if f"{settings.mode}-sweep" in parts]
    dtype = dtypes[-1]
    if modes or "forward" in parts:
        model, tokenizer = load_model(QWEN, dtype=dtype), load_tokenizer(QWEN)
    if "forward" in parts:
        report["profile"] = {"model": QWEN, "dtype": dtype, "tokens": 3072, "ops": forward_profile(model, 3072)}
    if modes:
        data = load_mdqa(records)
        samples = [mdqa_sample(r, g, 20, i) for i, r in enumerate(data) for g in MDQA_GOLD]
        for settings in modes:
            # score mode also as lpes_at_power runs it: continuations in pieces (its PREFILL_CHUNK)
            pieces = (None, LPES_AT_POWER_CHUNK) if settings.mode == "score" else (None,)
            for row in sweep_comparison(model, tokenizer, samples, settings, pieces=pieces):
                sweeps.append({"what": f"MDQA-20 sweep, {records} records x gold {MDQA_GOLD}", "model": QWEN, "dtype": dtype, **row})
                if progress:
                    print(sweeps[-1])
    if "fitness" in parts:
        smol, smol_tok = load_model("smollm2-135m"), load_tokenizer("smollm2-135m")
        search = TaskConfig("kv", 20, n=10, seed=7).samples()
        scales = lpes(np.linspace(1.0, 2.0, smol.config.num_hidden_layers))
        (row,) = sweep_comparison(smol, smol_tok, search, EvalSettings(mode="score"), scales, rounds=5)
        sweeps.append({"what": "one fitness evaluation of the search (KV, 20 pairs, 3 positions x 10 records, per-layer scales)",
                       "model": "smollm2-135m", "dtype": "float32", **row})
        if progress:
            print(row)
    report["sweeps"] = sorted(sweeps, key=_sweep_order)
    write_json(out, report)
    return report


# what a record of the map holds: MDQA-20 (5 gold positions + closed-book + oracle) and KV-75 (5 positions),
# up to 100 new tokens each, batch 8, one pass (the 0.5B's cells)
RECORD_CELLS = (("mdqa", 20), ("kv", 75))


def record_cost(models=(QWEN, QWEN_15B), dtype: str = "bfloat16", records=(430, 431), out: Path | None = None,
                tokens: int = 3072, cells=RECORD_CELLS) -> dict:
    """Seconds per map record for each of ``models`` on the same ``records``, the models interleaved
    record by record so that they share the machine's state; with each model's forward FLOPs at ``tokens`` tokens, whose ratio is what the
    per-record ratio should approach. Stored per CPU and dtype in ``out``: other CPUs' entries are kept, and
    so are this CPU's cells not measured now (each cell is timed on its own records, so a cell measured in a
    later sitting joins the earlier ones)."""
    out = out or output_dir("results", "cpu") / "bench" / "record_cost.json"
    loaded = {name: (load_model(name, dtype=dtype), load_tokenizer(name)) for name in models}
    data = {task: load_records(task, items) for task, items in cells}
    seconds = {name: {f"{task}-{items}": [] for task, items in cells} for name in models}
    for task, items in cells:  # untimed: the first record of a shape pays for building its kernels
        for model, tokenizer in loaded.values():
            record_rows(model, tokenizer, task, data[task][records[0]], records[0], items, batch_size=8)
    for r in records:
        for task, items in cells:
            for name, (model, tokenizer) in loaded.items():
                start = time.perf_counter()
                record_rows(model, tokenizer, task, data[task][r], r, items, batch_size=8)
                seconds[name][f"{task}-{items}"].append(time.perf_counter() - start)
                print(f"[record cost] {name} {task}-{items} record {r}: {seconds[name][f'{task}-{items}'][-1]:.1f} s", flush=True)
    flops = {name: forward_flops(model, tokens) for name, (model, _) in loaded.items()}
    small, large = models[0], models[-1]
    cpu = describe_cpu()
    stored = json.loads(out.read_text()) if out.exists() else []
    same = [e for e in stored if (e["cpu"]["cpu"], e["dtype"]) == (cpu["cpu"], dtype) and list(e.get("seconds", {})) == list(models)]
    earlier = same[-1] if same else {"seconds": {name: {} for name in models}, "records": {}}
    # entries of before cells were merged stored one list of records for all cells
    records_of = earlier["records"] if isinstance(earlier["records"], dict) else {c: earlier["records"] for c in earlier["seconds"][small]}
    seconds = {name: {**earlier["seconds"][name], **seconds[name]} for name in models}
    entry = {"cpu": cpu, "torch_threads": torch.get_num_threads(), "dtype": dtype,
             "records": {**records_of, **{f"{task}-{items}": list(records) for task, items in cells}},
             "seconds": seconds, "forward_gflops": {n: f / 1e9 for n, f in flops.items()}, "forward_tokens": tokens,
             "flop_ratio": flops[large] / flops[small],
             "record_ratio": {cell: float(np.median(seconds[large][cell]) / np.median(seconds[small][cell])) for cell in seconds[large]}}
    stored = [e for e in stored if (e["cpu"]["cpu"], e["dtype"]) != (cpu["cpu"], dtype)] + [entry]
    write_json(out, stored)
    return entry


def main(argv=None):
    parser = argparse.ArgumentParser(prog="lpes throughput", description=__doc__)
    parser.add_argument("--records", type=int, default=10)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="measure only these; the others keep their stored values")
    parser.add_argument("--record-cost", action="store_true",
                        help=f"instead: seconds per map record, {QWEN} against {QWEN_15B} (results/bench/record_cost.json)")
    parser.add_argument("--cells", nargs="+", choices=[f"{t}-{n}" for t, n in RECORD_CELLS], default=[f"{t}-{n}" for t, n in RECORD_CELLS],
                        help="--record-cost: time only these cells; this CPU's other cells keep their stored seconds")
    parser.add_argument("--cost-records", type=int, nargs="+", default=[430, 431], help="--record-cost: the records timed")
    args = parser.parse_args(argv)
    if args.record_cost:
        cells = tuple((t, int(n)) for t, n in (c.split("-") for c in args.cells))
        print(json.dumps(record_cost(records=tuple(args.cost_records), out=args.out, cells=cells)["record_ratio"], indent=2))
        return
    run(args.records, out=args.out, parts=args.parts)

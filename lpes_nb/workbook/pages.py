"""The measured numbers of README.md and docs/: generated from the stored tables, never typed.

A page marks a generated block as

    <!-- generated: NAME [ARGUMENT] (a note for the reader) -->
    ...
    <!-- /generated -->

and ``lpes claims`` (also run by ``lpes run --profile cpu --publish``) writes the claims ledger, then
rewrites every block's body from the stored files :data:`BLOCKS` names. ``tests/test_readme.py`` checks
that regenerating changes no page and that the prose outside the blocks holds no measured number, so
a rerun that moves a number moves it on the page too.

Timings measured once on a machine the project no longer has, with no bench file behind them (an
install, a whole test run, a CPU class measured in one sitting), are rows of
``results/bench/reported.csv``: what, the CPU, the date, the value, and where it was reported. They
are quoted as measured then, not reproduced by any stored command.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Callable

import pandas as pd

from ..store.models import model_label
from ..store.results import output_dir, project_root
from ..studies import claims

BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+)(?: (?P<arg>[\w.-]+))?[^\n]*-->\n)(?P<body>.*?)(<!-- /generated -->)", re.S)
PAGES = ("README.md", *(f"docs/{name}" for name in ("hardware.md", "gpu.md", "methods.md", "ray.md", "models.md", "layout.md")))


def markdown(frame: pd.DataFrame) -> str:
    """A DataFrame as a Markdown table, its cells as they are (format them before)."""
    def cells(values) -> str:
        return "| " + " | ".join(str(v).replace("|", "\\|") for v in values) + " |"  # a bar inside a cell ends it
    return "\n".join([cells(frame.columns), "|" + "---|" * len(frame.columns), *map(cells, frame.itertuples(index=False))])


def _json(results: Path, name: str) -> dict:
    return json.loads((results / name).read_text())


def findings(results: Path, _: str | None) -> str:
    return claims.findings_table(claims.read(results / "claims.csv"))


def throughput(results: Path, part: str | None) -> str:
    """``lpes throughput``'s file: the GEMM peak and forwards (``forwards``) or the shared-prefix sweeps, then
    those measured on other CPUs (``throughput-<cpu>.json`` beside it)."""
    d = _json(results, "bench/throughput.json")
    if part == "forwards":
        peak = d["gemm_gflops"]
        rows = pd.DataFrame(d["forward"])
        rows = rows.assign(model=rows.model.map(model_label), seconds=rows.seconds.map("{:.2f}".format),
                           percent_of_gemm_peak=rows.percent_of_gemm_peak.map("{:.0f} %".format))
        table = markdown(rows[["model", "dtype", "tokens", "seconds", "percent_of_gemm_peak"]]
                         .rename(columns={"percent_of_gemm_peak": "% of the dtype's GEMM peak"}))
        ops = ", ".join(f"{o['op'].removeprefix('aten::')} {o['share']:.0%}" for o in d["profile"]["ops"][:3])
        return (f"{d['cpu']['cpu']}, {d['torch_threads']} threads. GEMM peak: float32 {peak['float32']:.0f} GFLOP/s, "
                f"bf16 {peak['bfloat16']:.0f} GFLOP/s. One forward, the last token's logits:\n\n{table}\n\n"
                f"Where a {model_label(d['profile']['model'])} {d['profile']['dtype']} forward of {d['profile']['tokens']} "
                f"tokens spends its time (torch.profiler): {ops}.")
    others = sorted((results / "bench").glob("throughput-*.json"))  # one file per other CPU (throughput.others)
    return "\n\n".join(_sweeps(report) for report in [d, *(json.loads(f.read_text()) for f in others)])


def _sweeps(d: dict) -> str:
    rows = pd.DataFrame(d["sweeps"])
    rows = rows.assign(model=rows.model.map(model_label), pieces=rows.get("pieces", pd.Series(dtype=object)).map(
        lambda p: "one pass" if pd.isna(p) else f"{int(p)}-token pieces"),
        plain_s=rows.plain_s.map("{:.1f}".format), shared_s=rows.shared_s.map("{:.1f}".format),
        time_ratio=rows.time_ratio.map("**{:.2f}×**".format), token_ratio=rows.token_ratio.map("{:.2f}".format),
        identical=rows.identical.map({True: "yes", False: "no (bf16 rounding)"}))
    return (f"{d['cpu']['cpu']}, {d['torch_threads']} threads:\n\n"
            + markdown(rows[["what", "model", "dtype", "mode", "pieces", "prompts", "plain_s", "shared_s", "time_ratio",
                             "token_ratio", "identical"]]
                       .rename(columns={"plain_s": "plain s", "shared_s": "shared s", "time_ratio": "shared / plain",
                                        "token_ratio": "token ratio", "identical": "same answers"})))


def record_cost(results: Path, _: str | None) -> str:
    """Seconds per map record of the 1.5B beside the 0.5B on one CPU (``results/bench/record_cost.json``)."""
    rows = []
    for run in _json(results, "bench/record_cost.json"):
        for task, ratio in run["record_ratio"].items():
            small, large = (run["seconds"][m][task] for m in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"))
            rows.append({"CPU": run["cpu"]["cpu"], "dtype": run["dtype"], "task": task,
                         "records": ", ".join(map(str, run["records"][task])),
                         "0.5B s / record": f"{sum(small) / len(small):.0f}", "1.5B s / record": f"{sum(large) / len(large):.0f}",
                         "ratio": f"{ratio:.2f}×", "FLOP ratio (forward)": f"{run['flop_ratio']:.2f}×"})
    return markdown(pd.DataFrame(rows))


def csv_table(results: Path, name: str | None) -> str:
    """A stored cost table as it is (``results/costs/NAME.csv``)."""
    return markdown(pd.read_csv(results / "costs" / f"{name}.csv").fillna(""))


def notebook9_plan(results: Path, _: str | None) -> str:
    """The ``gpu`` profile's plan summed by model and stage (``results/costs/gpu_notebook9_plan.csv``)."""
    plan = pd.read_csv(results / "costs" / "gpu_notebook9_plan.csv")
    plan = plan.assign(stage=plan.stage.str.split(":").str[0] + " (" + plan.task + ")")
    total = plan.groupby(["model", "stage"], sort=False).agg(prompts=("prompts", "sum"), longest=("prompt_tokens", "max"),
                                                             pflop=("pflop", "sum"), hours=("gpu_hours", "sum")).reset_index()
    total = total.assign(model=total.model.map(model_label), prompts=total.prompts.map("{:,}".format),
                         pflop=total.pflop.map("{:,.1f}".format), hours=total.hours.map("{:.2f}".format))
    return markdown(total.rename(columns={"longest": "longest prompt (tokens)", "pflop": "PFLOP", "hours": "H100 hours"}))


def dry_run(results: Path, _: str | None) -> str:
    """The paper-dry run's wall time per notebook (``lpes costs dry-run``)."""
    d = _json(results, "costs/paper_dry_notebooks.json")
    rows = pd.DataFrame(d["notebooks"])
    rows = rows.assign(notebook=rows.notebook.str.removesuffix(".ipynb"), seconds=rows.seconds.map("{:.0f}".format))
    total = sum(n["seconds"] for n in d["notebooks"])
    return f"{d['cpu_count']} cores, {d['threads']} threads; {total / 60:.0f} min in all:\n\n" + markdown(rows)


def paper_memory(results: Path, _: str | None) -> str:
    """Peak memory of the paper profile's operations by width and its line to the 7B (``lpes costs memory``)."""
    measured = pd.read_csv(results / "costs" / "paper_memory_scaling.csv")
    wide = measured.pivot(index="operation", columns="width", values="activation_mib").round(0).astype(int)
    wide = wide.rename(columns=lambda w: f"MiB at width {w}").reset_index()
    fit = pd.read_csv(results / "costs" / "paper_memory_fit.csv")
    fit = fit.assign(line=[f"{r.mib_at_width_0} + {r.mib_per_width} · w MiB" if r.slope_resolved else "not resolved (width-independent)"
                           for r in fit.itertuples()],
                     peak=[f"{r.activations_7b_gib} + weights = **{r.peak_7b_gib} GiB**" if r.slope_resolved else "by hand (below)"
                           for r in fit.itertuples()])
    table = fit[["operation", "studies"]].merge(wide, on="operation").join(fit[["line", "peak"]])
    return markdown(table.rename(columns={"peak": "7B: activations (float32) + bf16 weights"}))


def gpu_kit(results: Path, step: str | None) -> str:
    """The GPU kit's stored steps (``results/gpu_kit/``): ``parity``, ``latency`` or ``ga``, each naming its device."""
    kit = results / "gpu_kit"
    if step == "parity":
        rows = []
        for path in sorted(kit.glob("parity_*.json")):
            d = json.loads(path.read_text())
            table = pd.read_csv(path.with_suffix(".csv"))
            for r in table.itertuples():
                ran = r.status == "ok"
                rows.append({"device": d["machine"]["device"], "model": r.model, "dtype": r.dtype, "attention": r.attention,
                             "logits: unpatched / patched / allowed": f"{r.unpatched_error:.4f} / {r.error:.4f} / {r.allowed:.4f}" if ran else "",
                             "tables: error / allowed": f"{r.table_error:.5f} / {r.table_allowed:.5f}" if ran else "",
                             "a missed layer": f"{r.wrong_scale_table_error:.2f}" if ran else "",
                             "status": r.status if ran else r.status.split(":")[0]})
        return markdown(pd.DataFrame(rows))
    if step == "latency":
        parts = []
        for path in sorted(kit.glob("latency_*.json")):
            d = json.loads(path.read_text())
            res = d["result"]
            methods = pd.DataFrame(res["methods"])
            methods = methods.assign(median_s=methods.median_s.map("{:.2f}".format), ratio=[
                f"{m.median_ratio:.2f} [{m.ratio_ci_low:.2f}, {m.ratio_ci_high:.2f}]" for m in methods.itertuples()])
            parts.append(f"{d['machine']['device']}, torch {d['machine']['torch']}, {res['dtype']}, {res['attention']}; "
                         f"{d['plan']['latency_model']}, MDQA-{d['plan']['latency_docs']}, {d['plan']['latency_prompts']} prompts, "
                         f"{d['plan']['latency_new_tokens']} new tokens, batch 1:\n\n"
                         + markdown(methods[["method", "median_s", "ratio"]].rename(
                             columns={"median_s": "median s", "ratio": "ratio to the baseline, median [95 % bootstrap]"})))
        return "\n\n".join(parts)
    rows = []
    for path in sorted(kit.glob("ga_*.json")):
        d = json.loads(path.read_text())
        r = d["result"]
        rows.append({"file": path.name, "device": d["machine"]["device"], "model": r["model"], "batch": r["batch_size"],
                     "prompts (mean tokens)": f"{r['prompts_per_candidate']} ({r['prompt_tokens_mean']:.0f})",
                     "s per evaluation": f"{r['seconds_per_candidate']:.1f}",
                     "cost model's s": f"{r['predicted_seconds_per_candidate']:.2f}",
                     "measured / model": f"{r['measured_over_predicted']:.2f}×", "peak GiB": f"{r['peak_memory_gib']:.1f}",
                     "paper's search, hours": f"{r['paper_search_hours']:.0f}"})
    return markdown(pd.DataFrame(rows))


def bench(results: Path, name: str | None) -> str:
    """The CPU micro-benchmarks' files: ``rope-overhead``, ``evaluator``, ``ray``."""
    if name == "rope-overhead":
        d = _json(results, "rope_overhead.json")
        rows = [{"tokens": n, "unpatched s": f"{v['median_s_unpatched']:.2f}", "patched s": f"{v['median_s_patched']:.2f}",
                 "patched / unpatched (median of rounds)": f"{v['median_ratio']:.3f}×"} for n, v in d["by_length"].items()]
        return f"{model_label(d['model'])}, {d['dtype']}, {d['threads']} threads, {d['rounds']} rounds:\n\n" + markdown(pd.DataFrame(rows))
    if name == "evaluator":
        d = _json(results, "evaluator_speed_float32.json")
        rows = [{"path": "single-forward scorer", "s": d["scorer_s"], "scorer's speed-up": "—"},
                {"path": "generate, the answer's length", "s": d["naive_answer_length_s"], "scorer's speed-up": f"{d['speedup_vs_answer_length']:.1f}×"},
                {"path": "generate, 8 tokens", "s": d["naive_8_tokens_s"], "scorer's speed-up": f"{d['speedup_vs_8_tokens']:.1f}×"}]
        return (f"{model_label(d['model'])}, {d['dtype']}, {d['threads']} threads, {d['samples']} prompts of {d['task']} "
                f"({d['mean_prompt_tokens']:.0f} tokens on average); the same correctness on {d['agreement']}:\n\n"
                + markdown(pd.DataFrame(rows)))
    d = _json(results, "ray_scaling.json")
    rows = [{"actors": n, "GA seconds": d["ga_seconds"].get(n, ""), "the paper's GA: speed-up its rounds allow": f"{x:.1f}×"}
            for n, x in d["expected_speedup_paper_ga_on_n_workers"].items()]
    return (f"{d['machine']}; {d['evaluations']} evaluations, {d['seconds_per_individual_one_thread']:.1f} s an individual; "
            f"two actors {d['speedup_2_actors']:.2f}× faster:\n\n" + markdown(pd.DataFrame(rows)))


def fitness_proxy(results: Path, _: str | None) -> str:
    """How the gold log-prob ranks curves against λ-accuracy (notebook 10's fitness-proxy study)."""
    d = _json(results, "fitness_proxy_mdqa20_20_qwen2.5-coder-0.5b_bfloat16.json")
    rows = [{"what": "proxy vs real fitness, Spearman ρ", "value": f"{d['rho']:.3f} [{d['ci_low']:.3f}, {d['ci_high']:.3f}]"}]
    for side, label in (("real", "λ-accuracy"), ("proxy", "gold log-prob")):
        r = d["reliability"][side]
        rows.append({"what": f"{label}: two halves of the records rank alike, ρ",
                     "value": f"{r['half_rho']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}], Spearman–Brown reliability {r['reliability']:.2f}"})
    return f"{d['candidates']} candidate curves, {d['records']} records, Qwen2.5-Coder-0.5B bf16:\n\n" + markdown(pd.DataFrame(rows))


def reported(results: Path, topic: str | None) -> str:
    """Timings measured once, with no bench file behind them (``results/bench/reported.csv``), for ``topic``."""
    table = pd.read_csv(results / "bench" / "reported.csv")
    rows = table[table.topic == topic]
    if rows.empty:
        raise ValueError(f"results/bench/reported.csv has no row of topic {topic!r}; topics: {sorted(set(table.topic))}")
    return markdown(rows.drop(columns="topic").fillna(""))


# name -> renderer(results folder, the block's argument or None)
BLOCKS: dict[str, Callable[[Path, str | None], str]] = {
    "findings": findings, "throughput": throughput, "record-cost": record_cost, "costs": csv_table,
    "notebook9-plan": notebook9_plan, "dry-run": dry_run, "paper-memory": paper_memory, "gpu-kit": gpu_kit, "bench": bench,
    "fitness-proxy": fitness_proxy, "reported": reported,
}


def render(text: str, results: Path) -> str:
    """``text`` with every generated block's body written again from ``results``."""
    def body(match: re.Match) -> str:
        name = match["name"]
        if name not in BLOCKS:
            raise ValueError(f"generated block {name!r} is unknown; known: {sorted(BLOCKS)}")
        return match.group(1) + BLOCKS[name](results, match["arg"]) + "\n" + match.group(5)
    return BLOCK.sub(body, text)


def prose(text: str) -> str:
    """``text`` without its generated blocks' bodies (what a person typed)."""
    return BLOCK.sub(lambda m: m.group(1) + m.group(5), text)


def write(root: Path | None = None, results: Path | None = None) -> list[Path]:
    """Rewrite the generated blocks of every page; return the pages that changed."""
    root = root or project_root()
    results = output_dir("results", "cpu") if results is None else Path(results)
    changed = []
    for page in PAGES:
        path = root / page
        text = path.read_text()
        new = render(text, results)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(prog="lpes claims", description="Write results/claims.csv from the stored tables, then every "
                                                            "generated block of README.md and docs/ from the stored files.").parse_args(argv)
    path = claims.write()
    changed = write()
    print(f"[claims] wrote {path}; pages rewritten: {', '.join(p.name for p in changed) or 'none (all current)'}")

"""``lpes bench``: the standalone timings behind the hardware and method pages, each writing its table
under ``results/`` (``--out``):

* ``latency``: every compared method against the unmodified model (LPES Table 4's analogue): the same
  MDQA prompts (10 documents, gold in the middle) and decode length per method, greedy, batch 1,
  interleaved rounds; the median per-sample time and the median of the per-round ratios to the baseline.
* ``rope-overhead``: SmolLM2's forward time with the per-layer RoPE patch (30 distinct scales) against
  unpatched, interleaved rounds.
* ``evaluator``: the batched one-forward scorer against a plain per-sample ``model.generate`` loop on the
  same KV samples (decoding the answer's length, and a fixed 8 tokens), checking that all three agree.
* ``ray``: GA wall time with 1 and 2 Ray CPU actors (a small budget), and the speed-up to expect on N
  workers from the GA's per-generation structure.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..core.ga import BezierSpace, GAConfig, GeneticSearch
from ..core.rope import RopePatch, scale_specs
from ..evaluation.distributed import FitnessSpec, RayFitness
from ..evaluation.evaluate import score_targets, target_ids
from ..evaluation.fitness import PositionFitness
from ..evaluation.moice import load_router, router_files
from ..evaluation.tasks import EvalSettings, TaskConfig
from ..store.models import EMBEDDED, load_model, load_tokenizer
from ..store.results import BEST_SCALES, project_root, read_scales, write_csv, write_json
from ..studies.benchmarks import compared_methods, latency, latency_samples
from ..studies.profiles import profile
from ..system.footprint import interleaved_times, ratio_to_baseline


def bench_latency(args) -> None:
    model, tok = load_model(), load_tokenizer()
    scales = read_scales(args.scales, model.config.num_hidden_layers)["scales"]
    samples = latency_samples(profile("cpu").mdqa, args.n)
    moice = load_router(model, args.router) if router_files(args.router)[0].exists() else None
    methods = compared_methods(scales, moice)
    if args.methods:
        unknown = set(args.methods) - set(methods)
        if unknown:
            raise SystemExit(f"unknown methods {sorted(unknown)}; choose from {list(methods)}")
        methods = {k: v for k, v in methods.items() if k == "baseline" or k in args.methods}
    times, table = latency(model, tok, samples, methods, args.rounds, args.new_tokens)
    print(table.round(3).to_string(index=False))
    write_csv(args.out / f"{args.name}.csv", times)
    meta = {"model": EMBEDDED, "dtype": "float32", "threads": torch.get_num_threads(), "prompts": len(samples),
            "mean_prompt_tokens": round(sum(len(tok(s.prompt).input_ids) for s in samples) / len(samples)),
            "rounds": args.rounds, "max_new_tokens": args.new_tokens,
            "note": "Dynamic NTK is a no-op below the model's 8192 positions, as in transformers"}
    write_json(args.out / f"{args.name}.json", {**meta, "methods": table.round(4).to_dict(orient="records")})


def bench_rope_overhead(args) -> None:
    model = load_model()
    layers = model.config.num_hidden_layers
    patch = RopePatch(model, scale_specs([1.0 + l / (layers - 1) for l in range(layers)]))  # every layer its own scale

    def forward(ids):
        with torch.inference_mode():
            model(ids, use_cache=False)

    def patched(ids):
        with patch:
            forward(ids)

    all_times, summary = [], {}
    for length in args.lengths:
        ids = torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
        times = interleaved_times({"unpatched": lambda: forward(ids), "patched": lambda: patched(ids)}, args.rounds)
        all_times.append(times.assign(tokens=length))
        table = ratio_to_baseline(times, "unpatched").set_index("variant")
        summary[str(length)] = {"median_s_unpatched": round(float(table.loc["unpatched", "median_s"]), 4),
                                "median_s_patched": round(float(table.loc["patched", "median_s"]), 4),
                                "median_ratio": round(float(table.loc["patched", "median_ratio"]), 4)}
        print(length, summary[str(length)], flush=True)
    write_csv(args.out / "rope_overhead.csv", pd.concat(all_times))
    write_json(args.out / "rope_overhead.json", {"model": EMBEDDED, "dtype": "float32", "threads": torch.get_num_threads(),
                                                 "rounds": args.rounds, "by_length": summary})


def bench_evaluator(args) -> None:
    model, tok = load_model(dtype=getattr(torch, args.dtype)), load_tokenizer()
    samples = TaskConfig("kv", args.num_pairs, n=args.n, seed=7).samples()
    prompts = [tok(s.prompt).input_ids for s in samples]
    targets = [target_ids(tok, s.answers[0]) for s in samples]

    def plain_loop(budget):
        start, correct = time.perf_counter(), []
        with torch.inference_mode():
            for p, t in tqdm(list(zip(prompts, targets)), desc=f"plain generate loop ({budget or 'answer length'})"):
                steps = budget or len(t)
                out = model.generate(torch.tensor([p]), max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                                     pad_token_id=tok.eos_token_id, top_p=None, top_k=None, temperature=None)
                correct.append(out[0, len(p): len(p) + len(t)].tolist() == t)
        return correct, time.perf_counter() - start

    plain, plain_s = plain_loop(None)
    plain8, plain8_s = plain_loop(8)
    start = time.perf_counter()
    scored, _ = score_targets(model, prompts, targets, batch_size=args.batch_size, pad_id=tok.pad_token_id or 0, progress=True)
    scorer_s = time.perf_counter() - start
    agree = sum(a == b == c for a, b, c in zip(plain, plain8, scored.tolist()))
    result = {
        "model": EMBEDDED, "dtype": args.dtype, "threads": torch.get_num_threads(), "task": f"kv letters6/digits4, {args.num_pairs} pairs",
        "samples": len(samples), "mean_prompt_tokens": round(sum(map(len, prompts)) / len(prompts), 1),
        "naive_answer_length_s": round(plain_s, 2), "naive_8_tokens_s": round(plain8_s, 2), "scorer_s": round(scorer_s, 2),
        "speedup_vs_answer_length": round(plain_s / scorer_s, 2), "speedup_vs_8_tokens": round(plain8_s / scorer_s, 2),
        "agreement": f"{agree}/{len(samples)}", "accuracy": round(float(scored.mean()), 3), "batch_size": args.batch_size,
    }
    print(json.dumps(result, indent=2))
    write_json(args.out / f"evaluator_speed_{args.dtype}.json", result)


RAY_TASK = TaskConfig("kv", 10, n=4, seed=5, key_format="letters6", value_format="digits4")
RAY_GA = GAConfig(population=8, parents=3, mutations=4, crossovers=1, generations=1, seed=0)


def per_generation_rounds(workers: int, population: int = 32, parents: int = 12, crossovers: int = 4) -> int:
    """Sequential rounds of scoring per generation: each crossover scores its 2 children before the
    next is drawn (the next pair must avoid the chosen child), then all mutations in one batch."""
    mutations = population - parents - crossovers
    return crossovers * math.ceil(2 / workers) + math.ceil(mutations / workers)


def bench_ray(args) -> None:
    import ray  # optional: the `ray` extra

    def ga_seconds(actors: int) -> tuple[float, int]:
        spec = FitnessSpec(EMBEDDED, RAY_TASK, EvalSettings(), tie_break=1e-3, dtype="float32")
        with RayFitness(spec, actors=actors, progress=False) as fitness:
            fitness(np.ones((1, 30)))  # warm-up: the first forward of each process is slower
            start = time.perf_counter()
            result = GeneticSearch(BezierSpace(30), fitness, RAY_GA, progress=False).run()
            return time.perf_counter() - start, result.evaluations

    torch.set_num_threads(1)  # like one Ray actor with num_cpus=1
    fitness = PositionFitness(load_model(EMBEDDED), load_tokenizer(EMBEDDED), RAY_TASK.samples(), EvalSettings())
    fitness(np.ones((1, 30)))
    start = time.perf_counter()
    fitness(np.full((3, 30), 1.3) + np.arange(3)[:, None] * 0.1)
    per_individual = (time.perf_counter() - start) / 3
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        runs = {n: ga_seconds(n) for n in (1, 2)}
    finally:
        ray.shutdown()
    serial = per_generation_rounds(1)
    out = {
        "machine": f"{torch.get_num_threads()} thread per actor, 2 cores, float32, {EMBEDDED}",
        "task": repr(RAY_TASK), "ga": repr(RAY_GA),
        "seconds_per_individual_one_thread": round(per_individual, 3),
        "ga_seconds": {str(n): round(t, 1) for n, (t, _) in runs.items()},
        "evaluations": runs[1][1],
        "speedup_2_actors": round(runs[1][0] / runs[2][0], 2),
        "expected_speedup_paper_ga_on_n_workers": {str(n): round(serial / per_generation_rounds(n), 2) for n in (1, 2, 4, 8, 16, 32)},
    }
    write_json(args.out / "ray_scaling.json", out)
    print(json.dumps(out, indent=2))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="lpes bench", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--out", type=Path, default=project_root() / "results", help="where the tables are written")
    sub = parser.add_subparsers(dest="bench", required=True)
    p = sub.add_parser("latency", help="every compared method's inference time over the baseline's")
    p.add_argument("--n", type=int, default=2, help="MDQA prompts per method and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--scales", type=Path, default=project_root() / "results" / BEST_SCALES)
    p.add_argument("--router", type=Path, default=project_root() / "results" / "moice_router", help="MoICE router trained by notebook 6")
    p.add_argument("--methods", nargs="+", help="a subset of the compared methods (the baseline is always timed)")
    p.add_argument("--name", default="latency", help="output file stem under --out")
    p = sub.add_parser("rope-overhead", help="forward time with the per-layer RoPE patch against unpatched")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048])
    p = sub.add_parser("evaluator", help="the batched scorer against a plain generate loop, same answers")
    p.add_argument("--num-pairs", type=int, default=20)
    p.add_argument("--n", type=int, default=10, help="samples per gold position (3 positions)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    sub.add_parser("ray", help="GA wall time on 1 and 2 Ray CPU actors (needs the `ray` extra)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    {"latency": bench_latency, "rope-overhead": bench_rope_overhead, "evaluator": bench_evaluator, "ray": bench_ray}[args.bench](args)

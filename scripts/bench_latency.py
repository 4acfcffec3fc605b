"""Latency of every compared method vs the unmodified model (LPES Table 4 analogue).

Same MDQA prompts (10 documents, gold in the middle) and decode length for every method, greedy,
batch 1, interleaved rounds; reports the median per-sample time and the median of the per-round
ratios to the baseline. Writes results/<name>.csv (every timing) and results/<name>.json (default name: latency).
Usage: python scripts/bench_latency.py [--n 2] [--rounds 3] [--new-tokens 8] [--methods baseline PI LPES]
        [--name latency]
"""

import argparse
from pathlib import Path

import torch

from lpes_nb.evaluation.moice import load_router, router_files
from lpes_nb.store.models import load_model, load_tokenizer
from lpes_nb.store.results import BEST_SCALES, read_scales, write_csv, write_json
from lpes_nb.studies.benchmarks import compared_methods, latency, latency_samples
from lpes_nb.studies.profiles import profile


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=2, help="MDQA prompts per method and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--scales", type=Path, default=Path("results") / BEST_SCALES)
    parser.add_argument("--router", type=Path, default=Path("results/moice_router"), help="MoICE router trained by notebook 6")
    parser.add_argument("--methods", nargs="+", help="a subset of the compared methods (the baseline is always timed)")
    parser.add_argument("--name", default="latency", help="output file stem under --out")
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args()
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
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / f"{args.name}.csv", times)
    meta = {"model": "smollm2-135m", "dtype": "float32", "threads": torch.get_num_threads(), "prompts": len(samples),
            "mean_prompt_tokens": round(sum(len(tok(s.prompt).input_ids) for s in samples) / len(samples)),
            "rounds": args.rounds, "max_new_tokens": args.new_tokens,
            "note": "Dynamic NTK is a no-op below the model's 8192 positions, as in transformers"}
    write_json(args.out / f"{args.name}.json", {**meta, "methods": table.round(4).to_dict(orient="records")})


if __name__ == "__main__":
    main()

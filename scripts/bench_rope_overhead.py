"""Forward time of SmolLM2 with the per-layer RoPE patch (30 distinct scales) vs unpatched.

Interleaved rounds; writes results/rope_overhead.csv (every timing) and results/rope_overhead.json
(median ratios). Usage: python scripts/bench_rope_overhead.py [--rounds 9] [--lengths 1024 2048]
"""

import argparse
from pathlib import Path

import pandas as pd
import torch

from lpes_nb.core.rope import RopePatch, scale_specs
from lpes_nb.store.models import load_model
from lpes_nb.store.results import write_csv, write_json
from lpes_nb.system.footprint import interleaved_times, ratio_to_baseline


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    model = load_model()
    layers = model.config.num_hidden_layers
    patch = RopePatch(model, scale_specs([1.0 + l / (layers - 1) for l in range(layers)]))  # 30 distinct scales

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
        times["tokens"] = length
        all_times.append(times)
        table = ratio_to_baseline(times, "unpatched").set_index("variant")
        summary[str(length)] = {
            "median_s_unpatched": round(float(table.loc["unpatched", "median_s"]), 4),
            "median_s_patched": round(float(table.loc["patched", "median_s"]), 4),
            "median_ratio": round(float(table.loc["patched", "median_ratio"]), 4),
        }
        print(length, summary[str(length)], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "rope_overhead.csv", pd.concat(all_times))
    meta = {"model": "smollm2-135m", "dtype": "float32", "threads": torch.get_num_threads(), "rounds": args.rounds}
    write_json(args.out / "rope_overhead.json", {**meta, "by_length": summary})


if __name__ == "__main__":
    main()

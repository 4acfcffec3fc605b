"""LPES where the U is, at the power to see the paper's effect (the issue "LPES at power").

The position map's paired gate calls a U for Qwen2.5-Coder-0.5B on 20-document MDQA (the LPES paper's
Qwen setting, ~3k tokens of a 32k window), so the search runs there, on the *search* part of the
data split only (:mod:`lpes_nb.splits`; validation and test are other records). The GA has the paper's
operators and Eq. 8 weights at a CPU budget (population 16: 6 parents, 8 mutations, 2 crossovers;
8 generations). Its fitness weights the gold answer's teacher-forced log-probability at begin /
middle / end, not accuracy: on these records that proxy ranks candidate curves like the real
fitness (Spearman ρ 0.84 [0.56, 0.95] over 15 curves) and, unlike it, alike on two halves of the
records (split-half ρ 0.92 against 0.22 for accuracy): ``results/fitness_proxy_mdqa20_*``. Every
verdict is still accuracy (and log-prob) on the validation and test records.

Each seed checkpoints after every generation and caches every evaluation (with its wall time) on
disk: a stopped search resumes where it stopped, and its convergence table (best fitness against
evaluations and CPU-hours) is written from the checkpoint at any point.

Run: ``python -m lpes_nb.lpes_at_power --seeds 0 1 --records 12 --dtype bfloat16`` (Qwen by default).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import numpy as np
import pandas as pd

from .fitness import PositionFitness
from .ga import GAConfig, GeneticSearch
from .models import QWEN, load_model, load_tokenizer, resolve_dtype
from .results import output_dir, write_csv
from .search import SearchRun, bezier_space, run_search, search_fitness
from .tasks import EvalSettings, TaskConfig

DATASET = "mdqa20"
GA = GAConfig(population=16, parents=6, mutations=8, crossovers=2, generations=8)
PREFILL_CHUNK = 512  # as the proxy check's log-probs (lpes_nb.fitness_proxy): faster for ~3k-token continuations
SEARCH_RECORDS = 12  # the proxy's split-half ρ is 0.92 already at 6 records; late candidates are closer
VALUE = "gold_logprob"


def search_task(records: int = SEARCH_RECORDS, dataset: str = DATASET, items: int | None = None) -> TaskConfig:
    """The first ``records`` records of the split's search part, at begin / middle / end (MDQA with
    ``items`` documents; default the file's 20)."""
    return TaskConfig.from_split(dataset, "search", records, num_items=items)


def search_run(seed: int, profile: str, ga: GAConfig = GA, batch_size: int = 8, dataset: str = DATASET) -> SearchRun:
    """Seed ``seed``'s search: the log-prob fitness (score mode, no tie-break), results under the profile's
    ``lpes_at_power/``."""
    return SearchRun(replace(ga, seed=seed), output_dir("results", profile) / "lpes_at_power", f"search_{dataset}_s{seed}",
                     EvalSettings(mode="score", batch_size=batch_size), tie_break=0.0, value=VALUE, prefill_chunk=PREFILL_CHUNK)


def convergence(search: GeneticSearch, fitness: PositionFitness, seed: int) -> pd.DataFrame:
    """Per generation of ``search`` (as far as its checkpoint goes): the best and top-4 fitness, the
    genomes scored so far and the wall hours their evaluations took (read from the fitness cache, so
    evaluations recovered after a stop count what they cost where they were computed), and the
    unmodified model's fitness on the same records (scale 1 in every layer) as the line to clear."""
    result = search.stored()
    seconds = np.array([fitness.seconds(search.space.decode(np.asarray(json.loads(k)))) for k in result.scored])
    if np.isnan(seconds).any():
        raise ValueError(f"{int(np.isnan(seconds).sum())} of {len(seconds)} evaluations have no recorded time in the fitness "
                         f"cache {fitness.cache.directory}")
    summary = result.summary
    unmodified = np.ones(search.space.num_layers)
    if np.isnan(fitness.seconds(unmodified)):
        raise ValueError("the unmodified model's fitness on the search records is not cached: run the search first")
    reference = float(fitness(unmodified[None])[0])
    return pd.DataFrame({"seed": seed, "generation": summary["generation"], "best": summary["best"],
                         "mean_best_4": summary["mean_best_4"], "evaluated": summary["evaluated"],
                         "hours": [float(np.sum(seconds[:k])) / 3600 for k in summary["evaluated"]],
                         "unmodified": reference})


def search_seed(model, tokenizer, model_name: str, seed: int, records: int = SEARCH_RECORDS, profile: str = "cpu",
                ga: GAConfig = GA, batch_size: int = 8, progress: bool = True, report_only: bool = False,
                items: int | None = None) -> pd.DataFrame:
    """Run (or resume, or read back) seed ``seed``'s search; its convergence table. ``report_only``:
    the table from the checkpoint as it stands (a running search's progress), computing nothing."""
    task, run, space = search_task(records, items=items), search_run(seed, profile, ga, batch_size), bezier_space(model)
    fitness = search_fitness(model, tokenizer, task, run, model_name)
    if not report_only:
        fitness(np.ones((1, space.num_layers)))  # the unmodified model's line, cached before the search
        run_search(model, tokenizer, task, space, run, model_name=model_name, progress=progress)
    search = GeneticSearch(space, fitness, run.ga, progress=False)
    search.checkpoint = run.out_dir / f"{run.name}-{search.fingerprint()}.ckpt.json"
    return convergence(search, fitness, seed)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lpes_nb.lpes_at_power", description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--records", type=int, default=SEARCH_RECORDS, help="the first N records of the search part")
    parser.add_argument("--model", default=QWEN)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--report", action="store_true", help="only write the convergence table from the checkpoints as they stand")
    args = parser.parse_args(argv)
    model, tokenizer = load_model(args.model, dtype=args.dtype), load_tokenizer(args.model)
    dtype = str(resolve_dtype(args.dtype)).removeprefix("torch.")
    tables = []
    for seed in args.seeds:
        tables.append(search_seed(model, tokenizer, args.model, seed, args.records, args.profile, batch_size=args.batch_size,
                                  report_only=args.report))
        table = pd.concat(tables, ignore_index=True)
        write_csv(output_dir("results", args.profile) / "lpes_at_power" / f"convergence_{DATASET}_{args.model}_{dtype}.csv",
                  table.round(5))
        print(table.round(4).to_string(index=False))


if __name__ == "__main__":
    main()

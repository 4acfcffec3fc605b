"""GA wall time with 1 vs 2 Ray CPU actors on the embedded model (small budget), and the scaling
to expect on N GPUs from the per-individual time and the GA's per-generation structure.

    python scripts/bench_ray.py        # writes results/ray_scaling.json
"""

import json
import math
import time
from pathlib import Path

import numpy as np
import ray
import torch

from lpes_nb.core.ga import BezierSpace, GAConfig, GeneticSearch
from lpes_nb.evaluation.distributed import FitnessSpec, RayFitness
from lpes_nb.evaluation.tasks import EvalSettings, TaskConfig
from lpes_nb.store.models import EMBEDDED, load_model
from lpes_nb.store.results import write_json

TASK = TaskConfig("kv", 10, n=4, seed=5, key_format="letters6", value_format="digits4")
CONFIG = GAConfig(population=8, parents=3, mutations=4, crossovers=1, generations=1, seed=0)


def ga_seconds(actors: int) -> tuple[float, int]:
    spec = FitnessSpec(EMBEDDED, TASK, EvalSettings(), tie_break=1e-3, dtype="float32")
    with RayFitness(spec, actors=actors, progress=False) as fitness:
        fitness(np.ones((1, 30)))  # warm-up: first forward of each process is slower
        start = time.perf_counter()
        result = GeneticSearch(BezierSpace(30), fitness, CONFIG, progress=False).run()
        return time.perf_counter() - start, result.evaluations


def per_generation_rounds(workers: int, population: int = 32, parents: int = 12, crossovers: int = 4) -> int:
    """Sequential rounds of scoring per generation: each crossover scores its 2 children before the
    next is drawn (the next pair must avoid the chosen child), then all mutations in one batch."""
    mutations = population - parents - crossovers
    return crossovers * math.ceil(2 / workers) + math.ceil(mutations / workers)


def main() -> None:
    model = load_model(EMBEDDED)
    from lpes_nb.evaluation.fitness import PositionFitness
    from lpes_nb.store.models import load_tokenizer

    torch.set_num_threads(1)  # like one Ray actor with num_cpus=1
    fitness = PositionFitness(model, load_tokenizer(EMBEDDED), TASK.samples(), EvalSettings())
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
        "task": repr(TASK), "ga": repr(CONFIG),
        "seconds_per_individual_one_thread": round(per_individual, 3),
        "ga_seconds": {str(n): round(t, 1) for n, (t, _) in runs.items()},
        "evaluations": runs[1][1],
        "speedup_2_actors": round(runs[1][0] / runs[2][0], 2),
        "expected_speedup_paper_ga_on_n_workers": {str(n): round(serial / per_generation_rounds(n), 2)
                                                   for n in (1, 2, 4, 8, 16, 32)},
    }
    path = Path(__file__).resolve().parents[1] / "results" / "ray_scaling.json"
    write_json(path, out)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

"""The GA's fitness on several workers: a local process pool or Ray actors, each holding one model.

A worker builds its fitness once, from a small picklable description (:class:`FitnessSpec`: model
name, task, settings), so it loads the model exactly once; afterwards only scale vectors go to the
workers and fitness numbers come back. Both classes are fitness callables with the same
``fingerprint()`` as the in-process :class:`~lpes_nb.evaluation.fitness.PositionFitness` they run, so the GA,
its on-disk fitness cache and checkpoint/resume work unchanged, with identical results.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

import numpy as np
import torch
from tqdm.auto import tqdm

from ..store.models import load_model, load_tokenizer
from ..store.results import ResultCache
from .fitness import LAMBDAS, PositionFitness
from .tasks import EvalSettings, TaskConfig

_loads = 0  # models loaded by FitnessSpec.build in this process (a worker reports it)


@dataclass(frozen=True)
class FitnessSpec:
    """Everything a worker needs to build the GA's fitness itself: which model (a name for
    :func:`~lpes_nb.store.models.load_model`: the embedded model, a hub id, a local directory), the task,
    the settings. Picklable and small: this, not the model, is what is shipped to workers."""

    model_name: str
    task: TaskConfig
    settings: EvalSettings = EvalSettings()
    lambdas: tuple[float, float, float] = LAMBDAS
    tie_break: float = 0.0
    dtype: str | None = None  # None: load_model's default for the model
    cache_dir: str | None = None  # the on-disk fitness cache (a shared file system on a cluster)
    data_dir: str | None = None
    value: str = "correct"  # what the fitness weights (PositionFitness)
    prefill_chunk: int | None = None

    def build(self) -> PositionFitness:
        global _loads
        model = load_model(self.model_name, dtype=self.dtype)
        _loads += 1
        cache = ResultCache(self.cache_dir) if self.cache_dir is not None else None
        return PositionFitness(model, load_tokenizer(self.model_name), self.task.samples(self.data_dir), self.settings,
                               self.lambdas, cache, self.model_name, self.tie_break, self.value,
                               self.prefill_chunk)

    __call__ = build  # a spec is the factory the workers call


class _Worker:
    """One fitness (or any callable: the map's record evaluator), built once in its process; also the
    body of a Ray actor."""

    def __init__(self, factory: Callable[[], Callable]):
        self.fitness = factory()
        self.scored = 0

    def score(self, scales: np.ndarray) -> np.ndarray:
        self.scored += len(scales)
        return np.asarray(self.fitness(scales), dtype=float)

    def run(self, item):
        """The built callable on one item (a record id for the map's record worker)."""
        self.scored += 1
        return self.fitness(item)

    def fingerprint(self) -> str | None:
        return self.fitness.fingerprint() if hasattr(self.fitness, "fingerprint") else None

    def stats(self) -> dict:
        return {"pid": os.getpid(), "model_loads": _loads, "scored": self.scored}


_process_worker: _Worker | None = None


def _start_process_worker(factory, threads: int) -> None:
    global _process_worker
    torch.set_num_threads(threads)  # the pool's workers share the machine's cores, not each take all of them
    _process_worker = _Worker(factory)


def _process_call(method: str, *args):
    return getattr(_process_worker, method)(*args)


class _Distributed:
    """Shared by both: one row of scales per task, results in order, a progress bar per batch."""

    progress: bool = True

    def _map(self, scales: np.ndarray) -> list:
        raise NotImplementedError

    def __call__(self, scales_batch: np.ndarray) -> np.ndarray:
        rows = np.atleast_2d(np.asarray(scales_batch, dtype=float))
        return np.array([float(s[0]) for s in tqdm(self._map(rows), total=len(rows), desc="fitness (workers)",
                                                   leave=False, disable=not self.progress)])

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ProcessPoolFitness(_Distributed):
    """The fitness on ``workers`` local processes (spawned), each building it once from ``factory``
    (a :class:`FitnessSpec`, or any picklable zero-argument callable returning a fitness)."""

    def __init__(self, factory: Callable[[], Callable], workers: int = 2, progress: bool = True):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
        self.progress = progress
        self.pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_start_process_worker,
                                        initargs=(factory, max(1, (os.cpu_count() or 1) // workers)))
        self._fingerprint = self.pool.submit(_process_call, "fingerprint").result()

    def fingerprint(self) -> str | None:
        return self._fingerprint

    def _map(self, rows):
        return self.pool.map(_process_call, ["score"] * len(rows), [r[None] for r in rows])

    def map_items(self, items: list):
        """The built callable on every item, results in the items' order as they finish."""
        return self.pool.map(_process_call, ["run"] * len(items), items)

    def close(self) -> None:
        self.pool.shutdown()


class RayFitness(_Distributed):
    """The fitness on ``actors`` Ray actors (``pip install lpes-nb[ray]``), each building it once from
    ``factory`` with its own resources (``num_gpus=1`` per actor on a GPU cluster). ``address``:
    None starts a local Ray instance, ``"auto"`` joins the running cluster (``ray start --head``),
    or a ``ray://`` address. Only scale vectors (L floats) and scores cross the network."""

    def __init__(self, factory: Callable[[], Callable], actors: int = 2, address: str | None = None,
                 num_cpus: float = 1, num_gpus: float = 0, progress: bool = True):
        import ray  # optional (pip install lpes-nb[ray]): imported where it is used
        from ray.util import ActorPool

        if isinstance(actors, bool) or not isinstance(actors, int) or actors < 1:
            raise ValueError(f"actors must be an integer >= 1, got {actors!r}")
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        self.progress = progress
        remote = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(_Worker)
        self.actors = [remote.remote(factory) for _ in range(actors)]
        fingerprints = set(ray.get([a.fingerprint.remote() for a in self.actors]))
        if len(fingerprints) != 1:
            raise RuntimeError(f"the Ray actors built different fitnesses (fingerprints {sorted(map(str, fingerprints))}); "
                               "do all nodes see the same model and data?")
        self._fingerprint = fingerprints.pop()
        self.pool = ActorPool(self.actors)

    def fingerprint(self) -> str | None:
        return self._fingerprint

    def _map(self, rows):
        return self.pool.map(lambda actor, row: actor.score.remote(row[None]), list(rows))

    def map_items(self, items: list):
        """The built callable on every item, results in the items' order as they finish."""
        return self.pool.map(lambda actor, item: actor.run.remote(item), list(items))

    def stats(self) -> list[dict]:
        import ray  # optional, as above

        return ray.get([a.stats.remote() for a in self.actors])

    def close(self) -> None:
        import ray  # optional, as above

        for actor in self.actors:
            ray.kill(actor)
        self.actors = []


def distributed_fitness(spec: Callable[[], Callable], backend: str, workers: int = 2, ray_address: str | None = None,
                        num_gpus: float = 0, progress: bool = True) -> ProcessPoolFitness | RayFitness:
    """Workers that each build ``spec`` once (a :class:`FitnessSpec`, or any picklable factory such as
    the map's :class:`~lpes_nb.studies.position_map.RecordWorker`) on a backend: ``"processes"`` (a local
    pool) or ``"ray"``. Called as a fitness, or through ``map_items``."""
    if backend == "processes":
        return ProcessPoolFitness(spec, workers, progress)
    if backend == "ray":
        return RayFitness(spec, workers, ray_address, num_gpus=num_gpus, progress=progress)
    raise ValueError(f"unknown backend {backend!r}; choose 'in-process', 'processes' or 'ray'")

"""The curve-constrained genetic algorithm of LPES (Algorithm 1) and its per-layer variant. Pure numpy.

Genomes live on an integer grid so they hash exactly: a Bézier genome is an (n, 2) int array of
(x in layers, y in units of ``y_step``); a per-layer genome is an (L,) int array of scales in units
of ``y_step``. A genome space decodes a genome into per-layer scales; the fitness is a callable on a
batch of scales, shape (B, L) -> B scores (higher is better), so both genome spaces share it.

One generation: keep the ``parents`` fittest (truncation selection); make ``crossovers`` children,
each by swapping one random control point between two distinct parents and keeping the fitter of
the two children (a pair is retried ``crossover_tries`` times, then replaced by a mutation); make
``mutations`` children by mutating random parents. Invalid children (constraints broken, or a copy
of a member of the new generation) are redrawn. No genome is ever scored twice.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ..system.files import atomic_write
from .bezier import CURVES, Y_RANGE, default_control_points, layer_scales, smoothness

Fitness = Callable[[np.ndarray], Sequence[float]]


@dataclass(frozen=True)
class GAConfig:
    """Hyperparameters; defaults are the paper's (Table 9 and App. B)."""

    population: int = 32  # N_ps
    parents: int = 12  # N_pa
    generations: int = 20  # T: evolution steps after the initial population
    mutations: int = 16  # N_mu
    crossovers: int = 4  # N_cr
    crossover_tries: int = 4  # N_ct
    mx: int = 2  # M_x: x moves by an integer in [-M_x, M_x]
    my: float = 0.2  # M_y: y moves by a multiple of y_step in [-M_y, M_y]
    y_step: float = 0.1
    max_redraws: int = 10_000  # an invalid child is redrawn at most this often before giving up
    seed: int = 0

    def __post_init__(self):
        for name in ("population", "parents", "generations", "mutations", "crossovers", "crossover_tries", "max_redraws"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < (0 if name in ("generations", "crossovers") else 1):
                raise ValueError(f"GAConfig.{name} must be a non-negative integer (>= 1 unless generations/crossovers), got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise ValueError(f"GAConfig.seed must be an integer >= 0, got {self.seed!r}")
        if self.parents + self.mutations + self.crossovers != self.population:
            raise ValueError(
                f"parents + mutations + crossovers must equal population: "
                f"{self.parents} + {self.mutations} + {self.crossovers} != {self.population}"
            )
        if self.crossovers and self.parents < 2:
            raise ValueError(f"crossover needs at least 2 parents, got parents={self.parents}")
        if isinstance(self.mx, bool) or not isinstance(self.mx, (int, np.integer)) or self.mx < 0:
            raise ValueError(f"GAConfig.mx (x moves in whole layers) must be an integer >= 0, got {self.mx!r}")
        if not (isinstance(self.y_step, (int, float)) and np.isfinite(self.y_step) and self.y_step > 0):
            raise ValueError(f"GAConfig.y_step must be a finite number > 0, got {self.y_step!r}")
        if not (isinstance(self.my, (int, float)) and np.isfinite(self.my) and self.my >= 0) or not _on_grid(self.my, self.y_step):
            raise ValueError(f"GAConfig.my must be 0 or a positive multiple of y_step={self.y_step}, got {self.my!r} "
                             "(a move smaller than one grid step would never change y)")
        if self.mutations and self.mx == 0 and self.my == 0:
            raise ValueError(f"GAConfig.mx=0 and my=0 make every mutation a copy of its parent ({self.mutations} mutations per "
                             f"generation would find no new individual): give mx >= 1 or my >= y_step={self.y_step}, or mutations=0")


# --- genome spaces -------------------------------------------------------------------------------


def _on_grid(value: float, step: float) -> bool:
    return abs(value / step - round(value / step)) < 1e-9


def _check_grid(y_range: tuple[float, float], y_step: float) -> None:
    """Scales live on a grid of y_step: the range's ends must lie on it, or decoded scales would
    fall outside the range."""
    lo, hi = y_range
    if not (isinstance(y_step, (int, float)) and np.isfinite(y_step) and y_step > 0):
        raise ValueError(f"y_step must be a finite number > 0, got {y_step!r}")
    if not (np.isfinite(lo) and np.isfinite(hi) and 0 < lo < hi):
        raise ValueError(f"y_range must be (low, high) with 0 < low < high, got {y_range!r}")
    for end in (lo, hi):
        if not _on_grid(end, y_step):
            raise ValueError(f"y_range end {end:g} is not a multiple of y_step={y_step:g}; choose a y_step that divides "
                             f"both ends of {tuple(y_range)}")


def _swap_one(a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Two children: the parents with one random gene (a control point, or a layer's scale) swapped."""
    k = rng.integers(len(a))
    ca, cb = a.copy(), b.copy()
    ca[k], cb[k] = b[k], a[k]
    return ca, cb


@dataclass(frozen=True)
class BezierSpace:
    """Control points of a curve of ``degree`` (d + 1 points) over ``num_layers`` layers."""

    num_layers: int
    degree: int = 3
    curve: str = "bezier"
    y_range: tuple[float, float] = Y_RANGE
    y_step: float = 0.1

    def __post_init__(self):
        _check_grid(self.y_range, self.y_step)
        if self.curve not in CURVES:
            raise ValueError(f"unknown curve type {self.curve!r}; choose one of {CURVES}")
        if self.num_layers < self.degree + 1:
            raise ValueError(f"{self.degree + 1} control points need at least as many layers, got {self.num_layers}")
        default_control_points(self.num_layers, self.degree)  # validates degree / num_layers

    @property
    def _y_grid(self) -> tuple[int, int]:
        return round(self.y_range[0] / self.y_step), round(self.y_range[1] / self.y_step)

    def first(self) -> np.ndarray:
        """Eq. 8 on the grid: x_k = round(k (L - 1) / d), y_k = the middle of the y range (the paper's
        1.5 on its [1, 2]; a narrower range, e.g. [1, 1.3], starts inside itself)."""
        pts = default_control_points(self.num_layers, self.degree)
        lo, hi = self._y_grid
        return np.stack([np.rint(pts[:, 0]), np.full(len(pts), (lo + hi) // 2)], axis=1).astype(np.int64)

    def random(self, rng: np.random.Generator) -> np.ndarray:
        """A uniformly random valid genome (for the random-search baseline)."""
        x = np.sort(rng.choice(self.num_layers, size=self.degree + 1, replace=False))
        lo, hi = self._y_grid
        return np.stack([x, rng.integers(lo, hi + 1, size=self.degree + 1)], axis=1).astype(np.int64)

    def is_valid(self, g: np.ndarray) -> bool:
        x, y = g[:, 0], g[:, 1]
        lo, hi = self._y_grid
        return bool(x[0] >= 0 and x[-1] <= self.num_layers - 1 and np.all(np.diff(x) > 0) and np.all((y >= lo) & (y <= hi)))

    def mutate(self, g: np.ndarray, rng: np.random.Generator, cfg: GAConfig) -> np.ndarray:
        """Eq. 9-10: every coordinate moves by a random grid step within +-M_x / +-M_y."""
        my = round(cfg.my / self.y_step)
        dx = rng.integers(-cfg.mx, cfg.mx + 1, size=len(g))
        dy = rng.integers(-my, my + 1, size=len(g))
        return g + np.stack([dx, dy], axis=1)

    def crossover(self, a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Swap one random control point (x and y together) between the parents."""
        return _swap_one(a, b, rng)

    def decode(self, g: np.ndarray) -> np.ndarray:
        pts = np.stack([g[:, 0].astype(float), g[:, 1] * self.y_step], axis=1)
        return layer_scales(pts, self.num_layers, self.curve, self.y_range)

    def control_points(self, g: np.ndarray) -> list[list[float]]:
        return [[int(x), round(float(y) * self.y_step, 10)] for x, y in g]


@dataclass(frozen=True)
class PerLayerSpace:
    """One scale per layer (the "brute-force" search of the smoothness study, Fig. 4).

    Adapted operators: the initial population is U(y_range) on the grid; a mutation moves every
    layer by a random grid step within +-M_y and clips to y_range (redrawing 30 independent
    coordinates until all land inside would almost never succeed near the bounds); a crossover
    swaps one random layer's scale."""

    num_layers: int
    y_range: tuple[float, float] = Y_RANGE
    y_step: float = 0.1

    def __post_init__(self):
        _check_grid(self.y_range, self.y_step)
        if isinstance(self.num_layers, bool) or not isinstance(self.num_layers, (int, np.integer)) or self.num_layers < 1:
            raise ValueError(f"num_layers must be an integer >= 1, got {self.num_layers!r}")

    @property
    def _y_grid(self) -> tuple[int, int]:
        return round(self.y_range[0] / self.y_step), round(self.y_range[1] / self.y_step)

    def first(self) -> None:
        return None  # no hand-made first individual: the whole initial population is random

    def random(self, rng: np.random.Generator) -> np.ndarray:
        lo, hi = self._y_grid
        return rng.integers(lo, hi + 1, size=self.num_layers).astype(np.int64)

    def is_valid(self, g: np.ndarray) -> bool:
        lo, hi = self._y_grid
        return bool(len(g) == self.num_layers and np.all((g >= lo) & (g <= hi)))

    def mutate(self, g: np.ndarray, rng: np.random.Generator, cfg: GAConfig) -> np.ndarray:
        my = round(cfg.my / self.y_step)
        return np.clip(g + rng.integers(-my, my + 1, size=len(g)), *self._y_grid)

    def crossover(self, a: np.ndarray, b: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return _swap_one(a, b, rng)

    def decode(self, g: np.ndarray) -> np.ndarray:
        return g * self.y_step

    def control_points(self, g: np.ndarray) -> None:
        return None


@dataclass(frozen=True)
class TargetCurveFitness:
    """Synthetic fitness with a known optimum: minus the RMSE to target scales. Used to check the
    search itself; a module-level class so that it pickles for process pools and Ray workers."""

    target: tuple[float, ...]

    def __call__(self, scales: np.ndarray) -> np.ndarray:
        return -np.sqrt(((np.asarray(scales) - np.asarray(self.target)) ** 2).mean(axis=1))

    def fingerprint(self) -> str:
        return f"target-curve {list(self.target)}"


def _fitness_id(fitness) -> str | None:
    """What a fitness says it measures (its ``fingerprint()``), or None where it cannot say."""
    return fitness.fingerprint() if callable(getattr(fitness, "fingerprint", None)) else None


def _key(g: np.ndarray) -> str:
    return json.dumps(np.asarray(g).tolist())


# --- the algorithm ---------------------------------------------------------------------------------


@dataclass
class GAResult:
    best_genome: np.ndarray
    best_scales: np.ndarray
    best_fitness: float
    rows: list[dict]  # one per individual per generation, as the checkpoint holds them
    evaluations: int  # distinct genomes scored
    control_points: list | None = None
    scored: list[str] | None = None  # every genome scored, in the order scored (``evaluated`` in the history counts them)

    # the tables are built on first use: the core runs a search without pandas, which a researcher's
    # own code need not load (lpes_nb.core imports torch, numpy and transformers only)
    @cached_property
    def history(self):
        """One row per individual per generation (a DataFrame)."""
        import pandas as pd

        return pd.DataFrame(self.rows)

    @cached_property
    def summary(self):
        """One row per generation: best and mean fitness, mean smoothness, the mean of the best n."""
        history = self.history
        summary = history.groupby("generation").agg(
            best=("fitness", "max"), mean=("fitness", "mean"), smoothness_mean=("smoothness", "mean"),
        )
        for n in (1, 2, 4, 8):
            summary[f"mean_best_{n}"] = history[history["rank"] < n].groupby("generation")["fitness"].mean()
        if "evaluated" in history:  # checkpoints written before it was recorded lack it
            summary["evaluated"] = history.groupby("generation")["evaluated"].max()
        return summary.reset_index()


@dataclass
class _State:
    generation: int
    population: list[np.ndarray]
    cache: dict[str, float]
    rng_state: dict
    history: list[dict] = field(default_factory=list)


class GeneticSearch:
    """Run (and resume) the search. ``checkpoint`` (a JSON path) is rewritten atomically after
    every generation; if it exists and belongs to the same configuration, the run resumes from it."""

    def __init__(self, space, fitness: Fitness, config: GAConfig = GAConfig(), checkpoint: str | Path | None = None,
                 progress: bool = True):
        if config.y_step != space.y_step:
            raise ValueError(f"GAConfig.y_step={config.y_step} differs from the space's y_step={space.y_step}")
        if checkpoint is not None and _fitness_id(fitness) is None:
            # a checkpoint stores scores; resuming under another fitness would report the old run's scores
            raise ValueError(f"a checkpointed search needs a fitness it can identify: {fitness!r} has no fingerprint() "
                             "method (PositionFitness and TargetCurveFitness have one); add one, or pass checkpoint=None")
        self.space, self.fitness, self.config = space, fitness, config
        self.checkpoint = Path(checkpoint) if checkpoint is not None else None
        self.progress = progress
        self.state: _State | None = None

    # identity of a run: everything that determines its trajectory, including what is optimised when
    # the fitness states it (PositionFitness.fingerprint(): model, dtype, task samples, settings)
    def fingerprint(self) -> str:
        fitness = _fitness_id(self.fitness)
        desc = {"space": type(self.space).__name__, **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.space).items()},
                **asdict(self.config), "fitness": fitness}
        return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]

    def _score(self, genomes: list[np.ndarray]) -> list[float]:
        """Fitness of each genome, scoring only genomes never seen before (in one batch)."""
        cache = self.state.cache
        new, seen = [], set()
        for g in genomes:
            k = _key(g)
            if k not in cache and k not in seen:
                seen.add(k)
                new.append(g)
        if new:
            scores = np.asarray(self.fitness(np.stack([self.space.decode(g) for g in new])), dtype=float)
            if len(scores) != len(new):
                raise ValueError(f"fitness returned {len(scores)} scores for {len(new)} individuals")
            for g, s in zip(new, scores):
                if not np.isfinite(s):
                    raise ValueError(f"fitness returned a non-finite score {s!r} for genome {g.tolist()}")
                cache[_key(g)] = float(s)
        return [cache[_key(g)] for g in genomes]

    def _draw(self, make, taken: set[str], rng) -> np.ndarray:
        for _ in range(self.config.max_redraws):
            child = make(rng)
            if self.space.is_valid(child) and _key(child) not in taken:
                return child
        raise RuntimeError(
            f"no valid new individual after {self.config.max_redraws} draws; the search space is too small "
            f"for population={self.config.population} (num_layers={self.space.num_layers})"
        )

    def _initial_population(self, rng) -> list[np.ndarray]:
        first = self.space.first()
        population, taken = [], set()
        if first is not None:
            population.append(first)
            taken.add(_key(first))
        while len(population) < self.config.population:
            if first is not None:
                child = self._draw(lambda r: self.space.mutate(first, r, self.config), taken, rng)
            else:
                child = self._draw(self.space.random, taken, rng)
            population.append(child)
            taken.add(_key(child))
        return population

    def _record(self, generation: int, population: list[np.ndarray], scores: list[float]) -> None:
        for rank, i in enumerate(np.argsort(-np.asarray(scores), kind="stable")):
            scales = self.space.decode(population[i])
            self.state.history.append({
                "generation": generation, "rank": rank, "genome": _key(population[i]), "fitness": scores[i],
                # genomes scored so far, crossover children left out of the population included
                "evaluated": len(self.state.cache),
                "smoothness": smoothness(scales) if len(scales) >= 3 else float("nan"),
                "scales": json.dumps([round(float(s), 10) for s in scales]),
            })

    def _next_generation(self, population: list[np.ndarray], scores: list[float], rng) -> list[np.ndarray]:
        cfg = self.config
        order = np.argsort(-np.asarray(scores), kind="stable")
        parents = [population[i] for i in order[: cfg.parents]]
        taken = {_key(p) for p in parents}
        children: list[np.ndarray] = []
        fallbacks = 0
        for _ in range(cfg.crossovers):
            pair = None
            for _ in range(cfg.crossover_tries):
                i, j = rng.choice(len(parents), size=2, replace=False)
                ca, cb = self.space.crossover(parents[i], parents[j], rng)
                ok = [c for c in (ca, cb) if self.space.is_valid(c) and _key(c) not in taken]
                if ok:
                    pair = ok
                    break
            if pair is None:
                fallbacks += 1
                continue
            fit = self._score(pair)
            child = pair[int(np.argmax(fit))]  # the fitter child (the first on a tie)
            children.append(child)
            taken.add(_key(child))
        for _ in range(cfg.mutations + fallbacks):
            parent = parents[rng.integers(len(parents))]
            child = self._draw(lambda r: self.space.mutate(parent, r, cfg), taken, rng)
            children.append(child)
            taken.add(_key(child))
        return parents + children

    def _save_checkpoint(self) -> None:
        if self.checkpoint is None:
            return
        s = self.state
        payload = {
            "fingerprint": self.fingerprint(), "generation": s.generation,
            "population": [p.tolist() for p in s.population], "cache": s.cache,
            "rng_state": s.rng_state, "history": s.history,
        }
        self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.checkpoint, json.dumps(payload))

    def _load_checkpoint(self) -> bool:
        if self.checkpoint is None or not self.checkpoint.exists():
            return False
        try:
            payload = json.loads(self.checkpoint.read_text())
            fingerprint = payload["fingerprint"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"GA checkpoint {self.checkpoint} is unreadable (truncated or not a checkpoint: "
                             f"{type(err).__name__}: {err}); delete it to start the search afresh") from None
        if fingerprint != self.fingerprint():
            raise ValueError(
                f"checkpoint {self.checkpoint} belongs to another search configuration or fitness (model, task, "
                "samples, settings); delete it or choose another checkpoint path"
            )
        try:
            self.state = _State(
                generation=payload["generation"],
                population=[np.asarray(p, dtype=np.int64) for p in payload["population"]],
                cache={k: float(v) for k, v in payload["cache"].items()},
                rng_state=payload["rng_state"], history=payload["history"],
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"GA checkpoint {self.checkpoint} is incomplete ({type(err).__name__}: {err}); "
                             "delete it to start the search afresh") from None
        return True

    def finished(self) -> bool:
        """Whether the checkpoint holds this search's complete run (so :meth:`run` scores nothing)."""
        if self.checkpoint is None or not self.checkpoint.exists():
            return False
        return self._load_checkpoint() and self.state.generation >= self.config.generations

    def stored(self) -> GAResult:
        """The run as far as its checkpoint goes, finished or not, scoring nothing."""
        if not self._load_checkpoint():
            raise FileNotFoundError(f"no checkpoint at {self.checkpoint}: run the search first")
        return self._result()

    def run(self) -> GAResult:
        cfg = self.config
        rng = np.random.default_rng(cfg.seed)
        if self._load_checkpoint():
            rng.bit_generator.state = self.state.rng_state
        else:
            self.state = _State(generation=-1, population=[], cache={}, rng_state={})
            population = self._initial_population(rng)
            scores = self._score(population)
            self.state.population, self.state.generation = population, 0
            self._record(0, population, scores)
            self.state.rng_state = rng.bit_generator.state
            self._save_checkpoint()
        bar = tqdm(total=cfg.generations, initial=self.state.generation, desc="GA generations",
                   disable=not self.progress or self.state.generation >= cfg.generations)
        while self.state.generation < cfg.generations:
            population = self.state.population
            population = self._next_generation(population, self._score(population), rng)
            scores = self._score(population)
            self.state.generation += 1
            self.state.population = population
            self._record(self.state.generation, population, scores)
            self.state.rng_state = rng.bit_generator.state
            self._save_checkpoint()
            bar.update(1)
            bar.set_postfix(best=f"{max(scores):.4f}", evaluated=len(self.state.cache))
        bar.close()
        return self._result()

    def _result(self) -> GAResult:
        scored = [row for row in self.state.history if not np.isnan(row["fitness"])]
        best = max(scored, key=lambda row: row["fitness"])  # the first of equals, as pandas' idxmax
        genome = np.asarray(json.loads(best["genome"]), dtype=np.int64)
        return GAResult(
            best_genome=genome, best_scales=self.space.decode(genome), best_fitness=float(best["fitness"]),
            rows=list(self.state.history), evaluations=len(self.state.cache),
            control_points=self.space.control_points(genome), scored=list(self.state.cache),
        )


def random_search(space, fitness: Fitness, budget: int, seed: int = 0) -> tuple[np.ndarray, float]:
    """Best of ``budget`` distinct uniformly random valid genomes: the baseline the GA must beat."""
    rng = np.random.default_rng(seed)
    genomes, taken = [], set()
    while len(genomes) < budget:
        g = space.random(rng)
        if space.is_valid(g) and _key(g) not in taken:
            taken.add(_key(g))
            genomes.append(g)
    scores = np.asarray(fitness(np.stack([space.decode(g) for g in genomes])), dtype=float)
    i = int(np.argmax(scores))
    return genomes[i], float(scores[i])

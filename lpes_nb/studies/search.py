"""The LPES search on a model: the GA over Bézier control points (or per-layer scales) with the
λ-weighted position accuracy as fitness, resumable, and the evaluation of the scales it finds."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..core.bezier import Y_RANGE
from ..core.ga import BezierSpace, GAConfig, GAResult, GeneticSearch, PerLayerSpace
from ..core.methods import LayerScales
from ..core.rope import RopePatch, RopeSpec
from ..evaluation.distributed import FitnessSpec, distributed_fitness
from ..evaluation.evaluate import evaluate_samples
from ..evaluation.fitness import LAMBDAS, PositionFitness, difference_text, fitness_se, position_tables, weighted_fitness
from ..evaluation.tasks import EvalSettings, TaskConfig
from ..evaluation.training import answer_batch, backward_answer_nll, frozen
from ..store.data import Sample
from ..store.models import dtype_name, model_identity
from ..store.results import ResultCache, cache_key, save_ga, will_compute
from ..system import footprint


@dataclass(frozen=True)
class SearchRun:
    """How one search runs, besides its task and space: the GA, where its results land (``out_dir``,
    files named ``name``), the judge's settings, the λ weights (Eq. 8), the log-probability
    tie-break, what the fitness weights (``value``: accuracy, or the gold answer's log-probability;
    :class:`~lpes_nb.evaluation.fitness.PositionFitness`), its ``prefill_chunk``, and where fitness is scored (``backend``:
    ``"in-process"``, ``"processes"`` — a local pool of ``workers`` — or ``"ray"`` — ``workers``
    actors; ``ray_address`` None starts a local Ray, ``"auto"`` joins a cluster; ``num_gpus`` per actor)."""

    ga: GAConfig
    out_dir: Path
    name: str
    settings: EvalSettings = EvalSettings()
    lambdas: tuple[float, ...] = LAMBDAS
    tie_break: float = 1e-3
    value: str = "correct"
    prefill_chunk: int | None = None
    backend: str = "in-process"
    workers: int = 2
    ray_address: str | None = None
    num_gpus: float = 0


def search_fitness(model, tokenizer, task: TaskConfig, run: SearchRun, model_name: str = "",
                   progress: bool = False) -> PositionFitness:
    """The fitness a search of ``run`` on ``task`` scores with, its evaluations cached under ``run.out_dir``
    (also how a finished search's evaluations are read back: their cost, their per-sample rows);
    ``progress``: a bar inside each evaluation (:class:`~lpes_nb.evaluation.fitness.PositionFitness`)."""
    return PositionFitness(model, tokenizer, task.samples(), run.settings, run.lambdas, ResultCache(Path(run.out_dir) / "fitness_cache"),
                           model_name, run.tie_break, run.value, run.prefill_chunk, progress)


def run_search(model, tokenizer, task: TaskConfig, space, run: SearchRun, model_name: str = "", progress: bool = True) -> GAResult:
    """Run (or resume, or reload) a GA search over ``space`` on ``task``'s samples; results land in
    ``run.out_dir/<run.name>_*``.

    The GA checkpoints after every generation to ``<out_dir>/<name>-<fingerprint>.ckpt.json``; a
    finished checkpoint is the stored result (nothing is scored again). Fitness evaluations are also
    cached on disk by scales, so ablations that meet the same scales never recompute them. On the
    ``processes`` / ``ray`` backends every worker loads ``model_name`` once and builds ``task``'s
    samples itself; only scale vectors and scores travel."""
    config, settings, lambdas, tie_break = run.ga, run.settings, run.lambdas, run.tie_break
    out_dir, name, backend = Path(run.out_dir), run.name, run.backend
    cache_dir = out_dir / "fitness_cache"
    fitness = search_fitness(model, tokenizer, task, run, model_name)
    search = GeneticSearch(space, fitness, config, progress=progress)
    # the checkpoint is the search's entry in the result store: keyed by everything that determines
    # the run, so a changed parameter starts a new search and a finished one is only read back
    search.checkpoint = out_dir / f"{name}-{search.fingerprint()}.ckpt.json"
    finished = search.finished()
    if not finished:
        will_compute(f"GA search {name}", search.checkpoint)
    if finished:
        result = search.run()
    elif backend == "in-process":
        with footprint.study(f"GA search {name}", evaluations_planned=config.population * (config.generations + 1)):
            result = search.run()
    else:
        if not model_name:
            raise ValueError(f"backend {backend!r} needs model_name, so that every worker loads the model itself")
        spec = FitnessSpec(model_name, task, settings, tuple(lambdas), tie_break, dtype_name(model.dtype),
                           str(cache_dir), value=run.value, prefill_chunk=run.prefill_chunk)
        with distributed_fitness(spec, backend, run.workers, run.ray_address, run.num_gpus, progress) as remote:
            if remote.fingerprint() != fitness.fingerprint():
                raise RuntimeError(f"the {backend} workers built a different fitness (fingerprint {remote.fingerprint()}) "
                                   f"than this process ({fitness.fingerprint()}): model, dtype, samples or settings differ")
            result = GeneticSearch(space, remote, config, checkpoint=search.checkpoint, progress=progress).run()
    save_ga(result, out_dir, name, model=model_identity(model, model_name), task=repr(task), settings=repr(settings),
                ga=repr(config), checkpoint=search.checkpoint.name)
    return result


class _LearnedScale:
    """Position remap p -> p / s_l with s_l = 1 + sigmoid(u_l), a differentiable scale in (1, 2)."""

    def __init__(self, raw: torch.Tensor, layer: int):
        self.raw, self.layer = raw, layer

    def __call__(self, position_ids, segment_ids):
        return position_ids.float() / (1.0 + torch.sigmoid(self.raw[self.layer]))


def gradient_search(model, tokenizer, samples: Sequence[Sample], steps: int = 30, batch_size: int = 6, lr: float = 0.1,
                    lambdas: Sequence[float] = LAMBDAS, seed: int = 0, progress: bool = True,
                    micro_batch: int | None = None) -> tuple[list[float], pd.DataFrame]:
    """The gradient-based baseline: per-layer scales as parameters (s_l = 1 + sigmoid(u_l), starting
    at 1.5 like the GA's first individual), optimised with Adam on the answer loss of the search set,
    each sample weighted by its position's λ (begin / middle / end). ``micro_batch``: backward passes
    over that many prompts at a time, the same gradient in less memory. Returns the final scales and
    the per-step history (loss and scales)."""
    positions = sorted({s.position for s in samples})
    if len(positions) != 3:
        raise ValueError(f"the gradient search needs samples at exactly 3 gold positions, got {positions}")
    weight = dict(zip(positions, lambdas))
    layers = model.config.num_hidden_layers
    raw = torch.zeros(layers, requires_grad=True)
    optimiser = torch.optim.Adam([raw], lr=lr)
    prompts, targets, pad = answer_batch(tokenizer, samples)
    specs = [RopeSpec(remap=_LearnedScale(raw, l)) for l in range(layers)]
    rng = np.random.default_rng(seed)
    rows = []
    with frozen(model), RopePatch(model, specs):
        for step in tqdm(range(steps), desc="gradient search", disable=not progress):
            batch = rng.choice(len(samples), size=min(batch_size, len(samples)), replace=False)
            optimiser.zero_grad()
            loss = backward_answer_nll(model, [prompts[i] for i in batch], [targets[i] for i in batch], pad,
                                       [weight[samples[i].position] for i in batch], micro_batch)
            optimiser.step()
            rows.append({"step": step, "loss": loss,
                         **{f"s{l}": float(1 + torch.sigmoid(raw[l].detach())) for l in range(layers)}})
    scales = [float(v) for v in (1 + torch.sigmoid(raw.detach()))]
    return scales, pd.DataFrame(rows)


def bezier_space(model, degree: int = 3, curve: str = "bezier", y_range: tuple[float, float] = Y_RANGE,
                 y_step: float = 0.1) -> BezierSpace:
    return BezierSpace(model.config.num_hidden_layers, degree=degree, curve=curve, y_range=y_range, y_step=y_step)


def per_layer_space(model, y_range: tuple[float, float] = Y_RANGE, y_step: float = 0.1) -> PerLayerSpace:
    return PerLayerSpace(model.config.num_hidden_layers, y_range=y_range, y_step=y_step)


def reference_fitness(model, tokenizer, samples: Sequence[Sample], settings: EvalSettings = EvalSettings(),
                      lambdas: Sequence[float] = LAMBDAS) -> pd.DataFrame:
    """The unmodified model on a search set: its λ-fitness (accuracy only, no tie-break) and that
    fitness's standard error — the line a search must clear, and how finely the set resolves it."""
    df = evaluate_samples(model, tokenizer, samples, settings=settings, progress=False)
    return pd.DataFrame([{"fitness": weighted_fitness(df, lambdas), "se": fitness_se(df, lambdas), "prompts": len(df)}])


def scales_samples(model, tokenizer, samples: Sequence[Sample], scales: Mapping[str, Sequence[float] | None],
                   settings: EvalSettings = EvalSettings(), progress: bool = False) -> pd.DataFrame:
    """Per-sample results (a ``method`` column first) for named per-layer scales (``None`` = the
    unmodified model), for paired comparisons on the same records."""
    df = pd.concat([evaluate_samples(model, tokenizer, samples, None if s is None else LayerScales(s), settings,
                                     progress=progress).assign(method=label)
                    for label, s in scales.items()], ignore_index=True)
    return df[["method", *df.columns.drop("method")]]


def evaluate_scales(model, tokenizer, samples: Sequence[Sample], scales: Mapping[str, Sequence[float] | None],
                    settings: EvalSettings = EvalSettings(), progress: bool = False) -> pd.DataFrame:
    """Accuracy by gold position (n, mean, Wilson 95 % CI, ρ, λ-fitness) for named per-layer scales."""
    return position_tables(scales_samples(model, tokenizer, samples, scales, settings, progress))


def ablation_runs(num_layers: int) -> list[tuple[str, object, dict]]:
    """The search ablations as (kind, setting, options): curve type, number of control points,
    λ weights, and the seed of the search set (robustness)."""
    return ([("curve", c, dict(curve=c)) for c in ("bezier", "linear", "step")]
            + [("control points", d + 1, dict(degree=d)) for d in (1, 2, 4) if d < num_layers]
            + [("lambda", str(l), dict(lambdas=l)) for l in ((1 / 3, 1 / 3, 1 / 3), (0.0, 1.0, 0.0), (0.5, 0.3, 0.2))]
            + [("search seed", s, dict(search_seed=s)) for s in (11, 12)])


def run_ablation(model, tokenizer, run: tuple[str, object, dict], search_task, test_samples: Sequence[Sample],
                 config: GAConfig, out_dir: Path, settings: EvalSettings = EvalSettings(), degree: int = 3,
                 model_name: str = "", tie_break: float = 1e-3) -> dict:
    """One ablation: a (resumable) Bézier GA with the run's options on ``search_task``, its best
    scales evaluated on ``test_samples``; one row for the ablation table."""
    kind, value, opts = run
    search_cfg = replace(search_task, seed=opts.get("search_seed", search_task.seed))
    space = bezier_space(model, opts.get("degree", degree), opts.get("curve", "bezier"))
    lambdas = opts.get("lambdas", LAMBDAS)
    name = f"ablation_{search_key(kind=kind, value=value, cfg=config, task=repr(search_cfg), lam=lambdas)}"
    res = run_search(model, tokenizer, search_cfg, space, SearchRun(config, out_dir, name, settings, tuple(lambdas), tie_break),
                     model_name=model_name, progress=False)
    test = evaluate_scales(model, tokenizer, test_samples, {"best": list(res.best_scales)}, settings)
    acc = test.set_index("position")["mean"]
    return {"ablation": kind, "setting": str(value), "search_fitness": res.best_fitness, "evaluations": res.evaluations,
            "test_first": acc.iloc[0], "test_middle": acc.iloc[1], "test_last": acc.iloc[2], "test_fitness": test.fitness.iloc[0],
            "smoothness": res.history.loc[res.history.fitness.idxmax(), "smoothness"]}


def smoothness_trend(history: pd.DataFrame, n_boot: int = 4000, seed: int = 0) -> pd.DataFrame:
    """LPES Fig. 4's question of a per-layer GA's ``history`` (one row per individual and generation): does
    the population grow smoother? One row: the mean smoothness S of the first and the last generation's
    individuals, their difference (last − first; negative: smoother) and its 95 % bootstrap interval,
    individuals drawn within each generation. (Survivors carried over make the two generations not
    independent: the interval is approximate, a direction with its scale, not a test.)"""
    first, last = (history.loc[history.generation == g, "smoothness"].to_numpy() for g in
                   (history.generation.min(), history.generation.max()))
    if len(first) < 2 or len(last) < 2 or history.generation.nunique() < 2:
        raise ValueError("the smoothness trend needs two generations of at least two individuals each")
    rng = np.random.default_rng(seed)
    boot = (last[rng.integers(0, len(last), (n_boot, len(last)))].mean(1)
            - first[rng.integers(0, len(first), (n_boot, len(first)))].mean(1))
    return pd.DataFrame([{"generations": int(history.generation.max()), "individuals": len(last),
                          "first_mean": float(first.mean()), "last_mean": float(last.mean()),
                          "difference": float(last.mean() - first.mean()), "ci_low": float(np.quantile(boot, 0.025)),
                          "ci_high": float(np.quantile(boot, 0.975))}])


def search_key(**parts) -> str:
    """A short name suffix for a search configuration (for file names of ablation runs)."""
    return cache_key(**{k: asdict(v) if hasattr(v, "__dataclass_fields__") else v for k, v in parts.items()})


def _short(setting) -> str:
    return re.sub(r"(\d\.\d\d)\d+", r"\1", str(setting))  # (0.3333333333333333, ...) as (0.33, ...)


def search_forwards(ga: GAConfig, task: TaskConfig) -> int:
    """Prompt-forwards of one search at most: population × (generations + 1) × search prompts."""
    return ga.population * (ga.generations + 1) * task.n * len(task.gold_positions())


def conclusion(test_table: pd.DataFrame, diffs: pd.DataFrame, reference: pd.DataFrame, lpes: GAResult, brute: GAResult,
               gradient: pd.DataFrame, ablations: pd.DataFrame, ga: GAConfig, task: TaskConfig, paper_ga: GAConfig,
               paper_task: TaskConfig) -> str:
    """Notebook 5's reading, every number from its results: the test set's accuracies and paired
    differences with their MDE, the search against the unmodified model's search-set fitness, the
    per-layer GA's smoothness, the gradient search, the ablations and the search budget against the
    paper profile's."""
    test_table = pd.concat([test_table, gradient[["method", "position", "n", "mean", "fitness"]]], ignore_index=True)
    acc = test_table.pivot(index="method", columns="position", values="mean")
    fit = test_table.groupby("method").fitness.first()
    n = int(test_table["n"].min())
    methods = list(dict.fromkeys(test_table["method"]))
    lines = [f"**The test set** (n = {n} records per position; first / middle / last accuracy, λ-score):", "",
             "| method | first | middle | last | λ-score |", "|---|---|---|---|---|"]
    lines += [f"| {m} | " + " | ".join(f"{100 * v:.0f} %" for v in acc.loc[m]) + f" | {fit[m]:.3f} |" for m in methods]
    lines += ["", "Paired on the same records (record-clustered 95 % intervals, MDE at 80 % power):"]
    lines += [f"- {difference_text(r)}" for _, r in diffs.iterrows()]
    ref, se = float(reference["fitness"].iloc[0]), float(reference["se"].iloc[0])
    search_prompts = task.n * len(task.gold_positions())
    first_best, best = float(lpes.summary["best"].iloc[0]), float(lpes.summary["best"].iloc[-1])
    scales = np.asarray(lpes.best_scales)
    # an SE of 0 (every search prompt scored alike) leaves the distance in SEs undefined
    distance = f"{(best - ref) / se:+.1f} SE from the unmodified model" if se > 0 else f"{best - ref:+.3f} from the unmodified model (SE 0)"
    lines += ["", f"**The search.** The unmodified model scores {ref:.3f} ± {se:.3f} (SE) on the search set ({search_prompts} "
              f"prompts); the Bézier GA's best goes from {first_best:.3f} in the first generation to {best:.3f} after "
              f"{len(lpes.summary) - 1} generations ({lpes.evaluations} evaluations), {distance}. "
              f"Its control points {[[round(x, 2), round(y, 2)] for x, y in lpes.control_points]} give "
              f"scales {scales.min():.2f}–{scales.max():.2f}."]
    s = brute.summary["smoothness_mean"]
    new = brute.history.drop_duplicates("genome").groupby("generation").smoothness.mean()
    lines.append(f"\n**The per-layer GA** reaches {brute.best_fitness:.3f} on the search set with {brute.evaluations} evaluations; "
                 f"its population's smoothness S goes {s.iloc[0]:.2f} → {s.iloc[-1]:.2f}, that of the individuals new in "
                 f"each generation {new.iloc[0]:.2f} → {new.iloc[-1]:.2f}.")
    g = [float(v) for v in json.loads(gradient["scales"].iloc[0])]
    lines.append(f"\n**The gradient search**: answer loss {gradient['loss_first'].iloc[0]:.2f} → {gradient['loss_last'].iloc[0]:.2f} "
                 f"(mean of the first / last five steps), scales {min(g):.2f}–{max(g):.2f}.")
    lines.append("\n**The ablations** (one short GA run each; the best scales on the first test records), search fitness → "
                 "test λ-score: " + "; ".join(f"{r['ablation']} {_short(r['setting'])}: {r['search_fitness']:.3f} → {r['test_fitness']:.3f}"
                                               for _, r in ablations.iterrows()) + ".")
    here, paper = search_forwards(ga, task), search_forwards(paper_ga, paper_task)
    lines.append(f"\n**Budget.** Prompt-forwards of a search, population × (generations + 1) × search prompts: "
                 f"{ga.population} × {ga.generations + 1} × {search_prompts} = {here:,} here, {paper:,} in the `paper` "
                 f"profile (1/{paper / here:.0f}).")
    return "\n".join(lines)

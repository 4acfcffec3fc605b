"""The benchmark study: every compared method on the same samples (accuracy by gold position, CIs,
ρ), their latency, and perplexity extrapolation with layer-specific vs uniform PI / NTK."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..evaluation.evaluate import encode, evaluate_samples, record_groups, token_segments
from ..evaluation.fitness import difference_text
from ..store.data import Sample
from ..core.methods import (
    CALIOPE_KINDS,
    LASP,
    AttentionBuckets,
    Baseline,
    Caliope,
    DynamicNTK,
    Method,
    MsPoE,
    MsPoEMeanPI,
    WindowOverflow,
    lpes,
    pi,
)
from ..core.rope import RopeSpec, dynamic_ntk_base, find_rope_stack, rope_context, single_base
from ..evaluation.metrics import perplexity
from ..evaluation.moice import MoICE, router_digest
from ..evaluation.tasks import EvalSettings, TaskConfig, scoring_key
from ..store.models import load_model, load_tokenizer
from ..store.results import cached_table, reading_only
from ..system.footprint import interleaved_times, ratio_to_baseline

# The compared methods, by display name, in the order of the benchmark tables: each entry builds the
# method from the searched per-layer scales and the trained MoICE (or None). A new method is one entry.
METHODS: dict[str, Callable[[Sequence[float], MoICE | None], Method]] = {
    "baseline": lambda scales, moice: Baseline(),
    "PI": lambda scales, moice: pi(scales),
    "Dynamic NTK": lambda scales, moice: DynamicNTK(),
    "Attention Buckets": lambda scales, moice: AttentionBuckets(),
    "Ms-PoE": lambda scales, moice: MsPoE(),
    # the variant run before the reference check (the paper's rank mapping, both ends of the ratio range)
    "Ms-PoE (rank, endpoints grid)": lambda scales, moice: MsPoE(grid="endpoints", assign="rank"),
    "MoICE": lambda scales, moice: moice or MoICE(),
    **{f"CALIOPE-{kind.capitalize()}": (lambda scales, moice, kind=kind: Caliope(kind)) for kind in CALIOPE_KINDS},
    "LASP": lambda scales, moice: LASP("both"),
    "LPES": lambda scales, moice: lpes(scales),
}


def compared_methods(scales: Sequence[float], moice: MoICE | None = None) -> dict[str, Method]:
    """Every registered method; LPES and PI from the searched ``scales``; MoICE with a trained router
    if given, else its untrained (uniform) mixture, named by the router that runs (:attr:`MoICE.label`)."""
    methods = {name: make(scales, moice) for name, make in METHODS.items()}
    return {(m.label if k == "MoICE" else k): m for k, m in methods.items()}


def ms_poe_parts(ms_poe: MsPoE | None = None) -> dict[str, Method]:
    """Where Ms-PoE's loss comes from (issue #100): Ms-PoE beside each of its two parts alone, to be
    compared paired on the same records. Its ratios handed to the key/value heads in a fixed order (the
    reference's ``head_type="normal"``: the heads without the outlier score), and uniform PI at its mean
    ratio from its first layer on (the ratio range without the heads)."""
    ms_poe = ms_poe or MsPoE()
    mean_pi = MsPoEMeanPI(ms_poe)
    return {ms_poe.name: ms_poe, f"{ms_poe.name}, fixed head order": replace(ms_poe, assign="normal"), mean_pi.name: mean_pi}


def method_key(method: Method) -> str:
    """What determines a method's outputs, for result caching (a trained router by its training recipe,
    or by its weights when it has none)."""
    if not isinstance(method, MoICE) or not method.trained:
        return repr(method)
    if method.recipe is not None:  # a stored router: its results do not need its weights
        return f"MoICE(bases={method.bases}, router={method.recipe})"
    return f"MoICE(bases={method.bases}, router={router_digest(method.router)})"


def runnable(model, tokenizer, samples: Sequence[Sample], methods: Mapping[str, Method]) -> dict[str, Method]:
    """The methods that can run on ``samples`` with this model; each one that would move positions
    past the model's trained window (:class:`~lpes_nb.core.methods.WindowOverflow`, e.g. CALIOPE-Moses's
    10,000-position gap on an 8k window) is left out with its reason printed, never extrapolated."""
    longest = max(samples, key=lambda s: len(tokenizer(s.prompt)["input_ids"]))
    segments = [token_segments(tokenizer, longest)]
    kept = {}
    for name, method in methods.items():
        try:
            method.specs(model, len(segments[0]), segments if method.needs_segments else None)
        except WindowOverflow as refusal:
            print(f"[benchmarks] {name} left out: {refusal}")
            continue
        kept[name] = method
    return kept


def unchanged(model, tokenizer, samples: Sequence[Sample], methods: Mapping[str, Method | None], chat: bool = False) -> dict[str, str]:
    """The methods that leave every prompt of ``samples`` as the unmodified model reads it, each with
    why: Dynamic NTK where the longest prompt is inside the window it grows from (transformers' dynamic
    RoPE keeps the trained base there). Their rows are the baseline's by definition, whatever the
    rounding of the path that evaluated them (:func:`lpes_nb.evaluation.fitness.paired_differences`)."""
    longest = max(len(encode(tokenizer, s, chat)) for s in samples)
    why = {}
    for name, method in methods.items():
        if isinstance(method, DynamicNTK) and method.specs(model, longest, None) is None:
            window = method.original_max_positions or model.config.max_position_embeddings
            why[name] = (f"the longest prompt, {longest:,} tokens, is inside the {window:,}-token window it grows from, "
                         "where transformers' dynamic RoPE keeps the trained base")
    return why


@dataclass(frozen=True)
class SampleWorker:
    """What a worker needs to evaluate a benchmark's samples itself (picklable; it loads the model and
    builds ``task``'s samples once): the factory of :func:`lpes_nb.evaluation.distributed.distributed_fitness`
    for :func:`method_samples` on processes or Ray actors. Each item is (method, sample indices, their
    digest, settings)."""

    model_name: str
    task: TaskConfig
    dtype: str | None = None
    data_dir: str | None = None

    def __call__(self):
        model, tokenizer = load_model(self.model_name, dtype=self.dtype), load_tokenizer(self.model_name)
        samples = self.task.samples(self.data_dir)

        def run(item):
            method, indices, digest, settings = item
            if _digest([samples[i] for i in indices]) != digest:
                raise ValueError("the workers evaluated other samples than this process holds: build their SampleWorker "
                                 "from the same task (and data) as these samples")
            return evaluate_samples(model, tokenizer, [samples[i] for i in indices], method=method, settings=settings,
                                    progress=False).to_dict(orient="records")
        return run


def _on_workers(pool, samples: Sequence[Sample], method: Method, settings: EvalSettings, records_per_item: int = 4) -> pd.DataFrame:
    """One method's per-sample table from the workers of ``pool`` (built from a :class:`SampleWorker`
    of the same task), whole records per item, rows back in the samples' order."""
    groups = record_groups(samples)
    shards = [[i for g in groups[k:k + records_per_item] for i in g] for k in range(0, len(groups), records_per_item)]
    items = [(method, shard, _digest([samples[i] for i in shard]), settings) for shard in shards]
    order = {(s.task, s.position, s.sample_id): k for k, s in enumerate(samples)}
    rows = [row for part in pool.map_items(items) for row in part]
    return pd.DataFrame(sorted(rows, key=lambda r: order[(r["task"], r["position"], r["sample"])]))


def _digest(samples: Sequence[Sample]) -> str:
    return hashlib.sha256("\x00".join(s.prompt + "\x01" + "|".join(s.answers) for s in samples).encode()).hexdigest()


def method_samples(model, tokenizer, samples: Sequence[Sample], methods: Mapping[str, Method], name: str,
                   params: dict, profile: str, settings: EvalSettings = EvalSettings(), progress: bool = True,
                   pool=None) -> pd.DataFrame:
    """Per-sample results of every method (a ``method`` column first). Each method's are cached under
    ``results/`` (keyed by ``params`` and the method), so a rerun or an added method only computes
    what is missing. ``pool``: workers (``distributed_fitness(SampleWorker(...), "processes" | "ray")``)
    that evaluate the missing tables record by record instead of ``model`` here."""
    tables = []
    for label, method in tqdm(methods.items(), desc=f"{name}: methods", disable=not progress or reading_only()):
        compute = ((lambda m=method: _on_workers(pool, samples, m, settings)) if pool is not None else
                   (lambda m=method: evaluate_samples(model, tokenizer, samples, method=m, settings=settings, progress=progress)))
        scored = scoring_key(s.task for s in samples) if settings.mode == "score" else {}
        per_sample = cached_table(f"{name}_samples", {**params, **scored, "method": method_key(method)}, compute, profile)
        per_sample.insert(0, "method", label)
        tables.append(per_sample)
    return pd.concat(tables, ignore_index=True)


def summary_table(acc: pd.DataFrame, methods: Sequence[str]) -> pd.DataFrame:
    """One row per method: "mean [CI low, CI high]" in % per task and gold position, then ρ and the
    λ-fitness per task (``acc``: position tables of :func:`method_samples` outputs with a ``task`` column)."""
    pct = lambda v: (100 * v).round().astype(int).astype(str)  # noqa: E731
    cells = acc.assign(cell=pct(acc["mean"]) + " [" + pct(acc.ci_low) + ", " + pct(acc.ci_high) + "]",
                       column=acc.task + " gold@" + acc.position.astype(str))
    table = cells.pivot_table(index="method", columns="column", values="cell", aggfunc="first", sort=False)
    per_task = acc.groupby(["method", "task"], sort=False)[["rho", "fitness"]].first().unstack()
    rho = per_task["rho"].round(1).add_prefix("ρ ")
    fitness = per_task["fitness"].round(3).add_prefix("fitness ")
    return table.join(rho).join(fitness).loc[list(methods)]


def latency_samples(mdqa: TaskConfig, n: int) -> list[Sample]:
    """The latency prompts: ``n`` MDQA questions past the ones any accuracy study reads (offset 300),
    with ``mdqa``'s number of documents and the gold document in the middle."""
    return TaskConfig("mdqa", mdqa.num_items, n=n, offset=300, positions=(mdqa.gold_positions()[1],)).samples()


def latency(model, tokenizer, samples: Sequence[Sample], methods: Mapping[str, Method], rounds: int = 3,
            new_tokens: int = 8) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-sample inference time of every method on the same prompts and decode length (greedy,
    batch 1, no early stop), interleaved; (all timings, medians and ratios to the baseline)."""
    settings = EvalSettings(mode="generate", max_new_tokens=new_tokens, batch_size=1, stop_at_newline=False)

    def run(method):
        evaluate_samples(model, tokenizer, samples, method=method, settings=settings, progress=False, fixed_length=True)

    times = interleaved_times({name: (lambda m=m: run(m)) for name, m in methods.items()}, rounds)
    times["seconds_per_sample"] = times["seconds"] / len(samples)
    table = ratio_to_baseline(times, next(iter(methods)))
    table["median_s_per_sample"] = table["median_s"] / len(samples)
    return times, table


# --- perplexity extrapolation (LPES v1, Table 3) ------------------------------------------------------

EXTRAPOLATION_VARIANTS = ("baseline", "PI", "PI + layer-specific", "NTK", "NTK + layer-specific")


def extrapolation_specs(model, variant: str, length: int, relative: Sequence[float]) -> list[RopeSpec] | None:
    """Specs for a ``length``-token input. PI divides positions by f = length / trained window; NTK
    uses transformers' dynamic base for that length (factor 2); "+ layer-specific" multiplies each
    layer's scale by the LPES profile ``relative`` (normalised to mean 1, so the average stretch is
    unchanged and only its distribution over layers differs)."""
    if variant not in EXTRAPOLATION_VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {EXTRAPOLATION_VARIANTS}")
    if variant == "baseline":
        return None
    cfg, stack = model.config, find_rope_stack(model)
    window, layers = cfg.max_position_embeddings, stack.num_layers
    rel = np.asarray(relative, float) / np.mean(relative) if variant.endswith("layer-specific") else np.ones(layers)
    if len(rel) != layers:
        raise ValueError(f"got {len(rel)} relative scales for {layers} layers")
    if variant.startswith("PI"):
        factor = max(length / window, 1.0)
        return [RopeSpec(scale=float(factor * r)) for r in rel]
    dim = 2 * stack.native(0)[0].shape[0]
    base = dynamic_ntk_base(single_base(model, "NTK extrapolation"), 2.0, length, window, dim)
    return [RopeSpec(base=base, scale=float(r)) for r in rel]


@torch.inference_mode()
def tail_perplexity(model, window: Sequence[int], tail: int, specs=None) -> float:
    """Perplexity of the last ``tail`` tokens of one long window (only their logits are computed)."""
    window = list(window)
    if isinstance(tail, bool) or not isinstance(tail, int) or not 1 <= tail < len(window):
        raise ValueError(f"tail must be an integer in [1, {len(window) - 1}] (the window has {len(window)} tokens), got {tail!r}")
    ids = torch.tensor([window], device=model.device)
    with rope_context(model, specs):
        logits = model(ids, logits_to_keep=tail + 1).logits[0, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits, ids[0, -tail:], reduction="sum")
    return perplexity(float(nll), tail)


def perplexity_extrapolation(model, windows: Mapping[int, Sequence[Sequence[int]]], relative: Sequence[float],
                             tail: int = 512, progress: bool = True) -> pd.DataFrame:
    """Tail perplexity per (length, variant, window); ``windows`` maps a length to its token windows."""
    rows = []
    jobs = [(length, v, i, w) for length, ws in windows.items() for i, w in enumerate(ws) for v in EXTRAPOLATION_VARIANTS]
    for length, variant, i, w in tqdm(jobs, desc="extrapolation", disable=not progress):
        specs = extrapolation_specs(model, variant, length, relative)
        rows.append({"length": length, "variant": variant, "window": i, "ppl": tail_perplexity(model, w, tail, specs)})
    return pd.DataFrame(rows)


def extrapolation_table(ppl: pd.DataFrame) -> pd.DataFrame:
    """Mean tail perplexity, one row per variant (in EXTRAPOLATION_VARIANTS order), one column per length."""
    table = ppl.groupby(["length", "variant"], sort=False).ppl.mean().unstack("length")
    return table.loc[[v for v in EXTRAPOLATION_VARIANTS if v in table.index]]


def conclusion(acc: pd.DataFrame, diffs: pd.DataFrame, chosen: Sequence[str], router_loss: Sequence[float],
               latency: pd.DataFrame, extrapolation: pd.DataFrame, window: int, timed_on: str) -> str:
    """Notebook 6's reading, every number from its tables: per task the unmodified model and every
    method's paired difference to the baseline and to PI with its MDE and verdict, the methods left
    out (named), the MoICE router's training, the latency ratios with their interquartile ranges and
    the extrapolation perplexities (one window per length: no interval)."""
    lines = []
    for task, t in acc.groupby("task", sort=False):
        base = t[t.method == "baseline"].sort_values("position")
        d = diffs[diffs.task == task]
        lines.append(f"**{task}** (n = {int(t['n'].min())} records per position): unmodified "
                     f"{' / '.join(f'{100 * v:.0f}' for v in base['mean'])} % (λ {base['fitness'].iloc[0]:.3f}); "
                     f"the paired MDE is {d['mde_80'].min():.2f}–{d['mde_80'].max():.2f} λ.")
        lines += [f"- {difference_text(r)}" for _, r in d.iterrows()]
        missing = [m for m in chosen if m not in set(t.method)]
        if missing:
            lines.append(f"- left out (their layouts pass the {window:,}-position window): {', '.join(missing)}")
    lines.append(f"\n**MoICE's router** (the only trained method): answer loss {np.mean(router_loss[:5]):.2f} → "
                 f"{np.mean(router_loss[-5:]):.2f} (mean of the first / last five of {len(router_loss)} steps).")
    base_s = latency.loc[latency.variant == "baseline", "median_s"].iloc[0]
    lines.append(f"\n**Latency** ({timed_on}; median ratio to the baseline's {base_s:.2f} s per prompt, interquartile range of the "
                 "per-round ratios): " + "; ".join(f"{r['variant']} {r['median_ratio']:.2f}× ({r['q25_ratio']:.2f}–{r['q75_ratio']:.2f})"
                                                  for _, r in latency.sort_values("median_ratio").iterrows()
                                                  if r["variant"] != "baseline") + ".")
    table = extrapolation_table(extrapolation)
    lengths = list(table.columns)
    lines += [f"\n**Perplexity of the tail** (one window per length: indicative, no interval; trained window {window:,}):", "",
              "| variant | " + " | ".join(f"{n:,}{' (beyond)' if n > window else ''}" for n in lengths) + " |",
              "|---|" + "---|" * len(lengths)]
    lines += [f"| {v} | " + " | ".join(f"{p:.2f}" for p in row) + " |" for v, row in table.iterrows()]
    return "\n".join(lines)

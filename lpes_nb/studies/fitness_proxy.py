"""Is a cheaper fitness good enough to search with? The check the LPES test (issue "LPES at power")
asks for before a search may use one: over ``k`` >= 15 candidate curves, the rank correlation of the
real fitness (λ-weighted accuracy at begin / middle / end, answers generated and judged as the
original evaluation) with the proxy (the same weights over the gold answer's teacher-forced
log-probability), Spearman's ρ with its interval (:func:`lpes_nb.evaluation.fitness.proxy_agreement`), and
each fitness's split-half reliability over the records (:func:`lpes_nb.evaluation.fitness.split_half_reliability`):
how alike each ranks the candidates on two disjoint halves of the records (a search on a fitness
that does not chases sampling noise).

The candidates are drawn uniformly from the search's Bézier space (seeded), and evaluated on the
*search* part of the data split only (:mod:`lpes_nb.store.splits`). One generate-mode run with the gold
log-probability beside gives both fitnesses. Every (candidate, record) is stored as it finishes
(one record table per candidate), record by record with every candidate on it, so a stopped run
resumes where it stopped and what it holds already ranks all candidates.

Run: ``lpes fitness-proxy --dataset mdqa20 --candidates 15 --records 20 --dtype bfloat16``
(Qwen by default).
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from ..core.methods import LayerScales
from ..evaluation.evaluate import evaluate_samples
from ..evaluation.fitness import proxy_agreement, split_half_reliability, weighted_fitness
from ..evaluation.prefix import check_chunk
from ..store import splits
from ..store.data import kv_sample, mdqa_sample, positions_for
from ..store.models import QWEN, dtype_name, load_model, load_tokenizer, model_key, resolve_dtype
from ..store.results import RecordTable, output_dir, will_compute, write_csv, write_json
from .position_map import load_records, record_settings
from .search import bezier_space

VERSION = 1  # bump when the code behind a stored record changes
PREFILL_CHUNK = 512  # continuations in pieces (lpes_nb.evaluation.prefix._pieces): a new study has no one-pass cells to match


def fitness_positions(items: int) -> tuple[int, int, int]:
    """Begin, middle, end: the three gold positions the search's fitness uses (also the map's first, middle, last)."""
    return tuple(positions_for(items, 3))


def candidates(model, k: int, seed: int = 0) -> list[list[float]]:
    """``k`` per-layer scale curves drawn uniformly from the search's Bézier space."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1 (candidates), got {k!r}")
    space, rng = bezier_space(model), np.random.default_rng(seed)
    return [[round(float(s), 10) for s in space.decode(space.random(rng))] for _ in range(k)]


def candidate_table(model_name: str, dtype: str, dataset: str, items: int, scales, batch_size: int, profile: str,
                    prefill_chunk: int | None, model=None) -> RecordTable:
    """Where one candidate's rows live, record by record (``model``: as :func:`lpes_nb.studies.position_map.record_table`'s)."""
    settings = record_settings(splits.FILES[dataset][0], batch_size)
    params = {**model_key(model_name, model, dtype), "dataset": dataset, "items": items, "positions": list(fitness_positions(items)),
              "scales": list(scales), "max_new_tokens": settings.max_new_tokens, "stop_at_newline": settings.stop_at_newline,
              "batch_size": batch_size, "prefill_chunk": prefill_chunk, "version": VERSION}
    return RecordTable("fitness_proxy_records", params, profile)


def run(model, tokenizer, model_name: str, dtype: str, dataset: str, k: int, n: int, seed: int = 0, items: int | None = None,
        batch_size: int = 8, prefill_chunk: int | None = PREFILL_CHUNK, profile: str = "cpu", data_dir=None,
        progress: bool = True) -> tuple[pd.DataFrame, dict]:
    """The ``k`` candidates on the first ``n`` records of ``dataset``'s search part (MDQA with ``items``
    documents, default the file's 20; KV with all the file's pairs): per candidate its real and
    proxy fitness, and their rank agreement."""
    if dataset not in splits.FILES:
        raise ValueError(f"unknown dataset {dataset!r}; choose one of {sorted(splits.FILES)}")
    task, in_file = splits.FILES[dataset]
    items = in_file if items is None else items
    if task == "kv" and items != in_file:
        raise ValueError(f"{dataset} records hold {in_file} pairs, each prompt all of them; got items={items}")
    if task == "mdqa" and not 3 <= items <= in_file:
        raise ValueError(f"items must be in [3, {in_file}] documents for {dataset}, got {items}")
    check_chunk(prefill_chunk)
    ids, data, positions = splits.records(dataset, "search", n), load_records(task, in_file, data_dir), fitness_positions(items)
    pool = [(scales, candidate_table(model_name, dtype, dataset, items, scales, batch_size, profile, prefill_chunk, model))
            for scales in candidates(model, k, seed)]
    # record by record, every candidate on it: a run stopped at any moment holds all candidates on
    # the records it finished, which already rank them
    done = [table.done() for _, table in pool]  # read each store once, not once per record
    for r in tqdm(ids, desc=f"{dataset} search records x {k} candidates", disable=not progress):
        for (scales, table), stored in zip(pool, done):
            if r in stored:
                continue
            will_compute("fitness_proxy_records", table.path)
            samples = [mdqa_sample(data[r], g, items, r) if task == "mdqa" else kv_sample(data[r], g, r) for g in positions]
            df = evaluate_samples(model, tokenizer, samples, LayerScales(scales), record_settings(task, batch_size), progress=False,
                                  gold_logprob=True, prefill_chunk=prefill_chunk)
            table.append(r, df.to_dict(orient="records"))
    tables = [table.frame(ids) for _, table in pool]
    rows = [{"candidate": c, "real": weighted_fitness(t), "proxy": weighted_fitness(t, value="gold_logprob"), "records": len(ids),
             "scales": scales} for c, ((scales, _), t) in enumerate(zip(pool, tables))]
    agreement = proxy_agreement(tables)  # refuses candidates that cannot be ranked, whatever the record count
    # how alike each fitness ranks the candidates on disjoint halves of the records (needs >= 4 records)
    reliability = (None if len(ids) < 4 else
                   {"real": split_half_reliability(tables), "proxy": split_half_reliability(tables, "gold_logprob")})
    return pd.DataFrame(rows), {**agreement, "reliability": reliability}


def summary_paths(profile: str, dataset: str, items: int, model_name: str, dtype: str):
    """Where the per-candidate table (CSV) and the agreement (JSON) go. Suffixes are appended, not
    swapped: model names hold dots ("qwen2.5-coder-0.5b"), which ``Path.with_suffix`` would cut."""
    stem = f"fitness_proxy_{dataset}_{items}_{model_name}_{dtype}"
    folder = output_dir("results", profile)
    return folder / f"{stem}.csv", folder / f"{stem}.json"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="lpes fitness-proxy", description=__doc__)
    parser.add_argument("--dataset", default="mdqa20", choices=sorted(splits.FILES))
    parser.add_argument("--items", type=int, help="MDQA: documents per prompt (default the file's 20)")
    parser.add_argument("--candidates", type=int, default=15)
    parser.add_argument("--records", type=int, default=20, help="the first N records of the search part")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=QWEN)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--prefill-chunk", type=int, metavar="T", default=PREFILL_CHUNK)
    parser.add_argument("--profile", default="cpu")
    args = parser.parse_args(argv)
    model, tokenizer = load_model(args.model, dtype=args.dtype), load_tokenizer(args.model)
    dtype = dtype_name(resolve_dtype(args.dtype))
    per_candidate, agreement = run(model, tokenizer, args.model, dtype, args.dataset, args.candidates, args.records, args.seed,
                                   args.items, args.batch_size, args.prefill_chunk, args.profile)
    csv_path, json_path = summary_paths(args.profile, args.dataset, args.items or splits.FILES[args.dataset][1], args.model, dtype)
    write_csv(csv_path, per_candidate)
    write_json(json_path, {**agreement, "records": args.records, "seed": args.seed, "prefill_chunk": args.prefill_chunk})
    print(per_candidate.drop(columns="scales").round(4).to_string(index=False))
    print(f"Spearman rho {agreement['rho']:.3f} [{agreement['ci_low']:.3f}, {agreement['ci_high']:.3f}] over "
          f"{agreement['candidates']} candidates, {args.records} records each")
    if agreement["reliability"] is None:
        print("split-half reliability: not computed, it needs >= 4 records")
    for name, r in (agreement["reliability"] or {}).items():
        print(f"{name} fitness ({r['value']}): split-half rho {r['half_rho']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] "
              f"(mean of {r['ranked_splits']} halvings, {r['candidates']} candidates), reliability at {r['records']} records "
              f"{r['reliability']:.3f}")

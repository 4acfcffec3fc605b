"""The search where the position map shows a middle deficit (notebook 9): LPES against PI with the
same mean scale and against the unmodified model, in the one regime (model, task, length) with the
largest deficit that passes the map's criterion, and nowhere else.

Per search task: the unmodified model's fitness on the search set (the line a search must clear,
with its SE), a Bézier GA per seed (accuracy fitness, the gold answer's log-probability as
tie-break), and every best curve and its PI twin re-scored on a disjoint test set, paired with the
unmodified model and with its PI twin on the same records (record-clustered bootstrap, minimum
detectable effect at 80 % power). With ``transfer`` the same is done on the other of KV / MDQA at
the length closest to the regime, and every curve is tested on both tasks' test sets: a curve found
on KV, tested on MDQA, and the reverse."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from ..evaluation.fitness import paired_fitness_difference
from ..evaluation.tasks import TASKS
from ..store.models import load_model, load_tokenizer, model_key
from ..store.results import cached_table, output_dir, write_csv
from .position_map import FIXED_CELLS
from .profiles import PositionMap, RegimeSearch
from .search import SearchRun, bezier_space, reference_fitness, run_search, scales_samples

TRANSFER = {"kv": "mdqa", "mdqa": "kv"}


def choose_regime(table: pd.DataFrame, deficits: pd.DataFrame, rs: RegimeSearch) -> dict | None:
    """The map cell to search: among the fixed-n cells of the map ``table`` whose paired gate on
    accuracy (``deficits``, :func:`lpes_nb.studies.position_map.deficit_table`) calls a U, the one with the
    largest ends − middle difference; with ``rs.require_u=False`` (dry runs on random models only) the
    largest difference whatever the verdict. None where no cell qualifies. Returns the cell's middle
    row of ``table`` with the gate's estimate, interval, MDE, Holm p and verdict beside it."""
    gated = deficits[(deficits["source"] == FIXED_CELLS) & (deficits["value"] == "correct")]
    if rs.require_u:
        gated = gated[gated["verdict"].str.startswith("U")]
    if gated.empty:
        return None
    best = gated.loc[gated["ends_minus_middle"].idxmax()]
    names = table["model"] + " " + table["dtype"] + " " + table["task"] + "-" + table["num_items"].astype(str)
    row = table[(names == best["cell"]) & (table["relative_position"] == 0.5)]
    if row.empty:
        raise ValueError(f"the gated cell {best['cell']!r} is not in the map table ({sorted(set(names))})")
    gate_columns = ["ends_minus_middle", "ends_minus_middle_ci_low", "ends_minus_middle_ci_high", "ends_minus_middle_mde",
                    "p_holm", "verdict"]
    return {**row.iloc[0].to_dict(), **best[gate_columns].to_dict()}


def search_tasks(table: pd.DataFrame, regime: dict, rs: RegimeSearch) -> list[tuple[str, int]]:
    """(task, num_items) to search: the regime's, and with ``transfer`` the other of KV / MDQA on the
    same model at the map's length closest to the regime's (if the map has that task)."""
    tasks = [(regime["task"], int(regime["num_items"]))]
    other = TRANSFER.get(regime["task"])
    if rs.transfer and other:
        cells = table[(table.model == regime["model"]) & (table.dtype == regime["dtype"]) & (table.task == other)]
        if not cells.empty:
            closest = cells.loc[(cells.length_tokens - regime["length_tokens"]).abs().idxmin()]
            tasks.append((other, int(closest.num_items)))
    return tasks


def run_regime_search(spec: PositionMap, rs: RegimeSearch, table: pd.DataFrame, regime: dict, profile: str,
                      progress: bool = True) -> dict[str, pd.DataFrame]:
    """Run (or read back) the search in ``regime`` (the map ``table``'s cell that :func:`choose_regime`
    picked). Returns the tables ``references`` (unmodified model on each search set), ``searches``
    (best fitness per task and seed), ``scales`` (the curves) and ``differences`` (paired Δλ on each
    test set, with the share of the method's answers that ran out of new tokens), the last also
    written to ``regime_search.csv``."""
    model_name, dtype = regime["model"], regime["dtype"]
    (m,) = [m for m in spec.models if m.model == model_name]
    model, tokenizer = load_model(model_name, dtype=m.dtype), load_tokenizer(model_name)
    layers = model.config.num_hidden_layers
    out = output_dir("results", profile) / "regime_search"
    key = {**model_key(model_name, model, dtype), "search": repr(rs)}
    tasks = search_tasks(table, regime, rs)

    references, searches, curves = [], [], {}
    for task, items in tasks:
        search_cfg, _ = rs.split(task, items)
        samples, settings = search_cfg.samples(), TASKS[task].settings(spec.batch_size)
        ref = cached_table("regime_search_reference", {**key, "task": repr(search_cfg)},
                           lambda: reference_fitness(model, tokenizer, samples, settings), profile)
        references.append(ref.assign(task=task, num_items=items))
        for seed in rs.seeds:
            name = f"regime_{task}{items}_s{seed}"
            res = run_search(model, tokenizer, search_cfg, bezier_space(model),
                             SearchRun(replace(rs.ga, seed=seed), out, name, settings, tie_break=rs.tie_break),
                             model_name=model_name, progress=progress)
            best = [float(s) for s in res.best_scales]
            curves[f"LPES {task} s{seed}"] = best
            curves[f"PI {task} s{seed}"] = [float(np.mean(best))] * layers  # PI with the curve's mean scale
            searches.append({"task": task, "num_items": items, "seed": seed, "best_fitness": res.best_fitness,
                             "evaluations": res.evaluations})

    differences = []
    for task, items in tasks:  # every curve on every test set: its own task's, and the transfer
        _, test_cfg = rs.split(task, items)
        settings = TASKS[task].settings(spec.batch_size)
        per_sample = cached_table("regime_search_test", {**key, "task": repr(test_cfg), "curves": curves},
                                  lambda: scales_samples(model, tokenizer, test_cfg.samples(), {"baseline": None, **curves},
                                                         settings, progress), profile)
        for label in curves:
            if label.startswith("LPES"):
                for ref in ("baseline", label.replace("LPES", "PI", 1)):
                    differences.append({"test_task": task, "test_items": items, "searched_on": label.split()[1],
                                        **paired_fitness_difference(per_sample, label, ref),
                                        "truncated": float(per_sample.loc[per_sample.method == label, "truncated"].mean())})
    differences = pd.DataFrame(differences)
    write_csv(output_dir("results", profile) / "regime_search.csv", differences.round(4))
    return {"references": pd.concat(references, ignore_index=True),
            "searches": pd.DataFrame(searches), "scales": pd.DataFrame(curves), "differences": differences}

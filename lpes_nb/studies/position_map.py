"""Where lost-in-the-middle lives: the unmodified model's accuracy by relative gold position × prompt
length (notebook 9).

Every cell (model, dtype, task, length) is one stored per-sample table (``position_map_samples``,
keyed by its parameters), so a long map resumes cell by cell and a longer ladder computes only its new
cells. Each task is judged as its original evaluation judges it (``TASKS[task].settings()``: KV
looks for the value anywhere in up to 32 new tokens — the record cells on the original UUID files in
up to 100, as lost-in-the-middle; MDQA takes the first line of up to 100; the two-fact task the first
line of up to 16), and every answer carries the copy control (does it hold
the first / last context item, whatever the gold position) and whether it ran out of tokens.

Run it from the command line (resumable, progress per cell):
``lpes map --profile cpu [--model smollm2-135m]``."""

from __future__ import annotations

import argparse
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from ..core.methods import Method
from ..evaluation.distributed import distributed_fitness
from ..evaluation.evaluate import encode, evaluate_samples, gold_scores
from ..evaluation.fitness import relative_positions
from ..evaluation.metrics import proportion_ci, u_shape_rho
from ..evaluation.position_gate import gate
from ..evaluation.tasks import ORIGINAL_ANSWER_TOKENS, TASKS, EvalSettings, TaskConfig, scoring_key
from ..store.data import KV_FILES, closed_book_sample, kv_sample, load_kv, load_mdqa, mdqa_sample, oracle_sample
from ..store.models import absent, dtype_name, load_model, load_tokenizer, model_key, resolve_dtype
from ..store.results import RecordTable, cached_table, output_dir, reading_only, will_compute, write_csv
from .benchmarks import method_key
from .profiles import POSITIONAL, MapModel, PositionMap, RecordCell, profile as named_profile  # `profile`: every study's argument

RELATIVE_POSITIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
LENGTH_TASKS = ("kv", "two_fact_block")  # their length is set by the number of items; MDQA's by its documents
VERSION = 1  # bump when the code behind a stored cell changes
MDQA_TOKENS_PER_DOC = 160  # about, for ordering the cells by cost
KV_TOKENS_PER_PAIR = 70  # about, for the file's UUID pairs (Qwen's tokenizer: 75 pairs 5.1k tokens; Llama's ~5.5k)
FIXED_CELLS, RECORD_CELLS = "map cells (fixed n)", "record cells"  # the deficit table's sources


def at_positions(cfg: TaskConfig) -> TaskConfig:
    """``cfg`` at the map's gold positions: the items nearest the relative positions 0, ¼, ½, ¾, 1."""
    positions = tuple(sorted({round(r * (cfg.num_items - 1)) for r in RELATIVE_POSITIONS}))
    return replace(cfg, positions=positions)


def items_for_length(task: str, tokens: int, tokenizer, n: int, seed: int, data_dir=None) -> TaskConfig:
    """The task setting whose prompts are about ``tokens`` long (number of KV pairs or filler
    sentences, from the measured tokens per item of this tokenizer), at the map's positions."""
    def length(items: int) -> float:
        cfg = TaskConfig(task, items, n=3, seed=seed)
        return float(np.mean([len(encode(tokenizer, s, False)) for s in cfg.samples(data_dir)]))

    lo, hi = 8, 64
    at_lo, at_hi = length(lo), length(hi)
    items = max(5, round(hi + (tokens - at_hi) * (hi - lo) / (at_hi - at_lo)))
    return at_positions(TaskConfig(task, items, n=n, seed=seed))


def map_cells(spec: PositionMap, m: MapModel, tokenizer) -> list[TaskConfig]:
    """The task settings of model ``m``'s cells in ``spec``, cheapest first (``tokenizer``: ``m``'s,
    which sizes the length-set tasks)."""
    cfgs = [(length, items_for_length(task, length, tokenizer, spec.n, spec.seed)) for length in m.lengths for task in LENGTH_TASKS]
    cfgs += [(docs * MDQA_TOKENS_PER_DOC, at_positions(TaskConfig("mdqa", docs, n=spec.n, offset=spec.mdqa_offset)))
             for docs in m.mdqa_docs]
    # shortest (cheapest) first, so that an interrupted map holds every short cell; two short
    # lengths can need the same minimum of items
    return list(dict.fromkeys(c for _, c in sorted(cfgs, key=lambda lc: lc[0])))


def cell_samples(model, tokenizer, model_name: str, dtype: str, cfg: TaskConfig, batch_size: int, profile: str,
                 progress: bool = True) -> pd.DataFrame:
    """The per-sample table of one cell (computed once, then read from the store)."""
    settings = TASKS[cfg.task].settings(batch_size)
    params = {**model_key(model_name, model, dtype), "task": repr(cfg), "settings": repr(settings), "version": VERSION}
    return cached_table("position_map_samples", params,
                        lambda: evaluate_samples(model, tokenizer, cfg.samples(), settings=settings, progress=progress),
                        profile)


RECORDS_VERSION = 1  # bump when the code behind a stored record changes


def record_settings(task: str, batch_size: int) -> EvalSettings:
    """How a record cell answers: as the task's original evaluation, with its budget of new tokens
    (:data:`~lpes_nb.evaluation.tasks.ORIGINAL_ANSWER_TOKENS`: a UUID value does not fit in the KV task's 32)."""
    settings = TASKS[task].settings(batch_size)
    return replace(settings, max_new_tokens=max(settings.max_new_tokens, ORIGINAL_ANSWER_TOKENS))


def record_table(model_name: str, dtype: str, task: str, items: int, batch_size: int, profile: str,
                 prefill_chunk: int | None = None, model=None, method: Method | None = None,
                 gold_withdrawn: bool = False) -> RecordTable:
    """Where the map's rows of one model, dtype, task and size live, record by record (``model``:
    ``model_name`` loaded in ``dtype``, where the caller holds it; else it is loaded for its key);
    with ``method``, the same cell under that method (None: the unmodified model, the map itself);
    ``gold_withdrawn``: the key a KV cell had before its answer forms (:class:`RecordCell`)."""
    settings = record_settings(task, batch_size)
    positions = list(at_positions(TaskConfig(task, items)).positions)
    if task == "mdqa":
        params = {**model_key(model_name, model, dtype), "task": "mdqa", "num_docs": items, "positions": positions,
                  "conditions": ["documents", "closed_book", "oracle"]}
    else:
        params = {**model_key(model_name, model, dtype), "task": task, "num_pairs": items, "positions": positions,
                  "conditions": [POSITIONAL[task]], "key_format": "uuid", **({} if gold_withdrawn else scoring_key([task]))}
    params |= {"max_new_tokens": settings.max_new_tokens, "stop_at_newline": settings.stop_at_newline, "batch_size": batch_size,
               "shared_prefix": True, "gold_logprob": True, "version": RECORDS_VERSION}
    if prefill_chunk is not None:  # the cells stored before pieces existed keep their keys
        params["prefill_chunk"] = prefill_chunk
    if method is not None:  # likewise the map's own cells, of the unmodified model
        params |= {"method": method_key(method), "conditions": [POSITIONAL[task]]}
    return RecordTable("position_map_records", params, profile)


def record_rows(model, tokenizer, task: str, record: dict, record_id: int, items: int, batch_size: int,
                prefill_chunk: int | None = None, method: Method | None = None) -> list[dict]:
    """One real record in the map's record cell: its answers at the map's gold positions (MDQA with
    ``items`` documents, plus closed-book and oracle; KV with its ``items`` pairs), column
    ``condition``, each judged as the original evaluation, with the copy control and the gold
    answer's teacher-forced log-probability. With ``method``: the record's positional prompts under
    it (the controls describe the unmodified model); a method that cannot share prefixes answers on
    the plain path and takes its gold log-probability from a teacher-forced scoring pass, the
    quantity the shared path computes beside decoding."""
    positions = at_positions(TaskConfig(task, items)).positions
    if task == "mdqa":
        samples = [mdqa_sample(record, g, items, record_id) for g in positions]
        if method is None:
            samples += [closed_book_sample(record, record_id), oracle_sample(record, record_id)]
    else:
        samples = [kv_sample(record, g, record_id) for g in positions]
    conditions = [POSITIONAL[task]] * len(positions) + ["closed_book", "oracle"][:len(samples) - len(positions)]
    settings = record_settings(task, batch_size)
    if method is None or method.shares_prefix:
        df = evaluate_samples(model, tokenizer, samples, method, settings, progress=False, gold_logprob=True, prefill_chunk=prefill_chunk)
    else:
        df = evaluate_samples(model, tokenizer, samples, method, settings, progress=False, prefill_chunk=prefill_chunk)
        scored = evaluate_samples(model, tokenizer, samples, method, replace(settings, mode="score"), progress=False)
        df["gold_logprob"] = scored["gold_logprob"].to_numpy()
    df["condition"] = conditions
    return df.to_dict(orient="records")


def rescore_cell(model, tokenizer, model_name: str, dtype: str, task: str, items: int, records, batch_size: int, profile: str,
                 prefill_chunk: int | None = None, progress: bool = True, data_dir=None) -> pd.DataFrame:
    """A KV cell stored before its task's answer forms (:class:`~lpes_nb.studies.profiles.RecordCell`'s
    ``gold_withdrawn``), carried to the key of a cell computed now: each record's stored answers (greedy
    decoding does not depend on the target) with its gold columns scored again under the written forms
    (:func:`lpes_nb.evaluation.evaluate.gold_scores`: the shared path's own scoring), appended record by record
    (resumable). Records the old cell lacks are refused; records the new cell holds are not redone."""
    old = record_table(model_name, dtype, task, items, batch_size, profile, prefill_chunk, model, gold_withdrawn=True)
    new = record_table(model_name, dtype, task, items, batch_size, profile, prefill_chunk, model)
    if new.path == old.path:
        raise ValueError(f"the {task} task scores its answers as given (no answer_forms of its own): the stored cell's gold "
                         "columns are what a fresh cell computes, nothing to re-score")
    records, stored = [int(r) for r in records], old.done()
    lacking = sorted(set(records) - stored)
    if lacking:
        raise ValueError(f"{task}-{items}: record(s) {lacking[:5]} are not in {old.path.name}: compute them with record_cell")
    todo = [r for r in records if r not in new.done()]
    if todo:
        will_compute("position_map_records (re-scored gold)", new.path)
    data = load_records(task, items, data_dir)
    for r in tqdm(todo, desc=f"{task}-{items}: gold re-scored, {model_name}", disable=not progress or not todo):
        rows = old.frame([r]).to_dict(orient="records")
        samples = [kv_sample(data[r], row["position"], r) for row in rows]
        for row, (first, logprob) in zip(rows, gold_scores(model, tokenizer, samples, prefill_chunk)):
            row.update(gold_first=float(first), gold_logprob=logprob)
        new.append(r, rows)
    return new.frame(records)


def load_records(task: str, items: int, data_dir=None) -> list[dict]:
    """The real records of a record cell's task (MDQA: the 441 20-document records; KV: the file of ``items`` pairs)."""
    return load_mdqa(None, data_dir) if task == "mdqa" else load_kv(None, data_dir, items)


@dataclass(frozen=True)
class RecordWorker:
    """What a worker needs to evaluate records itself (picklable; it loads the model once):
    the factory of :func:`lpes_nb.evaluation.distributed.distributed_fitness` for the map's record cells."""

    model_name: str
    dtype: str
    task: str
    items: int
    batch_size: int
    data_dir: str | None = None
    prefill_chunk: int | None = None
    method: Method | None = None

    def __call__(self):
        model, tokenizer = load_model(self.model_name, dtype=self.dtype), load_tokenizer(self.model_name)
        data = load_records(self.task, self.items, self.data_dir)
        return lambda r: record_rows(model, tokenizer, self.task, data[r], r, self.items, self.batch_size, self.prefill_chunk,
                                     self.method)


def record_cell(model, tokenizer, model_name: str, dtype: str, task: str, items: int, records, batch_size: int, profile: str,
                progress: bool = True, data_dir=None, backend: str = "in-process", workers: int = 2,
                ray_address: str | None = None, prefill_chunk: int | None = None, method: Method | None = None,
                gold_withdrawn: bool = False) -> pd.DataFrame:
    """The map's cell of ``task`` (``"mdqa"`` with ``items`` documents, ``"kv"`` with ``items``
    pairs) on the given real records (ids into the file), each as :func:`record_rows`. Stored record
    by record as each finishes (resumable; records already stored are read, not recomputed).
    ``backend``: ``"in-process"`` evaluates with ``model`` here; ``"processes"`` / ``"ray"`` shard
    the records over ``workers`` workers of the GA's backends (:mod:`lpes_nb.evaluation.distributed`), each
    loading ``model_name`` once (``model`` may then be None); this process alone writes the store.
    ``prefill_chunk``: as :class:`~lpes_nb.studies.profiles.RecordCell`'s (part of the cell's key).
    ``method``: the cell under a method (:func:`record_rows`), stored apart from the map's.
    ``gold_withdrawn``: read a cell stored before its task's answer forms (:class:`RecordCell`): its
    gold columns come back empty (NaN), and records it lacks are refused, never computed."""
    RecordCell(model_name, dtype, items, 1, task, prefill_chunk, gold_withdrawn)  # validates task, items, chunk
    table = record_table(model_name, dtype, task, items, batch_size, profile, prefill_chunk, model, method, gold_withdrawn)
    records = [int(r) for r in records]
    done, data = table.done(), load_records(task, items, data_dir)
    bad = [r for r in records if not 0 <= r < len(data)]
    if bad:
        raise ValueError(f"{task} record ids must be in [0, {len(data) - 1}], got {bad[:5]}")
    todo = [r for r in records if r not in done]
    if todo and gold_withdrawn:
        raise ValueError(f"{task}-{items}: {len(todo)} record(s) (first: {todo[0]}) are not in {table.path.name}, a cell stored "
                         "before the KV answer forms; it is read, never extended: compute the cell without gold_withdrawn")
    if todo:
        will_compute("position_map_records", table.path)
    if todo and model is None and backend == "in-process":
        raise FileNotFoundError(f"{task}-{items}, {model_name}: {len(todo)} record(s) (first: {todo[0]}) are not stored and the "
                                "model is not loaded here; install and load it to compute them")
    with ExitStack() as stack:
        if backend == "in-process" or not todo:
            results = (record_rows(model, tokenizer, task, data[r], r, items, batch_size, prefill_chunk, method) for r in todo)
        else:
            factory = RecordWorker(model_name, dtype, task, items, batch_size, None if data_dir is None else str(data_dir),
                                   prefill_chunk, method)
            pool = stack.enter_context(distributed_fitness(factory, backend, workers, ray_address, progress=False))
            results = pool.map_items(todo)
        for r, rows in tqdm(zip(todo, results), total=len(todo), desc=f"{task}-{items} records, {model_name}",
                            disable=not progress or not todo):
            table.append(r, rows)
    frame = table.frame(records)
    return frame.assign(gold_logprob=np.nan, gold_first=np.nan) if gold_withdrawn else frame


def run_record_cells(spec: PositionMap, profile: str, progress: bool = True) -> dict[str, pd.DataFrame]:
    """Every record cell of ``spec`` (computed where missing), by name; each row carries ``model``
    and ``dtype``. One model load per model and dtype, also where every record is stored: the
    cell's key holds the weights' fingerprint."""
    out, loaded = {}, {}
    for cell in spec.record_cells:
        dtype = dtype_name(resolve_dtype(cell.dtype))
        if (cell.model, dtype) not in loaded:
            # a model installed on demand and absent here: its stored records are read by its recorded key
            loaded = {(cell.model, dtype): (None, None) if absent(cell.model) else (load_model(cell.model, dtype=cell.dtype),
                                                                                    load_tokenizer(cell.model))}
        model, tokenizer = loaded[(cell.model, dtype)]
        frame = record_cell(model, tokenizer, cell.model, dtype, cell.task, cell.items, range(cell.n), spec.batch_size, profile,
                            progress, prefill_chunk=cell.prefill_chunk, gold_withdrawn=cell.gold_withdrawn)
        out[cell.name] = frame.assign(model=cell.model, dtype=dtype)
    return out


def positional_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of a record cell with the gold item at a position (not closed-book / oracle), with
    their nominal relative position and record id."""
    return with_nominal_positions(frame[frame["condition"].isin(POSITIONAL.values())])


def record_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per condition and gold position of one record cell: n, accuracy with its Wilson 95 % interval,
    the mean gold log-probability, the truncated share."""
    rows = []
    for (condition, position), group in frame.groupby(["condition", "position"], sort=False):
        k, n = int(group["correct"].sum()), len(group)
        low, high = proportion_ci(k, n)
        positional = condition in POSITIONAL.values()
        rows.append({"condition": condition, "gold_index": int(position),
                     "relative_position": position / (group["num_items"].iloc[0] - 1) if positional else np.nan,
                     "n": n, "accuracy": k / n, "ci_low": low, "ci_high": high,
                     "gold_logprob": group["gold_logprob"].mean(), "truncated": group["truncated"].mean()})
    return pd.DataFrame(rows)


PAPERS = Path(__file__).resolve().parents[2] / "data" / "papers"
# which of the papers' baseline curves each record cell is read against: (task, items) -> rows of
# (table, selection, label); the same layout where the papers have it, else the nearest, named
PAPER_ROWS = {
    ("mdqa", 20): (("lpes", {"model": "Qwen2.5-7B", "task": "mdqa"}, "LPES Table 1: Qwen2.5-7B, 20 documents (n = 500)"),
                   ("caliope", {"model": "Qwen-2.5-14B", "chunks": 20, "metric": "substring_match"},
                    "CALIOPE Table 5: Qwen-2.5-14B, 20 chunks, substring match (3 × 500)")),
    ("mdqa", 10): (("lpes", {"model": "Vicuna-7B-v1.5", "task": "mdqa"}, "LPES Table 1: Vicuna-7B, 10 documents (n = 500)"),),
    ("kv", 75): (("lpes", {"model": "Qwen2.5-7B", "task": "kv"}, "LPES Table 1: Qwen2.5-7B, 150 pairs (n = 500)"),),
    ("kv", 140): (("lpes", {"model": "Qwen2.5-7B", "task": "kv"}, "LPES Table 1: Qwen2.5-7B, 150 pairs (n = 500)"),),
}


def paper_curves(task: str, items: int) -> pd.DataFrame:
    """The papers' unmodified-model curves a record cell is read against (:data:`PAPER_ROWS`), as data
    (``data/papers``): one row per curve and relative position, with its ``label`` and the paper's
    ends − middle gap in points (the middle: the position(s) nearest 0.5). No rows where the papers
    report no curve at this layout (the conclusion then says the cell is not comparable)."""
    if (task, items) not in PAPER_ROWS:
        return pd.DataFrame(columns=["model", "relative_position", "accuracy_percent", "label", "ends_minus_middle"])
    tables = {"lpes": pd.read_csv(PAPERS / "lpes_table1.csv").query("method == 'Baseline'"),
              "caliope": pd.read_csv(PAPERS / "caliope_tables.csv").query("method == 'Identity'")}
    frames = []
    for table, selection, label in PAPER_ROWS[(task, items)]:
        rows = tables[table]
        rows = rows[np.logical_and.reduce([rows[k] == v for k, v in selection.items()])].sort_values("relative_position")
        acc, centre = rows["accuracy_percent"].to_numpy(), (rows["relative_position"] - 0.5).abs().to_numpy()
        gap = (acc[0] + acc[-1]) / 2 - acc[centre == centre.min()].mean()
        frames.append(rows[["model", "relative_position", "accuracy_percent"]].assign(label=label, ends_minus_middle=gap))
    return pd.concat(frames, ignore_index=True)


def record_cell_conclusion(cell: RecordCell, frame: pd.DataFrame, deficits: pd.DataFrame, window: int) -> str:
    """The Markdown verdict of one record cell, every number from the tables given: our curve with
    its n, closed-book and oracle (MDQA), the paired gate on accuracy and on the gold log-probability,
    the papers' curves (:func:`paper_curves`), and whether their U is reproduced here."""
    summary = record_summary(frame)
    docs = summary[summary["condition"] == POSITIONAL[cell.task]].sort_values("relative_position")
    other = summary.set_index("condition")
    tokens = int(round(frame.loc[frame["condition"] == POSITIONAL[cell.task], "prompt_tokens"].mean()))
    gated = deficits[deficits["cell"] == cell.name].set_index("value")

    def pct(v):
        return f"{100 * v:.1f}"

    def gate_text(value: str, unit: float, name: str) -> str:
        if value not in gated.index:
            return (f"{name}: **withdrawn** (scored the value without the quotes the model writes, before the task "
                    "declared its answer forms; to be re-scored)")
        r = gated.loc[value]
        if not np.isfinite(r["ends_minus_middle_mde"]):
            return f"{name}: every record has the same difference at the first, middle and last position → **{r['verdict']}**"
        verdict = r["verdict"]  # the gate states a negative's MDE as a fraction; here in the unit printed beside it
        if verdict.startswith("no deficit at MDE"):
            verdict = f"no deficit at MDE {unit * r['ends_minus_middle_mde']:.2f}"
        return (f"{name}: ends − middle {unit * r['ends_minus_middle']:+.2f} [{unit * r['ends_minus_middle_ci_low']:+.2f}, "
                f"{unit * r['ends_minus_middle_ci_high']:+.2f}], MDE {unit * r['ends_minus_middle_mde']:.2f}, "
                f"first − last {unit * r['first_minus_last']:+.2f} [{unit * r['first_minus_last_ci_low']:+.2f}, "
                f"{unit * r['first_minus_last_ci_high']:+.2f}] (Holm p {r['first_minus_last_p_holm']:.2g}), ends − middle Holm p = "
                f"{r['p_holm']:.2g} → **{verdict}**")

    ours = gated.loc["correct", "verdict"]
    claim = ("reproduced" if ours.startswith("U") else
             "not comparable: every record answers alike at every position (ceiling or floor)" if ours.startswith("undetermined") else
             f"not reproduced at MDE {100 * gated.loc['correct', 'ends_minus_middle_mde']:.1f} points" if ours.startswith("no deficit")
             else f"not reproduced: the curve is {ours}")
    papers = paper_curves(cell.task, cell.items)
    what = f"MDQA with {cell.items} documents" if cell.task == "mdqa" else f"KV retrieval with {cell.items} UUID pairs"
    lines = [f"**{cell.model} ({frame['dtype'].iloc[0]}), {what}** (~{tokens:,} tokens, "
             f"{100 * tokens / window:.0f} % of its {window:,}-token window), n = {int(docs['n'].min())} records at each position:",
             f"- accuracy (first → last) {' / '.join(pct(a) for a in docs['accuracy'])} %"
             + (f"; closed-book {pct(other.loc['closed_book', 'accuracy'])} %, oracle {pct(other.loc['oracle', 'accuracy'])} %."
                if cell.task == "mdqa" else ".")]
    return "\n".join(lines + [
        "- Intervals: 95 %, paired by record, unadjusted; each shape word comes from the Holm-adjusted tests.",
        f"- {gate_text('correct', 100, 'accuracy (points)')}.",
        f"- {gate_text('gold_logprob', 1, 'gold log-probability (nats)')}.",
    ] + [f"- {label} (no intervals): {' / '.join(f'{a:.1f}' for a in curve['accuracy_percent'])} %, "
         f"ends − middle {curve['ends_minus_middle'].iloc[0]:+.1f} points." for label, curve in papers.groupby("label", sort=False)]
        + [f"- The papers' U on accuracy: **{claim}**." if len(papers) else
           f"- The papers report no curve for {cell.task} with {cell.items} items: **not comparable**."])


def map_conclusion(table: pd.DataFrame, deficits: pd.DataFrame, windows: dict[str, int], chosen: dict | None) -> str:
    """The Markdown reading of the fixed-n map, every number from the tables given (``table``:
    :func:`summarize`; ``deficits``: :func:`deficit_table`; ``windows``: each model's trained
    window; ``chosen``: the regime the search ran in, or None): per model how far the map reached, per
    cell its curve, the paired gate's verdict with its MDE, and the copy control where it explains a
    primacy."""
    gated = deficits[(deficits["source"] == FIXED_CELLS) & (deficits["value"] == "correct")].set_index("cell")
    lines = []
    for (model, dtype), m in table.groupby(["model", "dtype"], sort=False):
        longest = int(m["length_tokens"].max())
        lines.append(f"\n**{model} ({dtype})**: {m.groupby(['task', 'num_items']).ngroups} cells up to ~{longest:,} tokens "
                     f"({100 * longest / windows[model]:.1f} % of its {windows[model]:,}-token window), "
                     f"n = {int(m['n'].min())} records per cell and position.")
        for (task, items), cell in m.groupby(["task", "num_items"], sort=False):
            cell = cell.sort_values("relative_position")
            g = gated.loc[f"{model} {dtype} {task}-{items}"]
            curve = f"- {task}, {items} items (~{int(cell['length_tokens'].iloc[0]):,} tokens): " \
                    f"{' / '.join(f'{100 * a:.0f}' for a in cell['accuracy'])} % (first → last)"
            if not np.isfinite(g["ends_minus_middle_mde"]):
                text = f"{curve}; every record answers alike at the first, middle and last position: **undetermined (ceiling or floor)**"
            else:
                p = "< 0.001" if g["p_holm"] < 0.001 else f"= {g['p_holm']:.2g}"
                shape = "no deficit" if g["verdict"].startswith("no deficit") else g["verdict"]
                text = (f"{curve}; ends − middle {100 * g['ends_minus_middle']:+.1f} points [{100 * g['ends_minus_middle_ci_low']:+.1f}, "
                        f"{100 * g['ends_minus_middle_ci_high']:+.1f}], MDE {100 * g['ends_minus_middle_mde']:.1f}, Holm p {p} "
                        f"(first − last: Holm p {g['first_minus_last_p_holm']:.2g}) → **{shape}**")
            elsewhere = cell.loc[cell["relative_position"] > 0, "copies_first"].mean()
            if elsewhere >= 0.5:  # most answers hold the first item whatever the gold position
                text += (f"; {100 * elsewhere:.0f} % of the answers with the gold item elsewhere hold the first item's "
                         "text: position 0 is copying, not retrieval")
            lines.append(text + ".")
    lines.append("\nIntervals: 95 %, paired by record, unadjusted; each shape word comes from the Holm-adjusted tests.")
    lines.append("\n**The search** " + ("did not run: the paired gate calls no fixed-n cell a U on accuracy."
                                      if chosen is None else
                                      f"ran in {chosen['model']} {chosen['task']}-{chosen['num_items']} ({chosen['verdict']})."))
    return "\n".join(lines).strip()


def summarize(per_sample: pd.DataFrame) -> pd.DataFrame:
    """The map's table: one row per (model, dtype, task, length, relative position) with n, accuracy,
    its Wilson 95 % interval, the copy-control rates, the truncated rate, and CALIOPE's ρ of the cell
    (over its samples at all positions)."""
    rows = []
    keys = ["model", "dtype", "task", "num_items"]
    for (model, dtype, task, num_items), cell in per_sample.groupby(keys, sort=False):
        rel = relative_positions(cell)
        rho = u_shape_rho(rel, cell["correct"])
        length = int(round(cell["prompt_tokens"].mean()))
        # the nominal relative position whose gold index this is (round(r (N - 1)) is not exactly r (N - 1))
        nominal = np.asarray(RELATIVE_POSITIONS)[np.abs(rel[:, None] - np.asarray(RELATIVE_POSITIONS)).argmin(axis=1)]
        for (r, index), group in cell.assign(relative_position=nominal).groupby(["relative_position", "position"]):
            k, n = int(group["correct"].sum()), len(group)
            low, high = proportion_ci(k, n)
            rows.append({"model": model, "dtype": dtype, "task": task, "num_items": num_items, "length_tokens": length,
                         "relative_position": r, "gold_index": index, "n": n, "accuracy": k / n, "ci_low": low, "ci_high": high,
                         "copies_first": group["copies_first"].mean() if "copies_first" in group else np.nan,
                         "copies_last": group["copies_last"].mean() if "copies_last" in group else np.nan,
                         "truncated": group["truncated"].mean(), "rho": rho})
    return pd.DataFrame(rows)


def with_nominal_positions(per_sample: pd.DataFrame) -> pd.DataFrame:
    """The per-sample rows with their nominal relative position and the record id (column ``record``)."""
    rel = relative_positions(per_sample)
    nominal = np.asarray(RELATIVE_POSITIONS)[np.abs(rel[:, None] - np.asarray(RELATIVE_POSITIONS)).argmin(axis=1)]
    return per_sample.assign(relative_position=nominal, record=per_sample["sample"])


def stored_cells(profile: str) -> dict[str, pd.DataFrame]:
    """Every per-sample cell of the map in the store (the fixed-n cells of :func:`cell_samples`), by
    name "model dtype task-items" in that order (not the files' key order), each with nominal
    positions and record ids."""
    cells = []
    for csv in output_dir("results", profile).glob("position_map_samples-*.csv"):
        params = pd.read_json(csv.with_suffix(".json"), typ="series")
        df = pd.read_csv(csv)
        cells.append(((params["model"], params["dtype"], df["task"].iloc[0], int(df["num_items"].iloc[0])), with_nominal_positions(df)))
    return {f"{model} {dtype} {task}-{items}": df for (model, dtype, task, items), df in sorted(cells, key=lambda c: c[0])}


def record_gates(record_cells: dict[str, pd.DataFrame]) -> list[pd.DataFrame]:
    """The gate over the record cells (name -> rows of :func:`record_cell`): accuracy, and the gold
    log-prob where a cell has it, one Holm family per model and score, so that a model whose map still
    grows leaves another model's verdicts alone."""
    docs = {name: positional_rows(df) for name, df in record_cells.items()}
    scored = {name: df for name, df in docs.items() if df["gold_logprob"].notna().all()}
    return [gate({k: v for k, v in cells.items() if k.split()[0] == model}, value).assign(source=RECORD_CELLS)
            for value, cells in (("correct", docs), ("gold_logprob", scored))
            for model in dict.fromkeys(name.split()[0] for name in cells)]


def deficit_table(profile: str, record_cells: dict[str, pd.DataFrame] | None = None) -> pd.DataFrame:
    """The paired gate (:mod:`lpes_nb.evaluation.position_gate`) over the map: every stored fixed-n cell on
    accuracy, and every record-by-record cell (``record_cells``: name -> rows of
    :func:`record_cell`, positional rows) on accuracy and on the gold log-probability. Holm runs
    over the cells of one score (the record cells: of one model and score); a cell whose gold columns are withdrawn (:class:`RecordCell`) is
    gated on accuracy only. Written to ``position_deficits.csv``."""
    tables = [gate(stored_cells(profile)).assign(source=FIXED_CELLS)]
    if record_cells:
        tables += record_gates(record_cells)
    table = pd.concat(tables, ignore_index=True)
    write_csv(output_dir("results", profile) / "position_deficits.csv", table.round(5))
    return table


def run_map(spec: PositionMap, profile: str, models: tuple[str, ...] | None = None, progress: bool = True) -> pd.DataFrame:
    """Compute (or read) every cell, write ``position_length_map.csv`` and the per-sample table, and
    return the map's table. One model is loaded at a time."""
    frames = []
    chosen = [m for m in spec.models if models is None or m.model in models]
    for m in chosen:
        model, tokenizer = load_model(m.model, dtype=m.dtype), load_tokenizer(m.model)
        dtype = dtype_name(resolve_dtype(m.dtype))
        cells = map_cells(spec, m, tokenizer)
        for cfg in tqdm(cells, desc=f"map cells, {m.model}", disable=not progress or reading_only()):
            df = cell_samples(model, tokenizer, m.model, dtype, cfg, spec.batch_size, profile, progress)
            frames.append(df.assign(model=m.model, dtype=dtype, num_items=cfg.num_items))
        del model
    per_sample = pd.concat(frames, ignore_index=True)
    table = summarize(per_sample)
    if models is None:  # the whole map: the published table
        write_csv(output_dir("results", profile) / "position_length_map.csv", table.round(4))
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="lpes map", description=__doc__)
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--model", action="append", help="only this model's cells (repeatable)")
    parser.add_argument("--mdqa-records", type=int, metavar="N", help="instead: the record-by-record MDQA cell on "
                        "records 0..N-1 (--model, --dtype, --docs; resumable)")
    parser.add_argument("--kv-records", type=int, metavar="N", help="instead: the record-by-record KV cell of the original "
                        "UUID file of --pairs pairs on records 0..N-1 (--model, --dtype; resumable)")
    parser.add_argument("--rescore", action="store_true", help="with --kv-records: carry the KV cell stored before the "
                        "answer forms to a cell of today's key, its answers kept and its gold scores computed again")
    parser.add_argument("--pairs", type=int, default=75, choices=sorted(KV_FILES))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--docs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--prefill-chunk", type=int, metavar="T", help="record cells: continue each prompt from its "
                        "shared prefix in pieces of T tokens (faster for long prompts; part of the cell's key: give it "
                        "on every run of that cell)")
    parser.add_argument("--backend", default="in-process", choices=["in-process", "processes", "ray"],
                        help="--mdqa-records: shard the records over local processes or Ray actors")
    parser.add_argument("--workers", type=int, default=2, help="processes or Ray actors, each loading the model once")
    parser.add_argument("--ray-address", help="Ray: 'auto' joins a running cluster; none starts a local Ray")
    args = parser.parse_args(argv)
    if args.mdqa_records and args.kv_records:
        parser.error("--mdqa-records and --kv-records are separate runs: give one")
    if args.mdqa_records or args.kv_records:
        task, items, n = ("mdqa", args.docs, args.mdqa_records) if args.mdqa_records else ("kv", args.pairs, args.kv_records)
        name = (args.model or ["qwen2.5-coder-0.5b"])[0]
        here = args.backend == "in-process"
        model, tokenizer = (load_model(name, dtype=args.dtype), load_tokenizer(name)) if here else (None, None)
        dtype = dtype_name(resolve_dtype(args.dtype))
        if args.rescore:
            if task != "kv" or not here:
                parser.error("--rescore re-scores a KV cell in this process: give --kv-records N and no --backend")
            df = rescore_cell(model, tokenizer, name, dtype, task, items, range(n), args.batch_size, args.profile,
                              args.prefill_chunk)
            print(df.groupby("position")[["correct", "gold_first", "gold_logprob"]].mean().round(3).to_string())
            return
        df = record_cell(model, tokenizer, name, dtype, task, items, range(n), args.batch_size, args.profile,
                         backend=args.backend, workers=args.workers, ray_address=args.ray_address,
                         prefill_chunk=args.prefill_chunk)
        print(df.groupby(["condition", "position"])[["correct", "gold_logprob"]].mean().round(3).to_string())
        return
    spec = named_profile(args.profile).position_map
    run_map(spec, args.profile, tuple(args.model) if args.model else None)
    gated = deficit_table(args.profile, run_record_cells(spec, args.profile))
    print(gated[["cell", "value", "n", "ends_minus_middle", "ends_minus_middle_mde", "p_holm", "verdict"]].round(3).to_string(index=False))

"""LPES where the U is, at the power to see the paper's effect (the issue "LPES at power").

The position map's paired gate calls a U for Qwen2.5-Coder-0.5B on 20-document MDQA (the LPES paper's
Qwen setting, ~3k tokens of a 32k window), so the search runs there, on the *search* part of the
data split only (:mod:`lpes_nb.store.splits`; validation and test are other records). The GA has the paper's
operators and Eq. 8 weights at a CPU budget (population 16: 6 parents, 8 mutations, 2 crossovers;
6 generations; 8 search records). Its fitness weights the gold answer's teacher-forced log-probability at begin /
middle / end, not accuracy: on these records that proxy ranks candidate curves like the real
fitness (Spearman ρ 0.84 [0.56, 0.95] over 15 curves) and, unlike it, alike on two halves of the
records (split-half ρ 0.92 against 0.22 for accuracy): ``results/fitness_proxy_mdqa20_*``. Every
verdict is still accuracy (and log-prob) on the validation and test records.

Each seed checkpoints after every generation and caches every evaluation (with its wall time) on
disk: a stopped search resumes where it stopped, and its convergence table (best fitness against
evaluations and CPU-hours) is written from the checkpoint at any point.

Then the **validation** part picks one curve: the best distinct curves (the profile's ``finalists``) of each seed's finished
search, scored by the same log-prob fitness on the 60 validation records (where the log-prob ranks
reproducibly and accuracy on so few records mostly ranks noise), the highest chosen and exported as
a scales JSON with the identity of the model it was found on and the search's provenance
(``chosen_scales_*.json``; the test step reads it back, and refuses it on any other model). The **test**
part (321 records) answers as the position map does (generate mode, the original evaluation's 100
new tokens, gold at 0 / 5 / 10 / 14 / 19, the gold answer's log-prob beside): the map's own rows are
the baseline, reused; LPES, its PI twin (one global scale, the curve's mean) and the other methods are
the map's record cells under a method (:func:`lpes_nb.studies.position_map.record_cell`), stored record by
record. MoICE answers with a router trained on this model on the search part's records (never on a
test record; :func:`moice_for_test`). Each comparison is paired on the records both answered
(:func:`lpes_nb.evaluation.position_gate.method_differences`).

Run (Qwen by default, each step resumable):
``lpes lpes-at-power search --seeds 0 1 --dtype bfloat16``,
``... validate --seeds 0 1``, ``... test --methods LPES PI --records 321``, ``... report`` (convergence of
the searches as their checkpoints stand).
"""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from ..core.ga import GAConfig, GeneticSearch
from ..core.methods import DynamicNTK, Method
from ..evaluation.fitness import PositionFitness
from ..evaluation.metrics import mdqa_correct_within
from ..evaluation.moice import PER_HEAD_MOICE, UNTRAINED_MOICE, MoICE, ReferenceTraining, RouterTraining, load_or_train
from ..evaluation.position_gate import method_differences, verdict_word
from ..evaluation.tasks import EvalSettings, TaskConfig
from ..store import splits
from ..store.models import dtype_name, load_model, load_tokenizer, model_identity, model_key, resolve_dtype
from ..store.results import output_dir, read_scales, save_scales, write_csv
from .benchmarks import METHODS, ms_poe_parts, unchanged
from .position_map import RELATIVE_POSITIONS, at_positions, load_records, positional_rows, record_cell
from .profiles import PROFILES, SPACES, Training, profile as named_profile
from .search import SearchRun, bezier_space, per_layer_space, run_search, search_fitness

DATASET = "mdqa20"
# the `cpu` profile's study (the defaults here). Its plan, measured: one evaluation (8 records x 3
# prompts of ~3.1k tokens, score mode, shared prefixes) on 2 cores: 73-79 s on an Intel Xeon with AMX,
# 127-139 s on an AMD EPYC of family 26, 217-265 s on one of family 25 (AVX512-BF16, no AMX), ~390 s on
# an Intel VM with AVX512-BF16 but no AMX; <= 16 + 6 x 12 = 88 evaluations per seed (each generation
# scores 8 mutations and both children of 2 crossovers): 1.8 h (AMX) to 5.5 h (EPYC family 25)
CPU = PROFILES["cpu"].lpes_at_power
PREFILL_CHUNK = 512  # as the proxy check's log-probs (lpes_nb.studies.fitness_proxy): faster for ~3k-token continuations
VALUE = "gold_logprob"
# The original metric judges the whole first line (up to 100 tokens), and a run of names holds the gold
# more often than a one-name answer: on the test records the unmodified model's first lines are several
# times longer than LPES's and PI's. So accuracy is also judged on the first SHORT_WORDS words (a gold
# answer is at most a few words): a difference that survives it is not the answers' length.
SHORT_WORDS = 10
SHORT = f"correct_first{SHORT_WORDS}"
# Ms-PoE beside its two parts alone (issue #100's diagnostic: is its loss the ratio range or the heads?)
MS_POE_PARTS = {label: part for label, part in ms_poe_parts().items() if label != "Ms-PoE"}
# MoICE as published (its reference router on general text) and the router this workbook trained before it was
# held against its authors' code (labels: MoICE.label), beside the untrained (uniform) mixture: the router's part
# apart from the mixture's
TRAINED_MOICE = ("MoICE", PER_HEAD_MOICE)
TEST_METHODS = ("LPES", "PI", "Ms-PoE", *MS_POE_PARTS, "Ms-PoE (rank, endpoints grid)", "CALIOPE-Moses", "CALIOPE-Hourglass",
                "CALIOPE-Decay", "Dynamic NTK", "Attention Buckets", *TRAINED_MOICE, UNTRAINED_MOICE)


@dataclass(frozen=True)
class Plan:
    """One search of the study, whatever its seed: on the first ``records`` search records of
    ``dataset`` (MDQA with ``items`` documents; default the file's), over the curve family ``space``,
    with the GA ``ga``; results under the profile's ``lpes_at_power/``."""

    dataset: str = DATASET
    space: str = "bezier"
    records: int = CPU.search_records
    ga: GAConfig = CPU.ga
    batch_size: int = CPU.batch_size
    items: int | None = CPU.items
    profile: str = "cpu"

    @classmethod
    def of(cls, profile: str, dataset: str = DATASET, space: str = "bezier") -> Plan:
        """The search of profile ``profile``'s study (:class:`lpes_nb.studies.profiles.LpesAtPower`) on ``dataset``
        over the curve family ``space``."""
        s = named_profile(profile).lpes_at_power
        items = s.items if splits.FILES[dataset][0] == "mdqa" else None  # a KV record's prompt holds all its pairs
        return cls(dataset, space, s.search_records, s.ga, s.batch_size, items, profile)

    def __post_init__(self):
        if self.dataset not in splits.FILES:
            raise ValueError(f"unknown dataset {self.dataset!r}; choose one of {sorted(splits.FILES)}")
        if self.space not in SPACES:
            raise ValueError(f"unknown search space {self.space!r}; choose one of {SPACES}")

    @property
    def label(self) -> str:
        return self.dataset if self.space == "bezier" else f"{self.dataset}_{self.space}"

    def task(self, part: str = "search", records: int | None = None) -> TaskConfig:
        """The first ``records`` (default the plan's) records of ``part``, at begin / middle / end."""
        return TaskConfig.from_split(self.dataset, part, records or self.records, num_items=self.items)

    def run(self, seed: int) -> SearchRun:
        """Seed ``seed``'s search: the log-prob fitness (score mode, no tie-break)."""
        return SearchRun(replace(self.ga, seed=seed), output_dir("results", self.profile) / "lpes_at_power", f"search_{self.label}_s{seed}",
                         EvalSettings(mode="score", batch_size=self.batch_size), tie_break=0.0, value=VALUE, prefill_chunk=PREFILL_CHUNK)

    def search_space(self, model):
        return per_layer_space(model) if self.space == "free" else bezier_space(model, curve=self.space)


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


def write_convergence(model, tokenizer, model_name: str, plan: Plan, seeds) -> pd.DataFrame | None:
    """The convergence table of each of ``seeds`` whose search has a checkpoint (read back from it,
    nothing scored), in that order, written to the plan's convergence CSV; None, and nothing written,
    where none has one. The one writer of that table (notebook 10 and the CLI)."""
    tables = []
    for seed in seeds:
        try:
            tables.append(search_seed(model, tokenizer, model_name, seed, plan, report_only=True))
        except FileNotFoundError:
            continue
    if not tables:
        return None
    table = pd.concat(tables, ignore_index=True).round(5)
    write_csv(_paths(plan, model_name, dtype_name(model.dtype))["convergence"], table)
    return table


def searched(model, tokenizer, model_name: str, seed: int, plan: Plan = Plan()) -> tuple[GeneticSearch, PositionFitness]:
    """Seed ``seed``'s search of ``plan`` as stored (its checkpoint named by its fingerprint) and its fitness."""
    run = plan.run(seed)
    fitness = search_fitness(model, tokenizer, plan.task(), run, model_name)
    search = GeneticSearch(plan.search_space(model), fitness, run.ga, progress=False)
    search.checkpoint = run.out_dir / f"{run.name}-{search.fingerprint()}.ckpt.json"
    return search, fitness


def search_seed(model, tokenizer, model_name: str, seed: int, plan: Plan = Plan(), progress: bool = True,
                report_only: bool = False) -> pd.DataFrame:
    """Run (or resume, or read back) seed ``seed``'s search of ``plan``; its convergence table.
    ``report_only``: the table from the checkpoint as it stands (a running search's progress), computing nothing."""
    search, fitness = searched(model, tokenizer, model_name, seed, plan)
    if not report_only:
        fitness(np.ones((1, search.space.num_layers)))  # the unmodified model's line, cached before the search
        run_search(model, tokenizer, plan.task(), search.space, plan.run(seed), model_name=model_name, progress=progress)
    return convergence(search, fitness, seed)


def finalists(model, tokenizer, model_name: str, seeds, plan: Plan = Plan(), top: int = CPU.finalists) -> pd.DataFrame:
    """The ``top`` best distinct curves of each seed's finished search: seed, rank, search fitness, scales
    and control points (JSON; ``null`` for a per-layer search, whose genome is the scales)."""
    rows = []
    for seed in seeds:
        search, _ = searched(model, tokenizer, model_name, seed, plan)
        result = search.stored()
        if not search.finished():
            raise ValueError(f"seed {seed}'s search stands at generation {int(result.summary['generation'].max())} of "
                             f"{plan.ga.generations}: finish it before validating")
        best = result.history.drop_duplicates("genome").sort_values("fitness", ascending=False, kind="stable").head(top)
        rows += [{"seed": seed, "rank": k, "search_fitness": r.fitness, "scales": r.scales,
                  "control_points": json.dumps(search.space.control_points(np.asarray(json.loads(r.genome))))}
                 for k, r in enumerate(best.itertuples())]
    return pd.DataFrame(rows)


def validate(model, tokenizer, model_name: str, finals: pd.DataFrame, plan: Plan = Plan(), records: int = CPU.validation_records,
             progress: bool = True) -> pd.DataFrame:
    """Every finalist and the unmodified model (a candidate of its own, the last row: what any curve
    must beat) scored by the search's fitness on the first ``records`` validation records of the
    plan's dataset. The finalist with the highest score is ``chosen``: the curve the test takes, as
    the paper's protocol does, also where it does not beat the unmodified model
    (``beats_unmodified``; the conclusion then says so first)."""
    fitness = search_fitness(model, tokenizer, plan.task("validation", records), plan.run(0), model_name, progress)
    scales = np.array([json.loads(s) for s in finals["scales"]])
    scores = [float(fitness(row[None])[0]) for row in tqdm(scales, desc="validation", disable=not progress)]
    unmodified = float(fitness(np.ones((1, scales.shape[1])))[0])
    out = finals.assign(candidate=[f"seed {s} rank {r}" for s, r in zip(finals["seed"], finals["rank"])], validation=scores,
                        validation_unmodified=unmodified, validation_records=records,
                        chosen=np.arange(len(finals)) == int(np.argmax(scores)), beats_unmodified=np.asarray(scores) > unmodified)
    identity = {"candidate": "unmodified", "scales": json.dumps([1.0] * scales.shape[1]), "validation": unmodified,
                "validation_unmodified": unmodified, "validation_records": records, "chosen": False, "beats_unmodified": False}
    return pd.concat([out, pd.DataFrame([identity])], ignore_index=True)


def export_chosen(path: Path, table: pd.DataFrame, model, model_name: str, plan: Plan = Plan()) -> Path:
    """The chosen curve of a :func:`validate` ``table`` as a scales JSON at ``path``: the scales, the
    identity of the model they were found on (read back on another model, they are refused) and how
    they were found (the search's records, GA, fitness and dtype; the finalist's seed, rank and scores)."""
    chosen = table[table["chosen"]]
    if len(chosen) != 1:
        raise ValueError(f"the validation table names {len(chosen)} chosen curves, not one")
    row = chosen.iloc[0]
    return save_scales(path, json.loads(row["scales"]), model=model_identity(model, model_name),
                       dtype=dtype_name(model.dtype), dataset=plan.dataset, space=plan.space,
                       search_records=splits.records(plan.dataset, "search", plan.records), ga=repr(plan.ga),
                       seeds=sorted(int(s) for s in table["seed"].dropna().unique()), fitness=f"{VALUE}, Eq. 8 weights",
                       seed=int(row["seed"]), rank=int(row["rank"]), search_fitness=float(row["search_fitness"]),
                       validation_records=int(row["validation_records"]), validation=float(row["validation"]),
                       validation_unmodified=float(row["validation_unmodified"]),
                       # the curve itself, so that it can be redrawn (the explorer) or moved to another depth (apply)
                       **({"control_points": json.loads(row["control_points"]), "curve": plan.space}
                          if isinstance(row.get("control_points"), str) and row["control_points"] != "null" else {}))


SEARCHED_ON = " (searched on "  # the label of a curve searched on another dataset than the test's


def _base(label: str) -> str:
    return label.split(SEARCHED_ON)[0]


def moice_for_test(model, tokenizer, model_name: str, profile: str = "cpu", budget: RouterTraining = RouterTraining.of(CPU.router),
                   records: int | None = None, items: int | None = None, progress: bool = True) -> MoICE:
    """MoICE as this workbook ran it before holding it against its authors' code (:data:`PER_HEAD_MOICE`):
    a router per layer and head trained on this model (the profile's ``router``: notebook 6's recipe, model
    frozen) on the answer loss of the first ``records`` (default all) search records of MDQA-20 (with
    ``items`` documents; default 20) at the map's gold positions, never on a test record; trained once,
    then known by its recipe (weights and loss history under the profile's ``lpes_at_power/``)."""
    task = at_positions(TaskConfig.from_split(DATASET, "search", records, num_items=items))
    dtype = dtype_name(model.dtype)
    path = output_dir("results", profile) / "lpes_at_power" / f"moice_router_{model_name}_{dtype}"
    return load_or_train(model, tokenizer, task.samples(), replace(budget, history=[]), path,
                         dict(**model_key(model_name, model), task=repr(task)), progress)


def reference_moice_for_test(model, tokenizer, model_name: str, profile: str = "cpu", budget: ReferenceTraining = ReferenceTraining(),
                             progress: bool = True) -> MoICE:
    """MoICE as published (issue #100): the reference router (one per layer, shared by its heads) trained
    as its authors' script trains it, on general text that holds no MDQA-20 question
    (:class:`lpes_nb.evaluation.moice.ReferenceTraining`); trained once, checkpointed after every step,
    then known by its recipe (weights, and the loss curve in the JSON beside them, under the profile's
    ``lpes_at_power/``)."""
    path = output_dir("results", profile) / "lpes_at_power" / f"moice_reference_router_{model_name}_{dtype_name(model.dtype)}"
    return load_or_train(model, tokenizer, None, replace(budget, history=[]), path, model_key(model_name, model), progress)


def methods_for_test(chosen: list[float], names, searched_on: str = DATASET,
                     moice: Mapping[str, MoICE] | None = None, tested_on: str = DATASET) -> dict[str, Method | None]:
    """The test's methods by label (``None``: the unmodified model): LPES with the chosen curve, PI with
    its mean scale (the twin), each trained MoICE of :data:`TRAINED_MOICE` from ``moice`` (label ->
    method: :func:`reference_moice_for_test`, :func:`moice_for_test`), its untrained mixture, Ms-PoE's
    parts (:data:`MS_POE_PARTS`), the others from the benchmark registry. A curve searched on another
    dataset than ``tested_on`` (the transfer test) labels LPES and its twin "LPES (searched on kv75)" and so on."""
    unknown = sorted(set(names) - set(TEST_METHODS) - {"baseline"})
    if unknown:
        raise ValueError(f"unknown test method(s) {unknown}; choose from {['baseline', *TEST_METHODS]}")
    moice = dict(moice or {})
    for name in set(names) & set(TRAINED_MOICE):  # an untrained (uniform) mixture is not the trained method
        if name not in moice or not moice[name].trained:
            raise ValueError(f"{name} needs a router trained on this model: pass moice={{{name!r}: ...}} "
                             "(reference_moice_for_test / moice_for_test)")
    suffix = "" if searched_on == tested_on else f"{SEARCHED_ON}{searched_on})"
    return {name + (suffix if name in ("LPES", "PI") else ""): method_for_test(name, chosen, moice) for name in names}


def method_for_test(name: str, chosen: list[float], moice: Mapping[str, MoICE]) -> Method | None:
    """The test's method labelled ``name`` (:func:`methods_for_test`, which checks the label and that each
    trained MoICE is in ``moice``)."""
    if name == "baseline":
        return None
    if name in moice:
        return moice[name]
    if name == UNTRAINED_MOICE:
        return MoICE()
    return MS_POE_PARTS[name] if name in MS_POE_PARTS else METHODS[name](chosen, None)


def refuse_unchanged(model, tokenizer, model_name: str, methods: dict[str, Method | None], records: dict[str, int],
                     items: int | None = None, dataset: str = DATASET) -> None:
    """Refuse a method that leaves every one of its test prompts as the unmodified model reads it
    (:func:`lpes_nb.studies.benchmarks.unchanged`: Dynamic NTK inside its window; MDQA-20's ~3k tokens are
    inside every window here). Its rows would be the baseline's answers, recomputed for hours and tabled
    as a method's."""
    for label, method in methods.items():
        if not isinstance(method, DynamicNTK):
            continue
        samples = at_positions(TaskConfig.from_split(dataset, "test", records[label], num_items=items)).samples()  # as the test's
        why = unchanged(model, tokenizer, samples, {label: method})
        if why:
            raise ValueError(f"{label} changes nothing on its {records[label]} test records on {model_name}: {why[label]}; its "
                             f"rows would be the baseline's. Drop it from the test, or set original_max_positions below "
                             "the longest prompt to emulate a shorter window")


def cells_on_test(model, tokenizer, model_name: str, dtype: str, methods: dict[str, Method | None],
                  records: dict[str, int], profile: str = "cpu", batch_size: int = 8, items: int = 20,
                  progress: bool = True, block: int = 20, dataset: str = DATASET) -> dict[str, pd.DataFrame]:
    """Each method's positional rows on the first ``records[label]`` records of ``dataset``'s test part
    (``items``: documents or pairs per prompt; the baseline, unless named, on the most any method takes),
    computed where not stored. Computed
    ``block`` records at a time, every method on a block before the next block: the test runs over
    several sittings, and a run stopped part-way leaves all methods on the same first records
    (paired), not the first method on all of its records and the others on none."""
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a whole number of records >= 1, got {block!r}")
    sizes = dict(records)
    sizes.setdefault("baseline", max(sizes.values()))
    task = splits.FILES[dataset][0]
    ids = splits.records(dataset, "test", max(sizes.values()))

    def cell(name: str, chosen: list[int], bar: bool) -> pd.DataFrame:
        return record_cell(model, tokenizer, model_name, dtype, task, items, chosen, batch_size, profile, bar, method=methods[name])

    steps = [(name, ids[start:min(start + block, sizes[name])]) for start in range(0, len(ids), block)
             for name in methods if start < sizes[name]]
    for name, chosen in tqdm(steps, desc="test blocks (method x records)", disable=not progress or len(steps) < 2):
        cell(name, chosen, progress)
    return {name: positional_rows(cell(name, ids[:sizes[name]], False)) for name in methods}


def with_short_answers(cells: dict[str, pd.DataFrame], words: int = SHORT_WORDS, data_dir=None,
                       items: int = splits.FILES[DATASET][1]) -> dict[str, pd.DataFrame]:
    """Each cell with ``correct_first{words}``: its answers judged on the first ``words`` words of their
    first line (:func:`lpes_nb.evaluation.metrics.mdqa_correct_within`) against the gold answers of the
    record of the ``items``-document MDQA file."""
    answers = [r["answers"] for r in load_records("mdqa", items, data_dir)]
    return {name: cell.assign(**{f"correct_first{words}": [mdqa_correct_within(p, answers[r], words)
                                                          for p, r in zip(cell["prediction"], cell["sample"])]})
            for name, cell in cells.items()}


def differences_on_test(cells: dict[str, pd.DataFrame], value: str = "correct") -> pd.DataFrame:
    """Every method against the baseline and LPES against its PI twin, paired on the records both
    answered: the first n of the test part, n the smaller of the two (a method on 150 records is
    compared with the baseline's first 150, never with all 321). Ms-PoE's parts (:data:`MS_POE_PARTS`)
    against the baseline and Ms-PoE against each of them form a Holm family of their own."""
    twins = [(m, "PI" + m[len("LPES"):]) for m in cells if _base(m) == "LPES" and "PI" + m[len("LPES"):] in cells]
    pairs = [(m, "baseline") for m in cells if m not in ("baseline", *MS_POE_PARTS)] + twins
    claims = method_differences(cells, pairs, value, on_method_records=True)
    # the diagnostic is its own Holm family: it asks a question of our own, and must not weaken the claims'
    parts = [part for part in MS_POE_PARTS if part in cells]
    if not parts:
        return claims
    diagnostic = [(part, "baseline") for part in parts] + [("Ms-PoE", part) for part in parts if "Ms-PoE" in cells]
    return pd.concat([claims, method_differences(cells, diagnostic, value, on_method_records=True)], ignore_index=True)


PAPER_TABLE = Path(__file__).resolve().parents[2] / "data" / "papers" / "lpes_table1.csv"
PAPER_MODEL = "Qwen2.5-7B"  # LPES Table 1's Qwen rows: 20-document MDQA, the setting searched here
PAPER_NAMES = {"baseline": "Baseline", "LPES": "LPES (Ours)", "PI": "Positional Interpolation", "Ms-PoE": "Ms-PoE",
               "Attention Buckets": "Attention Buckets", "MoICE": "MoICE"}  # ours -> the table's


def table1(cells: dict[str, pd.DataFrame], task: str = "mdqa") -> pd.DataFrame:
    """LPES Table 1's layout: accuracy (%) at the five relative gold positions and their average, one
    row per method; ours (``source`` "ours", with the records each stands on) above the paper's Qwen
    rows for the methods both have, on MDQA only (its KV rows stand at six other positions, 0, 0.2 … 1,
    and at another number of pairs)."""
    positions = list(RELATIVE_POSITIONS)
    rows = []
    for name, cell in cells.items():
        acc = cell.groupby("relative_position")["correct"].mean().reindex(positions) * 100
        rows.append({"source": "ours", "method": name, "records": int(cell["sample"].nunique()),
                     **{f"{p:g}": acc[p] for p in positions}, "average": acc.mean()})
    paper = pd.read_csv(PAPER_TABLE).query("model == @PAPER_MODEL and task == 'mdqa'")
    for name in cells if task == "mdqa" else []:
        if name in PAPER_NAMES:
            acc = paper[paper["method"] == PAPER_NAMES[name]].set_index("relative_position")["accuracy_percent"].reindex(positions)
            rows.append({"source": f"LPES Table 1, {PAPER_MODEL}", "method": name, "records": 500,
                         **{f"{p:g}": acc[p] for p in positions}, "average": acc.mean()})
    return pd.DataFrame(rows)


def claims(table: pd.DataFrame, differences: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """Each paired comparison averaged over positions (accuracy) read against the paper's: the
    paper's difference (points, from ``table``'s paper rows), ours with its interval, n and MDE (points),
    and the verdict: ``reproduced`` (ours significant after Holm, in the paper's direction),
    ``opposite`` (significant, the other way), ``not reproduced at MDE x`` (not significant; the
    smallest effect these records could have seen), or ``no paper figure`` (with ours: higher, lower, no
    difference at MDE x points, or undetermined). Where the paper's difference rounds to zero (its claim
    is "no difference"), ours not significant ``reproduced: no difference at MDE x``, significant
    ``not reproduced: ours differs``."""
    paper = table[table["source"] != "ours"].set_index("method")["average"]
    rows = []
    for r in differences[(differences["position"] == "average") & (differences["value"] == "correct")].itertuples():
        claimed = paper[r.method] - paper[r.reference] if {r.method, r.reference} <= set(paper.index) else np.nan
        significant = r.p_holm < alpha
        # the one rule (position_gate.verdict_word), in the table's unit: points, not the fraction
        ours = verdict_word(r.difference, r.ci_low, r.ci_high, r.p_holm, r.mde, alpha, 100, 1, " points")
        if np.isnan(claimed):
            verdict = f"no paper figure; ours: {ours}"
        elif round(claimed, 1) == 0 and np.isfinite(r.mde):
            verdict = "not reproduced: ours differs" if significant else f"reproduced: {ours}"
        elif significant and np.sign(r.difference) == np.sign(claimed):
            verdict = "reproduced"
        elif significant:
            verdict = "opposite"
        elif not np.isfinite(r.mde):
            verdict = ours
        else:
            verdict = "not reproduced" + ours.removeprefix("no difference")
        rows.append({"method": r.method, "reference": r.reference, "paper_points": claimed, "points": 100 * r.difference,
                     "ci_low": 100 * r.ci_low, "ci_high": 100 * r.ci_high, "n": r.n, "mde_points": 100 * r.mde,
                     "p_holm": r.p_holm, "verdict": verdict})
    return pd.DataFrame(rows)


# Stored steps withdrawn, with why; their files are kept under lpes_at_power/withdrawn/ and the
# conclusion prints their claims labelled withdrawn, never as results (a rerun stores the new ones)
WITHDRAWN = {
    "kv75": "scored the KV gold value without the quotes every answer writes (score mode's target before the task "
            "declared its answer forms): its search, validation, chosen curve and transfer test to MDQA-20 are withdrawn",
}


def withdrawn_claims(profile: str, model_name: str, dtype: str) -> pd.DataFrame:
    """The transfer claims of the withdrawn datasets (:data:`WITHDRAWN`) still in the store, with the reason."""
    folder = output_dir("results", profile) / "lpes_at_power" / "withdrawn"
    frames = [pd.read_csv(path).assign(searched_on=dataset, reason=reason) for dataset, reason in WITHDRAWN.items()
              if (path := folder / f"claims_{dataset}_{model_name}_{dtype}.csv").exists()]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _paths(plan: Plan, model_name: str, dtype: str, tested_on: str = DATASET) -> dict[str, Path]:
    """The plan's stored tables; its test's on ``tested_on``'s test part (MDQA-20's keep their first names)."""
    folder = output_dir("results", plan.profile) / "lpes_at_power"
    test = plan.label if tested_on == DATASET else f"{plan.label}_tested_on_{tested_on}"
    paths = {name: folder / f"{name}_{plan.label}_{model_name}_{dtype}.csv" for name in ("convergence", "validation")}
    paths |= {name: folder / f"{name}_{test}_{model_name}_{dtype}.csv" for name in ("test_differences", "table1", "claims")}
    return paths | {"chosen": folder / f"chosen_scales_{plan.label}_{model_name}_{dtype}.json"}


def run_validation(model, tokenizer, model_name: str, plan: Plan, seeds, top: int, records: int, progress: bool = True) -> pd.DataFrame:
    """The validation step: each seed's ``top`` finalists and the unmodified model on ``records``
    validation records (:func:`validate`); the table written and the chosen curve exported."""
    table = validate(model, tokenizer, model_name, finalists(model, tokenizer, model_name, seeds, plan, top), plan, records, progress)
    paths = _paths(plan, model_name, dtype_name(model.dtype))
    write_csv(paths["validation"], table)
    export_chosen(paths["chosen"], table, model, model_name, plan)
    return table


def run_test(model, tokenizer, model_name: str, plan: Plan, sizes: dict[str, int], searched_on: str = DATASET,
             router: Training = CPU.router, progress: bool = True, tested_on: str = DATASET) -> dict[str, pd.DataFrame]:
    """The test step: the curve chosen on ``searched_on``'s validation (read back from its export, on
    this model only), the baseline and every method of ``sizes`` (label -> records of ``tested_on``'s
    test part) answered record by record (MDQA: the plan's documents per prompt; KV: the file's pairs),
    compared paired; the tables ``test_differences``, ``table1`` and ``claims`` written (named by the
    search that chose the curve and where it was tested: a transfer test never overwrites the in-domain
    one) and returned. ``test_differences`` holds accuracy, the gold log-prob and, on MDQA, accuracy on
    the answers' first :data:`SHORT_WORDS` words (the length check); the claims are read on accuracy,
    the paper's metric. Off MDQA-20 (the in-domain KV test) only LPES and its PI twin are tested."""
    if plan.space != "bezier":
        raise ValueError("the test takes a Bézier search's chosen curve; the curve families are compared on validation")
    task = splits.FILES[tested_on][0]
    if tested_on != DATASET and set(sizes) - {"LPES", "PI"}:
        raise ValueError(f"the test on {tested_on} compares LPES with its PI twin and the baseline, got {sorted(sizes)}")
    dtype = dtype_name(model.dtype)
    paths = _paths(replace(plan, dataset=searched_on), model_name, dtype, tested_on)
    if not paths["chosen"].exists():
        raise FileNotFoundError(f"no chosen curve at {paths['chosen']}: run the validate step of the {searched_on} search")
    chosen = read_scales(paths["chosen"], model=model_identity(model, model_name))["scales"]
    moice = {}
    if "MoICE" in sizes:
        moice["MoICE"] = reference_moice_for_test(model, tokenizer, model_name, plan.profile,
                                                  ReferenceTraining(micro_batch=router.micro_batch), progress)
    if PER_HEAD_MOICE in sizes:
        moice[PER_HEAD_MOICE] = moice_for_test(model, tokenizer, model_name, plan.profile, RouterTraining.of(router),
                                               items=plan.items, progress=progress)
    methods = methods_for_test(chosen, ["baseline", *sizes], searched_on, moice, tested_on)
    labelled = {label: sizes[_base(label)] for label in methods if label != "baseline"}
    items = plan.items if task == "mdqa" else None  # a KV record's prompt holds all its pairs
    refuse_unchanged(model, tokenizer, model_name, methods, labelled, items, tested_on)
    cells = cells_on_test(model, tokenizer, model_name, dtype, methods, labelled, plan.profile, plan.batch_size,
                          items or splits.FILES[tested_on][1], progress, dataset=tested_on)
    values = ("correct", "gold_logprob")
    if task == "mdqa":
        cells, values = with_short_answers(cells), ("correct", SHORT, "gold_logprob")
    differences = pd.concat([differences_on_test(cells, value) for value in values], ignore_index=True)
    layout = table1(cells, task)
    tables = {"test_differences": differences, "table1": layout, "claims": claims(layout, differences)}
    for name, frame in tables.items():
        write_csv(paths[name], frame)
    return tables


def _searched_and_validated(model, tokenizer, profile: str, plan: Plan, progress: bool, pending: list[str]) -> dict:
    """``plan``'s searches (each seed's convergence; run or resumed unless the profile is read-only) and
    its validation (read back, or run once every seed's search has finished); each step not yet run
    appended to ``pending`` with the command that runs it. A stored validation made under other seeds
    or records than the profile's is refused."""
    s = named_profile(profile).lpes_at_power
    paths = _paths(plan, s.model, dtype_name(model.dtype))
    where = "".join(f" --{flag} {value}" for flag, value, default in (("dataset", plan.dataset, DATASET), ("space", plan.space, "bezier"))
                    if value != default)

    def command(step: str, seeds) -> str:
        return f"lpes lpes-at-power {step} --profile {profile}{where} --seeds {' '.join(map(str, seeds))}"

    found = {}
    if not s.read_only:
        for seed in s.seeds:
            search_seed(model, tokenizer, s.model, seed, plan, progress)
    table = write_convergence(model, tokenizer, s.model, plan, s.seeds)  # read-only, no checkpoint yet: pending below
    if table is not None:
        found["convergence"] = table
    # a seed is finished when its convergence reaches the last generation (no checkpoint: not started)
    last = table.groupby("seed")["generation"].max() if table is not None else pd.Series(dtype=int)
    unfinished = [seed for seed in s.seeds if last.get(seed, -1) < s.ga.generations]
    if unfinished:
        pending.append(f"the {plan.label} search of seed(s) {unfinished} has not finished: {command('search', unfinished)}")
    if paths["validation"].exists():
        found["validation"] = pd.read_csv(paths["validation"])
        stored = (sorted(int(k) for k in found["validation"]["seed"].dropna().unique()),
                  int(found["validation"]["validation_records"].iloc[0]))
        if stored != (sorted(s.seeds), s.validation_records):
            raise ValueError(f"{paths['validation']} holds seeds {stored[0]} on {stored[1]} validation records, the profile "
                             f"{profile!r} asks for {sorted(s.seeds)} on {s.validation_records}: rerun its validate step")
    elif not s.read_only and not unfinished:
        found["validation"] = run_validation(model, tokenizer, s.model, plan, s.seeds, s.finalists, s.validation_records, progress)
    else:
        pending.append(f"validation of the {plan.label} search: {command('validate', s.seeds)}")
    return found


def _tested(model, tokenizer, profile: str, plan: Plan, sizes: dict[str, int], searched_on: str, progress: bool,
            pending: list[str], can_run: bool, tested_on: str = DATASET) -> dict:
    """The test of the curve chosen on ``searched_on`` (tables read back, or run when ``can_run`` and the
    profile computes). Tables of some of the methods (the test runs over several sittings: LPES and its
    twin first) are read back with the rest named pending; refused when a stored method stands on
    other record counts than ``sizes`` asks, or is not asked for."""
    s = named_profile(profile).lpes_at_power
    paths = _paths(replace(plan, dataset=searched_on), s.model, dtype_name(model.dtype), tested_on)
    where = (f" --tested-on {tested_on}" if tested_on != DATASET else "") + (f" --searched-on {searched_on}" if searched_on != tested_on else "")
    command = f"lpes lpes-at-power test --profile {profile} --methods {shlex.join(sizes)}{where}"
    what = ("test" + (f" of the curve searched on {searched_on}" if searched_on != tested_on else "")
            + (f" on {tested_on}'s test part" if tested_on != DATASET else ""))
    if paths["claims"].exists():
        found = {name: pd.read_csv(paths[name]) for name in ("table1", "test_differences", "claims")}
        ours = found["table1"][found["table1"]["source"] == "ours"].set_index("method")["records"].astype(int).to_dict()
        stored = {_base(m): n for m, n in ours.items() if m != "baseline"}
        if any(sizes.get(m) != n for m, n in stored.items()):
            raise ValueError(f"{paths['table1']} holds {ours} records per method, the profile {profile!r} asks for {sizes}: "
                             "rerun its test step")
        missing = [m for m in sizes if m not in stored]
        if missing:
            pending.append(f"{what} of {', '.join(missing)} (the tables hold {', '.join(stored)}): {command}")
        return found
    if not s.read_only and can_run:
        return run_test(model, tokenizer, s.model, plan, sizes, searched_on, s.router, progress, tested_on)
    pending.append(f"{what}: {command}")
    return {}


def families(model, tokenizer, model_name: str, curves: dict[str, list[float]], plan: Plan = Plan(),
             records: int = CPU.validation_records) -> pd.DataFrame:
    """The curve families compared on the validation records: each family's chosen curve (``curves``:
    family -> scales) against the unmodified model and, for the others, against the Bézier curve, paired
    on the records (:func:`lpes_nb.evaluation.position_gate.method_differences`, the gold answer's log-probability,
    Holm over the family of comparisons; the validation's cached rows, nothing recomputed). Each family
    chose its curve on these records from as many finalists as the others, so every row carries the same
    selection optimism."""
    fitness = search_fitness(model, tokenizer, plan.task("validation", records), plan.run(0), model_name)
    cells = {name: fitness.table(scales) for name, scales in {**curves, "unmodified": [1.0] * model.config.num_hidden_layers}.items()}
    pairs = [(space, "unmodified") for space in curves] + [(space, "bezier") for space in curves if space != "bezier"]
    return method_differences(cells, pairs, VALUE)


def study(profile: str, progress: bool = True) -> dict:
    """Notebook 10's tables under ``profile`` (:class:`lpes_nb.studies.profiles.LpesAtPower`): the convergence of
    each seed of each curve family searched so far (``space``: Bézier first), the Bézier validation
    table, and the test's ``table1`` / ``test_differences`` / ``claims``;
    ``families`` (on the validation records, paired: the Bézier curve and each other family validated so
    far against the unmodified model, and the others against Bézier; their chosen scales in
    ``family_curves``) and ``transfer`` (each transfer search's chosen curve tested on MDQA-20: its
    claims, ``searched_on`` naming where), ``in_domain`` (each ``in_domain`` dataset's chosen curve tested
    on its own test part: its claims, ``tested_on`` naming where); ``pending``: the steps not yet run, each with the command
    that runs it. A profile that
    computes runs (or resumes) every step; a ``read_only`` one (``cpu``: hours of background runs) reads
    what the store holds and computes nothing. A stored table made under other settings than the
    profile's is refused."""
    s = named_profile(profile).lpes_at_power
    model, tokenizer = load_model(s.model, dtype=s.dtype), load_tokenizer(s.model)
    plan = Plan.of(profile)
    pending: list[str] = []
    bezier = _searched_and_validated(model, tokenizer, profile, plan, progress, pending)
    found: dict = {"pending": pending} | {k: v for k, v in bezier.items() if k != "convergence"}
    sizes = dict(s.test_records)
    found |= _tested(model, tokenizer, profile, plan, sizes, DATASET, progress, pending, "validation" in found)
    per_space = {"bezier": bezier} | {
        space: _searched_and_validated(model, tokenizer, profile, Plan.of(profile, space=space), progress, pending)
        for space in s.spaces[1:]}
    searched_spaces = {space: f["convergence"] for space, f in per_space.items() if "convergence" in f}
    if searched_spaces:
        found["convergence"] = pd.concat(searched_spaces, names=["space"]).reset_index(level="space").reset_index(drop=True)
    validations = {space: f.get("validation") for space, f in per_space.items()}
    curves = {space: json.loads(v.loc[v["chosen"], "scales"].iloc[0]) for space, v in validations.items() if v is not None}
    if "bezier" in curves:  # against the unmodified model at once; the other families join as they are validated
        found |= {"family_curves": curves, "families": families(model, tokenizer, s.model, curves, plan, s.validation_records)}
    twins = {m: sizes[m] for m in ("LPES", "PI")}
    chosen = {dataset: "validation" in _searched_and_validated(model, tokenizer, profile, Plan.of(profile, dataset), progress, pending)
              for dataset in s.transfer}
    for key, column, tests in (
            ("transfer", "searched_on", [(dataset, twins, DATASET) for dataset in s.transfer]),
            ("in_domain", "tested_on", [(dataset, {"LPES": n, "PI": n}, dataset) for dataset, n in s.in_domain])):
        tables = [tested["claims"].assign(**{column: dataset}) for dataset, records, tested_on in tests
                  if (tested := _tested(model, tokenizer, profile, plan, records, dataset, progress, pending, chosen[dataset], tested_on))]
        if tables:
            found[key] = pd.concat(tables, ignore_index=True)
    withdrawn = withdrawn_claims(profile, s.model, dtype_name(model.dtype))
    if len(withdrawn):
        found["withdrawn"] = withdrawn
    return found


def validation_text(v: pd.DataFrame) -> str:
    """The validation's reading, led by the comparison with the unmodified model (a row of the table)."""
    finals = v[v["candidate"] != "unmodified"]
    c, beating = finals[finals["chosen"]].iloc[0], int(finals["beats_unmodified"].sum())
    n, unmodified = int(c["validation_records"]), float(c["validation_unmodified"])
    lead = (f"**The search found nothing better than the unmodified model on validation**: none of the {len(finals)} finalists "
            f"beats its {unmodified:.3f} ({n} validation records; the best, seed {int(c['seed'])} rank {int(c['rank'])}, scores "
            f"{c['validation']:.3f}). The test below still runs the paper's protocol on that finalist, labelled as such."
            if not beating else
            f"**Validation**: {beating} of the {len(finals)} finalists beat the unmodified model's {unmodified:.3f} ({n} "
            f"validation records); the chosen one (seed {int(c['seed'])}, rank {int(c['rank'])}) scores {c['validation']:.3f}.")
    return (f"- {lead} Its mean scale is {np.mean(json.loads(c['scales'])):.3f} (its PI twin's). The paper's GA starts every "
            "curve at 1.5 (Eq. 8) and never scores the identity, so the unmodified model enters as a validation candidate. "
            "The chosen curve's validation score is optimistic: the best of the finalists on these same records.")


def conclusion(found: dict, profile: str) -> str:
    """Notebook 10's conclusion, every number printed from :func:`study`'s tables: where each seed's
    search stands against the unmodified model, the curve validation chose, each claim's verdict with
    its n, interval and MDE, and the steps not yet run."""
    s = named_profile(profile).lpes_at_power
    lines = [f"- **Setting**: {s.model}, {dtype_name(resolve_dtype(s.dtype))}, MDQA-20 ({s.items or 20} documents): search on "
             f"{s.search_records} records of the split's search part, validation on {s.validation_records} of its validation "
             "part, the test on its test part (n per claim below). Intervals: 95 %, clustered by record, unadjusted; "
             "each verdict comes from the Holm-adjusted test."]
    if "convergence" in found:
        conv = found["convergence"]
        for r in conv.loc[conv.groupby(["space", "seed"], sort=False)["generation"].idxmax()].itertuples():
            lines.append(f"- **Search ({r.space}), seed {r.seed}**: generation {r.generation} of {s.ga.generations}, {r.evaluated} "
                         f"evaluations, {r.hours:.2f} wall-hours on the CPUs its sittings ran on; best fitness {r.best:.3f}, "
                         f"the unmodified model's {r.unmodified:.3f} on the "
                         f"same {s.search_records} search records ({r.best - r.unmodified:+.3f}; the GA's objective on a fixed "
                         "set: no interval, the verdicts are the test's).")
    if "validation" in found:
        lines.insert(0, validation_text(found["validation"]))
    for r in found.get("claims", pd.DataFrame()).itertuples():
        paper = "" if np.isnan(r.paper_points) else f" (the paper {r.paper_points:+.1f})"  # else the verdict says so
        mde = f"MDE {r.mde_points:.1f}" if np.isfinite(r.mde_points) else "no MDE (no record differs)"
        lines.append(f"- **{r.method} − {r.reference}** (accuracy averaged over the 5 gold positions): {r.points:+.1f} points "
                     f"[{r.ci_low:+.1f}, {r.ci_high:+.1f}], n = {r.n} records, {mde}, Holm p = {r.p_holm:.3g}"
                     f"{paper}: **{r.verdict}**.")
    if found.get("claims", pd.DataFrame(columns=["reference"]))["reference"].isin(MS_POE_PARTS).any():
        lines.append("- *Reading Ms-PoE against its parts* (a Holm family of its own, apart from the claims): Ms-PoE − its "
                     "PI at the same mean near zero puts its loss on the ratio range on this model, not on its head-wise "
                     "machinery; Ms-PoE − its fixed head order near zero says the outlier score chooses no better than a fixed order.")
    if "test_differences" in found:
        d = found["test_differences"]
        for r in d[(d["position"] == "average") & (d["value"] == SHORT)].itertuples():
            mde = f"MDE {100 * r.mde:.1f}" if np.isfinite(r.mde) else "no MDE (no record differs)"
            lines.append(f"- *Length check, {r.method} − {r.reference}* (accuracy on the first {SHORT_WORDS} words of the "
                         f"answer's first line): {100 * r.difference:+.1f} points [{100 * r.ci_low:+.1f}, {100 * r.ci_high:+.1f}], "
                         f"n = {r.n} records, {mde}, Holm p = {r.p_holm:.3g}: "
                         f"{verdict_word(r.difference, r.ci_low, r.ci_high, r.p_holm, r.mde, unit=100, digits=1, suffix=' points')}.")
    if "families" in found:
        f = found["families"]
        for r in f[f["position"] == "average"].itertuples():
            lines.append(f"- **Curve family {r.method} − {r.reference}** (validation, the gold answer's log-prob averaged over "
                         f"begin / middle / end): {r.difference:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}], n = {r.n} records, "
                         f"MDE {r.mde:.3f}, Holm p = {r.p_holm:.3g}: **{r.verdict}** (each family's best of its finalists on "
                         "these records).")
    for r in found.get("transfer", pd.DataFrame()).itertuples():
        mde = f"MDE {r.mde_points:.1f}" if np.isfinite(r.mde_points) else "no MDE (no record differs)"
        lines.append(f"- **Transfer, {r.method} − {r.reference}** (MDQA-20 test, accuracy averaged over the 5 gold positions): "
                     f"{r.points:+.1f} points [{r.ci_low:+.1f}, {r.ci_high:+.1f}], n = {r.n} records, {mde}, Holm p = "
                     f"{r.p_holm:.3g}: **{r.verdict}**.")
    for r in found.get("in_domain", pd.DataFrame()).itertuples():
        mde = f"MDE {r.mde_points:.1f}" if np.isfinite(r.mde_points) else "no MDE (no record differs)"
        lines.append(f"- **In-domain {r.tested_on.upper()} test, {r.method} − {r.reference}** (its own test part, accuracy averaged "
                     f"over the 5 gold positions): {r.points:+.1f} points [{r.ci_low:+.1f}, {r.ci_high:+.1f}], n = {r.n} records, "
                     f"{mde}, Holm p = {r.p_holm:.3g}: **{r.verdict}**.")
    for dataset, rows in found.get("withdrawn", pd.DataFrame(columns=["searched_on"])).groupby("searched_on", sort=False):
        claims = "; ".join(f"{r.method} − {r.reference} {r.points:+.1f} points [{r.ci_low:+.1f}, {r.ci_high:+.1f}], n = {r.n}"
                           for r in rows.itertuples())
        lines.append(f"- **Withdrawn, the {dataset} transfer**: it {rows['reason'].iloc[0]}. What it had stored, not a result: "
                     f"{claims}.")
    lines += [f"- *Not yet run*: {step}" for step in found["pending"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="lpes lpes-at-power", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["search", "report", "validate", "test"])
    parser.add_argument("--profile", default="cpu", help="the study's settings (lpes_nb.studies.profiles.LpesAtPower) and results folder")
    parser.add_argument("--seeds", type=int, nargs="+", help="search, report, validate (default: the profile's)")
    parser.add_argument("--dataset", default=DATASET, choices=sorted(splits.FILES), help="search and validation: where to search")
    parser.add_argument("--space", default="bezier", choices=SPACES, help="search and validation: the curve family")
    parser.add_argument("--methods", nargs="+", default=["LPES", "PI"], help=f"test: of {list(TEST_METHODS)} (the baseline always)")
    parser.add_argument("--records", type=int, help="test: records of the test part for every named method (default: the profile's)")
    parser.add_argument("--searched-on", choices=sorted(splits.FILES),
                        help="test: take the curve chosen on this dataset's search (default: where it is tested; another than "
                             "MDQA-20, tested on MDQA-20: the transfer test)")
    parser.add_argument("--tested-on", default=DATASET, choices=sorted(splits.FILES),
                        help="test: on this dataset's test part (another than MDQA-20: the in-domain test of the profile's in_domain)")
    parser.add_argument("--model", help="default: the profile's")
    parser.add_argument("--dtype", help="default: the profile's")
    parser.add_argument("--batch-size", type=int, help="default: the profile's")
    args = parser.parse_args(argv)
    s = named_profile(args.profile).lpes_at_power
    name = args.model or s.model
    model, tokenizer = load_model(name, dtype=args.dtype or s.dtype), load_tokenizer(name)
    plan = replace(Plan.of(args.profile, args.dataset, args.space), batch_size=args.batch_size or s.batch_size)
    seeds = args.seeds or list(s.seeds)
    if args.step in ("search", "report"):
        # the table holds the profile's seeds too, as the notebook writes it: a call for one seed (the
        # notebook's resume command) must not drop the others' rows
        every = [*s.seeds, *(seed for seed in seeds if seed not in s.seeds)]
        if args.step == "search":
            for seed in seeds:  # written after each seed: a finished one is stored before the next starts
                search_seed(model, tokenizer, name, seed, plan)
                table = write_convergence(model, tokenizer, name, plan, every)
        else:
            table = write_convergence(model, tokenizer, name, plan, every)
        stored = set() if table is None else set(table["seed"])
        for seed in sorted(set(seeds) - stored):
            print(f"seed {seed}: no checkpoint yet (its first generation has not finished)")
        if not set(seeds) & stored:
            raise SystemExit(f"no search of {plan.label} with seed(s) {seeds} has a checkpoint yet")
        print(table.round(4).to_string(index=False))
    elif args.step == "validate":
        table = run_validation(model, tokenizer, name, plan, seeds, s.finalists, s.validation_records)
        print(table.drop(columns="scales").round(4).to_string(index=False))
        print(f"chosen curve exported to {_paths(plan, name, dtype_name(model.dtype))['chosen']}")
    else:
        unknown = sorted(set(args.methods) - set(TEST_METHODS))
        if unknown:
            raise ValueError(f"unknown test method(s) {unknown}; choose from {list(TEST_METHODS)}")
        if args.tested_on == DATASET:
            planned = dict(s.test_records)
            sizes = {m: args.records or planned.get(m) or max(planned.values()) for m in args.methods}
        elif args.records or args.tested_on in dict(s.in_domain):
            sizes = {m: args.records or dict(s.in_domain)[args.tested_on] for m in args.methods}
        else:
            raise ValueError(f"--tested-on {args.tested_on}: the profile {args.profile!r} plans no test there "
                             f"(its in_domain: {s.in_domain}); name --records")
        tables = run_test(model, tokenizer, name, plan, sizes, args.searched_on or args.tested_on, s.router, tested_on=args.tested_on)
        print(tables["table1"].round(1).to_string(index=False))
        print(tables["claims"].round(3).to_string(index=False))

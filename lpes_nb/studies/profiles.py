"""The named configurations of the notebooks: ``smoke`` (tiny random model, CI), ``cpu`` (the
committed run on the embedded model), ``gpu`` (the embedded models on a GPU: notebook 9's map
on long prompts — the analogue of the papers' Vicuna rows, which fill a 4k window — and the LPES Qwen
setting, MDQA-20 on all 441 records, with the search at the paper's budget; notebook 10 at the paper's
GA budget), ``gpu-dry`` (the gpu profile's notebook 9 on tiny random models, in CI; notebook 10 as in ``smoke``, in bf16), ``paper``
(the papers' settings, for a GPU; notebook 10 on LPES Table 1's Qwen2.5-7B) and
``paper-dry`` (the paper's shapes on a small random model, to measure what the paper profile costs).

One typed object per study, one :class:`Profile` per name. Every setting is checked when this
module is imported: a misspelt or missing key is a ``TypeError``, a bad value a ``ValueError``.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields, replace

from ..core.ga import GAConfig
from ..evaluation.prefix import check_chunk
from ..evaluation.tasks import EvalSettings, TaskConfig
from ..store.data import KV_FILES, KV_RECORDS, MDQA_RECORDS
from ..store.splits import SIZES



@dataclass(frozen=True)
class MapModel:
    """One model of the map: its dtype, the prompt lengths (tokens) of the length-set tasks, and the
    MDQA document counts (each count fixes its own length)."""

    model: str
    dtype: str
    lengths: tuple[int, ...]
    mdqa_docs: tuple[int, ...]

    def __post_init__(self):
        if not self.lengths or any(not isinstance(x, int) or x < 64 for x in self.lengths):
            raise ValueError(f"MapModel.lengths must be integers >= 64 tokens, got {self.lengths!r}")
        if any(not isinstance(d, int) or not 5 <= d <= 20 for d in self.mdqa_docs):
            raise ValueError(f"MapModel.mdqa_docs must be integers in [5, 20] (the records hold 20), got {self.mdqa_docs!r}")


RECORD_TASKS = {"mdqa": MDQA_RECORDS, "kv": KV_RECORDS}  # the real records' tasks -> records in the file
POSITIONAL = {"mdqa": "documents", "kv": "pairs"}  # the condition of the rows with the gold item at a position


@dataclass(frozen=True)
class RecordCell:
    """A cell computed record by record (:func:`record_cell`) on the first ``n`` real records: MDQA
    with ``items`` documents (2-20; with closed-book and oracle answers) or the original UUID KV
    retrieval with ``items`` pairs (75 or 140), with the gold answer's log-probability;
    ``prefill_chunk``: continuations from the shared prefix in pieces of this many tokens
    (:func:`lpes_nb.evaluation.prefix._pieces`; None: one pass, as the cells stored before it).
    ``gold_withdrawn``: a KV cell stored before the task declared its answer forms
    (:attr:`lpes_nb.evaluation.tasks.Task.answer_forms`), whose gold log-probabilities scored the value without
    the quotes every answer writes: its answers (accuracy) are read, its gold columns are withdrawn,
    and it is never extended (a cell without the flag is computed anew under the written forms)."""

    model: str
    dtype: str
    items: int
    n: int
    task: str = "mdqa"
    prefill_chunk: int | None = None
    gold_withdrawn: bool = False

    def __post_init__(self):
        if self.task not in RECORD_TASKS:
            raise ValueError(f"RecordCell.task must be one of {sorted(RECORD_TASKS)}, got {self.task!r}")
        allowed = range(2, 21) if self.task == "mdqa" else tuple(KV_FILES)
        if not isinstance(self.items, int) or self.items not in allowed:
            what = "[2, 20] documents (the records hold 20)" if self.task == "mdqa" else f"{sorted(KV_FILES)} pairs (the files)"
            raise ValueError(f"RecordCell.items must be one of {what}, got {self.items!r}")
        most = RECORD_TASKS[self.task]
        if not isinstance(self.n, int) or not 1 <= self.n <= most:
            raise ValueError(f"RecordCell.n must be an integer in [1, {most}] (the real {self.task} records), got {self.n!r}")
        check_chunk(self.prefill_chunk)
        if self.gold_withdrawn and self.task != "kv":
            raise ValueError(f"gold_withdrawn marks KV cells scored before the KV answer forms; {self.task} targets never changed")

    @property
    def name(self) -> str:
        return f"{self.model} {self.dtype} {self.task}-{self.items}"


@dataclass(frozen=True)
class PositionMap:
    """The map's settings: models, records per cell and position (``n``), batch size, and the cells
    computed record by record (``record_cells``)."""

    models: tuple[MapModel, ...]
    n: int
    batch_size: int = 8
    seed: int = 300  # generated tasks: records disjoint from the other studies' seeds
    mdqa_offset: int = 200  # MDQA: questions after those the other studies use
    record_cells: tuple[RecordCell, ...] = ()

    def __post_init__(self):
        if not self.models or self.n < 1 or self.batch_size < 1:
            raise ValueError(f"PositionMap needs models, n >= 1 and batch_size >= 1, got {self!r}")


@dataclass(frozen=True)
class RegimeSearch:
    """The search's settings. ``search_n`` / ``test_n``: records per position (begin, middle, end) of
    the search and test sets; MDQA has only :data:`MDQA_RECORDS` real records, so its test set takes
    those before ``mdqa_split`` and its search set those from it on (capped at what there is).
    ``require_u``: search only a cell the paired position gate calls a U on accuracy (``False`` only
    in dry runs on random models, so that they reach the search)."""

    ga: GAConfig
    search_n: int
    test_n: int
    seeds: tuple[int, ...] = (0, 1)
    require_u: bool = True
    transfer: bool = True
    tie_break: float = 1e-3
    mdqa_split: int = 300
    search_seed: int = 301  # generated tasks: records disjoint from the map's (seed 300) and from each other
    test_seed: int = 302

    def __post_init__(self):
        for name in ("search_n", "test_n"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RegimeSearch.{name} must be an integer >= 1, got {value!r}")
        if (not self.seeds or len(set(self.seeds)) != len(self.seeds)
                or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.seeds)):
            raise ValueError(f"RegimeSearch.seeds must be distinct integers >= 0, got {self.seeds!r}")
        if not isinstance(self.require_u, bool):
            raise ValueError(f"RegimeSearch.require_u must be True or False, got {self.require_u!r}")
        if not 1 <= self.mdqa_split < MDQA_RECORDS:
            raise ValueError(f"RegimeSearch.mdqa_split must be in [1, {MDQA_RECORDS - 1}], got {self.mdqa_split!r}")
        if self.search_seed == self.test_seed:
            raise ValueError(f"RegimeSearch: search_seed and test_seed must differ (disjoint records), both {self.search_seed}")

    def sizes(self, task: str) -> tuple[int, int]:
        """Records per position of the (search, test) sets of ``task``."""
        if task == "mdqa":
            return min(self.search_n, MDQA_RECORDS - self.mdqa_split), min(self.test_n, self.mdqa_split)
        return self.search_n, self.test_n

    def split(self, task: str, num_items: int) -> tuple[TaskConfig, TaskConfig]:
        """The (search, test) sets of a task at ``num_items`` items, at the first, middle and last position."""
        ends = (0, round(0.5 * (num_items - 1)), num_items - 1)
        search_n, test_n = self.sizes(task)
        if task == "mdqa":
            search = TaskConfig("mdqa", num_items, n=search_n, offset=self.mdqa_split, positions=ends)
            return search, TaskConfig("mdqa", num_items, n=test_n, positions=ends)
        return (TaskConfig(task, num_items, n=search_n, seed=self.search_seed, positions=ends),
                TaskConfig(task, num_items, n=test_n, seed=self.test_seed, positions=ends))


class _Checked:
    """Positive numbers and non-empty tuples of them, as annotated, for every field (a tuple whose
    default is empty may be empty)."""

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        for f in fields(self):
            value, hint = getattr(self, f.name), hints[f.name]
            where = f"{type(self).__name__}.{f.name}"
            if hint in (int, float):
                if isinstance(value, bool) or not isinstance(value, (int, float) if hint is float else int) or value <= 0:
                    raise ValueError(f"{where} must be a positive {hint.__name__}, got {value!r}")
            elif typing.get_origin(hint) is tuple:
                kind = typing.get_origin(typing.get_args(hint)[0]) or typing.get_args(hint)[0]
                numeric = kind in (int, float)
                if (not isinstance(value, tuple) or (not value and f.default != ())
                        or not all(isinstance(v, kind) and not isinstance(v, bool) and (not numeric or v >= 0) for v in value)):
                    what = f"non-negative {kind.__name__}s" if numeric else f"{kind.__name__}s"
                    raise ValueError(f"{where} must be a non-empty tuple of {what}, got {value!r}")


@dataclass(frozen=True)
class Calibration(_Checked):
    """Notebook 1: KV sizes to calibrate and samples per gold position."""

    kv_sizes: tuple[int, ...]
    n: int


@dataclass(frozen=True)
class Probes(_Checked):
    """Notebook 2: text windows for the perplexity probes, coarsening factors k, recall samples."""

    window: int
    windows: int
    ks: tuple[int, ...]
    recall_n: int


@dataclass(frozen=True)
class Attention(_Checked):
    """Notebook 3: lengths for entropy vs length, the length and scales of the scale study, the
    layer-range study (blocks of ``range_width`` layers at ``range_scale``, ``range_n`` samples)."""

    lengths: tuple[int, ...]
    length: int
    scales: tuple[float, ...]
    range_width: int
    range_scale: float
    range_n: int


@dataclass(frozen=True)
class Rsm(_Checked):
    """Notebook 4: the structure-deviation study on ``prompts`` MDQA inputs of ``docs`` documents (gold
    in the middle), stochastic variants drawn with each of ``seeds``."""

    prompts: int
    seeds: tuple[int, ...]
    docs: int


@dataclass(frozen=True)
class Training(_Checked):
    """A training budget: Adam steps, batch size, learning rate (notebook 5's gradient-based scale
    search, notebook 6's MoICE router)."""

    steps: int
    batch_size: int
    lr: float
    micro_batch: int | None = None  # backward over this many prompts at a time (memory only: the same gradient)

    def __post_init__(self):
        super().__post_init__()
        if self.micro_batch is not None and (isinstance(self.micro_batch, bool) or not isinstance(self.micro_batch, int)
                                             or not 1 <= self.micro_batch <= self.batch_size):
            raise ValueError(f"Training.micro_batch must be None or an integer in [1, batch_size={self.batch_size}], "
                             f"got {self.micro_batch!r}")

    @property
    def recipe(self) -> dict:
        """What determines the result (the key of stored results): not ``micro_batch``."""
        return dict(steps=self.steps, batch_size=self.batch_size, lr=self.lr)


@dataclass(frozen=True)
class Ablation(_Checked):
    """Notebook 5: the GA budget of each ablation run and its search set's samples per position."""

    ga: GAConfig
    n: int


@dataclass(frozen=True)
class Latency(_Checked):
    n: int
    rounds: int
    new_tokens: int


@dataclass(frozen=True)
class Extrapolation(_Checked):
    lengths: tuple[int, ...]
    tail: int
    windows: int


@dataclass(frozen=True)
class Benchmarks(_Checked):
    """Notebook 6: KV samples per position, the MDQA task (``None``: not compared), the MoICE router's
    training (and its KV samples per position), latency, perplexity extrapolation."""

    kv_n: int
    mdqa: TaskConfig | None
    router: Training
    router_n: int
    latency: Latency
    extrapolation: Extrapolation


@dataclass(frozen=True)
class SecondModel(_Checked):
    """Notebook 8: the search and its comparisons on a second model with headroom at every position.

    ``dtype`` is the one the study runs in (its results are keyed by it); ``agreement_n`` test
    records per position are also run in float32 to measure that choice. ``ranges``: the GA's y
    ranges as (low, high, grid step); the per-layer GA uses the first. ``bench_n``: test records per
    position for the training-free methods of notebook 6."""

    model: str
    dtype: str
    settings: EvalSettings
    calibration: tuple[TaskConfig, ...]
    search: TaskConfig
    test: TaskConfig
    ga: GAConfig
    ranges: tuple[tuple[float, float, float], ...]
    agreement_n: int
    bench_n: int

    def __post_init__(self):
        super().__post_init__()
        if self.dtype not in ("float32", "bfloat16", "auto"):
            raise ValueError(f"SecondModel.dtype must be 'float32', 'bfloat16' or 'auto', got {self.dtype!r}")
        for low, high, step in self.ranges:
            if not 0 < low < high or step <= 0:
                raise ValueError(f"SecondModel.ranges: need 0 < low < high and step > 0, got {(low, high, step)}")


# the curve families notebook 10 searches at an equal budget: cubic Bézier, piecewise linear through the
# same control points, a free scale per layer
SPACES = ("bezier", "linear", "free")


@dataclass(frozen=True)
class LpesAtPower(_Checked):
    """Notebook 10 (:mod:`lpes_nb.studies.lpes_at_power`): LPES searched, validated and tested on MDQA-20's data
    split (:mod:`lpes_nb.store.splits`) with ``model`` in ``dtype``. The search: ``seeds`` x the GA ``ga`` on
    the first ``search_records`` search records (``items`` documents per prompt; None: the file's 20);
    its ``finalists`` best curves per seed scored on ``validation_records`` validation records; the
    test: each (method, records) of ``test_records`` on that many test records (the baseline on the
    most any method takes); MoICE with a router trained by ``router`` on the search records.
    ``spaces``: the curve families searched and validated on MDQA-20 at the same GA and seeds (Bézier,
    the test's, first); ``transfer``: the other datasets of the split searched and validated alike, each
    one's chosen curve tested on MDQA-20's test part with its PI twin on LPES's records (a cross-task transfer
    the paper does not report: its Table 2 carries MDQA-searched scales to ZeroSCROLLS and L-Eval);
    ``in_domain``: (dataset, records) of those whose chosen curve is also tested on their own test part,
    the baseline, LPES and its PI twin on that many records (KV-75: where the map's accuracy U is deepest).
    ``read_only``: the notebook reads what the store holds (the search's checkpoints, the validation
    and test tables written by ``lpes lpes-at-power``, hours of background CPU) and names
    each step not yet run, computing nothing; otherwise it runs (or resumes) every step."""

    model: str
    dtype: str
    ga: GAConfig
    seeds: tuple[int, ...]
    search_records: int
    finalists: int
    validation_records: int
    test_records: tuple[tuple[str, int], ...]
    router: Training
    items: int | None = None
    batch_size: int = 8
    spaces: tuple[str, ...] = SPACES
    transfer: tuple[str, ...] = ("kv75",)
    in_domain: tuple[tuple[str, int], ...] = ()
    read_only: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"LpesAtPower.dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"LpesAtPower.seeds must be distinct, got {self.seeds!r}")
        if self.items is not None and (isinstance(self.items, bool) or not isinstance(self.items, int) or not 2 <= self.items <= 20):
            raise ValueError(f"LpesAtPower.items must be None (the file's 20) or an integer in [2, 20], got {self.items!r}")
        if not isinstance(self.read_only, bool):
            raise ValueError(f"LpesAtPower.read_only must be True or False, got {self.read_only!r}")
        if self.finalists > self.ga.population:
            raise ValueError(f"LpesAtPower.finalists must be in [1, {self.ga.population}] (the GA's population), got {self.finalists!r}")
        parts = dict(SIZES["mdqa20"][1])
        for name, most in (("search_records", parts["search"]), ("validation_records", parts["validation"])):
            if getattr(self, name) > most:
                raise ValueError(f"LpesAtPower.{name} must be in [1, {most}] (the split's {name.split('_')[0]} part), "
                                 f"got {getattr(self, name)!r}")
        for pair in self.test_records:
            if (len(pair) != 2 or not isinstance(pair[0], str) or isinstance(pair[1], bool) or not isinstance(pair[1], int)
                    or not 1 <= pair[1] <= parts["test"]):
                raise ValueError(f"LpesAtPower.test_records: each entry is (method, records in [1, {parts['test']}]), got {pair!r}")
        if self.spaces[0] != "bezier" or len(set(self.spaces)) != len(self.spaces) or not set(self.spaces) <= set(SPACES):
            raise ValueError(f"LpesAtPower.spaces must be distinct families of {SPACES}, 'bezier' (the test's curve) first, "
                             f"got {self.spaces!r}")
        others = sorted(set(SIZES) - {"mdqa20"})
        if len(set(self.transfer)) != len(self.transfer) or not set(self.transfer) <= set(others):
            raise ValueError(f"LpesAtPower.transfer must be distinct datasets of {others} (searched there, tested on MDQA-20), "
                             f"got {self.transfer!r}")
        for pair in self.in_domain:
            if (len(pair) != 2 or pair[0] not in self.transfer or isinstance(pair[1], bool) or not isinstance(pair[1], int)
                    or not 1 <= pair[1] <= dict(SIZES[pair[0]][1])["test"]):
                raise ValueError(f"LpesAtPower.in_domain: each entry is (a dataset of transfer {self.transfer}, records in [1, its "
                                 f"test part's size]), got {pair!r}")
        if not {"LPES", "PI"} <= dict(self.test_records).keys():
            raise ValueError(f"LpesAtPower.test_records must test LPES and its PI twin, got {self.test_records!r}")


@dataclass(frozen=True)
class Profile(_Checked):
    name: str
    model: str
    settings: EvalSettings
    search: TaskConfig  # the GA's search set
    test: TaskConfig  # the held-out test set (disjoint seed)
    mdqa: TaskConfig
    calibration: Calibration
    probes: Probes
    ga: GAConfig  # the search's budget (its seed is the notebook's parameter)
    ablation: Ablation
    gradient: Training
    attention: Attention
    rsm: Rsm
    benchmarks: Benchmarks
    second: SecondModel
    position_map: PositionMap  # notebook 9
    regime_search: RegimeSearch  # notebook 9, where its map shows a middle deficit
    lpes_at_power: LpesAtPower  # notebook 10


PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile(
        name="smoke", model="tiny-llama", settings=EvalSettings(batch_size=8),
        search=TaskConfig("kv", 6, n=2, seed=1), test=TaskConfig("kv", 6, n=3, seed=2), mdqa=TaskConfig("mdqa", 3, n=2),
        calibration=Calibration(kv_sizes=(4, 6), n=3),
        probes=Probes(window=64, windows=2, ks=(2, 8, 64), recall_n=2),
        ga=GAConfig(population=8, parents=3, mutations=4, crossovers=1, generations=2),
        ablation=Ablation(GAConfig(population=6, parents=2, mutations=3, crossovers=1, generations=1), n=1),
        gradient=Training(steps=2, batch_size=3, lr=0.1),
        attention=Attention(lengths=(32, 64, 128), length=64, scales=(1.0, 2.0, 4.0), range_width=2, range_scale=2.0, range_n=2),
        rsm=Rsm(prompts=4, seeds=(0, 1), docs=3),
        benchmarks=Benchmarks(kv_n=3, mdqa=TaskConfig("mdqa", 3, n=2), router=Training(steps=2, batch_size=2, lr=3e-3), router_n=2,
                              latency=Latency(n=1, rounds=1, new_tokens=2),
                              extrapolation=Extrapolation(lengths=(1024, 3072), tail=128, windows=1)),
        second=SecondModel(model="tiny-qwen2", dtype="bfloat16", settings=EvalSettings(mode="generate", max_new_tokens=4),
                           calibration=(TaskConfig("two_fact", 4, n=2, seed=100),), search=TaskConfig("two_fact", 4, n=2, seed=1),
                           test=TaskConfig("two_fact", 4, n=3, seed=2),
                           ga=GAConfig(population=4, parents=2, mutations=1, crossovers=1, generations=1),
                           ranges=((1.0, 2.0, 0.1), (1.0, 1.3, 0.05)), agreement_n=2, bench_n=2),
        position_map=PositionMap(models=(MapModel("tiny-llama", "float32", lengths=(96, 192), mdqa_docs=(5,)),
                                         MapModel("tiny-qwen2", "bfloat16", lengths=(96,), mdqa_docs=())), n=2,
                                 # KV on the original 75-pair file needs a 16k window: the paper-dry model's
                                 record_cells=(RecordCell("tiny-llama", "float32", items=5, n=2),
                                               RecordCell("paper-dry-llama", "float32", items=75, n=2, task="kv"))),
        regime_search=RegimeSearch(GAConfig(population=4, parents=2, mutations=1, crossovers=1, generations=1), search_n=2, test_n=3),
        # the whole pipeline (two searches per curve family and on KV-75, validation, export, the test with a trained
        # MoICE router, the transfer test) on 5-document prompts; the model with a window for KV-75's ~5.5k tokens
        lpes_at_power=LpesAtPower(model="paper-dry-llama", dtype="float32",
                                  ga=GAConfig(population=4, parents=2, mutations=1, crossovers=1, generations=1), seeds=(0, 1),
                                  search_records=1, finalists=2, validation_records=3,
                                  test_records=(("LPES", 3), ("PI", 3), ("Ms-PoE", 2), ("MoICE (per-head router, task-trained)", 2)),
                                  in_domain=(("kv75", 2),),
                                  router=Training(steps=2, batch_size=2, lr=3e-3), items=5),
    ),
    # SmolLM2 at 10 pairs: among the sizes where the middle and the end stay above the floor while the
    # prompt stays short (~160 tokens); notebook 1 prints its accuracy by position (score mode).
    Profile(
        name="cpu", model="smollm2-135m", settings=EvalSettings(batch_size=8),
        search=TaskConfig("kv", 10, n=8, seed=1), test=TaskConfig("kv", 10, n=100, seed=2),
        mdqa=TaskConfig("mdqa", 10, n=20, offset=100),
        calibration=Calibration(kv_sizes=(4, 6, 8, 10, 20, 30, 40), n=30),
        probes=Probes(window=512, windows=8, ks=(2, 4, 16, 64, 256, 512), recall_n=30),  # windows: the units of the probes' intervals
        # a CPU-sized budget (the paper: population 32, 20 generations)
        ga=GAConfig(population=16, parents=6, mutations=8, crossovers=2, generations=6),
        ablation=Ablation(GAConfig(population=6, parents=2, mutations=3, crossovers=1, generations=1), n=5),
        gradient=Training(steps=30, batch_size=6, lr=0.1),
        attention=Attention(lengths=(256, 512, 1024, 2048), length=1024, scales=(1.0, 1.25, 1.5, 1.75, 2.0, 3.0),
                            range_width=6, range_scale=2.0, range_n=10),
        rsm=Rsm(prompts=30, seeds=(0, 1, 2), docs=5),  # ~800-token MDQA prompts (the paper: 500 inputs, 16 seeds)
        # every method on the test KV set (fewer samples than notebook 5: 11 methods, Attention
        # Buckets costs 7 passes). No MDQA (None): at n = 6 the unmodified model answered 0 of 18,
        # and the ~1.4k-token prompts cost ~36 of the run's minutes for 11 methods.
        benchmarks=Benchmarks(kv_n=30, mdqa=None, router=Training(steps=30, batch_size=4, lr=3e-3), router_n=20,
                              latency=Latency(n=1, rounds=3, new_tokens=8),
                              extrapolation=Extrapolation(lengths=(6144, 10240), tail=512, windows=1)),
        # Qwen2.5-Coder-0.5B, bf16 (this CPU class has AVX512-BF16; agreement with float32 is
        # measured in the notebook), greedy decoding judged by the task metric (score mode assumes
        # the answer's canonical tokens; Qwen often answers a KV value in quotes). It is at the KV
        # ceiling (100/90/100 % at 100 letter pairs, n = 10) and near the floor on 5-document MDQA;
        # two-fact questions in 10 filler sentences (~400 tokens) have headroom everywhere.
        second=SecondModel(model="qwen2.5-coder-0.5b", dtype="bfloat16",
                           settings=EvalSettings(mode="generate", max_new_tokens=6),
                           calibration=(TaskConfig("kv", 40, n=10, seed=100), TaskConfig("kv", 100, n=10, seed=100),
                                        TaskConfig("mdqa", 10, n=10, offset=100), TaskConfig("two_fact", 10, n=20, seed=100),
                                        TaskConfig("two_fact", 20, n=20, seed=100)),
                           search=TaskConfig("two_fact", 10, n=4, seed=1), test=TaskConfig("two_fact", 10, n=20, seed=2),
                           ga=GAConfig(population=8, parents=3, mutations=4, crossovers=1, generations=1),
                           ranges=((1.0, 2.0, 0.1), (1.0, 1.3, 0.05)), agreement_n=20, bench_n=5),
        # n = 30 records per cell and position; SmolLM2 in float32 (the committed run's dtype), Qwen in
        # bf16 (notebook 8's, with its measured agreement). The ladder as far as two sessions' CPU time
        # reached (a cell is 150 prompts: ~4 min at 512 tokens, ~9 at 1k, ~20 at 2k for SmolLM2; Qwen's
        # 10-document MDQA ~35 min, on 2 cores with AVX512-BF16); longer lengths are the next cells
        # (notebook 9 says so)
        position_map=PositionMap(models=(MapModel("smollm2-135m", "float32", lengths=(256, 512, 1024), mdqa_docs=(10,)),
                                         MapModel("qwen2.5-coder-0.5b", "bfloat16", lengths=(256, 512), mdqa_docs=(10,))),
                                 n=30,
                                 # the LPES paper's Qwen setting (MDQA with 20 documents, ~3k tokens of a 32k
                                 # window) on all 441 records and its Vicuna layout (10 documents), record by
                                 # record; only cells the store holds in full (the cached rerun computes nothing)
                                 record_cells=(RecordCell("qwen2.5-coder-0.5b", "bfloat16", items=20, n=441),
                                               RecordCell("qwen2.5-coder-0.5b", "bfloat16", items=10, n=200),
                                               # ~2.2 min per record on 2 AMD EPYC cores with AVX512-BF16 (5.1k tokens
                                               # x 5 positions, 100 new tokens)
                                               # re-scored under the answer forms (lpes map --rescore): gold columns read
                                               RecordCell("qwen2.5-coder-0.5b", "bfloat16", items=75, n=100, task="kv"),
                                               # ~5 min per record there (9.5k tokens x 5 positions, continuations in
                                               # 512-token pieces)
                                               RecordCell("qwen2.5-coder-0.5b", "bfloat16", items=140, n=60, task="kv",
                                                          prefill_chunk=512, gold_withdrawn=True),
                                               # the size comparison: the 1.5B on the 0.5B's MDQA-20 records, as far as its
                                               # background map has reached (~1 min per record on an Intel Xeon with AMX,
                                               # ~2.5 on the AMD EPYC with AVX512-BF16, ~5-9 on one with AVX2 only; the
                                               # model installed on demand, read without it by its recorded fingerprint)
                                               RecordCell("qwen2.5-coder-1.5b", "bfloat16", items=20, n=325))),
        # where the map shows a deficit of >= 10 points at the middle, closing it moves the λ-score by
        # 0.3 x 0.1 = 0.03; 100 records per position give a paired SE near that (notebook 9 reports the
        # SE it reached). Searches only where the paired gate calls a cell a U (notebook 9 prints which).
        regime_search=RegimeSearch(GAConfig(population=16, parents=6, mutations=8, crossovers=2, generations=6),
                                   search_n=100, test_n=200),
        # the LPES Qwen setting at a CPU budget (the plan: lpes_nb.studies.lpes_at_power). Its steps are background
        # runs of `lpes lpes-at-power` over several sittings (a search evaluation 72-265 s by
        # CPU, measured in lpes_nb.studies.lpes_at_power; the test thousands of ~3k-token prompts): the notebook
        # shows what they have stored
        lpes_at_power=LpesAtPower(model="qwen2.5-coder-0.5b", dtype="bfloat16",
                                  # population 16: 6 parents, 8 mutations, 2 crossovers; 6 generations (the paper: 32, 20)
                                  ga=GAConfig(population=16, parents=6, mutations=8, crossovers=2, generations=6), seeds=(0, 1),
                                  # the log-prob fitness ranks random curves alike on two disjoint sets of 6 records (split-half ρ 0.92)
                                  search_records=8, finalists=4, validation_records=60,
                                  # LPES's claims at full power, the other baselines where the budget allows (>= 150, >= 100).
                                  # Not Dynamic NTK: inside the 32,768-token window (MDQA-20: ~3k tokens) it keeps the
                                  # trained base, so its rows would be the baseline's (the test refuses it)
                                  # Ms-PoE: the reference variant and each of its two parts alone (issue #100's
                                  # diagnostic), beside the variant run before it was held against its authors' code
                                  test_records=(("LPES", 321), ("PI", 321), ("Ms-PoE", 150), ("Ms-PoE, fixed head order", 150),
                                                ("PI at the mean Ms-PoE ratio from layer 2", 150), ("Ms-PoE (rank, endpoints grid)", 150),
                                                ("CALIOPE-Moses", 150), ("CALIOPE-Hourglass", 150), ("CALIOPE-Decay", 150),
                                                ("Attention Buckets", 100), ("MoICE (per-head router, task-trained)", 100),
                                                ("MoICE", 100), ("MoICE (untrained)", 100)),
                                  # the KV-75 curve on KV-75's own test part, where the map's accuracy U is deepest
                                  in_domain=(("kv75", 150),),
                                  # the per-head router: notebook 6's recipe (model frozen), on the search records'
                                  # answers; MoICE itself is trained as its authors' script trains it (its micro-batch this one's)
                                  router=Training(steps=30, batch_size=4, lr=3e-3, micro_batch=1), read_only=True),
    ),
    Profile(
        # Vicuna-7B-v1.5-16k: 75 UUID pairs are ~5.5k tokens, beyond the 4k window of Vicuna-7B-v1.5
        # (the paper-dry run found it); the extrapolation study therefore starts at its 16k window
        name="paper", model="lmsys/vicuna-7b-v1.5-16k", settings=EvalSettings(batch_size=16),
        search=TaskConfig("kv", 50, n=100, seed=1, key_format="uuid", value_format="uuid"),
        test=TaskConfig("kv", 75, n=500, source="file", key_format="uuid", value_format="uuid"),
        mdqa=TaskConfig("mdqa", 20, n=441, positions=(0, 4, 9, 14, 19)),
        calibration=Calibration(kv_sizes=(25, 50, 75), n=100),
        probes=Probes(window=4096, windows=8, ks=(2, 4, 16, 64, 256, 1024, 4096), recall_n=50),
        ga=GAConfig(),  # the paper's budget
        ablation=Ablation(GAConfig(population=16, parents=6, mutations=8, crossovers=2, generations=10), n=50),
        # backward passes over 16 prompts of 50 UUID pairs (~3.7k tokens) keep ~264 GB of a 7B's
        # activations, 8 prompts of 75 pairs ~196 GB: one prompt at a time, the same gradient
        gradient=Training(steps=200, batch_size=16, lr=0.05, micro_batch=1),
        attention=Attention(lengths=(1024, 2048, 4096, 8192), length=4096, scales=(1.0, 1.25, 1.5, 1.75, 2.0),
                            range_width=4, range_scale=2.0, range_n=100),
        rsm=Rsm(prompts=500, seeds=tuple(range(16)), docs=20),  # LPES Sec. 4.2: 500 MDQA inputs, 16 seeds
        benchmarks=Benchmarks(kv_n=500, mdqa=TaskConfig("mdqa", 20, n=441, positions=(0, 4, 9, 14, 19)),
                              router=Training(steps=2000, batch_size=8, lr=3e-3, micro_batch=1), router_n=500, latency=Latency(n=50, rounds=3, new_tokens=16),
                              extrapolation=Extrapolation(lengths=(16384, 24576, 32768), tail=2048, windows=4)),
        second=SecondModel(model="Qwen/Qwen2.5-7B-Instruct", dtype="bfloat16", settings=EvalSettings(mode="generate", batch_size=16),
                           calibration=(TaskConfig("two_fact", 20, n=100, seed=100), TaskConfig("two_fact", 100, n=100, seed=100)),
                           search=TaskConfig("two_fact", 100, n=50, seed=1), test=TaskConfig("two_fact", 100, n=300, seed=2),
                           ga=GAConfig(), ranges=((1.0, 2.0, 0.1), (1.0, 1.3, 0.05)), agreement_n=50, bench_n=100),
        # the papers' regime: prompts filling 25-75 % of Vicuna-7B-v1.5-16k's window
        position_map=PositionMap(models=(MapModel("lmsys/vicuna-7b-v1.5-16k", "bfloat16", lengths=(1024, 2048, 4096, 8192, 12288),
                                                  mdqa_docs=(10, 20)),), n=100, batch_size=16),
        regime_search=RegimeSearch(GAConfig(), search_n=100, test_n=500),
        # LPES Table 1's Qwen: the paper's GA on the whole search part (it searched on 200 records, tested on
        # 500; MDQA-20 has 441), every method on the whole test part (not Dynamic NTK: inside the window it
        # changes nothing, and the test refuses it)
        lpes_at_power=LpesAtPower(model="Qwen/Qwen2.5-7B-Instruct", dtype="bfloat16", ga=GAConfig(), seeds=(0, 1),
                                  search_records=60, finalists=4, validation_records=60,
                                  test_records=tuple((m, 321) for m in ("LPES", "PI", "Ms-PoE", "CALIOPE-Moses", "CALIOPE-Hourglass",
                                                                        "CALIOPE-Decay", "Attention Buckets", "MoICE")),
                                  router=Training(steps=2000, batch_size=8, lr=3e-3, micro_batch=1), batch_size=16),
    ),
)}


def _paper_dry(paper: Profile) -> Profile:
    """The ``paper`` profile's task sizes, sequence lengths, batch sizes, positions and studies on a
    random-weight Llama of Vicuna-7B-16k's structure at width 32 and depth 8 (``paper-dry-llama``): only
    the samples per study and the GA budget are smaller. ``lpes costs dry-run`` executes
    it and records what every study costs; the cost model scales that to the 7B model. Where memory
    is at stake the sample counts fill a batch of 16 at the longest prompts (KV calibration and test
    set at 75 pairs: 6 per position; the GA's search set at 50 pairs: 6; MDQA: 4 per position, 20
    prompts); studies that repeat the same forward many times (masking recall: once per layer) keep 1."""
    b = paper.benchmarks
    small_ga = GAConfig(population=4, parents=2, mutations=1, crossovers=1, generations=1)
    second = paper.second
    return replace(
        paper, name="paper-dry", model="paper-dry-llama",
        search=replace(paper.search, n=6), test=replace(paper.test, n=6), mdqa=replace(paper.mdqa, n=4),
        calibration=replace(paper.calibration, n=6), probes=replace(paper.probes, windows=1, recall_n=1),
        ga=small_ga, ablation=Ablation(small_ga, n=1), gradient=replace(paper.gradient, steps=2),
        attention=replace(paper.attention, range_n=1), rsm=replace(paper.rsm, prompts=4, seeds=(0, 1)),
        benchmarks=replace(b, kv_n=1, mdqa=replace(b.mdqa, n=1), router=replace(b.router, steps=2), router_n=2,
                           latency=replace(b.latency, n=1, rounds=1), extrapolation=replace(b.extrapolation, windows=1)),
        second=replace(second, model="paper-dry-llama", calibration=tuple(replace(c, n=1) for c in second.calibration),
                       search=replace(second.search, n=1), test=replace(second.test, n=6), ga=small_ga, agreement_n=1,
                       bench_n=1),
        position_map=replace(paper.position_map, n=1),
        regime_search=replace(paper.regime_search, ga=small_ga, search_n=1, test_n=1),
        lpes_at_power=replace(paper.lpes_at_power, model="paper-dry-llama", ga=small_ga, search_records=1, finalists=1,
                              validation_records=1, test_records=tuple((m, 1) for m, _ in paper.lpes_at_power.test_records),
                              router=replace(paper.lpes_at_power.router, steps=2)),
    )


PROFILES["paper-dry"] = _paper_dry(PROFILES["paper"])

# The embedded models on a GPU: the map continued to long prompts of each trained window (SmolLM2
# 8,192 tokens, Qwen 32,768; the analogue of the papers' Vicuna rows, which fill a 4k window; the
# papers' Qwen rows sit at 2-8 % of a 130k window, which the record cell below covers) in bf16 with 100 records per cell and position, and the search
# at the paper's GA budget in the regime with the largest deficit, a search set of 200 records per
# position (MDQA: the 141 real records left after the test set's 300), the test set at the paper's
# 500, two seeds, and the transfer KV <-> MDQA. ``lpes costs plan --profile gpu`` gives
# its cost before it starts (docs/gpu.md).
PROFILES["gpu"] = replace(
    PROFILES["cpu"], name="gpu", settings=EvalSettings(batch_size=16),
    position_map=PositionMap(models=(MapModel("smollm2-135m", "bfloat16", lengths=(256, 512, 1024, 2048, 4096, 5120, 6144, 7168),
                                              mdqa_docs=(10, 20)),
                                     MapModel("qwen2.5-coder-0.5b", "bfloat16",
                                              lengths=(512, 1024, 2048, 4096, 8192, 16384, 20480, 24576, 28672), mdqa_docs=(10, 20))),
                             n=100, batch_size=16,
                             # the papers' settings at their record counts (all 441 MDQA records; 500 KV)
                             record_cells=(RecordCell("qwen2.5-coder-0.5b", "bfloat16", items=20, n=441),
                                           RecordCell("qwen2.5-coder-0.5b", "bfloat16", items=10, n=441),
                                           RecordCell("qwen2.5-coder-0.5b", "bfloat16", items=75, n=500, task="kv"),
                                           RecordCell("qwen2.5-coder-0.5b", "bfloat16", items=140, n=500, task="kv"),
                                           # the size comparison (notebook 9): the 1.5B on the 0.5B's records
                                           RecordCell("qwen2.5-coder-1.5b", "bfloat16", items=20, n=441),
                                           RecordCell("qwen2.5-coder-1.5b", "bfloat16", items=75, n=500, task="kv"))),
    regime_search=RegimeSearch(GAConfig(), search_n=200, test_n=500),
    # the embedded Qwen at the paper's GA budget, every method on the whole test part
    lpes_at_power=replace(PROFILES["paper"].lpes_at_power, model="qwen2.5-coder-0.5b",
                          router=replace(PROFILES["cpu"].lpes_at_power.router, steps=200)),
)


def _gpu_dry(gpu: Profile) -> Profile:
    """The ``gpu`` profile's notebook 9 on tiny random models at short lengths, with a GA of one
    generation; its deficit criterion is off (a random model has no deficit), so that the dry run
    goes through the regime search and its transfer, as the gpu run would."""
    small_ga = GAConfig(population=4, parents=2, mutations=1, crossovers=1, generations=1)
    return replace(
        gpu, name="gpu-dry", model="tiny-llama",
        position_map=PositionMap(models=(MapModel("tiny-llama", "bfloat16", lengths=(96, 192), mdqa_docs=(5,)),
                                         MapModel("tiny-qwen2", "bfloat16", lengths=(96,), mdqa_docs=(5,))), n=2, batch_size=4,
                                 record_cells=(RecordCell("tiny-qwen2", "bfloat16", items=5, n=2),)),
        regime_search=replace(gpu.regime_search, ga=small_ga, search_n=2, test_n=2, require_u=False),
        lpes_at_power=replace(PROFILES["smoke"].lpes_at_power, dtype="bfloat16"),
    )


PROFILES["gpu-dry"] = _gpu_dry(PROFILES["gpu"])


def profile(name: str) -> Profile:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose one of {sorted(PROFILES)}")
    return PROFILES[name]

"""The named configurations of the notebooks: ``smoke`` (tiny random model, CI), ``cpu`` (the
committed run on the embedded model) and ``paper`` (the papers' settings, for a GPU).

One typed object per study, one :class:`Profile` per name. Every setting is checked when this
module is imported: a misspelt or missing key is a ``TypeError``, a bad value a ``ValueError``.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields

from .evaluate import EvalSettings
from .ga import GAConfig
from .tasks import TaskConfig


class _Checked:
    """Positive numbers and non-empty tuples of them, as annotated, for every field."""

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        for f in fields(self):
            value, hint = getattr(self, f.name), hints[f.name]
            where = f"{type(self).__name__}.{f.name}"
            if hint in (int, float):
                if isinstance(value, bool) or not isinstance(value, (int, float) if hint is float else int) or value <= 0:
                    raise ValueError(f"{where} must be a positive {hint.__name__}, got {value!r}")
            elif typing.get_origin(hint) is tuple:
                kind = typing.get_args(hint)[0]
                if (not isinstance(value, tuple) or not value
                        or not all(isinstance(v, kind) and not isinstance(v, bool) and v >= 0 for v in value)):
                    raise ValueError(f"{where} must be a non-empty tuple of non-negative {kind.__name__}s, got {value!r}")


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
    """Notebook 4: prompts and seeds of the RSM deviation study."""

    prompts: int
    seeds: tuple[int, ...]


@dataclass(frozen=True)
class Training(_Checked):
    """A training budget: Adam steps, batch size, learning rate (notebook 5's gradient-based scale
    search, notebook 6's MoICE router)."""

    steps: int
    batch_size: int
    lr: float


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
        rsm=Rsm(prompts=4, seeds=(0, 1)),
        benchmarks=Benchmarks(kv_n=3, mdqa=TaskConfig("mdqa", 3, n=2), router=Training(steps=2, batch_size=2, lr=3e-3), router_n=2,
                              latency=Latency(n=1, rounds=1, new_tokens=2),
                              extrapolation=Extrapolation(lengths=(1024, 3072), tail=128, windows=1)),
    ),
    # SmolLM2 at 10 pairs: first / middle / last = 90 / 10 / 13 % (n = 30 each, score mode), the
    # only size where middle and end are not ~0 while the prompt stays short (~160 tokens).
    Profile(
        name="cpu", model="smollm2-135m", settings=EvalSettings(batch_size=8),
        search=TaskConfig("kv", 10, n=8, seed=1), test=TaskConfig("kv", 10, n=50, seed=2),
        mdqa=TaskConfig("mdqa", 10, n=20, offset=100),
        calibration=Calibration(kv_sizes=(4, 6, 8, 10, 20, 30, 40), n=30),
        probes=Probes(window=512, windows=2, ks=(2, 4, 16, 64, 256, 512), recall_n=10),
        # a CPU-sized budget (the paper: population 32, 20 generations)
        ga=GAConfig(population=16, parents=6, mutations=8, crossovers=2, generations=6),
        ablation=Ablation(GAConfig(population=6, parents=2, mutations=3, crossovers=1, generations=1), n=5),
        gradient=Training(steps=30, batch_size=6, lr=0.1),
        attention=Attention(lengths=(256, 512, 1024, 2048), length=1024, scales=(1.0, 1.25, 1.5, 1.75, 2.0, 3.0),
                            range_width=6, range_scale=2.0, range_n=10),
        rsm=Rsm(prompts=20, seeds=(0, 1, 2)),
        # every method on the test KV set (fewer samples than notebook 5: 11 methods, Attention
        # Buckets costs 7 passes). No MDQA (None): at n = 6 the unmodified model answered 0 of 18,
        # and the ~1.4k-token prompts cost ~36 of the run's minutes for 11 methods.
        benchmarks=Benchmarks(kv_n=30, mdqa=None, router=Training(steps=30, batch_size=4, lr=3e-3), router_n=20,
                              latency=Latency(n=1, rounds=3, new_tokens=8),
                              extrapolation=Extrapolation(lengths=(6144, 10240), tail=512, windows=1)),
    ),
    Profile(
        name="paper", model="lmsys/vicuna-7b-v1.5", settings=EvalSettings(batch_size=16),
        search=TaskConfig("kv", 50, n=100, seed=1, key_format="uuid", value_format="uuid"),
        test=TaskConfig("kv", 75, n=500, source="file", key_format="uuid", value_format="uuid"),
        mdqa=TaskConfig("mdqa", 20, n=441, positions=(0, 4, 9, 14, 19)),
        calibration=Calibration(kv_sizes=(25, 50, 75), n=100),
        probes=Probes(window=4096, windows=8, ks=(2, 4, 16, 64, 256, 1024, 4096), recall_n=50),
        ga=GAConfig(),  # the paper's budget
        ablation=Ablation(GAConfig(population=16, parents=6, mutations=8, crossovers=2, generations=10), n=50),
        gradient=Training(steps=200, batch_size=16, lr=0.05),
        attention=Attention(lengths=(1024, 2048, 4096, 8192), length=4096, scales=(1.0, 1.25, 1.5, 1.75, 2.0),
                            range_width=4, range_scale=2.0, range_n=100),
        rsm=Rsm(prompts=100, seeds=(0, 1, 2, 3, 4)),
        benchmarks=Benchmarks(kv_n=500, mdqa=TaskConfig("mdqa", 20, n=441, positions=(0, 4, 9, 14, 19)),
                              router=Training(steps=2000, batch_size=8, lr=3e-3), router_n=500, latency=Latency(n=50, rounds=3, new_tokens=16),
                              extrapolation=Extrapolation(lengths=(4096, 8192, 16384), tail=2048, windows=4)),
    ),
)}


def profile(name: str) -> Profile:
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose one of {sorted(PROFILES)}")
    return PROFILES[name]

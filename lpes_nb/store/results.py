"""The result store: where studies write, how a result is keyed, and the one way files are written.

``results/<profile>/`` (CSV + the JSON of parameters that produced it) and ``figures/<profile>/``;
the ``cpu`` profile writes straight to ``results/`` and ``figures/``, which are committed. Every
expensive step is found by the key of its parameters (:func:`cache_key`): tables through
:func:`cached_table`, GA searches through their checkpoint (``search.run_search``), the MoICE router
through its JSON (``moice.load_or_train``). A rerun therefore recomputes nothing, and a changed
parameter recomputes exactly the steps whose key contains it.

When the *code* behind a step changes without a parameter changing, add or bump a ``version`` entry
in that step's parameters: the old result is then a miss. With ``LPES_CACHED_ONLY=1`` every miss
raises :class:`CacheMiss` naming the step, instead of recomputing (the published-run check)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from ..system import footprint
from ..system.files import atomic_write

CACHED_ONLY = "LPES_CACHED_ONLY"
PUBLISHED_PROFILE = "cpu"  # writes straight to results/ and figures/, which are committed
BEST_SCALES = "lpes_best_scales.json"  # what notebook 5 found; notebooks 4, 6, 7 and the scripts read it


class CacheMiss(RuntimeError):
    """A step that would be recomputed in a run that may only read stored results."""


NUMPY_REPR = re.compile(r"\bnp\.(?:float|int|uint|bool_)\w*\(")


def cache_key(**parts) -> str:
    """A stable hash of everything that determines a result (model, RoPE config, task, seed, ...):
    canonical JSON (sorted keys, numpy scalars and arrays as Python numbers and lists, other objects
    by their repr), hashed. A numpy repr inside a part (``np.float64(1.2)`` in a method's repr) is
    refused: it would change with numpy, not with the result, and silently orphan stored results."""
    text = json.dumps(parts, sort_keys=True, default=_canonical)
    if NUMPY_REPR.search(text):
        raise ValueError(f"a cache key holds a numpy repr ({NUMPY_REPR.search(text).group(0)}...): convert the "
                         f"values to Python numbers where the parameters are built; parts: {text[:200]}")
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _canonical(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return repr(value)


def reading_only() -> bool:
    """Whether this run may only read the store (``LPES_CACHED_ONLY=1``): it shows no progress bars,
    there being no work to follow (a published notebook holds none)."""
    return os.environ.get(CACHED_ONLY, "") not in ("", "0")


def will_compute(step: str, where: Path | str) -> None:
    """Call right before an expensive step recomputes: refuses, naming the step, under
    ``LPES_CACHED_ONLY=1``, so a check of the published run never silently spends an hour."""
    if reading_only():
        raise CacheMiss(
            f"step '{step}' is not in the result store (looked for {where}); {CACHED_ONLY} is set, so it is "
            "not recomputed. Rerun without it (scripts/run_all.sh) to compute and store it."
        )


def write_json(path: Path | str, payload) -> Path:
    """JSON with sorted keys and a final newline: the same payload always gives the same bytes."""
    return atomic_write(path, json.dumps(payload, indent=2, sort_keys=True, default=repr) + "\n")


def write_csv(path: Path | str, df: pd.DataFrame) -> Path:
    return atomic_write(path, df.to_csv(index=False))


def project_root(start: Path | None = None) -> Path:
    """The nearest directory upwards holding this project's pyproject.toml (notebooks run in notebooks/)."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "pyproject.toml").is_file() and (d / "lpes_nb").is_dir():
            return d
    return here


def output_dir(kind: str, profile: str) -> Path:
    """``results`` or ``figures`` directory for a profile (``$LPES_OUTPUT_ROOT`` overrides the root)."""
    if kind not in ("results", "figures"):
        raise ValueError(f"kind must be 'results' or 'figures', got {kind!r}")
    root = Path(os.environ.get("LPES_OUTPUT_ROOT", project_root()))
    path = root / kind if profile == PUBLISHED_PROFILE else root / kind / profile
    path.mkdir(parents=True, exist_ok=True)
    return path


def check_model_part(params: dict) -> None:
    """A result computed with a model is keyed by its weights and dtype, not its name alone."""
    if "model" in params and not {"weights", "dtype"} <= set(params):
        raise ValueError(f"the parameters of a result computed with model {params['model']!r} need its dtype and weight "
                         f"fingerprint: build them with lpes_nb.store.models.model_key (got keys {sorted(params)})")


def cached_table(name: str, params: dict, compute: Callable[[], pd.DataFrame], profile: str) -> pd.DataFrame:
    """Read ``<name>-<cache_key(params)>.csv`` if it exists, else compute it and write CSV + params JSON."""
    check_model_part(params)
    directory = output_dir("results", profile)
    stem = f"{name}-{cache_key(**params)}"
    csv = directory / f"{stem}.csv"
    if csv.exists():
        return pd.read_csv(csv)
    will_compute(name, csv)
    with footprint.study(name):
        df = compute()
    write_csv(csv, df)
    write_json(directory / f"{stem}.json", params)
    return df


def save_scales(path: Path | str, scales, **meta) -> Path:
    """The scales JSON every method and the explorer load: ``{"scales": [...], ...meta}``."""
    values = [float(s) for s in scales]
    if not values or not all(np.isfinite(s) and s > 0 for s in values):
        raise ValueError(f"scales must be finite numbers > 0, one per layer, got {list(scales)!r}")
    return write_json(path, {"scales": [round(s, 10) for s in values], **meta})


def save_ga(result, directory: Path | str, name: str = "ga", **provenance) -> Path:
    """Write a GA run (:class:`lpes_nb.core.ga.GAResult`) as ``<name>_history.csv``, ``<name>_summary.csv``
    and ``<name>_best.json`` (the scales JSON format that the methods load, with ``provenance``: the
    model's identity, the task …); returns the scales file."""
    directory = Path(directory)
    write_csv(directory / f"{name}_history.csv", result.history)
    write_csv(directory / f"{name}_summary.csv", result.summary)
    return save_scales(directory / f"{name}_best.json", result.best_scales, fitness=result.best_fitness,
                       control_points=result.control_points, evaluations=result.evaluations, **provenance)


def read_scales(path: Path | str, num_layers: int | None = None, model: dict | None = None) -> dict:
    """The payload of a scales JSON (``payload["scales"]``: floats), checked: one finite scale > 0
    per layer (``num_layers``, or the layers of ``model``, a :func:`lpes_nb.store.models.model_identity`).
    Scales exported with the identity of the model they were found on (a search's) are refused on
    any other model; curves that name no model (the explorer's) are checked by their layer count."""
    try:
        payload = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not a scales JSON file: {err}") from None
    if not isinstance(payload, dict) or "scales" not in payload:
        raise ValueError(f"{path} has no 'scales' list")
    listed = payload["scales"]
    if not isinstance(listed, list) or not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in listed):
        raise ValueError(f"{path}: 'scales' must be a list of numbers, one per layer, got {listed!r}")
    scales = [float(s) for s in listed]
    stored = payload.get("model")
    if model is not None and isinstance(stored, dict):
        differ = [f"{k} {stored.get(k)!r} (here {model.get(k)!r})" for k in sorted(set(stored) | set(model)) if stored.get(k) != model.get(k)]
        if differ:
            raise ValueError(f"{path} holds scales found on another model than {model['name']!r}: " + "; ".join(differ))
    num_layers = model["layers"] if model is not None and num_layers is None else num_layers
    if num_layers is not None and len(scales) != num_layers:
        raise ValueError(f"{path} holds {len(scales)} scales, the model has {num_layers} layers")
    if any(not (np.isfinite(s) and s > 0) for s in scales):
        raise ValueError(f"{path} has non-finite or non-positive scales; every RoPE scale must be a finite number > 0")
    return {**payload, "scales": scales}


class ResultCache:
    """Tables on disk under ``directory``, one CSV per key, written atomically (the GA's per-scales
    fitness tables)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.csv"

    def get(self, key: str) -> pd.DataFrame | None:
        path = self.path(key)
        return pd.read_csv(path) if path.exists() else None

    def put(self, key: str, df: pd.DataFrame) -> None:
        write_csv(self.path(key), df)


class RecordTable:
    """A table computed record by record: ``<name>-<key>.jsonl`` under the profile's results, one JSON
    line per finished record (its id and its rows), with the parameters beside it as JSON. The key
    holds everything that determines a record's rows but not how many records were asked for, so a
    cell grows from n = 200 to 441 by computing only the new records. Each line is appended and
    synced as its record finishes, and the file is never rewritten: a job stopped at any moment
    resumes at the next record. A torn last line (no final newline: an append killed midway) is set
    aside into ``<file>.torn`` before the next append, and reported; any other line that is not a
    record's JSON is damage, refused with its line number (never skipped with what follows it)."""

    def __init__(self, name: str, params: dict, profile: str):
        check_model_part(params)
        directory = output_dir("results", profile)
        self.params = params
        self.path = directory / f"{name}-{cache_key(**params)}.jsonl"
        self.params_path = directory / f"{name}-{cache_key(**params)}.json"

    def _lines(self) -> list[dict]:
        """The stored records' lines, each checked; a torn last line is left out (see the class)."""
        if not self.path.exists():
            return []
        lines = self.path.read_text().split("\n")
        out, seen = [], set()
        for number, line in enumerate(lines[:-1], 1):  # lines[-1]: after the last newline, "" unless torn
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{self.path}, line {number} of {len(lines) - 1}: not a record's JSON ({err.msg}); a damaged "
                                 "line before the last is not an interrupted append: restore the file (git) or remove the "
                                 "line by hand") from None
            if not isinstance(entry, dict) or set(entry) != {"record", "rows"} or not isinstance(entry["rows"], list):
                raise ValueError(f"{self.path}, line {number}: not a record line ({{'record': ..., 'rows': [...]}})")
            if entry["record"] in seen:
                raise ValueError(f"{self.path}, line {number}: record {entry['record']!r} is stored twice")
            seen.add(entry["record"])
            out.append(entry)
        return out

    def _set_aside_torn_tail(self) -> None:
        """Move a torn last line (bytes after the last newline) to ``<file>.torn`` and report it."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        cut = data.rfind(b"\n") + 1
        if cut == len(data):
            return
        torn = self.path.with_name(self.path.name + ".torn")
        with open(torn, "ab") as f:
            f.write(data[cut:] + b"\n")
        os.truncate(self.path, cut)
        print(f"[results] {self.path.name}: set aside a torn last line ({len(data) - cut} bytes, an append that was "
              f"interrupted) in {torn.name}; its record is computed again")

    def done(self) -> set:
        return {line["record"] for line in self._lines()}

    def append(self, record, rows: list[dict]) -> None:
        if not self.params_path.exists():
            write_json(self.params_path, self.params)
        if record in self.done():  # also checks every stored line
            raise ValueError(f"record {record!r} is stored in {self.path.name} already; a record is appended once")
        self._set_aside_torn_tail()
        with open(self.path, "a") as f:
            f.write(json.dumps({"record": record, "rows": rows}, sort_keys=True, default=_plain) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def frame(self, records=None) -> pd.DataFrame:
        """The rows of ``records`` (default: all stored), in the order given."""
        lines = {line["record"]: line["rows"] for line in self._lines()}
        wanted = list(lines) if records is None else list(records)
        missing = [r for r in wanted if r not in lines]
        if missing:
            raise KeyError(f"{len(missing)} record(s) not in {self.path.name} (first: {missing[0]!r}); compute them first")
        return pd.DataFrame([row for r in wanted for row in lines[r]])


def _plain(value):
    """numpy scalars as Python numbers in JSON (a key or a row never holds a numpy repr)."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot store {type(value).__name__} {value!r} as JSON")


def migrate_store(directory: Path | str) -> list[tuple[str, str]]:
    """Re-key stored results whose parameters hold numpy reprs (``np.float64(1.2)`` inside a method's
    repr, written before :func:`cache_key` refused them): each such parameter string gets plain
    numbers, and the result's files (``<name>-<key>.csv/.json/.jsonl``) move to the key of the
    cleaned parameters. Nothing is recomputed; a stored key that the parameters beside it do not
    reproduce is an error (the store is then not what this function assumes). Returns (old, new) stems."""
    moved = []
    for params_path in sorted(Path(directory).glob("*-*.json")):
        text = params_path.read_text()
        if not NUMPY_REPR.search(text):
            continue
        name, old = params_path.stem.rsplit("-", 1)
        params = json.loads(text)
        expected = hashlib.sha256(json.dumps(params, sort_keys=True, default=repr).encode()).hexdigest()[:20]
        if expected != old:
            raise ValueError(f"{params_path.name}: its parameters hash to {expected}, not to the key in its name")
        clean = json.loads(re.sub(r"\bnp\.(?:float|int|uint)\w*\(([^()]*)\)", r"\1", text))
        moved.append(rekey(params_path.parent, name, old, clean))
    return moved


def rekey(directory: Path, name: str, old: str, params: dict) -> tuple[str, str]:
    """Move a stored result's files (``<name>-<old>.csv/.json/.jsonl``) to the key of ``params``,
    written as its new parameters JSON; an existing target is an error, never overwritten.
    Returns the (old, new) stems."""
    new = cache_key(**params)
    for old_file in sorted(Path(directory).glob(f"{name}-{old}.*")):
        target = old_file.with_name(f"{name}-{new}{old_file.suffix}")
        if target.exists():
            raise FileExistsError(f"{target.name} exists already: {old_file.name} would overwrite it")
        if old_file.suffix == ".json":
            write_json(target, params)
            old_file.unlink()
        else:
            old_file.rename(target)
    return f"{name}-{old}", f"{name}-{new}"


def main(argv: list[str] | None = None) -> None:
    """``lpes store migrate [DIR ...]``: :func:`migrate_store` on each folder (default: results/ and its profiles)."""
    parser = argparse.ArgumentParser(prog="lpes store", description="Store maintenance.")
    parser.add_argument("action", choices=["migrate"], help="migrate: re-key results whose parameters hold numpy reprs")
    parser.add_argument("dirs", nargs="*", type=Path)
    args = parser.parse_args(argv)
    root = project_root() / "results"
    for d in args.dirs or [root, *sorted(p for p in root.iterdir() if p.is_dir())]:
        for old, new in migrate_store(d):
            print(f"{d}: {old} -> {new}")

"""Where studies write: ``results/<profile>/`` (CSV + the JSON of parameters that produced it) and
``figures/<profile>/``; the ``cpu`` profile writes straight to ``results/`` and ``figures/``, which
are committed. A table keyed by its parameters is computed once and read back on reruns."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from .evaluate import cache_key


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
    path = root / kind if profile == "cpu" else root / kind / profile
    path.mkdir(parents=True, exist_ok=True)
    return path


def cached_table(name: str, params: dict, compute: Callable[[], pd.DataFrame], profile: str) -> pd.DataFrame:
    """Read ``<name>-<hash(params)>.csv`` if it exists, else compute it and write CSV + params JSON
    (CSV first via a temporary file, so an interrupted run never leaves a half-written table)."""
    directory = output_dir("results", profile)
    stem = f"{name}-{cache_key(**params)}"
    csv = directory / f"{stem}.csv"
    if csv.exists():
        return pd.read_csv(csv)
    df = compute()
    tmp = csv.with_suffix(".tmp")
    df.to_csv(tmp, index=False)
    tmp.replace(csv)
    (directory / f"{stem}.json").write_text(json.dumps(params, indent=2, sort_keys=True, default=repr) + "\n")
    return df

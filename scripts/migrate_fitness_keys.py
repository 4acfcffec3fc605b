"""One-off migration of the committed GA checkpoints to a fitness keyed by :func:`lpes_nb.models.model_key`.

``PositionFitness`` keyed its per-scales tables and its GA checkpoints by the model's name and weight
fingerprint; it now takes the model part every other cached result takes (name, dtype, weights). A
checkpoint's name and its ``fingerprint`` field hash the search's space, GA configuration and that key,
and none of them is stored beside it, so the old and the new name can only be computed where a notebook
builds its search. This script therefore reruns the notebooks that search (05, 08) on the committed
store, cached only (``LPES_CACHED_ONLY=1``: nothing is scored), with a hook in every kernel: a search
that finds no checkpoint under its new fingerprint computes the old one (the same fitness without its
dtype field) and moves that checkpoint to the new name, its ``fingerprint`` field rewritten. A search
with neither fails as any cached-only miss does.

Run once: ``python scripts/migrate_fitness_keys.py``; then ``bash scripts/run_all.sh`` must leave
``git status`` clean.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


class _Named:
    """A stand-in fitness that only says what it measures (all a GA fingerprint reads of it)."""

    def __init__(self, fingerprint: str):
        self._fingerprint = fingerprint

    def fingerprint(self) -> str:
        return self._fingerprint


def move_old_checkpoint(search) -> None:
    from lpes_nb.ga import GeneticSearch
    from lpes_nb.results import atomic_write, cache_key

    fitness = search.fitness
    old_fitness = cache_key(**{k: v for k, v in fitness._task_key.items() if k != "dtype"},
                            lambdas=fitness.lambdas, tie_break=fitness.tie_break)
    old = GeneticSearch(search.space, _Named(old_fitness), search.config).fingerprint()
    new = search.fingerprint()
    old_path = search.checkpoint.with_name(search.checkpoint.name.replace(f"-{new}.", f"-{old}."))
    if not old_path.exists():
        return
    payload = json.loads(old_path.read_text())
    if payload["fingerprint"] != old:
        raise SystemExit(f"{old_path.name} holds fingerprint {payload['fingerprint']}, not {old}; nothing moved")
    atomic_write(search.checkpoint, json.dumps({**payload, "fingerprint": new}))
    old_path.unlink()
    print(f"[migrate] {old_path.name} -> {search.checkpoint.name}", file=sys.stderr)


def install() -> None:
    """Runs in every kernel (sitecustomize): move a search's old checkpoint before it looks for its own."""
    from lpes_nb.fitness import PositionFitness
    from lpes_nb.ga import GeneticSearch

    finished = GeneticSearch.finished

    def finished_after_moving(search) -> bool:
        if search.checkpoint is not None and not search.checkpoint.exists() and isinstance(search.fitness, PositionFitness):
            move_old_checkpoint(search)
        return finished(search)

    GeneticSearch.finished = finished_after_moving


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as hook:
        Path(hook, "sitecustomize.py").write_text(
            f"import sys\nsys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\nimport migrate_fitness_keys\nmigrate_fitness_keys.install()\n")
        env = {**os.environ, "LPES_CACHED_ONLY": "1", "PYTHONPATH": os.pathsep.join([hook, os.environ.get("PYTHONPATH", "")])}
        subprocess.run([sys.executable, "-m", "lpes_nb.run", "--profile", "cpu", "--only", "05", "08"], env=env, check=True)

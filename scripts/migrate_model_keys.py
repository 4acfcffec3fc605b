"""One-off migration of a result store to keys that carry the model's dtype and weight fingerprint.

Before :func:`lpes_nb.models.model_key`, a stored result named its model only (``"model": "smollm2-135m"``,
the dtype only where a study wrote it). This script gives every such result the model part that the
studies now write, and moves its files to the new key; nothing is recomputed. Per stored result:

* its parameters must still hash to the key in its file name (else the store is not what this
  script assumes, and it stops before moving anything);
* the dtype is the one its parameters name (``dtype``, or the compared dtype of a ``dtypes`` pair),
  else float32, the dtype every float32-only study loaded its model in;
* the MoICE router's recipe (``moice_router.json``) gets the same model part, and the recipe's new
  hash replaces the old one inside every method description that names it.

Run once on the committed store: ``python scripts/migrate_model_keys.py results``; then the cached
``cpu`` rerun (``bash scripts/run_all.sh``) must leave ``git status`` clean.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from lpes_nb.models import model_key
from lpes_nb.results import cache_key, rekey, write_json

STEM = re.compile(r"^(?P<name>.+)-(?P<key>[0-9a-f]{20})$")
ROUTER_RECIPE = ("steps", "batch_size", "lr", "hidden", "seed")  # lpes_nb.moice.load_or_train's budget part


def model_part(params: dict) -> dict:
    dtype = params.get("dtype") or (params["dtypes"][-1] if "dtypes" in params else "float32")
    return model_key(params["model"], dtype=dtype)


def migrate_router(directory: Path) -> dict[str, str]:
    """The router's recipe with the model part; returns {old recipe hash: new}."""
    path = directory / "moice_router.json"
    if not path.exists():
        return {}
    info = json.loads(path.read_text())
    if "model_name" not in info:
        return {}
    old = {k: info[k] for k in (*ROUTER_RECIPE, "model_name", "task")}
    new = {**{k: info[k] for k in ROUTER_RECIPE}, **model_part({"model": info["model_name"]}), "task": info["task"]}
    migrated = {k: v for k, v in info.items() if k != "model_name"} | new
    write_json(path, migrated)
    return {cache_key(**old): cache_key(**new)}


def migrate(directory: Path) -> list[tuple[str, str]]:
    plan = []
    for params_path in sorted(directory.glob("*.json")):
        match = STEM.match(params_path.stem)
        if not match:
            continue
        params = json.loads(params_path.read_text())
        if not isinstance(params, dict) or "model" not in params or "weights" in params:
            continue
        if cache_key(**params) != match["key"]:
            raise SystemExit(f"{params_path.name}: its parameters hash to {cache_key(**params)}, not to its key; nothing moved")
        plan.append((match["name"], match["key"], params))
    recipes = migrate_router(directory)
    moved = []
    for name, old, params in plan:
        text = json.dumps(params)
        for before, after in recipes.items():
            text = text.replace(f"router={before}", f"router={after}")
        moved.append(rekey(directory, name, old, {**json.loads(text), **model_part(params)}))
    return moved


if __name__ == "__main__":
    for before, after in migrate(Path(sys.argv[1] if len(sys.argv) > 1 else "results")):
        print(f"{before} -> {after}")

"""The real data travels with the code: every file in ``data/`` matches its recorded checksum, and a
copy of the package with its ``data/`` and nothing beside it (no ``../shared``) runs a study on it."""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from lpes_nb.store.data import data_dir

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"


def recorded() -> dict[str, str]:
    lines = (DATA / "SHA256SUMS").read_text().splitlines()
    return {name.strip(): digest for digest, name in (line.split(maxsplit=1) for line in lines)}


def test_the_data_files_are_the_recorded_ones():
    sums = recorded()
    present = sorted(str(p.relative_to(DATA)) for p in DATA.glob("*/*.gz"))
    assert present == sorted(sums) and len(sums) == 5
    for name, digest in sums.items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name


def test_the_default_data_dir_is_the_repository_and_the_environment_overrides_it(monkeypatch, tmp_path):
    monkeypatch.delenv("LPES_DATA_DIR", raising=False)
    assert data_dir() == DATA
    monkeypatch.setenv("LPES_DATA_DIR", str(tmp_path))
    assert data_dir() == tmp_path and data_dir(ROOT) == ROOT


STUDY = """
import sys
from pathlib import Path
import lpes_nb
from lpes_nb.store.data import data_dir, load_mdqa, long_text
from lpes_nb.store.models import load_model, load_tokenizer
from lpes_nb.studies import position_map

clone = Path(sys.argv[1])
assert Path(lpes_nb.__file__).parents[1] == clone and data_dir() == clone / "data", (lpes_nb.__file__, data_dir())
for name, task, items in (("tiny-llama", "mdqa", 5), ("paper-dry-llama", "kv", 75)):  # KV-75 needs a longer window
    model, tokenizer = load_model(name), load_tokenizer(name)
    cell = position_map.record_cell(model, tokenizer, name, "float32", task, items, [3], 4, "smoke", progress=False)
    print(task, len(cell), cell["sample"].nunique())
print(len(load_mdqa()), len(long_text()) > 4_000_000)
"""


def test_a_clone_with_nothing_beside_it_runs_an_uncached_study_on_the_real_data(tmp_path):
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "lpes_nb", clone / "lpes_nb", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(DATA, clone / "data")
    assert not (tmp_path / "shared").exists()
    env = {k: v for k, v in os.environ.items() if k not in ("LPES_DATA_DIR", "LPES_CACHED_ONLY")}
    env.update(PYTHONPATH=str(clone), LPES_OUTPUT_ROOT=str(tmp_path / "out"))
    done = subprocess.run([sys.executable, "-c", STUDY, str(clone)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # MDQA: 5 gold positions + closed-book + oracle a record; KV: 5 positions; all 441 MDQA records; the book text
    assert done.stdout.split() == ["mdqa", "7", "1", "kv", "5", "1", "441", "True"]
    assert len(list((tmp_path / "out").rglob("position_map_records-*.jsonl"))) == 2

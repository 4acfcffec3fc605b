"""figures/README.md lists every committed figure once, and only those (PNG and PDF of each)."""

import re
from pathlib import Path

FIGURES = Path(__file__).resolve().parents[1] / "figures"


def test_the_figure_index_and_the_folder_agree():
    indexed = re.findall(r"^\| `([^`]+)` \| (\d\d) \|", (FIGURES / "README.md").read_text(), flags=re.M)
    names = [name for name, _ in indexed]
    assert len(names) == len(set(names))
    for ext in ("png", "pdf"):
        assert sorted(p.stem for p in FIGURES.glob(f"*.{ext}")) == sorted(names), ext
    for name, notebook in indexed:  # a figure's name starts with its notebook's number (notebook 6: benchmark_)
        assert name.startswith(notebook + "_") or (notebook == "06" and name.startswith("benchmark_")), name

"""The notebook runner: discovery, --only/--from selection, cleaning before publishing."""

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from lpes_nb.workbook.run import clean_for_publish, discover, select


def test_discover_and_select(tmp_path):
    for name in ("01_a.ipynb", "02_b.ipynb", "05_c.ipynb", "notes.ipynb"):
        (tmp_path / name).write_text("{}")
    nbs = discover(tmp_path)
    assert [p.name for p in nbs] == ["01_a.ipynb", "02_b.ipynb", "05_c.ipynb"]
    assert [p.stem for p in select(nbs, only=["05", "01"])] == ["01_a", "05_c"]
    assert [p.stem for p in select(nbs, start="02")] == ["02_b", "05_c"]
    with pytest.raises(ValueError, match=r"--only \['09'\] match no notebook"):
        select(nbs, only=["09"])
    with pytest.raises(ValueError, match="--from '9' matches no notebook"):
        select(nbs, start="9")


def test_clean_for_publish_drops_widget_state_and_tqdm_noise(tmp_path):
    nb = new_notebook()
    nb.metadata["widgets"] = {"state": {"x": 1}}
    nb.metadata["papermill"] = {"parameters": {"profile": "cpu"}, "start_time": "t0", "output_path": "/tmp/x.ipynb"}
    cell = new_code_cell("x")
    cell.metadata.update(papermill={"duration": 0.1}, execution={"iopub.execute_input": "t1"})
    cell.outputs = [
        new_output("stream", name="stderr", text="TqdmWarning: IProgress not found"),
        new_output("display_data", data={"application/vnd.jupyter.widget-view+json": {"model_id": "a"}, "text/plain": "bar"}),
        new_output("display_data", data={"application/vnd.jupyter.widget-view+json": {"model_id": "b"}}),
        new_output("display_data", data={"application/vnd.jupyter.widget-view+json": {"model_id": "c"},
                                         "text/plain": "benchmark_kv: methods:   0%|          | 0/10 [00:00<?, ?it/s]"}),
        new_output("stream", name="stdout", text="kept"),
    ]
    nb.cells.append(cell)
    injected = new_code_cell('profile = "cpu"', metadata={"tags": ["injected-parameters"]})
    nb.cells.append(injected)
    path = tmp_path / "01_x.ipynb"
    nbformat.write(nb, path)
    clean_for_publish(path)
    out = nbformat.read(path, as_version=4)
    assert "widgets" not in out.metadata and out.metadata.papermill == {"parameters": {"profile": "cpu"}}
    assert "papermill" not in out.cells[0].metadata and "execution" not in out.cells[0].metadata  # no timestamps
    assert out.cells[1].id == "injected-parameters"  # not papermill's random id
    assert [o.get("text") or dict(o["data"]) for o in out.cells[0].outputs] == [{"text/plain": "bar"}, "kept"]


def test_notebook_parameters_from_the_command_line_are_python_literals_or_strings():
    from lpes_nb.workbook.run import _literal

    assert [_literal(v) for v in ("8", "ray", "None", "auto", "[1, 2]")] == [8, "ray", None, "auto", [1, 2]]


def test_no_committed_notebook_holds_a_progress_bar():
    """A frozen bar is not a result: publishing drops it, and a cached-only run shows none (so the
    strict nbval check of the published run sees none either)."""
    from lpes_nb.workbook.run import PROGRESS_BAR

    root = Path(__file__).resolve().parents[1] / "notebooks"
    found = [(path.stem, text[:60]) for path in sorted(root.glob("*.ipynb"))
             for cell in nbformat.read(path, as_version=4).cells for out in cell.get("outputs", [])
             for text in [str(out.get("text", "")) + str(out.get("data", {}).get("text/plain", ""))] if PROGRESS_BAR.search(text)]
    assert found == []


def test_a_long_table_is_shown_as_its_head_with_where_the_whole_lives(capsys):
    import pandas as pd

    from lpes_nb.workbook.notebook import head

    table = pd.DataFrame({"x": range(30)})
    shown = head(table, "results/x.csv", rows=12)
    assert shown.equals(table.head(12)) and capsys.readouterr().out.strip() == "the first 12 of 30 rows; the whole table: results/x.csv"
    assert head(table.head(5), "results/x.csv").equals(table.head(5)) and capsys.readouterr().out == ""  # short: whole, no note


def test_no_committed_notebook_output_is_a_long_table():
    """Committed outputs stay readable on a code host: no displayed table of more than 40 rows (a per-layer table of a 30-layer model fits)
    (``notebook.head`` shows a longer one's head and names its file)."""
    import json

    root = Path(__file__).resolve().parents[1] / "notebooks"
    long = []
    for path in sorted(root.glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            for out in cell.get("outputs", []):
                html = "".join(out.get("data", {}).get("text/html", ""))
                rows = html.split("<tbody>")[1].count("<tr") if "<tbody>" in html else 0
                if rows > 40:
                    long.append(f"{path.stem} cell {i}: {rows} rows")
    assert long == []

"""Run the numbered notebooks in order under papermill: ``lpes run --profile cpu``.

Executed copies go to ``runs/<profile>/``; ``--publish`` copies them back over ``notebooks/`` (what
is committed for readers is the ``cpu`` run). A failing cell stops the run with a message naming
the notebook and the cell.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import time
from pathlib import Path

import nbformat
import papermill

from ..store.results import PUBLISHED_PROFILE
from ..studies.profiles import PROFILES
from ..system.footprint import NOTEBOOK_ENV
from . import pages


def discover(notebook_dir: Path) -> list[Path]:
    """The numbered notebooks (``NN_name.ipynb``) in reading order."""
    return sorted(p for p in notebook_dir.glob("[0-9][0-9]_*.ipynb"))


def select(notebooks: list[Path], only: list[str] | None = None, start: str | None = None) -> list[Path]:
    """Filter by ``--only`` (number prefixes or names) and ``--from`` (first notebook to run)."""

    def matches(path: Path, key: str) -> bool:
        return path.stem == key or path.stem.startswith(f"{key}_") or path.name == key

    chosen = notebooks
    if start is not None:
        hits = [i for i, p in enumerate(notebooks) if matches(p, start)]
        if not hits:
            raise ValueError(f"--from {start!r} matches no notebook; have {[p.stem for p in notebooks]}")
        chosen = notebooks[hits[0]:]
    if only:
        unknown = [k for k in only if not any(matches(p, k) for p in notebooks)]
        if unknown:
            raise ValueError(f"--only {unknown} match no notebook; have {[p.stem for p in notebooks]}")
        chosen = [p for p in chosen if any(matches(p, k) for k in only)]
    return chosen


def run(notebooks: list[Path], profile: str, out_dir: Path, parameters: dict | None = None) -> list[dict]:
    """Execute each notebook; raise SystemExit with a clear message at the first failing cell."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {sorted(PROFILES)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    timings = []
    for i, nb in enumerate(notebooks, 1):
        target = out_dir / nb.name
        print(f"[run] ({i}/{len(notebooks)}) {nb.name}  profile={profile}", flush=True)
        start = time.perf_counter()
        os.environ[NOTEBOOK_ENV] = nb.stem  # the kernel inherits it: footprint records name their notebook
        try:
            papermill.execute_notebook(
                str(nb), str(target), parameters={"profile": profile, **(parameters or {})},
                cwd=str(nb.parent), progress_bar=True, kernel_name="python3",
            )
        except papermill.PapermillExecutionError as err:
            raise SystemExit(
                f"[run] FAILED: {nb.name}, cell {err.cell_index} (execution count {err.exec_count}): "
                f"{err.ename}: {err.evalue}\n[run] the partially executed notebook is {target}"
            ) from None
        seconds = time.perf_counter() - start
        timings.append({"notebook": nb.name, "profile": profile, "seconds": round(seconds, 1)})
        print(f"[run] done {nb.name} in {seconds:.1f} s", flush=True)
    return timings


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
PROGRESS_BAR = re.compile(r"\d+%\|.*\|")  # tqdm's text: "name:  40%|####      | 4/10 [...]"


def clean_for_publish(path: Path) -> None:
    """Drop what only made sense in the live kernel before a notebook is committed: the saved widget
    state (progress bars), widget views (their text fallback stays), TqdmWarning noise, and the
    run's timestamps and paths."""
    nb = nbformat.read(path, as_version=4)
    nb.metadata.pop("widgets", None)
    # run-specific timestamps and paths: without them, republishing the same outputs changes nothing
    for key in ("start_time", "end_time", "duration", "input_path", "output_path"):
        nb.metadata.get("papermill", {}).pop(key, None)
    for cell in nb.cells:
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)
        if "injected-parameters" in cell.metadata.get("tags", []):
            cell.id = "injected-parameters"  # papermill draws a random id for it on every run
        if cell.cell_type != "code":
            continue
        kept = []
        for out in cell.outputs:
            if out.get("output_type") == "stream" and "TqdmWarning" in out.get("text", ""):
                continue
            if WIDGET_VIEW in out.get("data", {}):
                out["data"].pop(WIDGET_VIEW)
                # a progress bar's text fallback is a frozen bar, not a result (a cached-only rerun shows none)
                if not out["data"] or PROGRESS_BAR.search("".join(out["data"].get("text/plain", ""))):
                    continue
            kept.append(out)
        cell.outputs = kept
    nbformat.write(nb, path)


def _literal(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="lpes run", description=__doc__)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="cpu")
    parser.add_argument("--only", nargs="+", help="run only these notebooks (number prefixes or names)")
    parser.add_argument("--from", dest="start", help="start at this notebook (number prefix or name)")
    parser.add_argument("--notebooks", type=Path, default=Path("notebooks"))
    parser.add_argument("--out", type=Path, help="run folder (default runs/<profile>)")
    parser.add_argument("--publish", action="store_true", help="copy the executed notebooks back over notebooks/")
    parser.add_argument("--dry-run", action="store_true", help="print which notebooks would run with which parameters; run nothing")
    parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="a notebook parameter, e.g. -p backend ray -p workers 8 (a Python literal, else a string)")
    args = parser.parse_args(argv)
    parameters = {name: _literal(value) for name, value in args.parameter}

    notebooks = select(discover(args.notebooks), args.only, args.start)
    if not notebooks:
        print(f"[run] no numbered notebooks in {args.notebooks}/ — nothing to do")
        return
    if args.profile not in PROFILES:
        raise ValueError(f"unknown profile {args.profile!r}; choose one of {sorted(PROFILES)}")
    if args.dry_run:
        print(f"[run] dry run, profile={args.profile}, parameters={parameters}: would run "
              f"{' '.join(p.stem for p in notebooks)}", flush=True)
        return
    out_dir = args.out or Path("runs") / args.profile
    timings = run(notebooks, args.profile, out_dir, parameters)
    if args.publish:
        for t in timings:
            shutil.copyfile(out_dir / t["notebook"], args.notebooks / t["notebook"])
            clean_for_publish(args.notebooks / t["notebook"])
        if args.profile == PUBLISHED_PROFILE:  # the ledger reads the tables the published run just stored
            pages.main([])
    total = sum(t["seconds"] for t in timings)
    print(f"[run] all {len(timings)} notebooks done in {total:.0f} s; executed copies in {out_dir}/", flush=True)

"""The README and docs/ are a tested contract: every fenced code block in them runs as written, and no
page holds a measured number typed by hand. Every command is one of the two scripts or an `lpes`
command.

Python blocks are executed in a fresh namespace each (from the repository root, on the embedded model
they name: loading it takes under a second once converted). Every command of a bash block either runs
(the runner's commands with ``--dry-run`` appended: they resolve their notebooks, profile and parameters
and stop), or runs in full where it is cheap (``RUN_AS_WRITTEN``), or is in ``NOT_RUN_HERE`` with the
reason it cannot run inside the test suite."""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lpes_nb.workbook import pages

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]  # the README and every docs/ page
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.M | re.S)

# commands that a test cannot run, and why; each must still name a program that exists
NOT_RUN_HERE = {
    "bash scripts/test.sh": "the test command itself (it is what runs this test)",
    "ray start --head": "starts a Ray cluster head that outlives the test",
    "lpes map --mdqa-records 441 --model qwen2.5-coder-0.5b --dtype bfloat16 --docs 20 --backend ray --ray-address auto --workers 8":
        "joins a running Ray cluster for hours of work; the same sharding on local processes is tested in test_position_map",
    "bash scripts/gpu_kit.sh": "the GPU kit: its real steps need a CUDA GPU (and `--steps carry` packs 1.5 GB); "
                               "the test command runs it with --dry",
}

# cheap commands that run in full, as written
RUN_AS_WRITTEN = {
    "lpes costs plan --profile gpu": "arithmetic on the profile (its CSV is checked against the committed one in test_costs)",
}


def blocks(language: str) -> list[str]:
    return [body for page in PAGES for lang, body in BLOCK.findall(page.read_text()) if lang == language]


def commands() -> list[str]:
    """Each command line of the bash blocks, without its trailing comment."""
    out = []
    for body in blocks("bash"):
        for line in body.splitlines():
            command = line.split(" #")[0].strip()
            if command and not command.startswith("#"):
                out.append(command)
    return out


def test_the_readme_has_code_blocks_of_both_kinds():
    assert blocks("python") and commands()
    languages = {lang for page in PAGES for lang, _ in BLOCK.findall(page.read_text())}
    assert languages <= {"python", "bash", "text"}, f"a block in a language this test does not run: {languages}"


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_python_block_runs_as_written(index, monkeypatch):
    monkeypatch.chdir(ROOT)
    code = blocks("python")[index]
    exec(compile(code, f"README/docs python block {index + 1}", "exec"), {"__name__": "__readme__"})


@pytest.mark.parametrize("command", commands())
def test_bash_command_runs_or_is_named_with_a_reason(command):
    words = shlex.split(command)
    env_assignments = {}
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env_assignments[name] = value
    if command in NOT_RUN_HERE or " ".join(words[:2]) in NOT_RUN_HERE:
        program = words[1] if words[0] == "bash" else words[0]
        assert (ROOT / program).is_file() or shutil.which(program) or shutil.which(program, path=str(Path(sys.executable).parent)), \
            f"{command!r} names {program!r}, which does not exist"
        return
    env = {**os.environ, **env_assignments, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    lpes = [sys.executable, "-m", "lpes_nb", *words[1:]]  # the `lpes` command, installed or not
    if command in RUN_AS_WRITTEN:
        done = subprocess.run(lpes, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{command!r} failed:\n{done.stdout}\n{done.stderr}"
        return
    if words[0] == "lpes":  # its subcommand exists and takes these words up to its help
        done = subprocess.run([*lpes, "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and f"usage: lpes {words[1]}" in done.stdout, f"{command!r} --help:\n{done.stdout}\n{done.stderr}"
        return
    assert words[:2] and words[0] == "bash" and (ROOT / words[1]).is_file(), f"{command!r}: not a script of this project"
    done = subprocess.run([*words, "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{command!r} --dry-run failed:\n{done.stdout}\n{done.stderr}"
    assert "[run] dry run" in done.stdout


def test_the_wrong_regime_premise_is_gone():
    """The papers measure their Qwen U at 2-8 % of a 130k window (LPES Table 1), not at "40-90 % of
    the window": no text of the workbook says otherwise."""
    import re

    root = Path(__file__).resolve().parents[1]
    for path in [*PAGES, *sorted((root / "notebooks").glob("*.ipynb")), *sorted((root / "lpes_nb").rglob("*.py"))]:
        assert not re.search(r"[46]0\s*[–-]\s*90\s*%", path.read_text()), f"{path.name} still states the 40-90 % premise"


MEASURED = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s*%|(?<![\w.])[−+-]?\d+(?:[.,]\d+)*\.\d+(?![\w.])")
# a confidence level, a power, or a reference into a paper: not measurements
SETTINGS = re.compile(r"\b(?:95|80)\s*%|\b(?:Sec|Eq|Fig|App|Table|Section)s?\.?\s*[A-Z]?\d+(?:\.\d+)*")


def typed_numbers(markdown: str) -> list[str]:
    """Decimals and percentages in Markdown prose (code spans and settings excluded)."""
    prose = SETTINGS.sub("", re.sub(r"`[^`]*`", "", markdown))
    return MEASURED.findall(prose)


def test_typed_numbers_finds_measurements_and_spares_settings():
    assert typed_numbers("accuracy 27.5 % at n = 30, Δλ −0.035 [−0.110, 0.045]") == ["27.5 %", "−0.035", "−0.110", "0.045"]
    assert typed_numbers("Wilson 95 % intervals, 80 % power, `scale 1.5`, θ = 10⁶, 20 documents, Sec. 4.2, Eq. 12–13") == []


def test_no_measured_number_is_typed_into_the_readme_or_docs():
    """The pages' numbers are generated blocks, written from the stored files by `lpes claims`
    (lpes_nb.workbook.pages); their prose holds none. docs/findings.md quotes the notebooks and is
    held to a stricter rule below: every number it quotes is one a published notebook prints."""
    found = {}
    for path in PAGES:
        if path.name != "findings.md":
            numbers = typed_numbers(pages.prose(path.read_text()))
            if numbers:
                found[path.name] = numbers[:8]
    assert found == {}


def test_every_generated_block_is_what_the_store_gives():
    """A stored file that moved without `lpes claims`, or a block edited by hand, fails here."""
    assert {str(p.relative_to(ROOT)) for p in PAGES if "<!-- generated:" in p.read_text()} <= set(pages.PAGES)
    blocks = 0
    for name in pages.PAGES:
        text = (ROOT / name).read_text()
        assert pages.render(text, ROOT / "results") == text, f"{name}: a generated block differs from the store"
        blocks += text.count("<!-- generated:")
    assert blocks >= 15


def test_a_generated_block_follows_its_source(tmp_path):
    """Change a stored number and the block's text changes with it; an unknown block is refused."""
    page = "<!-- generated: bench ray (x) -->\nstale\n<!-- /generated -->\n"
    shutil.copy(ROOT / "results" / "ray_scaling.json", tmp_path / "ray_scaling.json")
    before = pages.render(page, tmp_path)
    assert "stale" not in before and "44.6" in before
    ray = json.loads((tmp_path / "ray_scaling.json").read_text())
    ray["ga_seconds"]["2"] = 51.5
    (tmp_path / "ray_scaling.json").write_text(json.dumps(ray))
    assert "51.5" in pages.render(before, tmp_path) and "44.6" not in pages.render(before, tmp_path)
    import pandas as pd

    assert pages.markdown(pd.DataFrame({"what": ["mean |Δ|"], "n": [3]})) == "| what | n |\n|---|---|\n| mean \\|Δ\\| | 3 |"
    with pytest.raises(ValueError, match="'nonsense' is unknown"):
        pages.render("<!-- generated: nonsense -->\n<!-- /generated -->", tmp_path)


def test_the_sweeps_block_shows_every_cpu_measured(tmp_path):
    """The shared-prefix sweeps of another CPU (``throughput-<cpu>.json``) follow the main file's, under their CPU."""
    (tmp_path / "bench").mkdir()
    main = json.loads((ROOT / "results" / "bench" / "throughput.json").read_text())
    (tmp_path / "bench" / "throughput.json").write_text(json.dumps(main))
    other = {"cpu": {**main["cpu"], "cpu": "CPU B"}, "torch_threads": 2, "sweeps": [{**main["sweeps"][0], "shared_s": 123.4}]}
    (tmp_path / "bench" / "throughput-cpu-b.json").write_text(json.dumps(other))
    text = pages.render("<!-- generated: throughput sweeps (x) -->\n<!-- /generated -->\n", tmp_path)
    assert text.index(f"{main['cpu']['cpu']}, 2 threads") < text.index("CPU B, 2 threads") < text.index("| 123.4 |")


def test_no_measured_number_is_typed_into_a_notebook():
    """Conclusions print their numbers from the stored tables: no notebook's Markdown holds a measured
    decimal or percentage (settings go in code spans), so a rerun cannot leave a stale figure."""
    found = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        numbers = [n for c in cells if c["cell_type"] == "markdown" for n in typed_numbers("".join(c["source"]))]
        if numbers:
            found[path.stem] = numbers[:5]
    assert found == {}


def findings(readme: str) -> list[str]:
    """The "In short:" bullet lists of the findings page (docs/findings.md), one string per list."""
    lists = []
    for part in readme.split("In short:")[1:]:
        lines = []
        for line in part.splitlines()[1:]:
            if not (line.startswith("- ") or line.startswith("  ")):
                break
            lines.append(line)
        lists.append("\n".join(lines))
    return lists


NUMBER = r"[−+-]?\d+(?:\.\d+)?"
INTERVAL = re.compile(rf"({NUMBER})\s*%?\s*\[({NUMBER}),\s*({NUMBER})\]")


def printed_lines(notebook: Path) -> list[list[float]]:
    """The numbers of every output line of a published notebook (printed from its stored tables)."""
    lines = []
    for cell in json.loads(notebook.read_text())["cells"]:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            text = "".join(out.get("text", "")) + "".join(data.get("text/markdown", "")) + "".join(data.get("text/plain", ""))
            lines += [numbers_in(line) for line in text.splitlines()]
    return [line for line in lines if line]


def numbers_in(text: str) -> list[float]:
    return [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", text.replace("−", "-"))]


def stored_rows() -> list[list[float]]:
    """The numbers of every row of the committed result tables (a wide table prints its interval on
    another line than its estimate; its CSV row holds all three)."""
    paths = [p for p in (ROOT / "results").rglob("*.csv") if "fitness_cache" not in p.parts]
    return [row for p in paths for row in map(numbers_in, p.read_text().splitlines()[1:]) if row]


def matches(quoted: str, value: float) -> bool:
    """Whether a printed value is the quoted number at the quote's precision (a percentage may be
    printed as a fraction)."""
    quoted = quoted.replace("−", "-").lstrip("+")
    decimals = len(quoted.split(".")[1]) if "." in quoted else 0
    return any(round(v, decimals) == float(quoted) for v in (value, 100 * value))


def test_every_number_the_findings_page_quotes_is_printed_by_a_published_notebook():
    """docs/findings.md quotes the notebooks, which print from the stored tables. Every estimate
    with its interval, "x [lo, hi]", must be one printed line's or one stored row's numbers at the page's precision
    (0.196 matches a printed 0.1957, 90 % a printed 0.900), and every other measured decimal or
    percentage a number some notebook prints. A rerun that moves a number leaves the page's copy
    without a source, and this fails."""
    lines = [line for path in sorted((ROOT / "notebooks").glob("*.ipynb")) for line in printed_lines(path)] + stored_rows()
    printed = {v for line in lines for v in line}
    lists = findings((ROOT / "docs" / "findings.md").read_text())
    assert len(lists) >= 2 and all(lists)
    unsourced = []
    for text in lists:
        for triple in INTERVAL.findall(text):
            if not any(all(any(matches(q, v) for v in line) for q in triple) for line in lines):
                unsourced.append(" ".join(triple))
        for number in typed_numbers(INTERVAL.sub("", text)):
            if not any(matches(number.replace("%", "").strip(), v) for v in printed):
                unsourced.append(number)
    assert unsourced == [], unsourced

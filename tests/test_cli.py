"""`lpes`: one command with a subcommand for everything a user runs (issue #102)."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from lpes_nb import cli

ROOT = Path(__file__).resolve().parents[1]


def test_the_command_is_declared_and_lists_every_subcommand(capsys):
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"] == {"lpes": "lpes_nb.cli:main"}
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert all(f"\n  {name} " in out for name in cli.COMMANDS)


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_each_subcommand_has_its_own_help(command, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith(f"usage: lpes {command}")


def test_an_unknown_subcommand_is_refused_with_the_list(capsys):
    with pytest.raises(SystemExit):
        cli.main(["serach"])
    assert "invalid choice: 'serach'" in capsys.readouterr().err


def test_python_dash_m_is_the_same_command_and_the_modules_have_no_second_entry():
    done = subprocess.run([sys.executable, "-m", "lpes_nb", "doctor"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and '"bf16_gemm"' in done.stdout, done.stderr[-2000:]
    mains = [p.name for p in (ROOT / "lpes_nb").rglob("*.py") if p.name != "__main__.py" and "__main__" in p.read_text()]
    assert mains == []  # one way to run each thing: `lpes <command>`


@pytest.mark.parametrize("bench", ["latency", "rope-overhead", "evaluator", "ray"])
def test_each_bench_has_its_own_help(bench, capsys):
    """The timings that were scripts are `lpes bench NAME` (one way to run each thing)."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", bench, "--help"])
    assert exit_.value.code == 0 and f"lpes bench {bench}" in capsys.readouterr().out
    assert not list((ROOT / "scripts").glob("bench_*.py"))

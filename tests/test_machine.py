"""bf16 safety, decided before torch loads: a probe that dies with SIGILL (simulated) leads to an ISA
cap, a clear error or a warned float32 fallback, never a signal in the caller."""

import os
import subprocess
import sys

import pytest
import torch

from lpes_nb.system import machine

AMX_CPU = "model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
AVX2_CPU = "model name\t: AMD EPYC 7B12\nflags\t\t: fpu avx2 fma\n"
SIGILL = (sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)")
# dies unless the ISA is capped, as oneDNN's AMX dispatch does on a VM that does not grant AMX
SIGILL_UNLESS_CAPPED = (sys.executable, "-c", "import os, signal\n"
                        f"if os.environ.get('{machine.ISA_VARIABLE}') != '{machine.ISA_CAP}': os.kill(os.getpid(), signal.SIGILL)")
OK = (sys.executable, "-c", "pass")


def test_a_safe_cpu_changes_nothing():
    env = {}
    status = machine.decide_bf16(env, OK, cpuinfo=AMX_CPU)
    assert status.safe and status.isa_cap is None and env == {}


def test_an_amx_cpu_that_dies_is_capped_and_verified():
    env = {"PATH": os.environ["PATH"]}
    status = machine.decide_bf16(env, SIGILL_UNLESS_CAPPED, cpuinfo=AMX_CPU)
    assert status.safe and status.isa_cap == machine.ISA_CAP
    assert env[machine.ISA_VARIABLE] == machine.ISA_CAP
    assert "killed by SIGILL" in status.detail and "Platinum 8480+" in status.detail


def test_still_unsafe_after_the_cap_is_a_clear_error_not_a_signal():
    env = {}
    status = machine.decide_bf16(env, SIGILL, cpuinfo=AMX_CPU)
    assert not status.safe and machine.ISA_VARIABLE not in env  # a cap that did not help is not kept
    with pytest.raises(machine.Bf16Unsafe, match=r"Platinum 8480\+.*SIGILL.*dtype='float32'"):
        machine.require_bf16(status)


def test_the_users_isa_setting_is_left_alone():
    env = {machine.ISA_VARIABLE: "AVX2"}
    status = machine.decide_bf16(env, SIGILL, cpuinfo=AMX_CPU)
    assert not status.safe and env == {machine.ISA_VARIABLE: "AVX2"} and "set by the user" in status.detail


def test_a_cpu_without_amx_is_not_capped():
    env = {}
    status = machine.decide_bf16(env, SIGILL, cpuinfo=AVX2_CPU)
    assert not status.safe and env == {} and "EPYC" in status.detail


def test_probes_are_cached_per_cpu_and_isa(tmp_path):
    cache = tmp_path / "probe.json"
    env = {"PATH": os.environ["PATH"]}
    machine.decide_bf16(env, SIGILL_UNLESS_CAPPED, cache=cache, cpuinfo=AMX_CPU)
    assert len(__import__("json").loads(cache.read_text())) == 2  # plain and capped
    # the cached answers decide without running anything (a probe that would now succeed is not run)
    env = {"PATH": os.environ["PATH"]}
    assert machine.decide_bf16(env, SIGILL_UNLESS_CAPPED, cache=cache, cpuinfo=AMX_CPU).isa_cap == machine.ISA_CAP
    other = machine.decide_bf16({}, SIGILL_UNLESS_CAPPED, cache=cache, cpuinfo=AVX2_CPU)  # another CPU: probed anew
    assert not other.safe and len(__import__("json").loads(cache.read_text())) == 3


def test_bf16_requests_follow_the_decision(monkeypatch):
    import lpes_nb.store.models as models

    unsafe = machine.Bf16Status(False, None, "Test CPU", "a bf16 matmul on Test CPU was killed by SIGILL")
    monkeypatch.setattr(machine, "STATUS", unsafe)
    with pytest.raises(machine.Bf16Unsafe, match="Test CPU"):
        models.resolve_dtype("bfloat16")
    with pytest.raises(machine.Bf16Unsafe, match="Test CPU"):
        models.load_model("tiny-llama", dtype="bfloat16")
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: True)
    assert models.resolve_dtype("auto") == torch.float32  # the fallback that says so (below)
    assert models.resolve_dtype("float32") == torch.float32


def test_auto_falls_back_with_a_printed_warning(monkeypatch, capsys):
    import lpes_nb.store.models as models

    monkeypatch.setattr(machine, "STATUS", machine.Bf16Status(False, None, "Test CPU", "killed by SIGILL"))
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda: True)
    assert models.resolve_dtype("auto") == torch.float32
    assert "takes float32, not bf16" in capsys.readouterr().out


def test_importing_the_package_sets_the_cap_before_torch(tmp_path):
    """End to end in a fresh interpreter: a (simulated) dying CPU is capped by ``import lpes_nb``, and
    torch, imported afterwards, sees the cap in its environment."""
    code = ("import sys; from lpes_nb.system import machine\n"
            f"machine.PROBE = {SIGILL_UNLESS_CAPPED!r}\n"
            "machine.cpu_advertises_amx = lambda cpuinfo=None: True\n"
            "machine.STATUS = None\n"
            "status = machine.ensure_bf16_safety()\n"
            "import os, torch\n"
            "print(status.safe, status.isa_cap, os.environ.get(machine.ISA_VARIABLE), 'torch' in sys.modules)")
    env = {**os.environ, "LPES_CACHE_DIR": str(tmp_path)}
    env.pop(machine.ISA_VARIABLE, None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", machine.ISA_CAP, machine.ISA_CAP, "True"]


def test_this_machine_runs_a_bf16_forward_or_refuses_clearly():
    """The acceptance on whatever CPU runs the tests: through the package's entry point a bf16 forward
    completes or raises Bf16Unsafe; it never kills the process (run in a child to see a signal)."""
    code = ("import lpes_nb, torch\n"
            "from lpes_nb.store.models import load_model\n"
            "try:\n"
            "    m = load_model('tiny-qwen2', dtype='bfloat16')\n"
            "    print('ran', m(torch.tensor([[1, 2, 3]])).logits.dtype)\n"
            "except lpes_nb.system.machine.Bf16Unsafe as e:\n"
            "    print('refused', e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, f"the bf16 forward ended with return code {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.startswith(("ran torch.bfloat16", "refused bf16 is not safe"))


def test_every_entry_point_imports_lpes_nb_before_torch():
    """The notebooks' and the test suite's first import of torch comes after lpes_nb's (whose import
    decides the ISA cap; torch reads it once, when it loads)."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sources = {p.name: "".join("".join(c["source"]) + "\n" for c in json.loads(p.read_text())["cells"] if c["cell_type"] == "code")
               for p in sorted((root / "notebooks").glob("*.ipynb"))}
    sources["conftest.py"] = (root / "tests" / "conftest.py").read_text()
    for name, text in sources.items():
        lines = text.splitlines()
        torch_at = next((i for i, l in enumerate(lines) if l.startswith(("import torch", "from torch"))), None)
        ours_at = next((i for i, l in enumerate(lines) if l.startswith(("import lpes_nb", "from lpes_nb"))), None)
        assert torch_at is None or (ours_at is not None and ours_at < torch_at), f"{name} imports torch before lpes_nb"


ISA_SEEN = ("import os, torch\n{first}\nos.environ['ONEDNN_MAX_CPU_ISA'] = 'AVX512_CORE'\n"
            "a = torch.ones(256, 256, dtype=torch.bfloat16)\nassert float((a @ a)[0, 0]) == 256.0\n")


@pytest.mark.skipif(not machine.cpu_has_native_bf16() or os.environ.get(machine.ISA_VARIABLE) is not None,
                    reason="needs a CPU whose own oneDNN ISA is above AVX512_CORE, and no ISA cap set by the user")
def test_why_the_probe_runs_at_import_not_at_the_first_bf16_model():
    """oneDNN honours an ISA cap set after torch loads only until the process's first matmul, of any
    dtype: a probe deferred to the first bf16 model load would come too late wherever a float32 model ran
    first (notebook 8 does), so the decision stays at ``import lpes_nb`` (0.04 s once cached)."""
    def isa(first: str) -> str:
        env = {**os.environ, "ONEDNN_VERBOSE": "1"}
        env.pop(machine.ISA_VARIABLE, None)
        done = subprocess.run([sys.executable, "-c", ISA_SEEN.format(first=first)], env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return next(line for line in done.stdout.splitlines() if ",isa:" in line)

    assert "bfloat16" not in isa("pass")  # capped: torch loaded, no matmul yet
    assert "bfloat16" in isa("torch.ones(64, 64) @ torch.ones(64, 64)")  # one float32 matmul first: the cap is ignored

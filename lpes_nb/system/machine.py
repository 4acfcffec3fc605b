"""What this machine is, decided before torch loads: the CPU, whether bf16 matmuls are safe on it,
and the cache directory.

Why before torch: on some Intel virtual machines ``/proc/cpuinfo`` advertises AMX (``amx_bf16``,
``amx_tile``) but the hypervisor does not grant it. oneDNN picks its kernels from CPUID, so the first
bf16 matmul executes an AMX instruction and the process dies with SIGILL (exit code 132, no Python
traceback). The only cure is ``ONEDNN_MAX_CPU_ISA`` (e.g. ``AVX512_CORE_BF16``), and oneDNN reads it
once, when torch loads. So :func:`ensure_bf16_safety` runs when ``lpes_nb`` is imported: it runs a
small bf16 matmul in a child process (a SIGILL there is only a return code here), caches the answer
per CPU model, flags, torch version and ISA setting, and where the plain probe dies it caps the ISA
(only if the user has not set it) and probes again. :func:`require_bf16` then turns a bf16 request on
a CPU where bf16 is still unsafe into a clear error, never a signal.

Why at import and not lazily, at the first bf16 model: oneDNN honours a cap set after torch loads only
until the process's first matmul of any dtype (measured with torch 2.13 on an AMD EPYC: a float32
matmul first, and the cap set afterwards is ignored; tests/test_machine.py holds it), and a float32
model often runs first (notebook 8 compares the two). The decision costs 0.04 s at import once cached,
and one probe of ~2 s per CPU, torch version and ISA setting.

This module must not import torch.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ISA_VARIABLE = "ONEDNN_MAX_CPU_ISA"
ISA_CAP = "AVX512_CORE_BF16"  # the widest ISA without AMX: native bf16 dot products where the CPU has them
# a bf16 matmul through oneDNN's brgemm kernels (the AMX path where oneDNN believes AMX is there)
PROBE = (sys.executable, "-c",
         "import torch; a = torch.ones(256, 256, dtype=torch.bfloat16); assert float((a @ a)[0, 0]) == 256.0")
PROBE_TIMEOUT_S = 120


def cache_dir() -> Path:
    return Path(os.environ.get("LPES_CACHE_DIR", Path.home() / ".cache" / "lpes_nb"))


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (empty where there is none: not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    return {f for line in cpuinfo.splitlines() if line.startswith("flags") for f in line.split(":", 1)[1].split()}


def cpu_model(cpuinfo: str | None = None) -> str:
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return platform.processor() or platform.machine()
    for line in cpuinfo.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX-BF16). Without it PyTorch emulates
    bf16 matmuls, measured ~6x slower than float32; with it a bf16 forward was ~2x faster on an AMD
    EPYC, but *slower* on an Intel Xeon VM with AVX512-BF16 and no AMX (2026-11-27, 2 threads: GEMM
    162 vs 316 GFLOP/s, a Qwen 1k-token forward 8.8 vs 6.9 s). The flag says bf16 is native, not fast."""
    return bool(cpu_flags(cpuinfo) & {"avx512_bf16", "amx_bf16"})


def cpu_advertises_amx(cpuinfo: str | None = None) -> bool:
    return bool(cpu_flags(cpuinfo) & {"amx_bf16", "amx_tile"})


@dataclass(frozen=True)
class Bf16Status:
    """The decision for this process: ``safe`` (a bf16 matmul runs), ``isa_cap`` (the
    ``ONEDNN_MAX_CPU_ISA`` this module set to make it safe, else None), ``cpu`` and how it was
    decided (``detail``)."""

    safe: bool
    isa_cap: str | None
    cpu: str
    detail: str


def _probe(command, env: dict[str, str]) -> int:
    """The probe's return code (negative: killed by that signal)."""
    try:
        return subprocess.run(list(command), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=PROBE_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        return -signal.SIGKILL


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return "ok" if code == 0 else f"exit code {code}"


def cpu_key(cpuinfo: str | None, isa: str | None, what) -> str:
    """A short key for a fact about this CPU: its model and flags, the torch version, the oneDNN ISA
    setting and ``what`` was asked (a probe's command, a benchmark's shape)."""
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "none"
    text = json.dumps([cpu_model(cpuinfo), sorted(cpu_flags(cpuinfo)), torch_version, isa, list(what)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached(cache: Path | None, key: str, compute):
    """``compute()``'s JSON-able answer, read from / written to the JSON file ``cache`` under ``key``
    (None: always computed). Written whole through a temporary file: a reader never sees half of it."""
    seen = {}
    if cache is not None and cache.exists():
        try:
            seen = json.loads(cache.read_text())
        except (OSError, ValueError):
            seen = {}
    if key in seen:
        return seen[key]
    value = compute()
    if cache is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({**seen, key: value}, indent=1))
            tmp.replace(cache)
        except OSError:  # a read-only home: compute again next time, decide the same way
            pass
    return value


def _cached_probe(command, env: dict[str, str], cache: Path | None, cpuinfo: str | None) -> int:
    """The probe's return code under ``env``, read from / written to the JSON cache at ``cache``."""
    return int(cached(cache, cpu_key(cpuinfo, env.get(ISA_VARIABLE), command), lambda: _probe(command, env)))


def decide_bf16(environ: dict[str, str] | None = None, command=PROBE, cache: Path | None = None,
                cpuinfo: str | None = None) -> Bf16Status:
    """Probe bf16 under ``environ`` (default: this process's environment, which is updated in place
    when an ISA cap is needed and works). ``cache``: the JSON file of earlier probes (None: always
    probe)."""
    environ = os.environ if environ is None else environ
    cpu = cpu_model(cpuinfo)
    code = _cached_probe(command, dict(environ), cache, cpuinfo)
    user_isa = environ.get(ISA_VARIABLE)
    if code == 0:
        how = f" with {ISA_VARIABLE}={user_isa} (set by the user)" if user_isa else ""
        return Bf16Status(True, None, cpu, f"a bf16 matmul runs on {cpu}{how}")
    first = _describe(code)
    if user_isa:
        return Bf16Status(False, None, cpu, f"a bf16 matmul on {cpu} was {first} with {ISA_VARIABLE}={user_isa} "
                                            "(set by the user; left as it is)")
    if not cpu_advertises_amx(cpuinfo):
        return Bf16Status(False, None, cpu, f"a bf16 matmul on {cpu} was {first}")
    capped = {**environ, ISA_VARIABLE: ISA_CAP}
    second = _cached_probe(command, capped, cache, cpuinfo)
    if second == 0:
        environ[ISA_VARIABLE] = ISA_CAP
        return Bf16Status(True, ISA_CAP, cpu, f"{cpu} advertises AMX but a bf16 matmul was {first}; with "
                                              f"{ISA_VARIABLE}={ISA_CAP} (set by lpes_nb) it runs")
    return Bf16Status(False, None, cpu, f"{cpu} advertises AMX; a bf16 matmul was {first}, and "
                                        f"{_describe(second)} with {ISA_VARIABLE}={ISA_CAP}")


STATUS: Bf16Status | None = None  # this process's decision, made when lpes_nb is imported
TORCH_LOADED_FIRST = False  # torch was imported before lpes_nb: an ISA cap could not take effect


def ensure_bf16_safety() -> Bf16Status:
    """Decide once per process, before torch loads (``lpes_nb/__init__`` calls it)."""
    global STATUS, TORCH_LOADED_FIRST
    if STATUS is None:
        TORCH_LOADED_FIRST = "torch" in sys.modules
        environ = dict(os.environ) if TORCH_LOADED_FIRST else os.environ  # too late to cap: decide only
        STATUS = decide_bf16(environ, command=PROBE, cache=cache_dir() / "bf16_probe.json")
        if TORCH_LOADED_FIRST and STATUS.isa_cap is not None:
            STATUS = Bf16Status(False, None, STATUS.cpu,
                                f"{STATUS.detail}, but torch was imported before lpes_nb, so the cap cannot take "
                                "effect in this process: restart and import lpes_nb before torch")
    return STATUS


class Bf16Unsafe(RuntimeError):
    """bf16 would kill this process on this CPU."""


def require_bf16(status: Bf16Status | None = None) -> None:
    """Raise :class:`Bf16Unsafe` (naming the CPU and the float32 alternative) where bf16 is unsafe."""
    status = status or ensure_bf16_safety()
    if not status.safe:
        raise Bf16Unsafe(f"bf16 is not safe on this CPU: {status.detail}. A bf16 matmul here ends the process with "
                         "an illegal-instruction signal. Use dtype='float32' (or 'auto', which falls back to float32 "
                         "with a warning).")


def describe_cpu() -> dict:
    """The CPU facts a timing is reported with."""
    status = ensure_bf16_safety()
    flags = cpu_flags()
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "native_bf16": cpu_has_native_bf16(),
            "advertises_amx": cpu_advertises_amx(),
            "isa_flags": sorted(f for f in flags if f.startswith(("avx", "amx", "fma"))),
            "bf16": asdict(status), ISA_VARIABLE: os.environ.get(ISA_VARIABLE)}

"""A bf16 model's linear layers through float32 GEMMs, where this CPU runs those faster.

Every bf16 matmul here means bf16 operands, float32 products and sums, a bf16 result. oneDNN runs it
with bf16 instructions where the CPU has them (AMX, AVX512-BF16) and emulates them elsewhere, and
emulated — on some virtual machines even native — it is several times slower than float32's GEMM. The
same arithmetic through that GEMM: widen both operands to float32 (exact: every bf16 is a float32, and
a product of two is exact in float32), multiply and sum in float32, round the result to bf16. Only the
order of the sums differs, as it differs between oneDNN's own kernels on two CPUs. Measured on 2 cores
of an Intel Xeon with AVX-512 but no AVX512-BF16, nothing else running (2026-12-01): a 1024 x 896 -> 4864
bf16 product (Qwen2.5-0.5B's MLP) 132 ms through oneDNN, 45 ms through float32; a Qwen2.5-Coder-0.5B
bf16 forward of 1k / 3k tokens 11.6 / 41.2 s through oneDNN, 4.2 / 17.8 s through float32 (the float32
model: 4.1 / 14.1 s).

So where :func:`decide` finds the float32 GEMM faster on this CPU, :func:`route` makes a bf16 model's
``nn.Linear`` layers :class:`Float32GemmLinear`: the weights stay the model's bf16 parameters
(fingerprints, state dicts and tied weights unchanged), the activations between layers stay bf16, and
results are keyed by dtype as before. Products of fewer than :data:`MIN_ROWS` rows (decoding a token)
keep oneDNN's kernel: there the weights' widening per call costs more than the GEMM saves.

Which path: measured once per CPU (model, flags, torch version, oneDNN ISA setting, torch threads) and
cached beside the bf16 probe; ``LPES_BF16_GEMM=native`` or ``=float32`` sets it (e.g. to time both).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import machine

VARIABLE = "LPES_BF16_GEMM"
PATHS = ("native", "float32")
SHAPE = (1024, 896, 4864)  # rows x in x out: a prefill piece through Qwen2.5-0.5B's MLP, the bulk of a forward
MARGIN = 1.25  # the float32 path must be this much faster: no flip-flopping on a CPU where both are alike
MIN_ROWS = 32  # break-even measured between 8 and 16 rows (1.3 ms to widen 4864 x 896 weights)


@dataclass(frozen=True)
class Decision:
    """How this process computes bf16 linear layers on the CPU: ``path`` (one of :data:`PATHS`), the
    timings it was decided by (seconds for :data:`SHAPE`; None when set by :data:`VARIABLE`) and why."""

    path: str
    native_s: float | None
    float32_s: float | None
    detail: str


def _best_of(run, repeats: int = 3) -> float:
    run()  # the first product of a shape builds oneDNN's kernel
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def _measure() -> dict[str, float]:
    rows, cols, out = SHAPE
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, cols, generator=generator).bfloat16()
    weight = torch.randn(out, cols, generator=generator).bfloat16()
    with torch.no_grad():
        return {"native_s": _best_of(lambda: F.linear(x, weight)),
                "float32_s": _best_of(lambda: _float32_linear(x, weight, None))}


def decide(environ: dict[str, str] | None = None, measure=_measure, cache=None) -> Decision:
    """The path for this process: :data:`VARIABLE` where set, else measured (:func:`_measure`, cached
    per CPU in ``cache``, default ``$LPES_CACHE_DIR/bf16_gemm.json``)."""
    environ = os.environ if environ is None else environ
    chosen = environ.get(VARIABLE)
    if chosen is not None:
        if chosen not in PATHS:
            raise ValueError(f"{VARIABLE}={chosen!r}; allowed: {', '.join(PATHS)} (or unset: measured on this CPU)")
        return Decision(chosen, None, None, f"set by {VARIABLE}")
    cache = machine.cache_dir() / "bf16_gemm.json" if cache is None else cache
    key = machine.cpu_key(None, environ.get(machine.ISA_VARIABLE), ("bf16_gemm", *SHAPE, torch.get_num_threads()))
    times = machine.cached(cache, key, measure)
    faster = times["native_s"] > MARGIN * times["float32_s"]
    return Decision("float32" if faster else "native", times["native_s"], times["float32_s"],
                    f"a {'x'.join(map(str, SHAPE))} bf16 product: oneDNN {times['native_s'] * 1e3:.0f} ms, through float32 "
                    f"{times['float32_s'] * 1e3:.0f} ms on {machine.cpu_model()} ({torch.get_num_threads()} threads)")


def _float32_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(torch.bfloat16)


class Float32GemmLinear(nn.Linear):
    """``nn.Linear`` whose bf16 products of at least :data:`MIN_ROWS` rows on the CPU go through float32's
    GEMM (the module docstring says why that is the same arithmetic); anything else as ``nn.Linear``.
    The weights are widened per call, not kept: no second copy to hold or to go stale, and gradients
    reach them as through ``nn.Linear``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x.dtype != torch.bfloat16 or self.weight.dtype != torch.bfloat16 or x.device.type != "cpu"
                or x.numel() < MIN_ROWS * self.in_features):
            return super().forward(x)
        return _float32_linear(x, self.weight, self.bias)


def route(model: nn.Module, decision: Decision | None = None) -> int:
    """Make a bf16 CPU model's ``nn.Linear`` layers :class:`Float32GemmLinear` where ``decision`` (default
    :func:`decide`) says so; the number of layers changed (0: another dtype or device, or the native path)."""
    first = next(model.parameters(), None)
    if first is None or first.dtype != torch.bfloat16 or first.device.type != "cpu":
        return 0
    if (decision or decide()).path != "float32":
        return 0
    layers = [m for m in model.modules() if type(m) is nn.Linear]
    for layer in layers:
        layer.__class__ = Float32GemmLinear  # the module itself stays: its parameters, ties and hooks
    return len(layers)


def routed(model: nn.Module) -> bool:
    """Whether ``model``'s linear layers compute bf16 through float32 GEMMs."""
    return any(isinstance(m, Float32GemmLinear) for m in model.modules())


def main(argv: list[str] | None = None) -> None:
    """``lpes doctor``: what this machine decided (the CPU, whether bf16 is safe, the bf16 GEMM path)."""
    argparse.ArgumentParser(prog="lpes doctor", description=main.__doc__.split(": ", 1)[1]).parse_args(argv)
    print(json.dumps({"cpu": machine.describe_cpu(), "bf16_gemm": asdict(decide())}, indent=2, default=str))

"""What a study costs, measured while it runs: wall time, peak resident memory, the largest tensor
any operator produced, and the FLOPs of its matrix products and attention.

Off unless ``LPES_FOOTPRINT`` names a JSON-lines file; then every computed study (each
:func:`lpes_nb.store.results.cached_table`, GA search and router training) appends one record to it. The
``paper-dry`` run (``lpes costs dry-run``) uses the records for its time/memory table, and
:mod:`lpes_nb.operations.costs` scales their FLOPs to a 7B model.

* Peak memory: the process's RSS high-water mark (``VmHWM``), reset at the start of each study by
  writing 5 to ``/proc/self/clear_refs`` (Linux); where that is not allowed, the record says so and
  holds the process-lifetime peak instead.
* Largest tensor: the largest output of any aten operator (a :class:`TorchDispatchMode`), so it sees
  what fused kernels return, not their internal scratch.
* FLOPs: of every matrix product, by its output width (so the output head, as wide as the
  vocabulary, can be told from the decoder's products: each scales differently to another model
  shape), and of fused attention (``scaled_dot_product_attention``; eager attention's products are
  matrix products of width T or head size). Backward passes are counted as PyTorch runs them.

And for side-by-side timings (:func:`interleaved_times`): variants timed in rotating order, so that slow
drift of the machine hits every variant alike.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from tqdm.auto import tqdm

ENV = "LPES_FOOTPRINT"
NOTEBOOK_ENV = "LPES_NOTEBOOK"  # set by lpes_nb.workbook.run for each notebook it executes
_STATUS = Path("/proc/self/status")
_inside = False
_MATMULS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}


def _ops_mode():
    """A dispatch mode (its class built on first use) that counts
    matrix-product FLOPs by the product's output width (the output head is the product as wide as
    the vocabulary), fused-attention FLOPs and decoding steps, and tracks the largest freshly
    allocated operator output (views and in-place results alias an input and are skipped). It runs
    every operator as called: torch's FlopCounterMode decomposes fused attention it has no formula
    for into plain matmuls and a softmax, materialising the very T x T matrix the fused kernel avoids."""
    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bytes, self.shape, self.op = 0, (), ""
            self.matmul_flops: dict[int, int] = {}
            self.attention_flops = self.decode_calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.name()
            if name in _MATMULS or name == "aten::linear":
                # (..., m, k) @ (..., k, n): 2 m k n per batch element; linear's weight is (n, k)
                a, b = (args[0], args[1].T) if name == "aten::linear" else (args[-2], args[-1])
                width = b.shape[-1]
                self.matmul_flops[width] = self.matmul_flops.get(width, 0) + 2 * a.numel() * width
            elif "scaled_dot_product" in name:
                q, k = args[0], args[1]  # (batch, heads, queries, head_dim), (batch, kv_heads, keys, head_dim)
                bsz, h, t, d = q.shape
                s = k.shape[-2]
                pairs = t * (t + 1) // 2 if t == s else t * s  # a prefill is causal; a decode step sees every key
                self.attention_flops += 4 * bsz * h * d * pairs  # QK^T and the weighted sum of V
                self.decode_calls += t == 1 < s  # one per layer per decoding step: memory-bound on a GPU
            outputs = out if isinstance(out, (tuple, list)) else (out,)
            for t, ret in zip(outputs, func._schema.returns):
                if isinstance(t, torch.Tensor) and ret.alias_info is None and t.numel() * t.element_size() > self.bytes:
                    self.bytes, self.shape, self.op = t.numel() * t.element_size(), tuple(t.shape), name
            return out

    return Ops()


def rss_kib(field: str) -> int:
    """``VmRSS`` (now) or ``VmHWM`` (peak) of this process in KiB; 0 where /proc is unavailable."""
    try:
        return int(re.search(rf"{field}:\s+(\d+)", _STATUS.read_text()).group(1))
    except (OSError, AttributeError):
        return 0


def reset_peak_rss() -> bool:
    """Reset this process's RSS high-water mark to its current RSS; False where Linux does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


@contextmanager
def study(name: str, **details):
    """Record what the block costs as one JSON line in ``$LPES_FOOTPRINT`` (no-op when unset)."""
    global _inside
    target = os.environ.get(ENV)
    if not target or _inside:  # a study inside a study (an ablation's GA runs) belongs to the outer one
        yield
        return
    _inside = True
    reset = reset_peak_rss()
    ops = _ops_mode()
    before = rss_kib("VmRSS")
    start = time.perf_counter()
    try:
        with ops:
            yield
    finally:
        _inside = False
    record = {
        "notebook": os.environ.get(NOTEBOOK_ENV, ""), "study": name, **details,
        "seconds": round(time.perf_counter() - start, 2),
        "rss_before_mib": round(before / 1024, 1), "peak_rss_mib": round(rss_kib("VmHWM") / 1024, 1),
        "peak_rss_is_per_study": reset,
        "largest_tensor_mib": round(ops.bytes / 2**20, 2), "largest_tensor_shape": list(ops.shape),
        "largest_tensor_op": ops.op, "matmul_flops_by_width": {str(w): f for w, f in sorted(ops.matmul_flops.items())},
        "attention_flops": ops.attention_flops, "decode_attention_calls": ops.decode_calls,
    }
    with open(target, "a") as f:
        f.write(json.dumps(record) + "\n")


def interleaved_times(variants: Mapping[str, Callable[[], object]], rounds: int, warmup: int = 1) -> pd.DataFrame:
    """Time every variant once per round, rotating the order each round; one row per (round, variant)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    rows = []
    for r in tqdm(range(rounds), desc="timing rounds", leave=False):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            start = time.perf_counter()
            variants[name]()
            rows.append({"round": r, "variant": name, "seconds": time.perf_counter() - start})
    return pd.DataFrame(rows)


def ratio_to_baseline(times: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Median seconds per variant and the per-round ratios to ``baseline``: their median, interquartile
    range (what a figure draws) and range."""
    wide = times.pivot(index="round", columns="variant", values="seconds")
    if baseline not in wide:
        raise ValueError(f"baseline {baseline!r} is not among the timed variants {list(wide)}")
    ratios = wide.div(wide[baseline], axis=0)
    return pd.DataFrame(
        {"median_s": wide.median(), "median_ratio": ratios.median(), "q25_ratio": ratios.quantile(0.25),
         "q75_ratio": ratios.quantile(0.75), "min_ratio": ratios.min(), "max_ratio": ratios.max()}
    ).rename_axis("variant").reset_index()

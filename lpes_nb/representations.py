"""The representation study (notebook 4): how far per-layer scales move the model's layer-wise
representational structure (LPES Eq. 12-13: per input, the L×L dot products of every layer's
last-token hidden state), for a Bézier curve and its uniform / noisy / shuffled / random variants."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from .methods import uniform_like
from .rope import rope_context, scale_specs


@torch.inference_mode()
def last_token_states(model, tokenizer, prompts: Sequence[str], specs=None) -> np.ndarray:
    """Last-token hidden state of every prompt at every layer's output: [layers, prompts, hidden]."""
    out = []
    with rope_context(model, specs):
        for text in prompts:
            ids = torch.tensor([tokenizer(text).input_ids])
            hs = model(ids, output_hidden_states=True).hidden_states[1:]
            out.append(torch.stack([h[0, -1] for h in hs]).float().numpy())
    return np.stack(out, axis=1)


def layer_rsm(states: np.ndarray) -> np.ndarray:
    """LPES Eq. 12, one matrix per input: RSM_ij = H_i · H_j over the L layers' last-token hidden
    states. ``states`` as :func:`last_token_states` returns them, [layers, inputs, hidden];
    the result is [inputs, L, L]."""
    per_input = np.transpose(np.asarray(states, dtype=np.float64), (1, 0, 2))
    return per_input @ per_input.transpose(0, 2, 1)


def structure_deviation(reference: np.ndarray, other: np.ndarray) -> np.ndarray:
    """LPES Eq. 13 per input: D = (1/L²) Σ_ij |RSM_ij(other) − RSM_ij(reference)|, from the two
    models' last-token states ([layers, inputs, hidden], the same inputs in the same order). One
    value per input, so that it can carry an interval."""
    reference, other = np.asarray(reference), np.asarray(other)
    if reference.shape != other.shape or reference.ndim != 3:
        raise ValueError(f"need two [layers, inputs, hidden] arrays of one shape, got {reference.shape} and {other.shape}")
    return np.abs(layer_rsm(other) - layer_rsm(reference)).mean(axis=(1, 2))


def scale_variants(scales: Sequence[float], seed: int) -> dict[str, list[float]]:
    """The RSM study's comparisons for a Bézier curve: the same mean everywhere (uniform), the curve
    with U(−0.1, 0.1) noise, the curve's values shuffled across layers, and fully random U(1, 2)."""
    s = np.asarray(scales, dtype=float)
    rng = np.random.default_rng(seed)
    return {
        "uniform (mean)": uniform_like(s),
        "noisy Bézier": list(np.clip(s + rng.uniform(-0.1, 0.1, len(s)), 1.0, None)),
        "shuffled": list(rng.permutation(s)),
        "random U(1,2)": list(rng.uniform(1.0, 2.0, len(s))),
    }


def structure_study(model, tokenizer, prompts: Sequence[str], bezier: Sequence[float], seeds: Sequence[int]) -> pd.DataFrame:
    """Per (variant, seed, input): LPES's representational structure deviation (Eq. 13) from the
    unmodified model, for the Bézier scales and their :func:`scale_variants` (the deterministic ones
    once, seed -1)."""
    reference = last_token_states(model, tokenizer, prompts)

    def rows(name, seed, scales):
        d = structure_deviation(reference, last_token_states(model, tokenizer, prompts, scale_specs(scales)))
        return [{"variant": name, "seed": seed, "input": i, "deviation": float(v)} for i, v in enumerate(d)]

    out = rows("Bézier", -1, bezier)
    for seed in seeds:
        for name, scales in scale_variants(bezier, seed).items():
            if name == "uniform (mean)":
                if seed == seeds[0]:
                    out += rows(name, -1, scales)
                continue
            out += rows(name, seed, scales)
    return pd.DataFrame(out)


def deviation_summary(per_input: pd.DataFrame, n_boot: int = 4000, seed: int = 0) -> pd.DataFrame:
    """Per variant: mean deviation over inputs and seeds with a 95 % bootstrap interval that draws
    whole inputs (an input's values under every seed stay together), and the number of inputs."""
    rng = np.random.default_rng(seed)
    rows = []
    for name, g in per_input.groupby("variant", sort=False):
        per = g.groupby("input").deviation.mean().to_numpy()
        boot = per[rng.integers(0, len(per), size=(n_boot, len(per)))].mean(axis=1)
        rows.append({"variant": name, "inputs": len(per), "seeds": g.seed.nunique(), "mean": per.mean(),
                     "ci_low": np.quantile(boot, 0.025), "ci_high": np.quantile(boot, 0.975)})
    return pd.DataFrame(rows)

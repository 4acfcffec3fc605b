"""The representation study (notebook 4): how far per-layer scales move the model's layer-wise
representational structure (LPES Eq. 12-13: per input, the L×L dot products of every layer's
last-token hidden state), for a Bézier curve and its uniform / noisy / shuffled / random variants."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from ..core.methods import uniform_like
from ..core.rope import rope_context, scale_specs


@torch.inference_mode()
def last_token_states(model, tokenizer, prompts: Sequence[str], specs=None) -> np.ndarray:
    """Last-token hidden state of every prompt at every layer's output: [layers, prompts, hidden]."""
    out = []
    with rope_context(model, specs):
        for text in prompts:
            ids = torch.tensor([tokenizer(text).input_ids], device=model.device)
            hs = model(ids, output_hidden_states=True).hidden_states[1:]
            out.append(torch.stack([h[0, -1] for h in hs]).float().cpu().numpy())
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


def paired_against(per_input: pd.DataFrame, reference: str = "Bézier", n_boot: int = 4000, seed: int = 0) -> pd.DataFrame:
    """Each other variant against ``reference`` on the same inputs (each input's mean over seeds):
    on how many inputs the reference deviates less, the median of the per-input ratio reference /
    variant, and that ratio's 95 % bootstrap interval (whole inputs drawn)."""
    per = per_input.groupby(["variant", "input"]).deviation.mean().unstack("variant")
    if reference not in per:
        raise ValueError(f"no variant {reference!r} among {list(per.columns)}")
    rng = np.random.default_rng(seed)
    rows = []
    for name in [v for v in dict.fromkeys(per_input["variant"]) if v != reference]:
        ratio = (per[reference] / per[name]).to_numpy()
        boot = np.median(ratio[rng.integers(0, len(ratio), size=(n_boot, len(ratio)))], axis=1)
        rows.append({"variant": name, "inputs": len(ratio), "reference_lower": int((ratio < 1).sum()),
                     "median_ratio": float(np.median(ratio)), "ci_low": float(np.quantile(boot, 0.025)),
                     "ci_high": float(np.quantile(boot, 0.975))})
    return pd.DataFrame(rows)


def conclusion(summary: pd.DataFrame, paired: pd.DataFrame, reference: str = "Bézier") -> str:
    """Notebook 4's reading, every number from its tables (:func:`deviation_summary`,
    :func:`paired_against`): the mean deviation per variant with its interval, and each variant
    paired against the smooth curve, with the verdict each ratio's interval supports."""
    s = summary.set_index("variant")
    lines = [f"Mean structure deviation D (Eq. 13) over {int(s['inputs'].min())} inputs, 95 % intervals over inputs:"]
    lines += [f"- {v}: {r['mean']:,.0f} [{r['ci_low']:,.0f}, {r['ci_high']:,.0f}]" for v, r in s.sort_values("mean").iterrows()]
    lines.append(f"\nPaired on the same inputs, {reference} against each variant (ratio {reference} / variant per input):")
    for _, r in paired.iterrows():
        verdict = (f"{reference} deviates less" if r["ci_high"] < 1 else f"{reference} deviates more" if r["ci_low"] > 1
                   else "no difference resolved")
        lines.append(f"- {r['variant']}: lower on {r['reference_lower']} of {r['inputs']} inputs, median ratio "
                     f"{r['median_ratio']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}] → **{verdict}**")
    return "\n".join(lines)

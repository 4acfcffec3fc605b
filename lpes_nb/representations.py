"""The representation study (notebook 4): how far per-layer scales move the last token's hidden
states, as the layer-wise deviation of representational similarity matrices (RSM) from the
unmodified model, for a Bézier curve and its uniform / noisy / shuffled / random variants."""

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


def rsm(states: np.ndarray) -> np.ndarray:
    """Representational similarity matrices per layer: cosine H_i · H_j over prompts, [layers, N, N]."""
    unit = states / np.linalg.norm(states, axis=-1, keepdims=True)
    return unit @ unit.transpose(0, 2, 1)


def rsm_deviation(reference: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Per layer: ‖RSM_other − RSM_reference‖_F / ‖RSM_reference‖_F."""
    return np.linalg.norm(other - reference, axis=(1, 2)) / np.linalg.norm(reference, axis=(1, 2))


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


def rsm_study(model, tokenizer, prompts: Sequence[str], bezier: Sequence[float], seeds: Sequence[int]) -> pd.DataFrame:
    """Per (variant, seed, layer): RSM deviation from the unmodified model for the Bézier scales and
    their :func:`scale_variants` (the deterministic uniform variant once, under the first seed)."""
    reference = rsm(last_token_states(model, tokenizer, prompts))

    def deviation(scales):
        return rsm_deviation(reference, rsm(last_token_states(model, tokenizer, prompts, scale_specs(scales))))

    rows = [{"variant": "Bézier", "seed": -1, "layer": l, "deviation": d} for l, d in enumerate(deviation(bezier))]
    for seed in seeds:
        for name, scales in scale_variants(bezier, seed).items():
            if name == "uniform (mean)" and seed != seeds[0]:
                continue
            rows += [{"variant": name, "seed": seed, "layer": l, "deviation": d} for l, d in enumerate(deviation(scales))]
    return pd.DataFrame(rows)

"""Attention statistics computed from each layer's own queries and keys, for a few query rows only.

A forward pre-hook on every self-attention module recomputes q and k from its input, rotates them
with the (cos, sin) that layer actually receives (so per-layer RoPE patches are seen), and forms
softmax attention for the chosen query rows: memory O(rows × T) per layer instead of the full
T × T matrices (at 2k tokens the full matrices of all layers would take over 4 GB).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from ..core.interventions import Interventions
from ..core.rope import RopeSpec, UnsupportedModel, find_rope_stack, rope_context, scale_specs


class AttentionStats:
    """Context manager collecting, per layer and head, for each chosen query row i:
    the entropy of its attention over keys 0..i (nats) and the mass on the middle third of 0..i.

    >>> with AttentionStats(model, query_rows=[-1]) as stats:
    ...     model(ids)
    >>> stats.table()   # columns: layer, head, row, entropy, middle_mass
    """

    def __init__(self, model, query_rows: Sequence[int] = (-1,), layers: Sequence[int] | None = None):
        self.stack = find_rope_stack(model)
        self.query_rows = list(query_rows)
        self.layers = list(range(self.stack.num_layers)) if layers is None else list(layers)
        self._interventions = Interventions()
        self._rows: list[dict] = []
        attn = self.stack.layers[0].self_attn
        feature = "AttentionStats"
        if not all(hasattr(attn, a) for a in ("q_proj", "k_proj", "head_dim", "scaling")) or hasattr(attn, "q_norm"):
            raise UnsupportedModel(f"{feature} is not supported on model type {self.stack.model_type!r}: it recomputes "
                                   "attention from q_proj/k_proj without q/k norms (Llama, Qwen2, Mistral attention)")
        self._rotate = self.stack.rotation(0, feature)

    def __enter__(self) -> AttentionStats:
        for layer in self.layers:
            attn = self.stack.layers[layer].self_attn
            self._interventions.pre_hook(attn, self._hook(layer), with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        self._interventions.close()

    def _hook(self, layer: int):
        @torch.no_grad()
        def hook(module, args, kwargs):
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            cos, sin = kwargs["position_embeddings"]
            b, t, _ = hidden.shape
            d = module.head_dim
            q = module.q_proj(hidden).view(b, t, -1, d).transpose(1, 2)
            k = module.k_proj(hidden).view(b, t, -1, d).transpose(1, 2)
            rows = sorted({r % t for r in self.query_rows})
            q = q[:, :, rows]
            q = self._rotate(q, cos[:, rows], sin[:, rows])
            k = self._rotate(k, cos, sin)
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            scores = (q @ k.transpose(-1, -2)).float() * module.scaling  # [b, heads, rows, t]
            key_pos = torch.arange(t, device=scores.device)
            row_pos = torch.tensor(rows, device=scores.device)
            scores = scores.masked_fill(key_pos[None, :] > row_pos[:, None], float("-inf"))
            p = scores.softmax(-1)
            entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)  # [b, heads, rows]
            lo, hi = row_pos // 3 + 0, (2 * (row_pos + 1)) // 3
            middle = (key_pos[None, :] >= lo[:, None]) & (key_pos[None, :] < hi[:, None])
            middle_mass = (p * middle).sum(-1)
            for head in range(entropy.shape[1]):
                for j, row in enumerate(rows):
                    self._rows.append({"layer": layer, "head": head, "row": row,
                                       "entropy": float(entropy[:, head, j].mean()),
                                       "middle_mass": float(middle_mass[:, head, j].mean())})
            return None

        return hook

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(self._rows)


@torch.inference_mode()
def attention_profile(model, ids: torch.Tensor, specs=None, query_rows: Sequence[int] = (-1,),
                      cosine: bool = False) -> pd.DataFrame:
    """Per layer: mean over heads (and rows) of entropy and middle-third mass, for one forward; with
    ``cosine`` also :func:`middle_to_last_cosine` from the same forward."""
    with rope_context(model, specs), AttentionStats(model, query_rows) as stats:
        out = model(ids, output_hidden_states=cosine)
    table = stats.table().groupby("layer")[["entropy", "middle_mass"]].mean().reset_index()
    return table.merge(_middle_to_last(out.hidden_states, ids.shape[1]), on="layer") if cosine else table


def _middle_to_last(hidden_states, t: int) -> pd.DataFrame:
    rows = []
    for layer, h in enumerate(hidden_states[1:]):
        mid = h[:, t // 3 : 2 * t // 3].mean(1)
        rows.append({"layer": layer, "cosine": float(torch.nn.functional.cosine_similarity(mid, h[:, -1], dim=-1).mean())})
    return pd.DataFrame(rows)


@torch.inference_mode()
def middle_to_last_cosine(model, ids: torch.Tensor, specs=None) -> pd.DataFrame:
    """Per layer: cosine similarity between the mean hidden state of the middle third of the context
    and the last token's hidden state (how much of the middle reaches the final position)."""
    with rope_context(model, specs):
        states = model(ids, output_hidden_states=True).hidden_states
    return _middle_to_last(states, ids.shape[1])


def _uniform(model, scale: float):
    return None if scale == 1.0 else scale_specs([scale] * find_rope_stack(model).num_layers)


def entropy_vs_length(model, windows: dict[int, torch.Tensor], scales: Sequence[float] = (1.0, 2.0)) -> pd.DataFrame:
    """Per (length, uniform scale, layer): the last token's attention entropy and middle mass;
    ``windows`` maps each length to a [1, length] token window."""
    return pd.concat([attention_profile(model, ids, _uniform(model, s)).assign(length=length, scale=s)
                      for length, ids in windows.items() for s in scales], ignore_index=True)


def attention_by_scale(model, ids: torch.Tensor, scales: Sequence[float]) -> pd.DataFrame:
    """Per (uniform scale, layer): entropy, middle mass and middle-to-last cosine, one forward each."""
    return pd.concat([attention_profile(model, ids, _uniform(model, s), cosine=True).assign(scale=s) for s in scales],
                     ignore_index=True)


def layer_blocks(num_layers: int, width: int, scale: float) -> dict[str, list[float] | None]:
    """The layer-range study's settings: ``scale`` on one block of ``width`` consecutive layers
    (1 elsewhere), for every block, plus "none"."""
    return {"none": None, **{f"layers {a}-{min(a + width, num_layers) - 1}":
                             [scale if a <= l < a + width else 1.0 for l in range(num_layers)]
                             for a in range(0, num_layers, width)}}


@torch.inference_mode()
def rope_removal_cosine(model, ids: torch.Tensor, depths: Sequence[int], first: int = 128) -> pd.DataFrame:
    """RoPE removed (positions masked) in layers 0..k−1, for each k in ``depths``: per layer, the
    cosine between each token's hidden state and the unmodified model's, averaged over the first
    ``first`` tokens and over the rest of the context. High on the first tokens and lower later
    means the early layers' RoPE matters mainly for distant positions."""
    with torch.no_grad():
        reference = model(ids, output_hidden_states=True).hidden_states[1:]
    rows = []
    for k in depths:
        with rope_context(model, {l: RopeSpec(mask=True) for l in range(k)}):
            states = model(ids, output_hidden_states=True).hidden_states[1:]
        for layer, (h, ref) in enumerate(zip(states, reference)):
            cos = torch.nn.functional.cosine_similarity(h[0], ref[0], dim=-1)
            rows.append({"removed_layers": k, "layer": layer, "first_tokens": float(cos[:first].mean()),
                         "later_tokens": float(cos[first:].mean())})
    return pd.DataFrame(rows)



def conclusion(entropy: pd.DataFrame, by_scale: pd.DataFrame, removal: pd.DataFrame, ranges: pd.DataFrame) -> str:
    """Notebook 3's reading, every number from its four tables (:func:`entropy_vs_length`,
    :func:`attention_by_scale`, :func:`rope_removal_cosine`, the layer-block accuracies). Each study
    ran on one text window, so its numbers carry no interval: they describe that window."""
    mean = entropy.groupby(["length", "scale"]).entropy.mean().unstack()
    base, stretched = mean[1.0], mean[mean.columns.max()]
    slope = np.polyfit(np.log2(mean.index.to_numpy(float)), base.to_numpy(), 1)[0]
    scales = by_scale.groupby("scale")[["middle_mass", "cosine"]].mean()
    top = scales.index.max()
    rise = by_scale.pivot(index="layer", columns="scale", values="middle_mass")
    rise = (rise[top] - rise[1.0]).sort_values(ascending=False)
    lines = [
        f"- **(a) Entropy and length.** The last token's entropy, mean over layers and heads, goes from "
        f"{base.iloc[0]:.2f} nats at {mean.index[0]:,} tokens to {base.iloc[-1]:.2f} at {mean.index[-1]:,}: "
        f"{slope:.2f} nats per doubling (uniform attention: {np.log(2):.2f}). Scale {mean.columns.max():g} raises it at every "
        f"length by {(stretched - base).min():+.2f} to {(stretched - base).max():+.2f} nats.",
        f"- **(b) Scale and the middle.** The attention mass on the middle third goes from {scales.loc[1.0, 'middle_mass']:.3f} "
        f"at s = 1 to {scales.loc[top, 'middle_mass']:.3f} at s = {top:g} (mean over layers); the largest rise is in layer "
        f"{rise.index[0]} ({rise.iloc[0]:+.3f}). The cosine of the middle's mean state with the last token goes from "
        f"{scales.loc[1.0, 'cosine']:.2f} to {scales.loc[top, 'cosine']:.2f}.",
        "- **(c) RoPE removed in the first k layers**, cosine of the states with the unmodified model's (mean over layers):",
        "",
        "  | k | first tokens | later tokens |",
        "  |---|---|---|",
    ]
    cos = removal.groupby("removed_layers")[["first_tokens", "later_tokens"]].mean()
    lines += [f"  | {k} | {r['first_tokens']:.3f} | {r['later_tokens']:.3f} |" for k, r in cos.iterrows()]
    grid = ranges.pivot(index="method", columns="position", values="mean")
    n = int(ranges["n"].min())
    blocks = [m for m in dict.fromkeys(ranges["method"]) if m != "none"]
    lines += ["", f"- **(d) One block of layers scaled** (KV, n = {n} per position; first / middle / last accuracy, "
              f"none scaled: {' / '.join(f'{100 * v:.0f}' for v in grid.loc['none'])} %):"]
    lines += [f"  - {m}: {' / '.join(f'{100 * v:.0f}' for v in grid.loc[m])} %" for m in blocks]
    return "\n".join(lines)

"""Layer-wise RoPE probes (LASP-style): what happens to perplexity and retrieval when one layer
loses (masking) or blurs (coarsening ⌊p/k⌋) its positional information, and a control that
perturbs the same layer's hidden states by random noise of the same size."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .data import Sample
from .evaluate import EvalSettings, evaluate_samples, rope_context
from .metrics import perplexity
from .rope import RopeSpec, find_rope_stack


@torch.inference_mode()
def window_perplexity(model, windows: Sequence[Sequence[int]], specs=None, batch_size: int = 4) -> float:
    """Perplexity of next-token prediction over equal-length token windows, under optional specs."""
    ids = torch.tensor([list(w) for w in windows])
    nll, count = 0.0, 0
    with rope_context(model, specs):
        for start in range(0, len(ids), batch_size):
            batch = ids[start : start + batch_size]
            logits = model(batch).logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum")
            nll += float(loss)
            count += batch[:, 1:].numel()
    return perplexity(nll, count)


def _layers(model, layers: Sequence[int] | None) -> list[int]:
    n = find_rope_stack(model).num_layers
    chosen = list(range(n)) if layers is None else list(layers)
    bad = [l for l in chosen if not 0 <= l < n]
    if bad:
        raise ValueError(f"layer indices {bad} are outside [0, {n - 1}]")
    return chosen


def masking_perplexity(model, windows, layers: Sequence[int] | None = None) -> pd.DataFrame:
    """Perplexity with RoPE masked (all positions 0) in one layer at a time; layer -1 = unpatched."""
    rows = [{"layer": -1, "perplexity": window_perplexity(model, windows)}]
    for layer in tqdm(_layers(model, layers), desc="masking, layer by layer", leave=False):
        rows.append({"layer": layer, "perplexity": window_perplexity(model, windows, {layer: RopeSpec(mask=True)})})
    return pd.DataFrame(rows)


def coarsening_perplexity(model, windows, ks: Sequence[int], layers: Sequence[int] | None = None) -> pd.DataFrame:
    """Perplexity with positions ⌊p/k⌋ in one layer at a time, for each k."""
    rows = []
    grid = [(layer, k) for layer in _layers(model, layers) for k in ks]
    for layer, k in tqdm(grid, desc="coarsening, layer x k", leave=False):
        rows.append({"layer": layer, "k": k, "perplexity": window_perplexity(model, windows, {layer: RopeSpec(coarsen=k)})})
    return pd.DataFrame(rows)


def _capture_outputs(model, ids: torch.Tensor, layers: Sequence[int], specs=None) -> dict[int, torch.Tensor]:
    """Output hidden states of the given layers in one forward (under optional specs)."""
    stack = find_rope_stack(model)
    captured, handles = {}, []
    for layer in layers:
        def grab(module, args, output, layer=layer):
            captured[layer] = output[0] if isinstance(output, tuple) else output
        handles.append(stack.layers[layer].register_forward_hook(grab))
    try:
        with rope_context(model, specs):
            model(ids)
    finally:
        for h in handles:
            h.remove()
    return captured


@torch.inference_mode()
def noise_control_perplexity(model, windows, layers: Sequence[int] | None = None, seed: int = 0) -> pd.DataFrame:
    """Control for the masking probe: add isotropic noise to one layer's output whose per-token norm
    equals the shift that masking RoPE in that layer causes. If masking hurts much more than this
    noise, the layer's loss is positional, not a generic perturbation."""
    stack = find_rope_stack(model)
    ids = torch.tensor([list(w) for w in windows])
    chosen = _layers(model, layers)
    plain = _capture_outputs(model, ids, chosen)  # one unpatched forward serves every layer
    rows = []
    for layer in tqdm(chosen, desc="same-norm noise, layer by layer", leave=False):
        masked = _capture_outputs(model, ids, [layer], {layer: RopeSpec(mask=True)})[layer]
        norms = (masked - plain[layer]).norm(dim=-1, keepdim=True)
        gen = torch.Generator().manual_seed(seed + layer)
        noise = torch.randn(norms.shape[:-1] + (model.config.hidden_size,), generator=gen)
        noise = noise / noise.norm(dim=-1, keepdim=True) * norms

        def add_noise(module, args, output):
            if isinstance(output, tuple):
                return (output[0] + noise.to(output[0].dtype),) + output[1:]
            return output + noise.to(output.dtype)

        handle = stack.layers[layer].register_forward_hook(add_noise)
        try:
            ppl = window_perplexity(model, windows, batch_size=len(windows))
        finally:
            handle.remove()
        rows.append({"layer": layer, "perplexity": ppl, "shift_norm_mean": float(norms.mean())})
    return pd.DataFrame(rows)


def masking_recall(model, tokenizer, samples: Sequence[Sample], layers: Sequence[int] | None = None,
                   settings: EvalSettings = EvalSettings()) -> pd.DataFrame:
    """Retrieval accuracy by gold position with RoPE masked in one layer at a time; layer -1 = unpatched."""
    frames = [evaluate_samples(model, tokenizer, samples, None, settings, progress=False).assign(layer=-1)]
    for layer in tqdm(_layers(model, layers), desc="masking recall, layer by layer", leave=False):
        df = evaluate_samples(model, tokenizer, samples, {layer: RopeSpec(mask=True)}, settings, progress=False)
        frames.append(df.assign(layer=layer))
    return pd.concat(frames, ignore_index=True)


def tokens_of_text(tokenizer, text: str, max_chars: int = 400_000) -> list[int]:
    """Token ids of (the start of) a long text; the cap keeps tokenisation fast."""
    return tokenizer(text[:max_chars], add_special_tokens=False).input_ids


def coarsening_ks(context: int) -> list[int]:
    """Powers of two from 2 up to the context length (the probe's k axis)."""
    return [int(k) for k in 2 ** np.arange(1, int(np.log2(context)) + 1)]

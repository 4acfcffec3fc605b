"""Layer-wise RoPE probes (LASP-style): what happens to perplexity and retrieval when one layer
loses (masking) or blurs (coarsening ⌊p/k⌋) its positional information, and a control that
perturbs the same layer's hidden states by random noise of the same size. Each probe runs on one
text window at a time (:func:`per_window`), so that its spread over windows gives it an interval
(:func:`relative_change`)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext

import numpy as np
import pandas as pd
import torch
from scipy import stats
from tqdm.auto import tqdm

from ..core.interventions import Interventions, Stop
from ..core.methods import FixedSpecs
from ..core.rope import RopeSpec, find_rope_stack, rope_context
from ..evaluation.evaluate import evaluate_samples
from ..evaluation.metrics import perplexity
from ..evaluation.tasks import EvalSettings
from ..store.data import Sample
from ..store.results import cached_table, reading_only


def _batches(windows: Sequence[Sequence[int]], batch_size: int, device=None) -> list[torch.Tensor]:
    lengths = sorted({len(w) for w in windows})
    if not windows or len(lengths) != 1 or lengths[0] < 2:
        raise ValueError(f"windows must be one or more token windows of one length >= 2, got lengths {lengths}")
    ids = torch.tensor([list(w) for w in windows], device=device)
    return [ids[i : i + batch_size] for i in range(0, len(ids), batch_size)]


class UnpatchedPrefix:
    """Every layer's unpatched output for the batches of a window sweep, computed once.

    A probe that changes only layer ``l`` (and what follows it) leaves layers ``0..l-1`` computing
    exactly what they compute unpatched. Inside :meth:`start_at` those layers return the stored output
    instead of recomputing it: the same numbers from the same batches and kernels, for about half the
    work of a sweep over all layers. It holds layers x windows x length x hidden values (SmolLM2,
    2 x 512 tokens: 71 MB; a 7B model at 8 x 4096 tokens in float16: ~9 GB, so mind GPU memory)."""

    @torch.inference_mode()
    def __init__(self, model, windows: Sequence[Sequence[int]], batch_size: int = 4):
        self.layers = find_rope_stack(model).layers
        self.batches = _batches(windows, batch_size, model.device)
        self.outputs: list[dict[int, object]] = []
        for batch in self.batches:
            captured: dict[int, object] = {}
            with Interventions() as interventions:
                for i, layer in enumerate(self.layers):
                    interventions.hook(layer, lambda m, a, out, i=i: captured.__setitem__(i, out))
                model(batch)
            self.outputs.append(captured)

    def hidden(self, layer: int, batch: int = 0) -> torch.Tensor:
        return _hidden_states(self.outputs[batch][layer])

    @contextmanager
    def start_at(self, layer: int, batch: int) -> Iterator[None]:
        stored = self.outputs[batch].get(layer - 1)
        with Interventions() as interventions:
            for module in self.layers[:layer]:
                interventions.override(module, "forward", lambda *args, **kwargs: stored)
            yield


@torch.inference_mode()
def window_perplexity(model, windows: Sequence[Sequence[int]], specs=None, batch_size: int = 4,
                      prefix: UnpatchedPrefix | None = None, start: int = 0) -> float:
    """Perplexity of next-token prediction over equal-length token windows, under optional specs.
    With ``prefix`` (built from the same windows), layers before ``start`` are not recomputed."""
    nll, count = 0.0, 0
    batches = prefix.batches if prefix is not None else _batches(windows, batch_size, model.device)
    with rope_context(model, specs):
        for i, batch in enumerate(batches):
            with prefix.start_at(start, i) if prefix is not None else nullcontext():
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
    prefix = UnpatchedPrefix(model, windows)
    for layer in tqdm(_layers(model, layers), desc="masking, layer by layer", leave=False):
        ppl = window_perplexity(model, windows, {layer: RopeSpec(mask=True)}, prefix=prefix, start=layer)
        rows.append({"layer": layer, "perplexity": ppl})
    return pd.DataFrame(rows)


def coarsening_perplexity(model, windows, ks: Sequence[int], layers: Sequence[int] | None = None) -> pd.DataFrame:
    """Perplexity with positions ⌊p/k⌋ in one layer at a time, for each k."""
    rows = []
    prefix = UnpatchedPrefix(model, windows)
    grid = [(layer, k) for layer in _layers(model, layers) for k in ks]
    for layer, k in tqdm(grid, desc="coarsening, layer x k", leave=False):
        ppl = window_perplexity(model, windows, {layer: RopeSpec(coarsen=k)}, prefix=prefix, start=layer)
        rows.append({"layer": layer, "k": k, "perplexity": ppl})
    return pd.DataFrame(rows)


def _hidden_states(output) -> torch.Tensor:
    """A decoder layer's output hidden states (some architectures return a tuple)."""
    return output[0] if isinstance(output, tuple) else output


def _layer_output(model, prefix: UnpatchedPrefix, layer: int, specs) -> torch.Tensor:
    """Output hidden states of one layer under ``specs``: only that layer is computed (the ones before
    it come from ``prefix``, the forward stops after it)."""
    captured = {}
    try:
        with Interventions() as interventions, rope_context(model, specs), prefix.start_at(layer, 0):
            interventions.stop_after(find_rope_stack(model).layers[layer], lambda out: captured.update(out=_hidden_states(out)))
            model(prefix.batches[0])
    except Stop:
        pass
    return captured["out"]


@torch.inference_mode()
def noise_control_perplexity(model, windows, layers: Sequence[int] | None = None, seed: int = 0) -> pd.DataFrame:
    """Control for the masking probe: add isotropic noise to one layer's output whose per-token norm
    equals the shift that masking RoPE in that layer causes. If masking hurts much more than this
    noise, the layer's loss is positional, not a generic perturbation."""
    stack = find_rope_stack(model)
    chosen = _layers(model, layers)
    prefix = UnpatchedPrefix(model, windows, batch_size=len(windows))  # one batch: the noise is drawn for all windows
    rows = []
    for layer in tqdm(chosen, desc="same-norm noise, layer by layer", leave=False):
        masked = _layer_output(model, prefix, layer, {layer: RopeSpec(mask=True)})
        norms = (masked - prefix.hidden(layer)).norm(dim=-1, keepdim=True)
        gen = torch.Generator().manual_seed(seed + layer)
        # drawn on the CPU (the same noise on every device), then beside the hidden states
        noise = torch.randn(norms.shape[:-1] + (model.config.hidden_size,), generator=gen).to(norms.device)
        noise = noise / noise.norm(dim=-1, keepdim=True) * norms

        def add_noise(module, args, output):
            if isinstance(output, tuple):
                return (output[0] + noise.to(output[0]),) + output[1:]
            return output + noise.to(output)

        with Interventions() as interventions:
            interventions.hook(stack.layers[layer], add_noise)
            ppl = window_perplexity(model, windows, prefix=prefix, start=layer)
        rows.append({"layer": layer, "perplexity": ppl, "shift_norm_mean": float(norms.mean())})
    return pd.DataFrame(rows)


def masking_recall(model, tokenizer, samples: Sequence[Sample], layers: Sequence[int] | None = None,
                   settings: EvalSettings = EvalSettings()) -> pd.DataFrame:
    """Retrieval accuracy by gold position with RoPE masked in one layer at a time; layer -1 = unpatched."""
    frames = [evaluate_samples(model, tokenizer, samples, None, settings, progress=False).assign(layer=-1)]
    for layer in tqdm(_layers(model, layers), desc="masking recall, layer by layer", leave=False):
        df = evaluate_samples(model, tokenizer, samples, FixedSpecs({layer: RopeSpec(mask=True)}), settings, progress=False)
        frames.append(df.assign(layer=layer))
    return pd.concat(frames, ignore_index=True)


def tokens_of_text(tokenizer, text: str, max_chars: int = 400_000) -> list[int]:
    """Token ids of (the start of) a long text; the cap keeps tokenisation fast."""
    return tokenizer(text[:max_chars], add_special_tokens=False).input_ids


def per_window(name: str, params: dict, windows: Sequence[Sequence[int]], compute: Callable[[list[list[int]]], pd.DataFrame],
               profile: str) -> pd.DataFrame:
    """``compute([window])`` on each window alone, each stored under its own key (a digest of the
    window's tokens), with a ``window`` column: the windows are the probe's independent units."""
    frames = []
    for i, w in enumerate(tqdm(windows, desc=f"{name}, window by window", leave=False, disable=reading_only())):
        digest = hashlib.sha256(np.asarray(w, dtype=np.int64).tobytes()).hexdigest()[:16]
        frames.append(cached_table(name, {**params, "tokens": digest}, lambda: compute([list(w)]), profile).assign(window=i))
    return pd.concat(frames, ignore_index=True)


def relative_change(table: pd.DataFrame, reference: pd.DataFrame, on: Sequence[str] = ("window",),
                    by: Sequence[str] = ("layer",), confidence: float = 0.95) -> pd.DataFrame:
    """Per group ``by``: the perplexity change against ``reference`` matched ``on`` its keys (the
    same window; for the noise control also the same layer), in %, as exp(mean over windows of the log
    ratio) − 1, with a t interval over windows (NaN with a single window)."""
    merged = table.merge(reference[[*on, "perplexity"]], on=list(on), suffixes=("", "_reference"), validate="many_to_one")
    log_ratio = np.log(merged["perplexity"] / merged["perplexity_reference"])
    g = log_ratio.groupby([merged[c] for c in by])
    mean, se, n = g.mean(), g.sem(), g.count()
    half = stats.t.ppf(0.5 + confidence / 2, n - 1) * se
    pct = lambda x: 100 * np.expm1(x)  # noqa: E731
    return pd.DataFrame({"change_pct": pct(mean), "ci_low": pct(mean - half), "ci_high": pct(mean + half), "windows": n}).reset_index()


def masking_summary(masked: pd.DataFrame, noise: pd.DataFrame) -> pd.DataFrame:
    """Per layer: the change of masking and of the same-norm noise against the unpatched perplexity
    (``_mask`` / ``_noise`` columns), and of masking against the noise of the same layer and window
    (``mask_vs_noise_*``), each with its interval over windows (tables of :func:`per_window`)."""
    base, layers = masked[masked.layer == -1], masked[masked.layer >= 0]
    vs_noise = relative_change(layers, noise, on=("window", "layer")).rename(
        columns={"change_pct": "mask_vs_noise_pct", "ci_low": "mask_vs_noise_low", "ci_high": "mask_vs_noise_high"})
    return (relative_change(layers, base).merge(relative_change(noise, base), on=["layer", "windows"], suffixes=("_mask", "_noise"))
            .merge(vs_noise, on=["layer", "windows"]))


def depth_contrast(masked: pd.DataFrame, coarsened: pd.DataFrame, num_layers: int, window: int, confidence: float = 0.95,
                   power: float = 0.8) -> pd.DataFrame:
    """LASP's layer asymmetry (its Figs. 1–2: shallow layers need RoPE, deep ones hardly do) as one paired
    number per probe: per window, the mean log perplexity ratio (probed / unprobed) over the first third
    of the layers minus that over the last third; its mean over windows as a ratio in % (how much more a
    shallow-layer probe raises perplexity than a deep-layer one), a t interval and the MDE at ``power``
    over windows. One row for masking and one per coarsening k below the ``window`` length (at k ≥ the
    window every position is 0: that is masking), from the tables of :func:`per_window`."""
    third = num_layers // 3
    if third < 1:
        raise ValueError(f"a depth contrast needs at least 3 layers, got {num_layers}")
    shallow, deep = set(range(third)), set(range(num_layers - third, num_layers))
    base = masked[masked.layer == -1].set_index("window").perplexity
    probes = [("masking", masked[masked.layer >= 0])] + [(f"coarsening k={k}", coarsened[coarsened.k == k])
                                                        for k in sorted(coarsened.k.unique()) if k < window]
    rows = []
    for probe, table in probes:
        log_ratio = np.log(table.perplexity.to_numpy() / base.loc[table.window].to_numpy())
        by = table.assign(log_ratio=log_ratio).groupby("window")
        first = by.apply(lambda w: w.log_ratio[w.layer.isin(shallow)].mean(), include_groups=False)
        last = by.apply(lambda w: w.log_ratio[w.layer.isin(deep)].mean(), include_groups=False)
        d = first - last
        n, mean, se = len(d), d.mean(), d.sem()
        half = stats.t.ppf(0.5 + confidence / 2, n - 1) * se
        mde = (stats.t.ppf(0.5 + confidence / 2, n - 1) + stats.t.ppf(power, n - 1)) * se
        pct = lambda x: 100 * np.expm1(x)  # noqa: E731
        rows.append({"probe": probe, "shallow_layers": f"0-{third - 1}", "deep_layers": f"{num_layers - third}-{num_layers - 1}",
                     "shallow_pct": pct(first.mean()), "deep_pct": pct(last.mean()), "contrast_pct": pct(mean),
                     "ci_low": pct(mean - half), "ci_high": pct(mean + half), "mde_pct": pct(mde), "windows": n,
                     "window": window})
    return pd.DataFrame(rows)


def conclusion(probe: pd.DataFrame, coarsening: pd.DataFrame, recall: pd.DataFrame, window: int, top: int = 3) -> str:
    """Notebook 2's reading, every number from its tables (:func:`masking_summary`, the coarsening
    changes of :func:`relative_change` by layer and k, the recall accuracies by layer and position):
    which layers masking hurts most and least, where it hurts more or less than same-norm noise
    (intervals over windows clear of zero), what coarsening by the smallest k costs, and how
    single-layer masks move retrieval at each gold position."""
    def pct(r, column, low, high):
        return f"{r[column]:+.1f} % [{r[low]:+.1f}, {r[high]:+.1f}]"

    ranked = probe.sort_values("change_pct_mask", ascending=False)
    windows = int(probe["windows"].min())
    above = probe[probe["mask_vs_noise_low"] > 0].sort_values("mask_vs_noise_pct", ascending=False)
    below = probe[probe["mask_vs_noise_high"] < 0].sort_values("mask_vs_noise_pct")
    k = coarsening["k"].min()
    smallest = coarsening[coarsening["k"] == k].sort_values("change_pct", ascending=False)
    worst_by_k = coarsening.sort_values("change_pct", ascending=False).groupby("k").head(1).sort_values("k")
    base = recall[recall["layer"] == -1].set_index("position")["mean"]
    masked = recall[recall["layer"] >= 0].pivot(index="layer", columns="position", values="mean")
    first, others = masked.columns[0], masked.columns[1:]
    n = int(recall["n"].min())
    lines = [
        f"{windows} windows of {window} tokens, each probed separately: a change is the geometric mean over windows "
        f"with a 95 % t interval over the windows; retrieval n = {n} records per position, Wilson intervals.",
        f"- **Masking RoPE in one layer** changes perplexity by {probe['change_pct_mask'].min():+.1f} to "
        f"{probe['change_pct_mask'].max():+.1f} %: most in "
        + ", ".join(f"layer {int(r['layer'])} ({pct(r, 'change_pct_mask', 'ci_low_mask', 'ci_high_mask')})" for _, r in ranked.head(top).iterrows())
        + "; least in "
        + ", ".join(f"layer {int(r['layer'])} ({pct(r, 'change_pct_mask', 'ci_low_mask', 'ci_high_mask')})" for _, r in ranked.tail(top).iterrows())
        + ".",
        f"- **Against the same-norm noise control** (paired per window): masking hurts more than noise of its own size in "
        f"{len(above)} layer{'s' * (len(above) != 1)} — "
        + (", ".join(f"{int(r['layer'])} ({pct(r, 'mask_vs_noise_pct', 'mask_vs_noise_low', 'mask_vs_noise_high')})"
                     for _, r in above.iterrows()) or "none")
        + f"; less than noise in {len(below)} — "
        + (", ".join(f"{int(r['layer'])} ({pct(r, 'mask_vs_noise_pct', 'mask_vs_noise_low', 'mask_vs_noise_high')})"
                     for _, r in below.iterrows()) or "none") + ".",
        f"- **Coarsening ⌊p/k⌋** at k = {k} costs at most {smallest['change_pct'].iloc[0]:+.1f} % (layer "
        f"{int(smallest['layer'].iloc[0])}); the most damaged layer per k: "
        + ", ".join(f"k = {int(r['k'])}: layer {int(r['layer'])} ({r['change_pct']:+.1f} %)" for _, r in worst_by_k.iterrows()) + ".",
        f"- **Retrieval with one layer masked** (unpatched: {' / '.join(f'{100 * base[p]:.0f}' for p in masked.columns)} % "
        f"at gold {' / '.join(str(p) for p in masked.columns)}): first-position accuracy ranges "
        f"{100 * masked[first].min():.0f}–{100 * masked[first].max():.0f} % over the layers (lowest with layers "
        f"{', '.join(str(l) for l in masked.index[masked[first] == masked[first].min()])}); no single-layer mask lifts "
        + " or ".join(f"gold {p} above {100 * masked[p].max():.0f} %" for p in others) + ".",
    ]
    return "\n".join(lines)

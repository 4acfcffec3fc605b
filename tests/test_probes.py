"""Layer-wise RoPE probes on a tiny model."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats
import torch

from lpes_nb.core.rope import RopeSpec
from lpes_nb.store.data import Sample
from lpes_nb.store.models import model_key
from lpes_nb.studies import probes
from lpes_nb.studies.probes import (
    UnpatchedPrefix,
    coarsening_perplexity,
    masking_perplexity,
    masking_recall,
    noise_control_perplexity,
    per_window,
    relative_change,
    window_perplexity,
)

WINDOWS = torch.randint(0, 49152, (2, 64), generator=torch.Generator().manual_seed(0)).tolist()


def test_window_perplexity_matches_the_model_loss(tiny_llama):
    with torch.no_grad():
        loss = tiny_llama(torch.tensor(WINDOWS), labels=torch.tensor(WINDOWS)).loss
    assert window_perplexity(tiny_llama, WINDOWS) == pytest.approx(math.exp(float(loss)), rel=1e-5)


def test_starting_at_the_patched_layer_gives_the_same_numbers(tiny):
    windows = torch.randint(0, 1000, (3, 48), generator=torch.Generator().manual_seed(1)).tolist()
    prefix = UnpatchedPrefix(tiny, windows, batch_size=2)  # two batches, the second of one window
    layers = tiny.config.num_hidden_layers
    for layer in range(layers):
        for spec in (RopeSpec(mask=True), RopeSpec(coarsen=4)):
            full = window_perplexity(tiny, windows, {layer: spec}, batch_size=2)
            assert window_perplexity(tiny, windows, {layer: spec}, prefix=prefix, start=layer) == full  # bit-identical
    assert window_perplexity(tiny, windows, prefix=prefix) == window_perplexity(tiny, windows, batch_size=2)
    # the skipped layers are back to their own forward: a later patch on layer 0 still has an effect
    assert all("forward" not in vars(layer) for layer in prefix.layers)
    assert window_perplexity(tiny, windows, {0: RopeSpec(mask=True)}) != window_perplexity(tiny, windows)


def test_masking_and_coarsening_tables(tiny_llama):
    masked = masking_perplexity(tiny_llama, WINDOWS)
    assert masked["layer"].tolist() == [-1, 0, 1, 2, 3]
    base = masked.loc[masked.layer == -1, "perplexity"].item()
    assert base == pytest.approx(window_perplexity(tiny_llama, WINDOWS))
    assert (masked.loc[masked.layer >= 0, "perplexity"] != base).all()  # every layer's mask has an effect
    assert masked.loc[masked.layer == 2, "perplexity"].item() == pytest.approx(
        window_perplexity(tiny_llama, WINDOWS, {2: RopeSpec(mask=True)}))
    coarse = coarsening_perplexity(tiny_llama, WINDOWS, ks=[2, 64], layers=[0, 3])
    assert list(zip(coarse.layer, coarse.k)) == [(0, 2), (0, 64), (3, 2), (3, 64)]
    # k = context length puts every position at 0: the same as masking
    assert coarse.query("layer == 3 and k == 64")["perplexity"].item() == pytest.approx(
        masked.loc[masked.layer == 3, "perplexity"].item(), rel=1e-6)
    with pytest.raises(ValueError, match=r"layer indices \[7\] are outside \[0, 3\]"):
        masking_perplexity(tiny_llama, WINDOWS, layers=[7])


def test_noise_control_uses_the_masking_shift_norm(tiny_llama):
    df = noise_control_perplexity(tiny_llama, WINDOWS, layers=[1, 2])
    assert df["layer"].tolist() == [1, 2] and (df["shift_norm_mean"] > 0).all()
    base = window_perplexity(tiny_llama, WINDOWS)
    assert (df["perplexity"] != base).all()
    # the hooks are gone afterwards
    assert window_perplexity(tiny_llama, WINDOWS) == base


def test_masking_recall_has_a_row_per_layer_and_sample(tiny_llama, tokenizer):
    samples = [Sample("kv", i, pos, 3, f"Key {i}: value is", ("7",)) for pos in (0, 1, 2) for i in range(2)]
    df = masking_recall(tiny_llama, tokenizer, samples, layers=[0, 1])
    assert sorted(df["layer"].unique()) == [-1, 0, 1] and len(df) == 18



def test_per_window_stores_each_window_once_and_joins_to_the_joint_perplexity(tiny_llama, tmp_path, monkeypatch):
    """Equal-length windows: the joint perplexity is the geometric mean of the per-window ones."""
    monkeypatch.setenv("LPES_OUTPUT_ROOT", str(tmp_path))
    params = model_key("tiny-llama", tiny_llama)
    table = per_window("probe_masking_ppl", params, WINDOWS, lambda w: masking_perplexity(tiny_llama, w, layers=[1]), "smoke")
    assert table.window.tolist() == [0, 0, 1, 1]
    base = table[table.layer == -1].perplexity
    assert np.exp(np.log(base).mean()) == pytest.approx(window_perplexity(tiny_llama, WINDOWS), rel=1e-5)
    again = per_window("probe_masking_ppl", params, WINDOWS[::-1], lambda w: pytest.fail("recomputed a stored window"), "smoke")
    assert again.perplexity.tolist() == table[table.window == 1].perplexity.tolist() + table[table.window == 0].perplexity.tolist()


def test_relative_change_is_the_mean_log_ratio_over_windows_with_a_t_interval():
    base = pd.DataFrame({"window": [0, 1, 2], "perplexity": [10.0, 20.0, 40.0]})
    layer = pd.DataFrame({"layer": 3, "window": [0, 1, 2], "perplexity": [11.0, 22.0, 46.0]})
    change = relative_change(layer, base).iloc[0]
    logs = np.log([1.1, 1.1, 1.15])
    half = stats.t.ppf(0.975, 2) * logs.std(ddof=1) / np.sqrt(3)
    assert change.change_pct == pytest.approx(100 * np.expm1(logs.mean()))
    assert (change.ci_low, change.ci_high) == pytest.approx((100 * np.expm1(logs.mean() - half), 100 * np.expm1(logs.mean() + half)))
    assert change.windows == 3 and change.ci_low < change.change_pct < change.ci_high


def test_the_depth_contrast_is_shallow_minus_deep_paired_per_window():
    """Six layers, three windows: the first two layers double perplexity (×2.2 on one window), the last two
    leave it alone; the contrast is the geometric mean of the per-window ratios, with a t interval."""
    rows = []
    for window, factor in enumerate((2.0, 2.0, 2.2)):
        rows.append({"window": window, "layer": -1, "perplexity": 10.0})
        rows += [{"window": window, "layer": layer, "perplexity": 10.0 * (factor if layer < 2 else 1.3 if layer < 4 else 1.0)}
                 for layer in range(6)]
    masked = pd.DataFrame(rows)
    coarsened = pd.concat([masked[masked.layer >= 0].assign(k=4, perplexity=10.0), masked[masked.layer >= 0].assign(k=64)])
    depth = probes.depth_contrast(masked, coarsened, 6, window=64).set_index("probe")
    assert list(depth.index) == ["masking", "coarsening k=4"]  # k = 64 blurs all 64 positions into one: masking, once
    d = np.log([2.0, 2.0, 2.2])
    assert depth.loc["masking", "contrast_pct"] == pytest.approx(100 * np.expm1(d.mean()))
    assert depth.loc["masking", "deep_pct"] == pytest.approx(0.0) and depth.loc["masking", "windows"] == 3
    half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)
    assert depth.loc["masking", "ci_low"] == pytest.approx(100 * np.expm1(d.mean() - half))
    assert depth.loc["coarsening k=4", "contrast_pct"] == pytest.approx(0.0)
    assert (depth.shallow_layers == "0-1").all() and (depth.deep_layers == "4-5").all()
    with pytest.raises(ValueError, match="at least 3 layers, got 2"):
        probes.depth_contrast(masked, coarsened, 2, window=64)

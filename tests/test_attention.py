"""Attention statistics from q/k in hooks == the model's own eager attention weights; RSM helpers."""

import numpy as np
import pytest
import torch

from lpes_nb.attention import AttentionStats, attention_profile, rsm, rsm_deviation, scale_variants
from lpes_nb.models import load_model
from lpes_nb.rope import RopePatch, RopeSpec, scale_specs


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
@pytest.mark.parametrize("patched", [False, True])
def test_hook_statistics_equal_eager_attention_weights(name, patched):
    model = load_model(name, attn_implementation="eager")
    ids = torch.randint(0, 49152, (2, 40), generator=torch.Generator().manual_seed(1))
    specs = [RopeSpec(scale=2.0), RopeSpec(mask=True), RopeSpec(coarsen=3), None] if patched else [None] * 4
    rows = [-1, 20, 5]
    with torch.no_grad(), RopePatch(model, specs), AttentionStats(model, rows) as stats:
        attentions = model(ids, output_attentions=True).attentions
    table = stats.table()
    assert len(table) == 4 * model.config.num_attention_heads * 3
    for layer, att in enumerate(attentions):
        for row in (39, 20, 5):
            p = att[:, :, row, : row + 1].double()
            entropy = -(p * p.clamp_min(1e-30).log()).sum(-1).mean(0)
            lo, hi = row // 3, 2 * (row + 1) // 3
            middle = p[..., lo:hi].sum(-1).mean(0)
            got = table[(table.layer == layer) & (table.row == row)].sort_values("head")
            np.testing.assert_allclose(got.entropy, entropy.numpy(), atol=1e-5)
            np.testing.assert_allclose(got.middle_mass, middle.numpy(), atol=1e-5)


def test_attention_profile_sees_the_scale(tiny_llama):
    ids = torch.randint(0, 49152, (1, 64), generator=torch.Generator().manual_seed(2))
    plain = attention_profile(tiny_llama, ids)
    scaled = attention_profile(tiny_llama, ids, scale_specs([4.0] * 4))
    assert list(plain.columns) == ["layer", "entropy", "middle_mass"] and len(plain) == 4
    assert not np.allclose(plain.entropy, scaled.entropy)
    assert not tiny_llama.model.layers[0].self_attn._forward_pre_hooks  # hooks removed


def test_rsm_and_variants():
    states = np.random.default_rng(0).normal(size=(3, 5, 8))
    m = rsm(states)
    assert m.shape == (3, 5, 5) and np.allclose(np.diagonal(m, axis1=1, axis2=2), 1)
    assert np.allclose(rsm_deviation(m, m), 0) and (rsm_deviation(m, rsm(states[:, ::-1])) > 0).all()
    s = list(np.linspace(1.1, 1.9, 30))
    v = scale_variants(s, seed=0)
    assert v["uniform (mean)"] == [pytest.approx(np.mean(s))] * 30
    assert sorted(v["shuffled"]) == sorted(s) and v["shuffled"] != s
    assert np.all(np.abs(np.array(v["noisy Bézier"]) - s) <= 0.1 + 1e-12)
    assert all(1 <= x <= 2 for x in v["random U(1,2)"]) and scale_variants(s, 0) == v

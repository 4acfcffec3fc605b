"""Attention statistics from q/k in hooks == the model's own eager attention weights."""

import numpy as np
import pytest
import torch

from lpes_nb.studies.attention import (
    AttentionStats,
    attention_by_scale,
    attention_profile,
    layer_blocks,
    middle_to_last_cosine,
    rope_removal_cosine,
)
from lpes_nb.core.rope import RopePatch, RopeSpec, scale_specs
from lpes_nb.store.models import load_model


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


def test_one_forward_per_scale_gives_the_same_numbers_as_separate_probes(tiny_llama):
    ids = torch.randint(0, 49152, (1, 48), generator=torch.Generator().manual_seed(3))
    table = attention_by_scale(tiny_llama, ids, [1.0, 3.0])
    for s, g in table.groupby("scale"):
        specs = None if s == 1.0 else scale_specs([s] * 4)
        np.testing.assert_allclose(g.entropy, attention_profile(tiny_llama, ids, specs).entropy, atol=1e-6)
        np.testing.assert_allclose(g.cosine, middle_to_last_cosine(tiny_llama, ids, specs).cosine, atol=1e-6)
    assert not np.allclose(table[table.scale == 1.0].cosine, table[table.scale == 3.0].cosine)


def test_rope_removal_cosine_is_one_where_nothing_changes(tiny_llama):
    ids = torch.randint(0, 49152, (1, 40), generator=torch.Generator().manual_seed(4))
    table = rope_removal_cosine(tiny_llama, ids, depths=[1, 2], first=10)
    assert len(table) == 2 * 4 and table.first_tokens.between(-1, 1 + 1e-6).all()
    # the very first token has position 0 either way, so masking RoPE cannot change it; later ones do change
    assert table.later_tokens.max() < 1 - 1e-6
    first = rope_removal_cosine(tiny_llama, ids, depths=[2], first=1)
    assert np.allclose(first.first_tokens, 1.0, atol=1e-5)


def test_layer_blocks_cover_every_layer_once():
    blocks = layer_blocks(10, 4, 2.0)
    assert list(blocks) == ["none", "layers 0-3", "layers 4-7", "layers 8-9"] and blocks["none"] is None
    assert np.array_equal(np.sum([np.array(v) > 1 for k, v in blocks.items() if v], axis=0), np.ones(10))

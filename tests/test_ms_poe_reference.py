"""Ms-PoE held against its authors' code (issue #100).

The port below is written from the reference's definitions (VITA-Group/Ms-PoE,
``utils/modify_arch/llama.py``), not copied: per query head, the outlier score of the prompt's last row
of un-rotated attention (−fraction of keys above 3 × the row's mean weight), ``head_order = argsort``,
ratios ``min + (max − min)·i/H``, head h rotated with ratio ``head_order[h]`` (``head_type="normal"``:
ratio H − 1 − h), keys with every G-th query head's table, the order fixed at the prefill and kept while
decoding. It runs the model without a cache, recomputing the whole sequence at every step."""

import math
import types

import pytest
import torch
from transformers.models.llama.modeling_llama import rotate_half

from lpes_nb.core.methods import Baseline, MsPoE, OutlierHeadScales, ms_poe_ratios
from lpes_nb.store.models import model_from_config, tiny_config

MIN, MAX, FIRST = 1.2, 1.8, 2
# query-projection gains per (layer, head): heads of different sharpness, so that every head has its own
# outlier count and the argsort permutation is not its own inverse (the reference and rank mappings differ)
GAINS = {2: (15.0, 250.0, 60.0, 1000.0), 3: (20.0, 150.0, 40.0, 400.0)}


def _model(kv_heads: int):
    model = model_from_config(tiny_config("tiny-llama", num_key_value_heads=kv_heads), seed=3)
    with torch.no_grad():
        for layer, gains in GAINS.items():
            q = model.model.layers[layer].self_attn.q_proj.weight.view(4, 16, -1)
            q.mul_(torch.tensor(gains)[:, None, None])
    return model


@pytest.fixture(scope="module")
def mha():
    return _model(kv_heads=4)


@pytest.fixture(scope="module")
def gqa():
    return _model(kv_heads=2)


PROMPT = torch.randint(0, 49152, (1, 48), generator=torch.Generator().manual_seed(5))


def reference_outlier(q, k):
    """q [H, T, D], k [H_kv, T, D], both un-rotated: the reference's per-head outlier score."""
    k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)
    t = q.shape[1]
    w = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    w = w + torch.full((t, t), torch.finfo(w.dtype).min).triu(1)
    w = w.softmax(-1, dtype=torch.float32)
    return -(w > 3 * w.mean(-1, keepdim=True)).float().mean(-1)[:, -1]


def reference_head_order(outlier, head_type="outlier"):
    if head_type == "normal":
        return len(outlier) - 1 - torch.arange(len(outlier))
    return outlier.argsort(stable=True)


class ReferenceMsPoE:
    """The reference's attention in layers FIRST … L−1 of a Llama model, without a cache."""

    def __init__(self, model, head_type="outlier", offset=0):
        self.model, self.head_type, self.offset, self.orders, self.saved = model, head_type, offset, {}, {}

    def __enter__(self):
        for i, layer in enumerate(self.model.model.layers):
            if i >= FIRST:
                self.saved[i] = layer.self_attn.forward
                layer.self_attn.forward = types.MethodType(self._forward(i), layer.self_attn)
        return self

    def __exit__(self, *exc):
        for i, forward in self.saved.items():
            self.model.model.layers[i].self_attn.forward = forward

    def _forward(self, layer):
        ref = self
        inv_freq = self.model.model.rotary_emb.inv_freq

        def forward(attn, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
            b, t, _ = hidden_states.shape
            d = attn.head_dim
            q = attn.q_proj(hidden_states).view(b, t, -1, d).transpose(1, 2)[0]  # [H, T, D]
            k = attn.k_proj(hidden_states).view(b, t, -1, d).transpose(1, 2)[0]
            v = attn.v_proj(hidden_states).view(b, t, -1, d).transpose(1, 2)[0]
            heads, group = q.shape[0], q.shape[0] // k.shape[0]
            if layer not in ref.orders:  # the prefill's order, kept while decoding
                ref.orders[layer] = reference_head_order(reference_outlier(q, k), ref.head_type)
            ratios = MIN + (MAX - MIN) * torch.arange(heads, dtype=torch.float32) / heads
            per_head = ratios[ref.orders[layer]]  # cos[head_order]
            positions = torch.arange(t, dtype=torch.float32) + ref.offset
            freqs = (positions[None, :, None] / per_head[:, None, None]) * inv_freq
            emb = torch.cat([freqs, freqs], dim=-1)  # [H, T, D]
            cos, sin = emb.cos(), emb.sin()
            q = q * cos + rotate_half(q) * sin
            k = k * cos[::group] + rotate_half(k) * sin[::group]
            k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
            w = q @ k.transpose(-1, -2) / math.sqrt(d) + torch.full((t, t), torch.finfo(q.dtype).min).triu(1)
            out = (w.softmax(-1, dtype=torch.float32) @ v).transpose(0, 1).reshape(1, t, -1)
            return attn.o_proj(out), None

        return forward


def reference_generate(model, ids, steps, head_type="outlier"):
    with torch.no_grad(), ReferenceMsPoE(model, head_type) as ref:
        prefill = model(ids).logits
        seq = ids
        for _ in range(steps):
            seq = torch.cat([seq, model(seq).logits[:, -1:].argmax(-1)], dim=1)
    return prefill, seq[:, ids.shape[1]:], ref.orders


def ours_generate(model, method, ids, steps):
    with torch.no_grad(), method.context(model, ids.shape[1], None):
        prefill = model(ids).logits
        if not steps:
            return prefill, ids[:, :0]
        new = model.generate(ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False, pad_token_id=0)
    return prefill, new[:, ids.shape[1]:]


def _unrotated_qk(model, layer, ids):
    """Layer ``layer``'s un-rotated queries and keys on ``ids`` (the baseline's: the layers before it are
    untouched by Ms-PoE when ``layer`` is its first)."""
    attn, got = model.model.layers[layer].self_attn, {}
    hooks = [attn.q_proj.register_forward_hook(lambda m, a, out: got.__setitem__("q", out)),
             attn.k_proj.register_forward_hook(lambda m, a, out: got.__setitem__("k", out))]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    d = attn.head_dim
    return (got[x].view(1, ids.shape[1], -1, d).transpose(1, 2) for x in ("q", "k"))


def test_outlier_scores_ratios_and_mapping_are_the_references(mha):
    q, k = _unrotated_qk(mha, FIRST, PROMPT)
    valid = torch.ones(1, PROMPT.shape[1], dtype=torch.bool)
    scaler = OutlierHeadScales(MIN, MAX)
    ours = scaler.scores(q[:, :, -1], k, valid, mha.model.layers[FIRST].self_attn.scaling)[0]
    ref = reference_outlier(q[0], k[0])
    assert (ours - ref).abs().max().item() <= 1e-6
    assert len(set(ref.tolist())) == 4  # distinct: the mapping is decided by the scores, not by ties
    assert ms_poe_ratios(4, MIN, MAX).tolist() == pytest.approx([1.2, 1.35, 1.5, 1.65])  # 1.8 never reached
    assert ms_poe_ratios(2, MIN, MAX).tolist() == pytest.approx([1.2, 1.5])  # Qwen's two key/value heads
    order = reference_head_order(ref)
    assert not torch.equal(order, order.argsort())  # a permutation that is not its own inverse
    expected = ms_poe_ratios(4, MIN, MAX)[order]
    assert scaler(q[:, :, -1], k, valid)[0].tolist() == pytest.approx(expected.tolist())
    normal = OutlierHeadScales(MIN, MAX, assign="normal")(q[:, :, -1], k, valid)[0]
    assert normal.tolist() == pytest.approx(ms_poe_ratios(4, MIN, MAX).flip(0).tolist())


@pytest.mark.parametrize("assign,head_type", [("reference", "outlier"), ("normal", "normal")])
def test_ms_poe_matches_the_reference_forward_and_greedy_decoding(mha, assign, head_type):
    ref_logits, ref_tokens, orders = reference_generate(mha, PROMPT, steps=6, head_type=head_type)
    logits, tokens = ours_generate(mha, MsPoE(MIN, MAX, FIRST, assign=assign), PROMPT, steps=6)
    assert (logits - ref_logits).abs().max().item() <= 1e-5
    assert torch.equal(tokens, ref_tokens)
    with torch.no_grad():
        base = Baseline().forward(mha, PROMPT, None, None, 0)
    assert (logits - base).abs().max().item() > 1e-3  # the comparison is not between two unchanged models
    if head_type == "outlier":  # the test sees the mapping: the paper's rank mapping gives other logits
        assert any(not torch.equal(o, o.argsort()) for o in orders.values())
        rank, _ = ours_generate(mha, MsPoE(MIN, MAX, FIRST, assign="rank"), PROMPT, steps=1)
        assert (rank - ref_logits).abs().max().item() > 1e-4


def test_the_earlier_endpoint_grid_is_not_the_references(mha):
    ref_logits, _, _ = reference_generate(mha, PROMPT, steps=0)
    logits, _ = ours_generate(mha, MsPoE(MIN, MAX, FIRST, grid="endpoints"), PROMPT, steps=0)
    assert (logits - ref_logits).abs().max().item() > 1e-4


def test_layers_before_the_first_are_untouched_and_equal_ratios_are_the_baseline(mha):
    with torch.no_grad():
        base = mha(PROMPT, output_hidden_states=True)
        with MsPoE(MIN, MAX, FIRST).context(mha, PROMPT.shape[1], None):
            ours = mha(PROMPT, output_hidden_states=True)
        with MsPoE(1.0, 1.0, FIRST).context(mha, PROMPT.shape[1], None):
            same = mha(PROMPT).logits
    assert all(torch.equal(a, b) for a, b in zip(base.hidden_states[:FIRST + 1], ours.hidden_states[:FIRST + 1]))
    assert not torch.equal(base.hidden_states[FIRST + 1], ours.hidden_states[FIRST + 1])
    assert torch.equal(same, base.logits)


def test_under_grouped_query_attention_ms_poe_stays_relative_where_a_literal_port_does_not(gqa):
    shifted = torch.arange(PROMPT.shape[1])[None] + 37

    def logits(context, **kw):
        with torch.no_grad(), context:
            return gqa(PROMPT, **kw).logits

    method = MsPoE(MIN, MAX, FIRST)
    ours = logits(method.context(gqa, PROMPT.shape[1] + 37, None))
    ours_shifted = logits(method.context(gqa, PROMPT.shape[1] + 37, None), position_ids=shifted)
    assert (ours - ours_shifted).abs().max().item() <= 1e-4
    literal, literal_shifted = logits(ReferenceMsPoE(gqa)), logits(ReferenceMsPoE(gqa, offset=37))
    assert (literal - literal_shifted).abs().max().item() > 1e-2


def test_ms_poe_parts_keep_its_ratio_range_without_the_heads_and_its_heads_without_the_score(gqa):
    from lpes_nb.core.methods import LayerScales
    from lpes_nb.studies.benchmarks import ms_poe_parts

    parts = ms_poe_parts()
    mean_pi = "PI at the mean Ms-PoE ratio from layer 2"
    assert list(parts) == ["Ms-PoE", "Ms-PoE, fixed head order", mean_pi]
    assert parts["Ms-PoE, fixed head order"].assign == "normal"
    assert parts[mean_pi].scales(gqa) == pytest.approx([1.0, 1.0, 1.35, 1.35])  # the mean of its ratios {1.2, 1.5}
    assert parts[mean_pi].scales(_model(kv_heads=4)) == pytest.approx([1.0, 1.0, 1.425, 1.425])  # {1.2, 1.35, 1.5, 1.65}
    with torch.no_grad():  # the same rotation as per-layer PI with those scales
        with parts[mean_pi].context(gqa, PROMPT.shape[1], None):
            ours = gqa(PROMPT).logits
        with LayerScales([1.0, 1.0, 1.35, 1.35], "PI").context(gqa, PROMPT.shape[1], None):
            as_pi = gqa(PROMPT).logits
        base = gqa(PROMPT).logits
    assert torch.equal(ours, as_pi) and not torch.allclose(ours, base)
    with pytest.raises(ValueError, match="first_layer 4 is out of range"):
        ms_poe_parts(MsPoE(first_layer=4))[mean_pi.replace("2", "4")].specs(gqa, PROMPT.shape[1], None)

"""MoICE's reference-shaped router held against the reference's formulas (issue #100).

The port below is written from the definitions of p1nksnow/MoICE (``modeling/modeling_llama.py``), not
copied: per layer, each query rotated once per base; the router, shared by the layer's heads, reads the
query under the first base, w = softmax(gate_2(act(gate_1(q)) · gate_3(q))), kept on its top-k logits and
renormalised; a head's output is Σ_e w_e · softmax(q_e k_eᵀ / √d + causal) v."""

import math
import types

import pytest
import torch
from transformers.models.llama.modeling_llama import rotate_half

from lpes_nb.evaluation.moice import MoICE, ReferenceRouter
from lpes_nb.store.models import model_from_config, tiny_config

# seven bases far apart: on 40 tokens the reference's own set (10,000 … 25,000) gives near-identical attention
# under every base, and a test of the mixture could not tell one router from another
BASES = (10.0, 100.0, 1000.0, 10000.0, 1e5, 1e6, 1e7)
PROMPT = torch.randint(0, 49152, (1, 40), generator=torch.Generator().manual_seed(8))


@pytest.fixture(scope="module", params=[4, 2], ids=["multi-head", "grouped-query"])
def model(request):
    return model_from_config(tiny_config("tiny-llama", num_key_value_heads=request.param), seed=4)


def reference_logits(model, router: ReferenceRouter, ids):
    """The model with every layer's attention replaced by the reference's MoICE attention (no cache)."""
    saved = {}

    def port(layer):
        def forward(attn, hidden_states, **kwargs):
            b, t, _ = hidden_states.shape
            d = attn.head_dim
            q = attn.q_proj(hidden_states).view(b, t, -1, d).transpose(1, 2)
            k = attn.k_proj(hidden_states).view(b, t, -1, d).transpose(1, 2)
            v = attn.v_proj(hidden_states).view(b, t, -1, d).transpose(1, 2)
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            positions = torch.arange(t, dtype=torch.float32)
            rotated = []
            for base in BASES:
                freqs = positions[:, None] * (1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
                emb = torch.cat([freqs, freqs], dim=-1)
                rotated.append((q * emb.cos() + rotate_half(q) * emb.sin(), k * emb.cos() + rotate_half(k) * emb.sin()))
            q0 = rotated[0][0]
            logits = (torch.nn.functional.silu(q0 @ router.gate_1[layer]) * (q0 @ router.gate_3[layer])) @ router.gate_2[layer]
            w = logits.softmax(-1)
            top = logits.topk(router.topk, dim=-1).indices
            w = torch.where(torch.zeros_like(w, dtype=torch.bool).scatter(-1, top, True), w, 0.0)
            w = w / w.sum(-1, keepdim=True)  # [B, H, T, E]
            causal = torch.full((t, t), float("-inf")).triu(1)
            out = sum(w[..., e, None] * ((qe @ ke.transpose(-1, -2) / math.sqrt(d) + causal).softmax(-1) @ v)
                      for e, (qe, ke) in enumerate(rotated))
            return attn.o_proj(out.transpose(1, 2).reshape(b, t, -1)), None
        return forward

    try:
        for i, layer in enumerate(model.model.layers):
            saved[i] = layer.self_attn.forward
            layer.self_attn.forward = types.MethodType(port(i), layer.self_attn)
        with torch.no_grad():
            return model(ids).logits
    finally:
        for i, forward in saved.items():
            model.model.layers[i].self_attn.forward = forward


def _router(model, topk=None):
    router = MoICE(bases=BASES).new_reference_router(model, topk=topk, seed=1)
    with torch.no_grad():  # gates large enough that the weights are far from uniform
        for p in router.parameters():
            p.mul_(30.0)
    return router


@pytest.mark.parametrize("topk", [None, 2])
def test_the_reference_router_matches_the_reference_forward(model, topk):
    router = _router(model, topk)
    with torch.no_grad():
        w = router(1, torch.randn(1, 4, 6, 16))
    assert w.sum(-1).allclose(torch.ones(1, 4, 6)) and (w > 0).sum(-1).le(topk or len(BASES)).all()
    with torch.no_grad(), MoICE(router=router, bases=BASES).context(model, PROMPT.shape[1], None):
        ours = model(PROMPT).logits
    with torch.no_grad(), MoICE(bases=BASES).context(model, PROMPT.shape[1], None):
        uniform = model(PROMPT).logits
    assert (ours - reference_logits(model, router, PROMPT)).abs().max().item() <= 1e-5
    assert (ours - uniform).abs().max().item() > 1e-4  # 10x the tolerance: the router's weights matter here


def test_an_unrotated_query_is_not_the_references_router_input(model):
    router = _router(model)
    reference = reference_logits(model, router, PROMPT)
    router.rotated_input = False  # the workbook's own router reads the un-rotated query
    with torch.no_grad(), MoICE(router=router, bases=BASES).context(model, PROMPT.shape[1], None):
        ours = model(PROMPT).logits
    assert (ours - reference).abs().max().item() > 1e-4


def test_topk_outside_the_bases_is_refused():
    with pytest.raises(ValueError, match=r"MoICE topk must be in \[1, 7\] \(the number of bases\), got 8"):
        ReferenceRouter(2, 16, 7, topk=8)


def test_reference_training_moves_only_the_gates_and_resumes_step_for_step(tmp_path, tokenizer):
    from lpes_nb.evaluation.moice import ReferenceTraining, train_reference_router

    model = model_from_config(tiny_config("tiny-llama"), seed=4)
    before = [p.detach().clone() for p in model.parameters()]
    budget = ReferenceTraining(steps=3, batch_size=2, lr=1e-2, tokens=48)
    whole = train_reference_router(model, tokenizer, budget, progress=False)
    assert len(budget.history) == 3 and all(math.isfinite(v) for v in budget.history)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the model stays frozen
    untrained = MoICE().new_reference_router(model, seed=0)
    assert not torch.equal(whole.router.gate_2, untrained.gate_2)
    checkpoint = tmp_path / "router.ckpt.pt"
    train_reference_router(model, tokenizer, ReferenceTraining(steps=2, batch_size=2, lr=1e-2, tokens=48), False, checkpoint,
                           key={"recipe": "a"})
    resumed_budget = ReferenceTraining(steps=3, batch_size=2, lr=1e-2, tokens=48)
    resumed = train_reference_router(model, tokenizer, resumed_budget, False, checkpoint, key={"recipe": "a"})
    assert resumed_budget.history == pytest.approx(budget.history)
    assert torch.allclose(resumed.router.gate_2, whole.router.gate_2)
    with pytest.raises(ValueError, match="was made for"):
        train_reference_router(model, tokenizer, ReferenceTraining(steps=3, batch_size=2, lr=1e-2, tokens=48), False, checkpoint,
                               key={"recipe": "b"})


def test_general_text_leaves_out_every_mdqa20_question(tokenizer):
    from lpes_nb.store.data import general_text, load_mdqa

    text = tokenizer.decode(sum(general_text(tokenizer, 40, 256), []))
    assert not any(f"Question: {r['question']}\n" in text for r in load_mdqa())
    with pytest.raises(ValueError, match="not the 100000 asked for"):
        general_text(tokenizer, 100000, 256)

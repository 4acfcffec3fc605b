"""bf16 linear layers through float32 GEMMs: the same arithmetic (bf16 operands, float32 products and
sums, one rounding to bf16), decided per CPU or by the user, invisible to result keys."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lpes_nb.store.models import load_model, model_key
from lpes_nb.system import bf16_gemm
from lpes_nb.system.bf16_gemm import MIN_ROWS, VARIABLE, Decision, Float32GemmLinear

FLOAT32 = Decision("float32", None, None, "test")
NATIVE = Decision("native", None, None, "test")


def _layer(rows=MIN_ROWS + 72, cols=96, out=80, seed=0):
    generator = torch.Generator().manual_seed(seed)
    layer = nn.Linear(cols, out).bfloat16()
    with torch.no_grad():
        layer.weight.copy_(torch.randn(out, cols, generator=generator))
        layer.bias.copy_(torch.randn(out, generator=generator))
    return layer, torch.randn(2, rows // 2, cols, generator=generator).bfloat16()


def _exact(layer, x):
    """The product of the bf16 values in float64, rounded once to bf16: what both paths approximate
    to within their float32 sums."""
    return F.linear(x.double(), layer.weight.double(), layer.bias.double()).bfloat16()


def _within_one_bf16_step(out, exact):
    # a float32 sum can fall on the other side of a bf16 rounding boundary: one step of bf16, no more
    step = exact.float().abs().clamp_min(1e-3) * 2.0**-7
    return bool(((out.float() - exact.float()).abs() <= step).all())


def test_the_float32_path_is_the_bf16_products_arithmetic():
    layer, x = _layer()
    exact, native = _exact(layer, x), layer(x)
    bf16_gemm.route(layer, FLOAT32)
    assert isinstance(layer, Float32GemmLinear)
    out = layer(x)
    assert out.dtype == torch.bfloat16 and out.shape == native.shape
    assert _within_one_bf16_step(out, exact) and _within_one_bf16_step(native, exact)
    assert (out != native).float().mean() < 0.05  # the two paths round alike but for a few ties


def test_decode_sized_products_keep_onednns_kernel(monkeypatch):
    def widened(*_):
        raise AssertionError("widened")

    monkeypatch.setattr(bf16_gemm, "_float32_linear", widened)
    layer, x = _layer(rows=MIN_ROWS - 2)
    native = layer(x)
    bf16_gemm.route(layer, FLOAT32)
    assert torch.equal(layer(x), native)  # fewer rows than MIN_ROWS: oneDNN's kernel
    with pytest.raises(AssertionError, match="widened"):
        layer(_layer(rows=MIN_ROWS)[1])


def test_gradients_reach_inputs_and_weights_as_through_nn_linear():
    layer, x = _layer()
    twin, _ = _layer()
    bf16_gemm.route(layer, FLOAT32)
    grads = []
    for module in (layer, twin):
        inputs = x.clone().requires_grad_()
        module.zero_grad()
        module(inputs).float().square().sum().backward()
        grads.append((inputs.grad.float(), module.weight.grad.float()))
    for ours, theirs in zip(*grads):
        assert torch.allclose(ours, theirs, rtol=0.05, atol=0.5)


def test_a_routed_model_is_the_same_model(monkeypatch):
    monkeypatch.setenv(VARIABLE, "native")
    native = load_model("tiny-llama", dtype="bfloat16")
    monkeypatch.setenv(VARIABLE, "float32")
    routed = load_model("tiny-llama", dtype="bfloat16")
    linears = sum(isinstance(m, nn.Linear) for m in routed.modules())
    assert bf16_gemm.routed(routed) and not bf16_gemm.routed(native)
    assert sum(isinstance(m, Float32GemmLinear) for m in routed.modules()) == linears > 0
    assert model_key("tiny-llama", routed) == model_key("tiny-llama", native)  # the same results, the same key
    assert list(routed.state_dict()) == list(native.state_dict())
    ids = torch.randint(0, routed.config.vocab_size, (1, 2 * MIN_ROWS), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = routed(ids).logits.float(), native(ids).logits.float()
    assert (a - b).abs().max() < 0.1 * b.abs().max()
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.9


def test_only_bf16_models_on_the_cpu_are_routed(monkeypatch):
    monkeypatch.setenv(VARIABLE, "float32")
    assert not bf16_gemm.routed(load_model("tiny-llama", dtype="float32"))
    layer, _ = _layer()
    assert bf16_gemm.route(layer, NATIVE) == 0 and type(layer) is nn.Linear


def test_the_path_is_set_or_measured_once_per_cpu(tmp_path):
    with pytest.raises(ValueError, match=r"LPES_BF16_GEMM='fast'.*native, float32"):
        bf16_gemm.decide({VARIABLE: "fast"})
    assert bf16_gemm.decide({VARIABLE: "native"}).path == "native"
    cache = tmp_path / "bf16_gemm.json"
    slow_bf16 = bf16_gemm.decide({}, measure=lambda: {"native_s": 3.0, "float32_s": 1.0}, cache=cache)
    assert slow_bf16.path == "float32" and "3000 ms" in slow_bf16.detail

    def never():
        raise AssertionError("measured again on the same CPU")

    assert bf16_gemm.decide({}, measure=never, cache=cache) == slow_bf16
    alike = bf16_gemm.decide({}, measure=lambda: {"native_s": 1.1, "float32_s": 1.0}, cache=tmp_path / "other.json")
    assert alike.path == "native"  # inside the margin: oneDNN's own kernel stays

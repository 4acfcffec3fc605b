"""The one intervention helper: removal on any exit, the stacking rules, and that every probe and
method leaves the model exactly as it found it."""

import pytest
import torch
from torch import nn

from lpes_nb.core.interventions import Interventions, Stop


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))


def test_everything_is_undone_on_an_exception_newest_first():
    net, x = _net(), torch.ones(1, 3)
    before = net(x)
    order = []
    with pytest.raises(ZeroDivisionError):
        with Interventions() as iv:
            iv.hook(net[0], lambda m, a, out: out * 0)
            iv.pre_hook(net[1], lambda m, a: None)
            iv.override(net[1], "forward", lambda *a: torch.zeros(1, 3))
            iv.add(lambda: order.append("first"))
            iv.add(lambda: order.append("second"))
            assert torch.equal(net(x), torch.zeros(1, 3)) and iv.active
            1 / 0
    assert order == ["second", "first"] and not iv.active
    assert "forward" not in vars(net[1]) and not net[0]._forward_hooks and not net[1]._forward_pre_hooks
    assert torch.equal(net(x), before)


def test_hooks_stack_in_order_and_an_attribute_has_one_owner():
    net, x = _net(), torch.ones(1, 3)
    with Interventions() as a, Interventions() as b:
        a.hook(net[0], lambda m, args, out: out + 1)
        b.hook(net[0], lambda m, args, out: out * 2)
        assert torch.allclose(net[0](x), (nn.functional.linear(x, net[0].weight, net[0].bias) + 1) * 2)
        a.override(net[0], "extra", 1)
        with pytest.raises(RuntimeError, match=r"Linear.extra is already overridden by another live intervention"):
            b.override(net[0], "extra", 2)
    assert not hasattr(net[0], "extra")


def test_a_property_is_restored_and_stop_after_ends_the_forward(tiny_llama):
    config = tiny_llama.config
    previous = config._attn_implementation
    with Interventions() as iv:
        iv.override(config, "_attn_implementation", "eager")
        assert config._attn_implementation == "eager"
    assert config._attn_implementation == previous
    seen = {}
    hooks_before = dict(tiny_llama.model.layers[0]._forward_hooks)  # transformers may keep its own there
    with pytest.raises(Stop), Interventions() as iv:
        iv.stop_after(tiny_llama.model.layers[0], lambda out: seen.update(out=out))
        iv.hook(tiny_llama.model.layers[1], lambda *a: pytest.fail("ran past the stop"))
        tiny_llama(torch.tensor([[1, 2, 3]]))
    assert "out" in seen and dict(tiny_llama.model.layers[0]._forward_hooks) == hooks_before

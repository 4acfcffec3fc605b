"""A stored curve on another model (issue #102): `lpes_nb.apply`, refused across models unless the caller
asks for a transfer, which resamples the control points to the new depth."""

import numpy as np
import pytest
import torch

import lpes_nb
from lpes_nb.core.bezier import layer_scales
from lpes_nb.core.rope import RopePatch, scale_specs
from lpes_nb.store.models import load_model, model_identity
from lpes_nb.store.results import save_scales

POINTS = [[0.0, 1.1], [1.0, 1.9], [2.0, 1.2], [3.0, 1.6]]  # x in layer units of a 4-layer model


@pytest.fixture
def curve(tmp_path):
    """A curve searched on tiny-llama (4 layers), exported with its control points and model."""
    small = load_model("tiny-llama")
    scales = layer_scales(POINTS, 4)
    return save_scales(tmp_path / "scales.json", scales, model=model_identity(small, "tiny-llama"), control_points=POINTS,
                       curve="bezier")


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_the_recipe_applies_a_stored_curve_and_removes_it(curve):
    model, ids = load_model("tiny-llama"), torch.arange(40)[None]
    before = logits(model, ids)
    patch = lpes_nb.apply(model, curve, name="tiny-llama")
    with_curve = logits(model, ids)
    patch.remove()
    with RopePatch(model, scale_specs(layer_scales(POINTS, 4))):
        assert torch.equal(logits(model, ids), with_curve)
    assert torch.equal(logits(model, ids), before) and not torch.equal(with_curve, before)


def test_another_model_is_refused_without_transfer_and_resampled_with_it(curve, capsys):
    deeper, ids = load_model("paper-dry-llama"), torch.arange(40)[None]  # 8 layers, another width
    with pytest.raises(ValueError, match=r"found on tiny-llama, not this model: .*layers 4 \(here 8\).*transfer=True"):
        lpes_nb.apply(deeper, curve)
    patch = lpes_nb.apply(deeper, curve, transfer=True)
    transferred = logits(deeper, ids)
    patch.remove()
    assert "transferred a curve found on tiny-llama (4 layers) to this model (8 layers)" in capsys.readouterr().out
    expected = layer_scales(np.array(POINTS) * [7 / 3, 1], 8)  # the same curve at the same relative depth
    with RopePatch(deeper, scale_specs(expected)):
        assert torch.equal(logits(deeper, ids), transferred)
    assert expected[0] == pytest.approx(layer_scales(POINTS, 4)[0]) and expected[-1] == pytest.approx(layer_scales(POINTS, 4)[-1])


def test_a_model_of_the_same_shape_under_another_name_is_refused_when_named(curve):
    with pytest.raises(ValueError, match=r"name 'tiny-llama' \(here 'my-llama'\)"):
        lpes_nb.apply(load_model("tiny-llama"), curve, name="my-llama")


def test_a_curve_without_control_points_cannot_be_transferred(tmp_path):
    path = save_scales(tmp_path / "bare.json", [1.2, 1.4, 1.3, 1.1])  # the explorer's older exports: scales only
    deeper = load_model("paper-dry-llama")
    with pytest.raises(ValueError, match="4 scales for 8 layers"):
        lpes_nb.apply(deeper, path)
    with pytest.raises(ValueError, match="stores no control points"):
        lpes_nb.apply(deeper, path, transfer=True)

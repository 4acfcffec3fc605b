"""A stored curve on your own model: ``lpes_nb.apply(model, "scales.json")`` patches any Hugging Face
RoPE causal LM with a scales JSON's per-layer scales, through the model's own rotary code
(:class:`lpes_nb.core.rope.RopePatch`), and returns the applied patch (``patch.remove()`` restores the model).

A curve belongs to the model it was searched on. A JSON that names that model (a search's export) is
refused on any other, and one that names none (the explorer's) on another depth, unless the caller
asks for a transfer (``transfer=True``): the curve's control points, kept in the JSON, are moved to
the same relative depth of this model (x scaled from the first model's ``L - 1`` to this one's) and
the curve is sampled at this model's layers; a note says what was transferred. A transferred curve
was not searched on this model: it is a starting point, not a result."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ..core.bezier import layer_scales
from ..core.rope import RopePatch, find_rope_stack, scale_specs
from .models import IDENTITY, describe_model, load_model, load_tokenizer
from .results import read_scales


def _payload(curve) -> dict:
    if isinstance(curve, (str, Path)):
        return read_scales(curve)
    if isinstance(curve, dict) and "scales" in curve:
        return {**curve, "scales": [float(s) for s in curve["scales"]]}
    raise ValueError(f"a curve is a scales JSON path or its payload (a dict with 'scales'), got {type(curve).__name__}")


def transferred_points(payload: dict, num_layers: int) -> np.ndarray:
    """The payload's control points (x in layer units of the model it was found on, ``len(payload["scales"])``
    layers) moved to the same relative depth of a model of ``num_layers`` layers."""
    points = payload.get("control_points")
    if not points:
        raise ValueError("this curve stores no control points (only its per-layer scales), so it cannot be resampled to "
                         "another depth; transfer needs a curve exported with its control points (a Bézier search's or "
                         "the explorer's)")
    pts = np.asarray(points, dtype=float)
    pts[:, 0] *= (num_layers - 1) / (len(payload["scales"]) - 1)
    return pts


def transferred_scales(payload: dict, num_layers: int) -> np.ndarray:
    """The payload's curve at ``num_layers`` layers (:func:`transferred_points`), so layer h of L' samples the
    curve where layer h·(L−1)/(L'−1) of the first model did (Eq. 6)."""
    return layer_scales(transferred_points(payload, num_layers), num_layers, payload.get("curve", "bezier"))


def curve_scales(model, curve, transfer: bool = False, name: str | None = None) -> list[float]:
    """The per-layer scales ``curve`` gives ``model`` (see the module docstring for the checks);
    ``name``: the model's name in this workbook's registry, compared with the one the curve names."""
    payload = _payload(curve)
    layers = find_rope_stack(model).num_layers
    found_on = payload.get("model")
    here = {**describe_model(model), "name": name}
    compared = [k for k in IDENTITY if k != "name" or name is not None]
    differ = ([f"{k} {found_on.get(k)!r} (here {here[k]!r})" for k in compared if found_on.get(k) != here[k]]
              if isinstance(found_on, dict) else [])
    if len(payload["scales"]) != layers:
        differ.append(f"{len(payload['scales'])} scales for {layers} layers")
    if not differ:
        return [float(s) for s in payload["scales"]]
    where = found_on.get("name", "another model") if isinstance(found_on, dict) else "a model of another depth"
    if not transfer:
        raise ValueError(f"this curve was found on {where}, not this model: " + "; ".join(differ)
                         + ". Pass transfer=True to resample its control points to this model's depth (a starting "
                           "point, not a searched result)")
    scales = transferred_scales(payload, layers) if len(payload["scales"]) != layers else np.asarray(payload["scales"])
    print(f"[lpes] transferred a curve found on {where} ({len(payload['scales'])} layers) to this model ({layers} layers): "
          f"{'; '.join(differ)}. It was not searched here.")
    return [float(s) for s in scales]


def apply(model, curve, transfer: bool = False, name: str | None = None) -> RopePatch:
    """Patch ``model`` with ``curve`` (a scales JSON path or payload); returns the applied
    :class:`~lpes_nb.core.rope.RopePatch` (``.remove()`` restores the model)."""
    return RopePatch(model, scale_specs(curve_scales(model, curve, transfer, name))).apply()



def main(argv: list[str] | None = None) -> None:
    """``lpes apply``: greedy answers of a model with and without a stored curve, side by side."""
    parser = argparse.ArgumentParser(prog="lpes apply", description=main.__doc__.split(": ", 1)[1])
    parser.add_argument("curve", type=Path, help="a scales JSON (e.g. results/lpes_best_scales.json)")
    parser.add_argument("--model", default="smollm2-135m", help="an embedded or tiny model's name, or a Hugging Face id / folder")
    parser.add_argument("--prompt", default="The capital of France is")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--transfer", action="store_true", help="move a curve found on another model to this one's depth")
    args = parser.parse_args(argv)
    model, tokenizer = load_model(args.model), load_tokenizer(args.model)
    ids = tokenizer(args.prompt, return_tensors="pt").input_ids

    def answer() -> str:
        return tokenizer.decode(model.generate(ids, max_new_tokens=args.new_tokens, do_sample=False)[0, ids.shape[1]:])

    unmodified = answer()
    patch = apply(model, args.curve, args.transfer, args.model)
    try:
        print(f"unmodified: {unmodified!r}\nwith curve: {answer()!r}")
    finally:
        patch.remove()

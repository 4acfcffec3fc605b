"""Per-layer RoPE: one mechanism that gives every decoder layer its own positions and frequencies.

For layer l the rotary angle of position p and frequency d is ``phi_l(p) * inv_freq_l[d]``, where
``phi_l`` is a position transform (remap, coarsen, mask) and ``inv_freq_l`` a frequency table (the
model's own, or one built from another base, divided by a scale). LPES, positional interpolation,
masking and coarsening probes, CALIOPE remaps and per-layer base schedules are all such specs.
A spec may also divide the frequencies per key/value head (``heads``: Ms-PoE's head-wise scales).

How it works: a forward pre-hook on each patched decoder layer replaces the ``position_embeddings``
(cos, sin) that the model computed once for all layers with the pair for that layer's spec. Queries
and keys are rotated inside the attention before the KV cache is updated, so cached keys carry
their layer's rotation and ``generate()`` stays consistent. Nothing in the model is modified: the
patch only adds hooks, and removing them restores the model bit for bit.

Head-wise specs use the same tables with one more axis. The layer then receives the identity
rotation (cos 1, sin 0, which leaves q and k unchanged exactly) and forward hooks on the modules
that produce the per-head queries and keys (``q_norm``/``k_norm`` where the model has them, else
``q_proj``/``k_proj``) rotate each head with its own table, before the keys are cached.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

# A position remap receives integer position ids [B, T] and, when the caller supplied them,
# per-token segment ids of the same shape; it returns (float or integer) positions [B, T].
PositionRemap = Callable[[torch.Tensor, "torch.Tensor | None"], torch.Tensor]
# Head-wise scales computed from the input at prefill: called with the un-rotated query of the last
# token [B, H_q, D], the un-rotated keys [B, H_kv, T, D] and a key mask [B, T] (True = real token),
# it returns one scale per key/value head [B, H_kv]; decoding steps reuse the prefill's scales.
HeadScaler = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def positive_real(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a finite number > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class RopeSpec:
    """What one layer does to RoPE. The default is the identity (the model's own RoPE).

    scale:   positional interpolation p -> p / scale, applied as ``inv_freq / scale`` exactly as
             transformers' ``linear`` rope type does, so uniform scales are bit-identical to it.
    base:    build the frequency table from this RoPE base instead of the model's own table.
    coarsen: p -> floor(p / coarsen) (integer k >= 1).
    mask:    every position 0, i.e. no rotation at all in this layer (NoPE).
    remap:   an arbitrary position function f(position_ids, segment_ids), applied before coarsening.
    heads:   per key/value head scales multiplying ``scale`` (a tuple), or a :data:`HeadScaler` that
             computes them from the prefill. With grouped-query attention all query heads of a group
             share their key head's scale (rotating q and k alike keeps attention relative).
    """

    scale: float = 1.0
    base: float | None = None
    coarsen: int = 1
    mask: bool = False
    remap: PositionRemap | None = None
    heads: tuple[float, ...] | HeadScaler | None = None

    def __post_init__(self):
        object.__setattr__(self, "scale", positive_real(self.scale, "RoPE scale"))
        if self.base is not None:
            base = positive_real(self.base, "RoPE base")
            if base <= 1:
                raise ValueError(f"RoPE base must be > 1, got {self.base!r}")
            object.__setattr__(self, "base", base)
        k = self.coarsen
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"coarsening factor k must be an integer >= 1, got {k!r}")
        object.__setattr__(self, "coarsen", int(k))
        if self.remap is not None and not callable(self.remap):
            raise ValueError(f"remap must be callable(position_ids, segment_ids), got {self.remap!r}")
        if self.heads is not None and not callable(self.heads):
            heads = tuple(positive_real(h, "head scale") for h in self.heads)
            if not heads:
                raise ValueError("heads must hold one scale per key/value head, got an empty sequence")
            object.__setattr__(self, "heads", heads)

    def positions(self, position_ids: torch.Tensor, segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The transformed positions phi(p) as float32."""
        if self.mask:
            return torch.zeros(position_ids.shape, dtype=torch.float32, device=position_ids.device)
        p = position_ids
        if self.remap is not None:
            p = self.remap(p, segment_ids)
            if p.shape != position_ids.shape:
                raise ValueError(f"remap returned shape {tuple(p.shape)}, expected {tuple(position_ids.shape)}")
        if self.coarsen != 1:
            p = torch.div(p, self.coarsen, rounding_mode="floor")
        return p.float()


IDENTITY = RopeSpec()


def default_inv_freq(base: float, dim: int) -> torch.Tensor:
    """The original RoPE frequency table, computed as transformers computes it (float32)."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))


def rotation_tables(freqs: torch.Tensor, attention_scaling: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) for angles ``freqs`` = position x inv_freq [..., D/2]. Same operations as
    transformers' rotary forward, so identity and uniform-scale specs reproduce it bit for bit."""
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * attention_scaling).to(dtype), (emb.sin() * attention_scaling).to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the last axis (rotate-half convention, as transformers' Llama family)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def dynamic_ntk_base(base: float, factor: float, seq_len: int, max_position_embeddings: int, dim: int) -> float:
    """The base that transformers' ``dynamic`` rope type uses for a sequence of ``seq_len`` tokens."""
    seq_len = max(seq_len, max_position_embeddings)
    return base * ((factor * seq_len / max_position_embeddings) - (factor - 1)) ** (dim / (dim - 2))


@dataclass
class RopeStack:
    """The parts of a model the mechanism touches: the decoder layers and the shared rotary module."""

    decoder: nn.Module
    layers: nn.ModuleList
    rotary: nn.Module
    layer_types: list[str | None]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def native(self, layer: int) -> tuple[torch.Tensor, float]:
        """The model's own (inv_freq, attention_scaling) for a layer, read at call time so that
        models whose rotary module updates itself during the forward (dynamic RoPE) stay exact."""
        kind = self.layer_types[layer]
        if kind is not None:  # Gemma-3 style: one table per attention type
            return getattr(self.rotary, f"{kind}_inv_freq"), getattr(self.rotary, f"{kind}_attention_scaling")
        return self.rotary.inv_freq, self.rotary.attention_scaling

    def inv_freq(self, layer: int, spec: RopeSpec) -> tuple[torch.Tensor, float]:
        """Frequency table and attention scaling of ``layer`` under ``spec``."""
        native, attention_scaling = self.native(layer)
        inv_freq = native if spec.base is None else default_inv_freq(spec.base, 2 * native.shape[0]).to(native.device)
        if spec.scale != 1.0:
            inv_freq = inv_freq / spec.scale
        return inv_freq, attention_scaling


def find_rope_stack(model: nn.Module) -> RopeStack:
    """Locate the decoder stack and its rotary embedding; a clear ValueError for models without RoPE."""
    for module in model.modules():
        layers, rotary = getattr(module, "layers", None), getattr(module, "rotary_emb", None)
        if isinstance(layers, nn.ModuleList) and rotary is not None:
            types = getattr(getattr(module, "config", None), "layer_types", None)
            if types is not None and hasattr(rotary, f"{types[0]}_inv_freq"):
                layer_types = list(types)
            elif hasattr(rotary, "inv_freq"):
                layer_types = [None] * len(layers)
            else:
                break
            return RopeStack(module, layers, rotary, layer_types)
    model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    raise ValueError(
        f"model type {model_type!r} has no rotary position embedding (RoPE) that this workbook can patch; "
        "use a RoPE decoder such as Llama, Qwen2, Mistral or Gemma-3"
    )


def normalize_specs(specs: Sequence[RopeSpec | None] | Mapping[int, RopeSpec], num_layers: int) -> list[RopeSpec | None]:
    """A list with one entry per layer; ``None`` leaves a layer untouched."""
    if isinstance(specs, Mapping):
        out: list[RopeSpec | None] = [None] * num_layers
        for layer, spec in specs.items():
            if isinstance(layer, bool) or not isinstance(layer, numbers.Integral) or not 0 <= layer < num_layers:
                raise ValueError(f"layer index {layer!r} is out of range [0, {num_layers - 1}]")
            out[int(layer)] = spec
    else:
        out = list(specs)
        if len(out) != num_layers:
            raise ValueError(f"got {len(out)} RoPE specs for a model with {num_layers} layers; give exactly {num_layers}")
    for layer, spec in enumerate(out):
        if spec is not None and not isinstance(spec, RopeSpec):
            raise ValueError(f"spec for layer {layer} must be a RopeSpec or None, got {spec!r}")
    return out


def scale_specs(scales: Sequence[float]) -> list[RopeSpec]:
    """One positional-interpolation scale per layer (LPES)."""
    return [RopeSpec(scale=s) for s in scales]


class RopePatch:
    """Per-layer RoPE on a model, as a context manager or with explicit ``apply()`` / ``remove()``.

    >>> with RopePatch(model, scale_specs(scales)):
    ...     logits = model(input_ids).logits
    """

    _ATTR = "_lpes_rope_patch"

    def __init__(self, model: nn.Module, specs: Sequence[RopeSpec | None] | Mapping[int, RopeSpec]):
        self.model = model
        self.stack = find_rope_stack(model)
        self.specs = normalize_specs(specs, self.stack.num_layers)
        self._handles: list = []
        self._cache: dict = {}
        self._segment_ids: torch.Tensor | None = None
        self._attention_mask: torch.Tensor | None = None  # the decoder's 2-D mask, for head scalers
        self._positions: dict[int, torch.Tensor] = {}  # per head-wise layer: phi(p) of this forward
        self._head_scales: dict[int, torch.Tensor] = {}  # per head-wise layer: [B, H_kv], kept for decoding

    @property
    def active(self) -> bool:
        return bool(self._handles)

    def apply(self) -> RopePatch:
        current = getattr(self.model, self._ATTR, None)
        if current is not None:
            raise RuntimeError("a RoPE patch is already applied to this model; remove it before applying another")
        try:
            self._handles.append(self.stack.decoder.register_forward_pre_hook(self._start_forward, with_kwargs=True))
            for layer, spec in enumerate(self.specs):
                if spec is not None:
                    hook = self._layer_hook(layer, spec)
                    self._handles.append(self.stack.layers[layer].register_forward_pre_hook(hook, with_kwargs=True))
                    if spec.heads is not None:
                        self._add_head_hooks(layer, spec)
        except BaseException:
            self.remove()
            raise
        setattr(self.model, self._ATTR, self)
        return self

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._cache.clear()
        self._positions.clear()
        self._head_scales.clear()
        if getattr(self.model, self._ATTR, None) is self:
            delattr(self.model, self._ATTR)

    def __enter__(self) -> RopePatch:
        return self.apply()

    def __exit__(self, *exc) -> None:
        self.remove()

    @contextmanager
    def segments(self, segment_ids: torch.Tensor) -> Iterator[None]:
        """Make per-position segment ids ([S] or [B, S], indexed by position id) visible to remaps.

        Positions beyond the last given one (tokens generated later) take the last segment id.
        """
        if segment_ids.dim() not in (1, 2):
            raise ValueError(f"segment_ids must have shape [S] or [B, S], got {tuple(segment_ids.shape)}")
        previous, self._segment_ids = self._segment_ids, segment_ids.long()
        try:
            yield
        finally:
            self._segment_ids = previous

    def _start_forward(self, module, args, kwargs) -> None:
        # cos/sin are shared by all layers with the same spec, but only within one forward pass.
        self._cache.clear()
        mask = kwargs.get("attention_mask")
        self._attention_mask = mask if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None

    def _segments_for(self, position_ids: torch.Tensor) -> torch.Tensor | None:
        if self._segment_ids is None:
            return None
        seg = self._segment_ids if self._segment_ids.dim() == 2 else self._segment_ids[None]
        batch = max(seg.shape[0], position_ids.shape[0])
        idx = position_ids.long().clamp(0, seg.shape[1] - 1).expand(batch, -1)
        return seg.to(position_ids.device).expand(batch, -1).gather(1, idx)

    def _layer_hook(self, layer: int, spec: RopeSpec):
        def hook(module, args, kwargs):
            if kwargs.get("position_embeddings") is None or kwargs.get("position_ids") is None:
                raise RuntimeError(
                    f"decoder layer {layer} was called without position_embeddings/position_ids keyword "
                    "arguments; this architecture is not supported by the per-layer RoPE patch"
                )
            hidden = args[0] if args else kwargs["hidden_states"]
            if spec.heads is None:
                kwargs["position_embeddings"] = self._cos_sin(layer, spec, kwargs["position_ids"], hidden)
            else:  # the head hooks rotate q and k; the layer's own rotation becomes the identity
                position_ids = kwargs["position_ids"]
                self._positions[layer] = spec.positions(position_ids, self._segments_for(position_ids))
                kwargs["position_embeddings"] = self._cos_sin(layer, RopeSpec(mask=True), position_ids, hidden)
            return args, kwargs

        return hook

    def _cos_sin(self, layer: int, spec: RopeSpec, position_ids: torch.Tensor, hidden: torch.Tensor):
        key = (spec, self.stack.layer_types[layer], hidden.dtype)
        if key not in self._cache:
            inv_freq, attention_scaling = self.stack.inv_freq(layer, spec)
            positions = spec.positions(position_ids, self._segments_for(position_ids))
            freqs = positions[..., None] * inv_freq.to(device=hidden.device, dtype=torch.float)
            self._cache[key] = rotation_tables(freqs, attention_scaling, hidden.dtype)
        return self._cache[key]

    def _add_head_hooks(self, layer: int, spec: RopeSpec) -> None:
        attn = getattr(self.stack.layers[layer], "self_attn", None)
        q_mod = getattr(attn, "q_norm", None) or getattr(attn, "q_proj", None)
        k_mod = getattr(attn, "k_norm", None) or getattr(attn, "k_proj", None)
        if q_mod is None or k_mod is None or not hasattr(attn, "head_dim"):
            raise ValueError(f"layer {layer} has no self_attn with q_proj/k_proj; head-wise RoPE specs need them")
        config = self.model.config
        heads_q, heads_kv = config.num_attention_heads, config.num_key_value_heads
        if not callable(spec.heads) and len(spec.heads) != heads_kv:
            raise ValueError(f"layer {layer}: got {len(spec.heads)} head scales, the model has {heads_kv} key/value heads")
        if callable(spec.heads):
            self._handles.append(attn.register_forward_pre_hook(self._scaler_hook(layer, spec, attn), with_kwargs=True))
        for module, heads in ((q_mod, heads_q), (k_mod, heads_kv)):
            self._handles.append(module.register_forward_hook(self._rotate_hook(layer, spec, attn.head_dim, heads, heads_kv)))

    def _scaler_hook(self, layer: int, spec: RopeSpec, attn: nn.Module):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            if hidden.shape[1] == 1 and layer in self._head_scales:
                return None  # a decoding step keeps the prefill's head scales
            # .forward() skips the module hooks: these projections only feed the scaler
            q = attn.q_proj.forward(hidden[:, -1:]).view(hidden.shape[0], -1, attn.head_dim)
            k = attn.k_proj.forward(hidden).view(*hidden.shape[:2], -1, attn.head_dim)
            if hasattr(attn, "q_norm"):
                q, k = attn.q_norm.forward(q), attn.k_norm.forward(k)
            mask = self._attention_mask
            valid = torch.ones(hidden.shape[:2], dtype=torch.bool, device=hidden.device) if mask is None else mask[:, -hidden.shape[1]:].bool()
            self._head_scales[layer] = spec.heads(q, k.transpose(1, 2), valid).float()
            return None

        return hook

    def _rotate_hook(self, layer: int, spec: RopeSpec, head_dim: int, heads: int, heads_kv: int):
        layout: list[bool] = []  # [heads_first], learned from the first call whose shape tells

        def hook(module, args, output):
            tokens = self._positions[layer].shape[1]
            if output.dim() == 4:  # after a per-head norm: [B, T, H, D] (Qwen3) or [B, H, T, D] (Gemma-3)
                if output.shape[1] != output.shape[2]:
                    layout[:] = [output.shape[1] == heads and output.shape[2] == tokens]
                elif not layout:
                    raise RuntimeError(f"layer {layer}: cannot tell the head axis of a {tuple(output.shape)} query/key "
                                       "tensor when the input length equals the number of heads; run a longer input first")
                if layout[0]:
                    output = output.transpose(1, 2)
            x = output.reshape(*output.shape[:2], heads, head_dim)  # [B, T, H, D]
            cos, sin = self._head_cos_sin(layer, spec, x)
            if heads != heads_kv:  # query heads share their key head's table
                cos, sin = cos.repeat_interleave(heads // heads_kv, dim=2), sin.repeat_interleave(heads // heads_kv, dim=2)
            out = rotate(x, cos, sin).view(output.shape)
            return out.transpose(1, 2) if output.dim() == 4 and layout[0] else out

        return hook

    def _head_cos_sin(self, layer: int, spec: RopeSpec, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [B, T, H_kv, D] of a head-wise layer, computed once per forward for q and k."""
        key = ("heads", layer, x.dtype)
        if key not in self._cache:
            per_kv = self._head_scales[layer] if callable(spec.heads) else torch.tensor([spec.heads], device=x.device)
            native, attention_scaling = self.stack.inv_freq(layer, spec)
            inv_freq = native.to(device=x.device, dtype=torch.float)[None, None, :] / per_kv[:, :, None]  # [B, H_kv, D/2]
            freqs = self._positions[layer][:, :, None, None] * inv_freq[:, None]  # [B, T, H_kv, D/2]
            self._cache[key] = rotation_tables(freqs, attention_scaling, x.dtype)
        return self._cache[key]

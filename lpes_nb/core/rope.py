"""Per-layer RoPE: one mechanism that gives every decoder layer its own positions and frequencies.

For layer l the rotary angle of position p and frequency d is ``phi_l(p) * inv_freq_l[d]``, where
``phi_l`` is a position transform (remap, coarsen, mask) and ``inv_freq_l`` a frequency table (the
model's own, or one built from another base, divided by a scale). LPES, positional interpolation,
masking and coarsening probes, CALIOPE remaps and per-layer base schedules are all such specs.
A spec may also divide the frequencies per key/value head (``heads``: Ms-PoE's head-wise scales).

How it works: a forward pre-hook on each patched decoder layer replaces the ``position_embeddings``
that the model computed once for all layers with that layer's, made by the model's own rotary module
(its forward, called with the spec's frequency table and positions). Queries and keys are rotated
inside the attention before the KV cache is updated, so cached keys carry their layer's rotation and
``generate()`` stays consistent. Nothing in the model is modified: the patch only adds hooks, and
removing them restores the model bit for bit.

Head-wise specs need one table per head: while such a layer's attention runs, the model's own
``apply_rotary_pos_emb`` (a module global its attention calls) is redirected to per-head tables, so q
and k are still rotated exactly where and how the model rotates them.

Models or features that cannot be patched exactly raise :class:`UnsupportedModel` (a ValueError)
naming the model type and the feature.
"""

from __future__ import annotations

import copy
import inspect
import math
import numbers
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .interventions import Interventions

# A position remap receives integer position ids [B, T] and, when the caller supplied them,
# per-token segment ids of the same shape; it returns (float or integer) positions [B, T].
PositionRemap = Callable[[torch.Tensor, "torch.Tensor | None"], torch.Tensor]
# Head-wise scales computed from the input at prefill: called with the un-rotated query of the last
# token [B, H_q, D], the un-rotated keys [B, H_kv, T, D] and a key mask [B, T] (True = real token),
# the attention module's logit scaling (None where it has none), and returns one scale per key/value
# head [B, H_kv]. Every forward that continues the prefill's cache (a decoding step, a teacher-forced
# target) reuses the prefill's scales: they belong to the prompt.
HeadScaler = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float | None], torch.Tensor]


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
        if not isinstance(self.mask, bool):
            raise ValueError(f"mask must be True or False, got {self.mask!r}")
        if self.remap is not None and not callable(self.remap):
            raise ValueError(f"remap must be callable(position_ids, segment_ids), got {self.remap!r}")
        if self.heads is not None and not callable(self.heads):
            heads = tuple(positive_real(h, "head scale") for h in self.heads)
            if not heads:
                raise ValueError("heads must hold one scale per key/value head, got an empty sequence")
            object.__setattr__(self, "heads", heads)

    def positions(self, position_ids: torch.Tensor, segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The transformed positions phi(p): integer, unless a remap returns fractional positions."""
        if self.mask:
            return torch.zeros_like(position_ids)
        p = position_ids
        if self.remap is not None:
            p = self.remap(p, segment_ids)
            if p.shape != position_ids.shape:
                raise ValueError(f"remap returned shape {tuple(p.shape)}, expected {tuple(position_ids.shape)}")
        if self.coarsen != 1:
            p = torch.div(p, self.coarsen, rounding_mode="floor")
        return p


IDENTITY = RopeSpec()

# RoPE types whose frequency table can be rebuilt for another base (RopeSpec.base) by the model's
# own init function, which keeps llama3 / yarn / dynamic / linear scaling. longrope switches between
# two tables by sequence length and is refused rather than guessed.
REBUILDABLE_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "proportional")


def dynamic_ntk_base(base: float, factor: float, seq_len: int, max_position_embeddings: int, dim: int) -> float:
    """The base that transformers' ``dynamic`` rope type uses for a sequence of ``seq_len`` tokens."""
    seq_len = max(seq_len, max_position_embeddings)
    return base * ((factor * seq_len / max_position_embeddings) - (factor - 1)) ** (dim / (dim - 2))


class UnsupportedModel(ValueError):
    """A model, or one feature on it, that the per-layer RoPE mechanism cannot patch exactly."""


@dataclass
class RopeStack:
    """The parts of a model the mechanism touches: the decoder layers and the shared rotary module.

    Every table comes from the model's own code: its rotary module's forward (called with a swapped
    frequency table and transformed positions), its own RoPE init function (for another base), and
    its own ``apply_rotary_pos_emb`` (for rotations outside the attention). Layouts (rotate-half or
    interleaved), table dtypes (fp32 tables in bf16 models) and RoPE scaling types therefore follow
    the model instead of a hand copy that is silently wrong on some."""

    decoder: nn.Module
    layers: nn.ModuleList
    rotary: nn.Module
    layer_types: list[str | None]
    model_type: str

    def __post_init__(self):
        # the undecorated forward: no torch.no_grad (learned position remaps need gradients) and no
        # dynamic-RoPE update (the model's own call has already updated its table for this forward)
        self._forward = inspect.unwrap(type(self.rotary).forward)
        self._rebuilt: dict = {}  # (layer type, base, seq_len) -> rebuilt frequency table
        self._verified: set = set()  # one-time checks passed, per layer type

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def _prefix(self, layer: int) -> str:
        kind = self.layer_types[layer]
        return "" if kind is None else f"{kind}_"

    def native(self, layer: int) -> tuple[torch.Tensor, float]:
        """The model's own (inv_freq, attention_scaling) for a layer, read at call time so that
        models whose rotary module updates itself during the forward (dynamic RoPE) stay exact."""
        prefix = self._prefix(layer)
        scaling = getattr(self.rotary, f"{prefix}attention_scaling", None)
        return getattr(self.rotary, f"{prefix}inv_freq"), self.rotary.attention_scaling if scaling is None else scaling

    def rope_type(self, layer: int) -> str:
        rope_type = getattr(self.rotary, "rope_type", "default")
        return rope_type[self.layer_types[layer]] if isinstance(rope_type, dict) else rope_type

    def inv_freq(self, layer: int, spec: RopeSpec) -> torch.Tensor:
        """Frequency table of ``layer`` under ``spec``: the model's own (or rebuilt for
        ``spec.base``), divided by ``spec.scale`` as transformers' ``linear`` type does."""
        native, _ = self.native(layer)
        inv_freq = native if spec.base is None else self._with_base(layer, spec.base).to(native.device)
        if spec.scale != 1.0:
            inv_freq = inv_freq / spec.scale
        return inv_freq

    def _init_fn(self, rope_type: str):
        if rope_type == "default":
            return self.rotary.compute_default_rope_parameters
        return ROPE_INIT_FUNCTIONS[rope_type]

    def _build(self, layer: int, rope_type: str, base: float | None, seq_len) -> torch.Tensor:
        kind = self.layer_types[layer]
        config = copy.deepcopy(self.rotary.config)
        if base is not None:
            (config.rope_parameters if kind is None else config.rope_parameters[kind])["rope_theta"] = base
        extra = {} if kind is None else {"layer_type": kind}
        if seq_len is not None:
            extra["seq_len"] = seq_len
        # on the device of the model's own table: a table built on a GPU (a model made there) differs
        # from the CPU's in the last bit, and the bit-for-bit check below would refuse it
        with torch.device(self.native(layer)[0].device):
            return self._init_fn(rope_type)(config, **extra)[0]

    def _with_base(self, layer: int, base: float) -> torch.Tensor:
        kind, rope_type = self.layer_types[layer], self.rope_type(layer)
        if rope_type not in REBUILDABLE_ROPE_TYPES or not hasattr(self.rotary, "config") or (
                rope_type == "default" and not hasattr(self.rotary, "compute_default_rope_parameters")):
            raise UnsupportedModel(
                f"RopeSpec(base=...) on model type {self.model_type!r}: its rope_type {rope_type!r} cannot be rebuilt "
                f"for another base (supported: {', '.join(REBUILDABLE_ROPE_TYPES)})")
        # dynamic: the sequence length the model's own table was last built for
        seq_len = getattr(self.rotary, f"{self._prefix(layer)}max_seq_len_cached", None) if "dynamic" in rope_type else None
        if ("rebuild", kind) not in self._verified:
            # rebuilding with the model's own base must give its table back bit for bit; a model
            # that builds its table some other way is refused, not approximated
            original = getattr(self.rotary, f"{self._prefix(layer)}original_inv_freq", None)
            try:
                own = self._build(layer, rope_type, None, None)
            except Exception:  # e.g. a config whose head_dim varies per layer (Gemma-4)
                own = None
            if original is None or own is None or not torch.equal(own.to(original.device), original):
                raise UnsupportedModel(
                    f"RopeSpec(base=...) on model type {self.model_type!r}: its rope_type {rope_type!r} init function "
                    "does not reproduce the model's own frequency table, so another base cannot be applied exactly")
            self._verified.add(("rebuild", kind))
        key = (kind, base, seq_len)
        if key not in self._rebuilt:
            self._rebuilt[key] = self._build(layer, rope_type, base, seq_len)
        return self._rebuilt[key]

    def tables(self, layer: int, inv_freq: torch.Tensor, positions: torch.Tensor, x: torch.Tensor):
        """The model's own position embeddings (e.g. (cos, sin)) of ``layer`` for ``positions``
        [B, T] under the frequency table ``inv_freq``; ``x`` sets dtype and device as in the model."""
        saved = self.native(layer)[0]
        if inv_freq is not saved:
            self._check_swappable(layer)
        return self._call(layer, inv_freq, positions, x)

    def _call(self, layer: int, inv_freq: torch.Tensor, positions: torch.Tensor, x: torch.Tensor):
        kind = self.layer_types[layer]
        name = f"{self._prefix(layer)}inv_freq"
        saved = getattr(self.rotary, name)
        setattr(self.rotary, name, inv_freq)
        try:
            return self._forward(self.rotary, x, positions) if kind is None else self._forward(self.rotary, x, positions, kind)
        finally:
            setattr(self.rotary, name, saved)

    def _check_swappable(self, layer: int) -> None:
        """Once per table kind: the rotary forward must really use the table the patch sets (PhiMoE's
        rebuilds its own from the config on every call, which would make every spec a silent no-op)."""
        kind = self.layer_types[layer]
        if ("swappable", kind) in self._verified:
            return
        native = self.native(layer)[0]
        x, one = torch.zeros(1, 1, 1, device=native.device), torch.ones(1, 1, dtype=torch.long, device=native.device)
        same = self._call(layer, native, one, x)[0]
        doubled = self._call(layer, native * 2, one, x)[0]
        if torch.equal(same, doubled):
            raise UnsupportedModel(
                f"model type {self.model_type!r}: its rotary module ignores the frequency table it is given (it rebuilds "
                "its own on every call), so no RoPE spec other than the identity can be applied exactly")
        self._verified.add(("swappable", kind))

    def rotation(self, layer: int, feature: str) -> Callable:
        """The model's own rotation of one tensor, f(x [B, H, T, D], cos, sin [B, T, D]), for work
        outside its attention (``feature`` names that work in the error if the model has none)."""
        attn = getattr(self.layers[layer], "self_attn", None)
        fn = getattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb", None) if attn is not None else None
        fn = getattr(fn, "_lpes_original", fn)
        if fn is not None and list(inspect.signature(fn).parameters)[:4] == ["q", "k", "cos", "sin"]:
            return lambda x, cos, sin: fn(x, x, cos, sin)[0]
        raise UnsupportedModel(
            f"{feature} is not supported on model type {self.model_type!r}: its attention has no "
            "apply_rotary_pos_emb(q, k, cos, sin) to rotate queries and keys with outside the attention")


def key_value_heads(model: nn.Module) -> int:
    """The model's key/value heads (its query heads where it has no grouped-query attention)."""
    config = model.config.get_text_config()
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


def single_base(model: nn.Module, feature: str) -> float:
    """The model's one RoPE base, for methods defined relative to it; models with one base per
    attention type (Gemma-3) are refused, naming the ``feature``."""
    params = model.config.get_text_config().rope_parameters
    if "rope_theta" not in params:
        raise UnsupportedModel(f"{feature} needs a single RoPE base; model type {model.config.model_type!r} has one per "
                               f"attention type ({', '.join(sorted(params))})")
    return float(params["rope_theta"])


def rescaled_bases(model: nn.Module, reference: Iterable[float], given: Sequence[float] | None, feature: str) -> list[float]:
    """``given`` bases as floats, else the ``reference`` set (stated for the base 10000 of the original
    papers) rescaled to the model's own base: b · θ / 10000 (Attention Buckets, MoICE)."""
    if given is not None:
        return [float(b) for b in given]
    theta = single_base(model, feature)
    return [theta * b / 10000.0 for b in reference]


def find_rope_stack(model: nn.Module) -> RopeStack:
    """Locate the decoder stack and its rotary embedding; a clear ValueError for models without RoPE."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", type(model).__name__)
    varying = getattr(config.get_text_config(), "per_layer_attributes", None) if config is not None else None
    if varying:
        raise UnsupportedModel(f"model type {model_type!r} has layers of different shapes ({', '.join(sorted(varying))} "
                               "set per layer); the per-layer RoPE patch does not support such heterogeneous models")
    for module in model.modules():
        rotary = getattr(module, "rotary_emb", None)
        # the decoder layers beside the shared rotary module: `layers` in most models, `h` in Falcon
        layers = next((getattr(module, n) for n in ("layers", "h") if isinstance(getattr(module, n, None), nn.ModuleList)), None)
        if layers is not None and rotary is not None:
            types = getattr(getattr(module, "config", None), "layer_types", None)
            if types is not None and hasattr(rotary, f"{types[0]}_inv_freq"):
                layer_types = list(types)
            elif hasattr(rotary, "inv_freq"):
                layer_types = [None] * len(layers)
            else:
                break
            return RopeStack(module, layers, rotary, layer_types, model_type)
    if any(name.endswith("rotary_emb") for name, _ in model.named_modules()):
        raise UnsupportedModel(
            f"model type {model_type!r} has rotary position embeddings, but not one shared rotary module "
            "beside its decoder layers, which the per-layer RoPE patch needs; it is not supported")
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
    if isinstance(scales, (str, bytes)) or not isinstance(scales, Iterable):
        raise ValueError(f"scales must be a sequence of numbers, one per layer, got {scales!r}")
    return [RopeSpec(scale=s) for s in scales]


def rope_context(model, specs: Sequence[RopeSpec | None] | Mapping[int, RopeSpec] | None):
    """A :class:`RopePatch` with ``specs``, or nothing when ``specs`` is None (the unmodified model)."""
    return RopePatch(model, specs) if specs is not None else nullcontext()


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
        self._interventions = Interventions()
        self._cache: dict = {}
        self._segment_ids: torch.Tensor | None = None
        self._attention_mask: torch.Tensor | None = None  # the decoder's 2-D mask, for head scalers
        self._positions: dict[int, torch.Tensor] = {}  # per head-wise layer: phi(p) of this forward
        self._head_scales: dict[int, torch.Tensor] = {}  # per head-wise layer: [B, H_kv], kept for decoding
        self._continues_cache = False  # this forward appends to a filled cache

    @property
    def active(self) -> bool:
        return self._interventions.active

    def apply(self) -> RopePatch:
        current = getattr(self.model, self._ATTR, None)
        if current is not None:
            raise RuntimeError("a RoPE patch is already applied to this model; remove it before applying another")
        try:
            self._interventions.pre_hook(self.stack.decoder, self._start_forward, with_kwargs=True)
            for layer, spec in enumerate(self.specs):
                if spec is not None:
                    hook = self._layer_hook(layer, spec)
                    self._interventions.pre_hook(self.stack.layers[layer], hook, with_kwargs=True)
                    if spec.heads is not None:
                        self._add_head_hooks(layer, spec)
        except BaseException:
            self.remove()
            raise
        setattr(self.model, self._ATTR, self)
        return self

    def remove(self) -> None:
        self._interventions.close()
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
        cache = kwargs.get("past_key_values")
        self._continues_cache = isinstance(cache, Cache) and cache.get_seq_length() > 0

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
                raise UnsupportedModel(
                    f"decoder layer {layer} of model type {self.stack.model_type!r} was called without "
                    "position_embeddings/position_ids keyword arguments; the per-layer RoPE patch cannot reach its RoPE"
                )
            hidden = args[0] if args else kwargs["hidden_states"]
            position_ids = kwargs["position_ids"]
            if spec.heads is None:
                kwargs["position_embeddings"] = self._cos_sin(layer, spec, position_ids, hidden)
            else:  # the model's own rotation call is redirected to per-head tables (_HeadwiseRotation)
                self._positions[layer] = spec.positions(position_ids, self._segments_for(position_ids))
            return args, kwargs

        return hook

    def _cos_sin(self, layer: int, spec: RopeSpec, position_ids: torch.Tensor, hidden: torch.Tensor):
        key = (spec, self.stack.layer_types[layer], hidden.dtype)
        if key not in self._cache:
            positions = spec.positions(position_ids, self._segments_for(position_ids))
            self._cache[key] = self.stack.tables(layer, self.stack.inv_freq(layer, spec), positions, hidden)
        return self._cache[key]

    def _add_head_hooks(self, layer: int, spec: RopeSpec) -> None:
        attn = getattr(self.stack.layers[layer], "self_attn", None)
        heads_kv = key_value_heads(self.model)
        if not callable(spec.heads) and len(spec.heads) != heads_kv:
            raise ValueError(f"layer {layer}: got {len(spec.heads)} head scales, the model has {heads_kv} key/value heads")
        rotation = _HeadwiseRotation.install(self.stack, layer)
        self._interventions.add(rotation.remove)
        self._interventions.pre_hook(attn, lambda *_: rotation.enter(self, layer, spec))
        self._interventions.hook(attn, lambda *_: rotation.leave(), always_call=True)

    def rotate_heads(self, layer: int, spec: RopeSpec, rotate, q: torch.Tensor, k: torch.Tensor):
        """Rotate q [B, H_q, T, D] and k [B, H_kv, T, D] of a head-wise layer, each key/value head
        (and its query heads) with its own table, through the model's own ``rotate(q, k, cos, sin)``."""
        if callable(spec.heads) and self._continues_cache:
            if layer not in self._head_scales:  # scales from this continuation's last query would be silently wrong
                raise RuntimeError(f"layer {layer}: a forward continues a cache this patch did not prefill; its head "
                                   "scales come from the prompt's last query, so prefill the prompt inside the patch")
        elif callable(spec.heads):
            mask = self._attention_mask
            valid = torch.ones(k.shape[0], k.shape[2], dtype=torch.bool, device=k.device) if mask is None else mask[:, -k.shape[2]:].bool()
            # the logits scaled as this attention scales them (1/√d unless the model says otherwise)
            scaling = getattr(getattr(self.stack.layers[layer], "self_attn", None), "scaling", None)
            self._head_scales[layer] = spec.heads(q[:, :, -1], k, valid, scaling).float()
        b, heads_q, t, d = q.shape
        heads_kv = k.shape[1]
        if not callable(spec.heads) and len(spec.heads) != heads_kv:  # config and attention can disagree
            raise ValueError(f"layer {layer}: got {len(spec.heads)} head scales, its attention has {heads_kv} key/value heads")
        cos, sin = self._head_cos_sin(layer, spec, q)  # [B or 1, H_kv, T, D_rot]
        cos, sin = cos.expand(b, -1, -1, -1), sin.expand(b, -1, -1, -1)  # position ids may be [1, T]

        def per_head(x, c, s):  # every head as its own batch row, so one table broadcasts per head
            h = x.shape[1]
            rows = x.reshape(b * h, 1, t, d)
            return rotate(rows, rows, c.reshape(b * h, t, -1), s.reshape(b * h, t, -1))[0].reshape(b, h, t, d)

        group = heads_q // heads_kv  # query heads share their key head's table
        q_out = per_head(q, cos.repeat_interleave(group, dim=1), sin.repeat_interleave(group, dim=1))
        return q_out, per_head(k, cos, sin)

    def _head_cos_sin(self, layer: int, spec: RopeSpec, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [B, H_kv, T, D] of a head-wise layer: one model table per key/value head (and
        per batch row for computed scales), computed once per forward."""
        key = ("heads", layer, x.dtype)
        if key not in self._cache:
            per_kv = self._head_scales[layer] if callable(spec.heads) else torch.tensor([spec.heads])  # [B or 1, H_kv]
            inv_freq = self.stack.inv_freq(layer, spec)
            positions = self._positions[layer]
            rows = []
            for b in range(per_kv.shape[0]):
                pos = positions if per_kv.shape[0] == 1 else positions[b : b + 1]
                tables = [self.stack.tables(layer, inv_freq / h.to(inv_freq.device), pos, x) for h in per_kv[b]]
                rows.append(tuple(torch.stack([t[i] for t in tables], dim=1) for i in (0, 1)))
            self._cache[key] = tuple(torch.cat([r[i] for r in rows]) for i in (0, 1))
        return self._cache[key]


class _HeadwiseRotation:
    """Redirects the model's own ``apply_rotary_pos_emb`` (looked up as a module global by its
    attention at call time) to per-head tables while a head-wise layer's attention runs, so q and k
    are rotated exactly where and how the model rotates them (after or before its q/k norms,
    partial rotary dims, fp32 upcasts), and nowhere else. One per patched module of transformers,
    shared by all layers and patches; it restores the original when the last user removes it.
    Like every hook, it is process-global state: two threads running models of the same type with
    head-wise patches at once are not supported."""

    _installed: dict[str, _HeadwiseRotation] = {}
    NAME = "apply_rotary_pos_emb"

    def __init__(self, module):
        self.module, self.original, self.users, self.active = module, getattr(module, self.NAME), 0, None

    @classmethod
    def install(cls, stack: RopeStack, layer: int) -> _HeadwiseRotation:
        feature = "a head-wise RoPE spec (RopeSpec(heads=...))"
        attn = getattr(stack.layers[layer], "self_attn", None)
        forward = inspect.unwrap(type(attn).forward) if attn is not None else None
        if forward is None or cls.NAME not in forward.__code__.co_names:
            raise UnsupportedModel(f"{feature} is not supported on model type {stack.model_type!r}: the attention of "
                                   f"layer {layer} does not rotate q and k through {cls.NAME}(q, k, cos, sin)")
        stack.rotation(layer, feature)  # checks the signature
        module = sys.modules[type(attn).__module__]
        rotation = cls._installed.get(module.__name__)
        if rotation is None:
            rotation = cls._installed[module.__name__] = cls(module)

            def dispatch(q, k, cos, sin, *args, **kwargs):
                if rotation.active is None:
                    return rotation.original(q, k, cos, sin, *args, **kwargs)
                patch, layer, spec = rotation.active
                return patch.rotate_heads(layer, spec, rotation.original, q, k)

            dispatch._lpes_original = rotation.original
            setattr(module, cls.NAME, dispatch)
        rotation.users += 1
        return rotation

    def enter(self, patch: RopePatch, layer: int, spec: RopeSpec) -> None:
        self.active = (patch, layer, spec)

    def leave(self) -> None:
        self.active = None

    def remove(self) -> None:  # an undo step of the patch's interventions
        self.active = None
        self.users -= 1
        if self.users == 0:
            setattr(self.module, self.NAME, self.original)
            del self._installed[self.module.__name__]

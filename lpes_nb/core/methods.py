"""The compared methods, all on the one per-layer RoPE mechanism.

A method gives, for each batch, a context in which the model behaves as the method: usually a
:class:`~lpes_nb.core.rope.RopePatch` with per-layer specs, built from the batch's input length (Dynamic
NTK) or its document membership (CALIOPE). Pass one to ``evaluate_samples(..., method=m)``.

:class:`Method` declares the protocol the evaluator uses; methods that combine several passes
(Attention Buckets) override its ``forward`` (scoring) and ``generate`` (greedy decoding).

Here: baseline, PI, Dynamic NTK, LPES, the three CALIOPE calibrators, Attention Buckets, Ms-PoE,
LASP. MoICE (a trained router) is in :mod:`lpes_nb.evaluation.moice`, the gradient-based scale search in
:mod:`lpes_nb.studies.search`; :data:`lpes_nb.studies.benchmarks.METHODS` registers them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import DynamicCache
from transformers.generation.stopping_criteria import EosTokenCriteria, StoppingCriteriaList, StopStringCriteria

from .rope import (
    RopePatch,
    RopeSpec,
    dynamic_ntk_base,
    find_rope_stack,
    key_value_heads,
    positive_real,
    rescaled_bases,
    scale_specs,
    single_base,
)


class Method:
    """The protocol every compared method implements; the evaluator calls exactly these members.

    * ``name``: display name; ``needs_segments``: receive each token's document membership.
    * ``shares_prefix``: whether prompts that start alike may share the keys and values of their
      common prefix (:mod:`lpes_nb.evaluation.prefix`): True only where every token's rotation depends on its own
      position alone, not on the prompt's length, later tokens or document membership, and the
      method runs the model's own forward. Every method states it (a test checks the registry).
    * ``state_from_prompt``: part of its state is computed once, from the prompt's last query, and
      kept while decoding (Ms-PoE's head scales). A teacher-forced target is then fed after the
      prompt's cache, as decoding sees it: in one pass with the target, the last query would be the
      target's last token.
    * ``specs(model, length, segments)``: per-layer RoPE specs for a batch (``None``: unpatched).
    * ``context(model, length, segments)``: what is entered around each batch; by default a
      :class:`~lpes_nb.core.rope.RopePatch` with :meth:`specs`.
    * ``forward(model, ids, mask, positions, keep)`` -> logits: one scoring pass.
    * ``generate(model, ids, mask, max_new_tokens, **options)`` -> new token ids: greedy decoding
      (``options``: the evaluator's ``model.generate`` arguments: padding id, stop strings).

    Methods that combine passes (Attention Buckets) override ``forward`` and ``generate``."""

    name = "method"
    needs_segments = False
    state_from_prompt = False
    shares_prefix: bool  # no default: each method says (see above)

    def specs(self, model, length: int, segments: list[list[int]] | None) -> list[RopeSpec | None] | None:
        return None

    def context(self, model, length: int, segments: list[list[int]] | None):
        check_batch(length, segments)
        specs = self.specs(model, length, segments)
        if specs is None:
            return nullcontext()
        with ExitStack() as stack:  # if entering a part fails, the parts entered before are left again
            patch = stack.enter_context(RopePatch(model, specs))
            if segments is not None:
                stack.enter_context(patch.segments(_segment_tensor(segments)))
            return stack.pop_all()

    def forward(self, model, ids, mask, positions, keep) -> torch.Tensor:
        return model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep).logits

    def generate(self, model, ids, mask, max_new_tokens: int, **options) -> torch.Tensor:
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                              top_p=None, top_k=None, temperature=None, **options)[:, ids.shape[1]:]


def _segment_tensor(segments: list[list[int]]) -> torch.Tensor:
    """[B, max_len] segment ids indexed by position id; shorter rows repeat their last id."""
    width = max(len(s) for s in segments)
    return torch.tensor([s + [s[-1]] * (width - len(s)) for s in segments], dtype=torch.long)


@dataclass
class Baseline(Method):
    name = "baseline"
    shares_prefix = True


@dataclass
class FixedSpecs(Method):
    """Given per-layer specs (a list, one per layer, or {layer: spec}), the same for every batch: a
    probe's masks or a hand-made configuration as a method."""

    fixed: Sequence[RopeSpec | None] | dict
    name = "specs"

    @property
    def state_from_prompt(self) -> bool:  # head scales computed from the prefill's last query
        specs = self.fixed.values() if isinstance(self.fixed, dict) else self.fixed
        return any(s is not None and callable(s.heads) for s in specs)

    @property
    def shares_prefix(self) -> bool:  # those head scales depend on the whole prompt
        return not self.state_from_prompt

    def specs(self, model, length, segments):
        return self.fixed


@dataclass
class LayerScales(Method):
    """Per-layer positional interpolation: LPES (scales from the search) or PI (one scale everywhere)."""

    scales: Sequence[float]
    label: str = "LPES"
    shares_prefix = True

    def __post_init__(self):
        # plain floats: the repr is part of stored results' keys, and a numpy scalar's repr
        # (np.float64(1.2)) would change with numpy, not with the method
        self.scales = [float(s) for s in self.scales]

    @property
    def name(self) -> str:
        return self.label

    def specs(self, model, length, segments):
        n = find_rope_stack(model).num_layers
        if len(self.scales) != n:
            raise ValueError(f"{self.label} has {len(self.scales)} scales for a model with {n} layers")
        return scale_specs(self.scales)


def uniform_like(scales: Sequence[float]) -> list[float]:
    """Positional interpolation with the same average scale as per-layer ``scales`` (LPES's PI baseline)."""
    return [float(np.mean(scales))] * len(scales)


def lpes(scales: Sequence[float]) -> LayerScales:
    return LayerScales(list(scales), "LPES")


def pi(scales_or_scale: Sequence[float] | float, num_layers: int | None = None) -> LayerScales:
    """PI with the mean of the given per-layer scales (LPES's comparison), or one given scale."""
    if np.ndim(scales_or_scale) == 0:
        if num_layers is None:
            raise ValueError("pi(scale) needs num_layers")
        return LayerScales([float(scales_or_scale)] * num_layers, "PI")
    return LayerScales(uniform_like(scales_or_scale), "PI")


@dataclass
class DynamicNTK(Method):
    """transformers' ``dynamic`` RoPE: for inputs longer than ``original_max_positions`` the base
    grows with the length (NTK-aware). The base is set from each batch's input length; during
    decoding it is not grown further (the answers here are a few tokens). ``original_max_positions``
    defaults to the model's own and may be set lower to emulate a shorter training window."""

    factor: float = 2.0
    original_max_positions: int | None = None
    name = "Dynamic NTK"
    shares_prefix = False  # the base follows the whole input's length

    def __post_init__(self):
        if isinstance(self.factor, bool) or not isinstance(self.factor, (int, float)) or not self.factor >= 1:
            raise ValueError(f"Dynamic NTK factor must be a number >= 1, got {self.factor!r}")
        m = self.original_max_positions
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(f"original_max_positions must be None or an integer >= 1, got {m!r}")

    def specs(self, model, length, segments):
        cfg = model.config
        theta = single_base(model, "Dynamic NTK")
        max_pos = self.original_max_positions or cfg.max_position_embeddings
        if length <= max_pos:
            return None  # transformers applies no change inside the original window
        dim = 2 * find_rope_stack(model).native(0)[0].shape[0]
        base = dynamic_ntk_base(theta, self.factor, length, max_pos, dim)
        return [RopeSpec(base=base)] * cfg.num_hidden_layers


@dataclass(frozen=True)
class SegmentOffsets:
    """Position remap Φ(t) = t + c(m(t)) for per-token segment ids m (a RopeSpec remap)."""

    offsets: tuple[float, ...]

    def __call__(self, position_ids: torch.Tensor, segment_ids: torch.Tensor | None) -> torch.Tensor:
        if segment_ids is None:
            raise ValueError("this position remap needs segment ids (document membership)")
        table = torch.tensor(self.offsets, dtype=torch.float32, device=position_ids.device)
        return position_ids.float() + table[segment_ids.clamp(0, len(self.offsets) - 1)]


CALIOPE_KINDS = ("moses", "hourglass", "decay")


class WindowOverflow(ValueError):
    """A method would move positions past the model's trained window."""


def check_batch(length, segments) -> None:
    """What a method's context is entered for: the batch's ``length`` (an integer >= 1) and, per
    prompt, its tokens' segments (None, or one list of non-negative integers per prompt)."""
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
        raise ValueError(f"a method's context needs the batch length, an integer >= 1, got {length!r}")
    if segments is not None and (not isinstance(segments, (list, tuple)) or not all(
            isinstance(s, (list, tuple)) and all(isinstance(t, (int, np.integer)) and t >= 0 for t in s) for s in segments)):
        raise ValueError(f"segments must be None or one list of non-negative segment ids per prompt, got {segments!r}")


@dataclass
class Caliope(Method):
    """CALIOPE's calibrators exactly as defined in its paper (003, Sec. 5): every layer reads the
    position Φ(t) = t + c(m(t)) (Eq. 2), where m(t) is the document a token belongs to (0 before the
    first of the d documents; the question after the last keeps m = d) and the gap accumulation c is

    * Moses (Eq. 3): c(m) = 0 for m ≤ ⌊d/2⌋, else Δ_gap (one jump after document ⌊d/2⌋);
    * Hourglass (Eq. 4): c(m) = Σ_{k=1}^{m−1} [Δmin + 4·k/(d−1)·(1 − k/(d−1))·(Δmax − Δmin)]: the gap
      after document k is a parabola in k, largest in the middle (Δmax near k = (d−1)/2), Δmin at k = d−1;
    * Decay (Eq. 5): c(m) = Σ_{k=1}^{m−1} Δ0·λ^k: the first gap is Δ0·λ (950 at the defaults).

    Defaults are the paper's (Δ_gap = 10,000; Δmin = 5, Δmax = 1,000; Δ0 = 1,000, λ = 0.95). A layout
    whose last prompt token would land past the model's trained window is refused
    (:class:`WindowOverflow`), not extrapolated silently: at the defaults Moses needs 10,000 positions
    beyond the prompt, more than SmolLM2's 8,192-position window holds."""

    kind: str = "moses"  # moses | hourglass | decay
    gap: float = 10000.0  # Moses: Δ_gap
    delta_min: float = 5.0  # Hourglass: Δmin, Δmax
    delta_max: float = 1000.0
    delta_0: float = 1000.0  # Decay: Δ0, λ
    lam: float = 0.95
    # in the repr (the result key): results computed under an earlier, wrong reading of Eq. 3-5 never match
    equations: str = field(default="003 Eq. 3-5", init=False)
    needs_segments = True
    shares_prefix = False  # positions shift by document membership, which differs between gold positions

    def __post_init__(self):
        if self.kind not in CALIOPE_KINDS:
            raise ValueError(f"unknown CALIOPE calibrator {self.kind!r}; choose moses, hourglass or decay")
        if min(self.gap, self.delta_min, self.delta_max, self.delta_0, self.lam) < 0:
            raise ValueError("CALIOPE gaps must be >= 0 (else positions would not be monotone)")

    @property
    def name(self) -> str:
        return f"CALIOPE-{self.kind.capitalize()}"

    def accumulated(self, num_docs: int) -> np.ndarray:
        """c(m) for m = 0 … d (Eq. 3-5)."""
        d, m = num_docs, np.arange(num_docs + 1)
        if self.kind == "moses":
            return np.where(m > d // 2, self.gap, 0.0)
        k = np.arange(1, max(d, 1), dtype=float)  # the gaps after documents 1 … d − 1
        if self.kind == "hourglass":
            x = k / (d - 1) if d > 1 else k
            gaps = self.delta_min + 4 * x * (1 - x) * (self.delta_max - self.delta_min)
        else:
            gaps = self.delta_0 * self.lam**k
        return np.concatenate([[0.0, 0.0], np.cumsum(gaps)])[: d + 1]  # c(0) = c(1) = 0: empty sums

    def gaps(self, num_docs: int) -> np.ndarray:
        """The gap inserted after document k, k = 1 … d − 1: c(k + 1) − c(k)."""
        return np.diff(self.accumulated(num_docs))[1:]

    def offsets(self, num_docs: int) -> tuple[float, ...]:
        """Per segment (0 = instruction, 1 … d = documents, d + 1 = question): c(m(t))."""
        c = self.accumulated(num_docs)
        return tuple(float(x) for x in np.concatenate([c, c[-1:]]))  # the question follows document d: m = d

    def specs(self, model, length, segments):
        if not segments:
            raise ValueError(f"{self.name} needs each token's document segment (needs_segments=True), got "
                             f"segments={segments!r}; evaluate it through lpes_nb.evaluation.evaluate, which passes them")
        num_docs = max(max(s) for s in segments) - 1
        offsets = self.offsets(num_docs)
        window = int(model.config.max_position_embeddings)
        last = length - 1 + max(offsets)
        if last >= window:
            settings = {"moses": f"gap={self.gap:g}", "hourglass": f"delta_min={self.delta_min:g}, delta_max={self.delta_max:g}",
                        "decay": f"delta_0={self.delta_0:g}, lam={self.lam:g}"}[self.kind]
            raise WindowOverflow(
                f"{self.name} ({settings}) puts the last of {length} prompt tokens at position {last:.0f} "
                f"({num_docs} documents, accumulated gap {max(offsets):.0f}), past the model's trained window of {window} "
                "positions; choose smaller gaps or a model with a longer window")
        remap = SegmentOffsets(offsets)
        return [RopeSpec(remap=remap)] * find_rope_stack(model).num_layers


@dataclass
class AttentionBuckets(Method):
    """Attention Buckets: one forward pass per RoPE base; at every position the final logits are
    Σ_b softmax_b(max-logit_b) · logits_b. ``bases=None`` takes the reference RAG set 10000, 13000,
    ..., 28000, scaled by the model's own base / 10000. Greedy decoding keeps one KV cache per base."""

    bases: Sequence[float] | None = None
    name = "Attention Buckets"
    shares_prefix = False  # several passes of its own, one cache per base

    def __post_init__(self):
        if self.bases is not None:
            if isinstance(self.bases, (str, bytes)) or len(self.bases) < 1:
                raise ValueError(f"Attention Buckets bases must be a non-empty sequence of RoPE bases, got {self.bases!r}")
            for b in self.bases:
                RopeSpec(base=b)  # a RoPE base: a finite number > 1

    def bucket_bases(self, model) -> list[float]:
        return rescaled_bases(model, range(10000, 28001, 3000), self.bases, "Attention Buckets")

    def _patches(self, model) -> list[RopePatch]:
        layers = find_rope_stack(model).num_layers
        return [RopePatch(model, [RopeSpec(base=b)] * layers) for b in self.bucket_bases(model)]

    @staticmethod
    def _pass(model, patch: RopePatch, **inputs):
        with patch:
            return model(**inputs)

    @staticmethod
    def combine(logits: list[torch.Tensor]) -> torch.Tensor:
        stacked = torch.stack([l.float() for l in logits])  # [buckets, B, T, V]
        weights = torch.softmax(stacked.amax(-1), dim=0)  # per position, over buckets
        return (weights[..., None] * stacked).sum(0)

    def forward(self, model, ids, mask, positions, keep):
        return self.combine([self._pass(model, p, input_ids=ids, attention_mask=mask, position_ids=positions,
                                        logits_to_keep=keep).logits for p in self._patches(model)])

    def generate(self, model, ids, mask, max_new_tokens, pad_token_id=None, stop_strings=None, tokenizer=None,
                 min_new_tokens: int = 0):
        """Greedy decoding over the buckets, ended as ``model.generate`` ends it: a row is finished at an
        end-of-sequence token of the model's generation config (none before ``min_new_tokens``) or at one
        of ``stop_strings``, and padded with ``pad_token_id`` after it; decoding stops once every row is
        finished. (Decoding on past a row's end would add text after its end-of-sequence token to its
        answer, and each step costs one pass per bucket.)"""
        eos = model.generation_config.eos_token_id
        eos = torch.tensor([] if eos is None else eos, dtype=torch.long, device=ids.device).flatten()
        # as model.generate: rows are padded once ended only where an end-of-sequence token can end them
        pad = (pad_token_id if pad_token_id is not None else int(eos[0])) if len(eos) else None
        ended = StoppingCriteriaList([EosTokenCriteria(eos)] if len(eos) else [])
        if stop_strings:
            ended.append(StopStringCriteria(tokenizer, stop_strings))
        patches = self._patches(model)
        caches = [DynamicCache(config=model.config) for _ in patches]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        sequence, step_ids = ids, ids
        unfinished = torch.ones(ids.shape[0], dtype=torch.bool, device=ids.device)
        for step in range(max_new_tokens):
            logits = self.combine([self._pass(model, p, input_ids=step_ids, attention_mask=mask, position_ids=positions,
                                              past_key_values=cache, use_cache=True, logits_to_keep=1).logits
                                   for p, cache in zip(patches, caches)])[:, -1]
            if step < min_new_tokens and len(eos):
                logits[:, eos] = float("-inf")
            nxt = logits.argmax(-1)
            if pad is not None:
                nxt = torch.where(unfinished, nxt, pad)
            sequence = torch.cat([sequence, nxt[:, None]], dim=1)
            unfinished &= ~ended(sequence, None)
            if not unfinished.any():
                break
            step_ids = nxt[:, None]
            mask = torch.cat([mask, torch.ones_like(step_ids)], dim=1)
            positions = positions[:, -1:] + 1
        return sequence[:, ids.shape[1]:]


# Ms-PoE's two free choices, each as the reference code (VITA-Group/Ms-PoE, utils/modify_arch/llama.py) makes it
# and as this workbook made it before holding it against that code; stored rows name the variant that ran
MS_POE_GRIDS = ("reference", "endpoints")
MS_POE_ASSIGNMENTS = ("reference", "rank", "normal")


def ms_poe_ratios(n: int, min_scale: float, max_scale: float, grid: str = "reference") -> torch.Tensor:
    """The ``n`` compression ratios Ms-PoE hands out. ``reference``: min + (max − min)·i/n, i = 0 … n − 1,
    as the reference code builds them (``max_scale`` itself is never reached: 32 heads at 1.2–1.8 average
    1.49); ``endpoints``: i/(n − 1), both ends included (this workbook's rows before the reference check)."""
    if grid not in MS_POE_GRIDS:
        raise ValueError(f"unknown Ms-PoE ratio grid {grid!r}; choose one of {MS_POE_GRIDS}")
    steps = torch.arange(n, dtype=torch.float32) / (n if grid == "reference" else max(n - 1, 1))
    return min_scale + (max_scale - min_scale) * steps


def assign_ratios(scores: torch.Tensor, ratios: torch.Tensor, assign: str = "reference") -> torch.Tensor:
    """Per head (last axis of ``scores`` [B, n]), its ratio from ``ratios`` [n].

    * ``reference``: the reference code's mapping, head h takes ratio ``argsort(scores)[h]``. Its paper
      gives the heads with most outliers (lowest score) the smallest ratios; indexing by the argsort
      permutation instead of by the ranks (its inverse) hands most heads another head's ratio. The
      published numbers ran this.
    * ``rank``: the paper's stated intent, head h takes ratio ``rank(h)`` (lowest score: the smallest).
    * ``normal``: the reference's ``head_type="normal"``, no score at all: head h takes ratio n − 1 − h
      (its script uses it for gold positions 5, 7 and 10).

    Ties (common with 2–3 key/value heads) go to the lower head index (a stable sort), where the
    reference's unstable sort breaks them arbitrarily."""
    if assign not in MS_POE_ASSIGNMENTS:
        raise ValueError(f"unknown Ms-PoE head assignment {assign!r}; choose one of {MS_POE_ASSIGNMENTS}")
    n = scores.shape[-1]
    if assign == "normal":
        index = (n - 1 - torch.arange(n)).expand_as(scores)
    else:
        order = scores.argsort(dim=-1, stable=True)
        index = order if assign == "reference" else order.argsort(dim=-1)
    return ratios[index]


@dataclass(frozen=True)
class OutlierHeadScales:
    """Ms-PoE's head scaler, from the un-rotated attention of the prompt's last query over its real keys,
    computed as the reference code computes it: per head, score = −(fraction of keys whose weight exceeds
    ``k`` × the mean weight 1/T), the logits scaled as the attention module scales them (its ``scaling``;
    1/√head_dim where a module has none), then ratios on ``grid`` handed out by ``assign``
    (:func:`ms_poe_ratios`, :func:`assign_ratios`).

    Grouped-query attention (the reference is written for multi-head Llama): one ratio per key/value head,
    from the mean score of its query heads, because a key is rotated once for all the query heads that read
    it. A literal port gives every query head its own ratio and the shared key the first query head's; a
    query and a key then rotate by different ratios, and attention stops depending on relative positions
    alone (a uniform shift of all positions changes the logits). With one query head per key head (the
    reference's case) the two are the same computation."""

    min_scale: float = 1.2
    max_scale: float = 1.8
    k: float = 3.0
    grid: str = "reference"
    assign: str = "reference"

    def __post_init__(self):
        if self.grid not in MS_POE_GRIDS:
            raise ValueError(f"unknown Ms-PoE ratio grid {self.grid!r}; choose one of {MS_POE_GRIDS}")
        if self.assign not in MS_POE_ASSIGNMENTS:
            raise ValueError(f"unknown Ms-PoE head assignment {self.assign!r}; choose one of {MS_POE_ASSIGNMENTS}")

    def scores(self, q_last: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, scaling: float | None = None) -> torch.Tensor:
        """Per query head [B, H_q]: −(fraction of the real keys weighted above ``k`` / their count)."""
        heads_q, dim = q_last.shape[1:]
        keys = keys.repeat_interleave(heads_q // keys.shape[1], dim=1)  # [B, H_q, T, D]
        scaling = dim**-0.5 if scaling is None else scaling
        logits = torch.einsum("bhd,bhtd->bht", q_last.float(), keys.float()) * scaling
        attn = logits.masked_fill(~valid[:, None], float("-inf")).softmax(-1)
        count = valid.sum(-1, keepdim=True).float()  # [B, 1]
        return -((attn > self.k / count[..., None]) & valid[:, None]).sum(-1) / count  # mean weight = 1/count

    def __call__(self, q_last: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, scaling: float | None = None) -> torch.Tensor:
        heads_kv = keys.shape[1]
        scores = self.scores(q_last, keys, valid, scaling).view(q_last.shape[0], heads_kv, -1).mean(-1)
        return assign_ratios(scores, ms_poe_ratios(heads_kv, self.min_scale, self.max_scale, self.grid), self.assign)


@dataclass
class MsPoE(Method):
    """Ms-PoE: head-wise positional interpolation in layers ``first_layer`` … L−1, each key/value head's
    ratio chosen by its outlier score on the prefill (:class:`OutlierHeadScales`). The defaults are the
    reference code's (ratios 1.2–1.8 on its grid, its head mapping, layers 2 …); ``grid="endpoints",
    assign="rank"`` is the variant this workbook ran before it was held against that code. The name
    says which variant ran."""

    min_scale: float = 1.2
    max_scale: float = 1.8
    first_layer: int = 2
    grid: str = "reference"
    assign: str = "reference"
    shares_prefix = False  # head scales from the last query of the whole prompt
    state_from_prompt = True

    def __post_init__(self):
        positive_real(self.min_scale, "Ms-PoE min scale")
        positive_real(self.max_scale, "Ms-PoE max scale")
        if self.min_scale > self.max_scale:
            raise ValueError(f"Ms-PoE needs min_scale <= max_scale, got {self.min_scale} > {self.max_scale}")
        self.scaler = OutlierHeadScales(self.min_scale, self.max_scale, grid=self.grid, assign=self.assign)  # checks both

    @property
    def name(self) -> str:
        if (self.grid, self.assign) == ("reference", "reference"):
            return "Ms-PoE"
        return f"Ms-PoE ({self.assign}, {self.grid} grid)"

    def specs(self, model, length, segments):
        n = find_rope_stack(model).num_layers
        if not 0 <= self.first_layer < n:
            raise ValueError(f"Ms-PoE first_layer {self.first_layer} is out of range [0, {n - 1}]")
        spec = RopeSpec(heads=self.scaler)
        return [None] * self.first_layer + [spec] * (n - self.first_layer)


@dataclass
class MsPoEMeanPI(Method):
    """Uniform positional interpolation at ``ms_poe``'s mean ratio from its first layer on: its ratio
    range without its heads (issue #100's diagnostic, beside it paired). The mean is over the ratios it
    would hand this model's key/value heads, so the scales are resolved per model, not fixed."""

    ms_poe: MsPoE = field(default_factory=MsPoE)
    shares_prefix = True

    @property
    def name(self) -> str:
        return f"PI at the mean {self.ms_poe.name} ratio from layer {self.ms_poe.first_layer}"

    def scales(self, model) -> list[float]:
        m = self.ms_poe
        mean = float(ms_poe_ratios(key_value_heads(model), m.min_scale, m.max_scale, m.grid).mean())
        return [1.0] * m.first_layer + [mean] * (find_rope_stack(model).num_layers - m.first_layer)

    def specs(self, model, length, segments):
        self.ms_poe.specs(model, length, segments)  # its first-layer check
        return scale_specs(self.scales(model))


@dataclass
class LASP(Method):
    """LASP-style layer schedules ("anchor" in shallow layers, "reason" in deep ones): layers up to
    the anchor depth ``anchor`` (a fraction of the depth) keep the model's RoPE; after it the scale
    rises linearly to ``max_scale`` at the last layer (``kind="scale"``), the base grows
    geometrically to ``base_factor`` × the model's base (``"base"``), or both (``"both"``)."""

    kind: str = "both"
    anchor: float = 0.5
    max_scale: float = 2.0
    base_factor: float = 4.0
    shares_prefix = True

    def __post_init__(self):
        if self.kind not in ("scale", "base", "both"):
            raise ValueError(f"unknown LASP variant {self.kind!r}; choose scale, base or both")
        if not 0.0 <= self.anchor < 1.0:
            raise ValueError(f"LASP anchor depth must be in [0, 1), got {self.anchor!r}")
        if positive_real(self.max_scale, "LASP max scale") < 1 or positive_real(self.base_factor, "LASP base factor") < 1:
            raise ValueError(f"LASP max_scale and base_factor must be >= 1, got {self.max_scale}, {self.base_factor}")

    @property
    def name(self) -> str:
        return f"LASP-{self.kind}"

    def schedule(self, num_layers: int) -> tuple[np.ndarray, np.ndarray]:
        """(scale, base multiplier) per layer: flat up to the anchor layer, then rising."""
        anchor = int(round(self.anchor * (num_layers - 1)))
        depth = np.clip((np.arange(num_layers) - anchor) / max(num_layers - 1 - anchor, 1), 0.0, 1.0)
        scales = 1.0 + (self.max_scale - 1.0) * depth if self.kind != "base" else np.ones(num_layers)
        bases = self.base_factor**depth if self.kind != "scale" else np.ones(num_layers)
        return scales, bases

    def specs(self, model, length, segments):
        theta = single_base(model, "LASP")
        scales, bases = self.schedule(find_rope_stack(model).num_layers)
        return [RopeSpec(scale=float(s), base=None if b == 1.0 else float(theta * b)) for s, b in zip(scales, bases)]

"""MoICE: every attention head attends under several RoPE bases at once, mixed by a trained router.

A router reads the query of each token and gives weights over the bases,
w = softmax(gate_2(act(gate_1(q)) * gate_3(q))); the head's output is Σ_b w_b · attention under base b.
Two routers: :class:`Router`, this workbook's (one per layer *and* head, on the un-rotated RMS-normalised
query, trained on the answer loss of task samples: the rows stored so far), and :class:`ReferenceRouter`,
the reference code's (one per layer shared by its heads, on the query rotated with the first base). Only
the router is trained; the model stays frozen.

On the mechanism: a :class:`~lpes_nb.core.rope.RopePatch` with masked positions in every layer hands
the attention its queries and keys un-rotated (and caches the keys that way); the registered
attention function ``lpes_moice`` then rotates them once per base with the mechanism's own tables
and mixes the results of transformers' SDPA attention.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import AttentionInterface
from transformers.activations import ACT2FN
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

from ..core.interventions import Interventions
from ..core.methods import Method
from ..core.rope import RopePatch, RopeSpec, find_rope_stack, rescaled_bases
from ..store.data import general_text
from ..store.results import cache_key, will_compute, write_json
from ..system import footprint
from ..system.files import atomic_write
from .training import answer_batch, backward_answer_nll, backward_lm_nll, frozen

REFERENCE_BASES = (10000.0, 17500.0, 18000.0, 19000.0, 20000.0, 22500.0, 25000.0)  # for base-10000 models
ATTENTION_NAME = "lpes_moice"
_STATE = "_lpes_moice"  # attribute set on each attention module while MoICE is active
# What a MoICE row is labelled by the router that ran (issue #100): the published one keeps the paper's name;
# this workbook's per-head router, trained on the task's own records, and the uniform mixture say so.
PER_HEAD_MOICE = "MoICE (per-head router, task-trained)"
UNTRAINED_MOICE = "MoICE (untrained)"


class Router(nn.Module):
    """One small gated MLP per layer and head: query [B, H, T, D] -> weights over bases [B, H, T, E].
    ``gate_2`` starts at zero, so an untrained router mixes the bases uniformly."""

    def __init__(self, num_layers: int, num_heads: int, head_dim: int, num_bases: int, hidden: int = 16, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.gate_1 = nn.Parameter(torch.randn(num_layers, num_heads, head_dim, hidden, generator=g) * head_dim**-0.5)
        self.gate_3 = nn.Parameter(torch.randn(num_layers, num_heads, head_dim, hidden, generator=g) * head_dim**-0.5)
        self.gate_2 = nn.Parameter(torch.zeros(num_layers, num_heads, hidden, num_bases))

    def forward(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        q = q.float() * torch.rsqrt(q.float().pow(2).mean(-1, keepdim=True) + 1e-6)  # scale-free input
        h = nn.functional.silu(torch.einsum("bhtd,hdk->bhtk", q, self.gate_1[layer]))
        h = h * torch.einsum("bhtd,hdk->bhtk", q, self.gate_3[layer])
        return torch.einsum("bhtk,hke->bhte", h, self.gate_2[layer]).softmax(-1)


class ReferenceRouter(nn.Module):
    """The router as the reference code builds it (p1nksnow/MoICE, ``modeling/modeling_llama.py``): one
    gated MLP per layer shared by all its heads, ``gate_1``, ``gate_3``: head_dim -> E and ``gate_2``:
    E -> E without biases, w = softmax(gate_2(act(gate_1(q)) · gate_3(q))) on each head's query *rotated
    with the first base*, kept on the ``topk`` largest logits and renormalised (its script: top 7 of 7,
    i.e. every base). ``act`` is the model's MLP activation, as the reference's ``ACT2FN[hidden_act]``.
    Drawn as the reference's untrained gates are (a model's ``_init_weights``: normal, std 0.02)."""

    rotated_input = True  # _attention hands it the query under the first base

    def __init__(self, num_layers: int, head_dim: int, num_bases: int, act: str = "silu", topk: int | None = None,
                 seed: int = 0, std: float = 0.02):
        super().__init__()
        if topk is not None and not 1 <= topk <= num_bases:
            raise ValueError(f"MoICE topk must be in [1, {num_bases}] (the number of bases), got {topk!r}")
        g = torch.Generator().manual_seed(seed)
        self.gate_1 = nn.Parameter(torch.randn(num_layers, head_dim, num_bases, generator=g) * std)
        self.gate_3 = nn.Parameter(torch.randn(num_layers, head_dim, num_bases, generator=g) * std)
        self.gate_2 = nn.Parameter(torch.randn(num_layers, num_bases, num_bases, generator=g) * std)
        self.act, self.topk = ACT2FN[act], topk or num_bases

    def forward(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        h = self.act(q @ self.gate_1[layer].to(q.dtype)) * (q @ self.gate_3[layer].to(q.dtype))
        logits = h @ self.gate_2[layer].to(q.dtype)
        weights = logits.float().softmax(-1)
        if self.topk < weights.shape[-1]:
            kept = torch.zeros_like(weights, dtype=torch.bool).scatter_(-1, logits.topk(self.topk, dim=-1).indices, True)
            weights = torch.where(kept, weights, 0.0)
        return weights / weights.sum(-1, keepdim=True)


def _attention(module, query, key, value, attention_mask, **kwargs):
    """Registered as ``lpes_moice``: q [B, H, T, D] and k [B, H_kv, S, D] arrive un-rotated."""
    router, stack, rotate, tables = getattr(module, _STATE)
    layer = module.layer_idx
    q_pos = kwargs["position_ids"].float()  # [B or 1, T]
    # keys are contiguous positions ending at the last query's (left padding keeps that true)
    k_pos = q_pos[:, -1:] - torch.arange(key.shape[2] - 1, -1, -1, device=key.device, dtype=torch.float)
    queries = [rotate(query, *stack.tables(layer, inv_freq, q_pos, query)) for inv_freq in tables]
    weights = router(layer, queries[0] if getattr(router, "rotated_input", False) else query).to(query.dtype)  # [B, H, T, E]
    out = 0.0
    for e, inv_freq in enumerate(tables):
        k_cos, k_sin = stack.tables(layer, inv_freq, k_pos, key)
        o, _ = sdpa_attention_forward(module, queries[e], rotate(key, k_cos, k_sin), value, attention_mask, **kwargs)
        out = out + o * weights[..., e].transpose(1, 2)[..., None]  # o: [B, T, H, D]
    return out, None


def _register() -> None:
    if ATTENTION_NAME not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionInterface.register(ATTENTION_NAME, _attention)
        AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)


def _attention_shape(model):
    """The model's text config and its attention's head size."""
    cfg = model.config.get_text_config()
    return cfg, getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


@dataclass
class MoICE(Method):
    """MoICE with a router (``None``: uniform mixing, the untrained start). ``bases=None`` takes the
    reference set scaled by the model's own base / 10000.

    A router from :func:`load_or_train` is known by its training ``recipe`` (which keys its results)
    and may come without weights (git keeps the JSON, never the weights): ``train`` rebuilds them the
    first time the method runs, i.e. only when a result is not in the store, and refuses weights other
    than those the stored results were made with (another CPU need not give the same bits)."""

    router: Router | None = None
    bases: Sequence[float] | None = None
    recipe: str | None = field(default=None, repr=False, compare=False)
    train: Callable[[], Router] | None = field(default=None, repr=False, compare=False)
    reference: bool = field(default=False, repr=False, compare=False)  # a stored recipe's router kind, before its weights load
    name = "MoICE"
    shares_prefix = False  # its own attention function: not shown exact over a cropped cache, so not shared

    @property
    def trained(self) -> bool:
        return self.router is not None or self.train is not None

    @property
    def label(self) -> str:
        """The name its rows carry: ``MoICE`` only for the published router (:class:`ReferenceRouter`),
        :data:`PER_HEAD_MOICE` for this workbook's trained :class:`Router`, :data:`UNTRAINED_MOICE` without one."""
        if not self.trained:
            return UNTRAINED_MOICE
        return "MoICE" if self.reference or isinstance(self.router, ReferenceRouter) else PER_HEAD_MOICE

    def model_bases(self, model) -> list[float]:
        return rescaled_bases(model, REFERENCE_BASES, self.bases, "MoICE")

    def new_reference_router(self, model, topk: int | None = None, seed: int = 0) -> ReferenceRouter:
        """:class:`ReferenceRouter` for ``model`` (its layers, head size, activation and this method's bases)."""
        cfg, head_dim = _attention_shape(model)
        router = ReferenceRouter(cfg.num_hidden_layers, head_dim, len(self.model_bases(model)), cfg.hidden_act, topk, seed)
        return router.to(model.device)

    def new_router(self, model, hidden: int = 16, seed: int = 0) -> Router:
        cfg, head_dim = _attention_shape(model)
        router = Router(cfg.num_hidden_layers, cfg.num_attention_heads, head_dim, len(self.model_bases(model)), hidden, seed)
        return router.to(model.device)  # drawn on the CPU (the same weights on every device), used beside the model

    @contextmanager
    def _active(self, model):
        stack = find_rope_stack(model)
        router = self.router if self.router is not None else self.new_router(model)
        bases = self.model_bases(model)
        _register()
        with Interventions() as interventions:
            for i, layer in enumerate(stack.layers):
                tables = [stack.inv_freq(i, RopeSpec(base=b)).float() for b in bases]
                interventions.override(layer.self_attn, _STATE, (router, stack, stack.rotation(i, "MoICE"), tables))
            interventions.override(model.config, "_attn_implementation", ATTENTION_NAME)
            yield

    def context(self, model, length, segments):
        if self.router is None and self.train is not None:
            # before any patch (training runs the model under its own), and with gradients even when
            # the evaluator enters this context under inference mode
            with torch.inference_mode(False), torch.enable_grad():
                self.router = self.train()
        with ExitStack() as stack:  # if entering a part fails, the parts entered before are left again
            stack.enter_context(RopePatch(model, [RopeSpec(mask=True)] * find_rope_stack(model).num_layers))
            stack.enter_context(self._active(model))
            return stack.pop_all()


@dataclass
class RouterTraining:
    """The router's training budget (stated in the results JSON)."""

    steps: int = 40
    batch_size: int = 4
    lr: float = 3e-3
    hidden: int = 16
    seed: int = 0
    micro_batch: int | None = None  # backward over this many prompts at a time: memory only, not in the recipe
    history: list[float] = field(default_factory=list)
    seconds: float = 0.0  # wall time of the steps in ``history``, over every sitting a checkpointed run took

    @property
    def recipe(self) -> dict:
        """What determines the trained weights (the micro-batch and the history do not)."""
        return dict(steps=self.steps, batch_size=self.batch_size, lr=self.lr, hidden=self.hidden, seed=self.seed)

    @classmethod
    def of(cls, training) -> RouterTraining:
        """The budget of a profile's :class:`lpes_nb.studies.profiles.Training` (its recipe and micro-batch)."""
        return cls(**training.recipe, micro_batch=training.micro_batch)


def train_router(model, tokenizer, samples, budget: RouterTraining = RouterTraining(), progress: bool = True,
                 checkpoint: Path | None = None, key: dict | None = None) -> MoICE:
    """Train only the router on the answer loss of ``samples`` (model frozen). Returns the method.

    With ``checkpoint``, the state after every step (router, Adam, losses) is written there, and a
    run stopped part-way resumes from it step for step as if it had not stopped (the batches are
    drawn up front from the seed). A checkpoint made for another ``key`` (default: the budget's
    recipe) is refused, not resumed."""
    method = MoICE()
    method.router = method.new_router(model, budget.hidden, budget.seed)
    prompts, targets, pad = answer_batch(tokenizer, samples)
    rng = np.random.default_rng(budget.seed)
    batches = [rng.choice(len(samples), size=min(budget.batch_size, len(samples)), replace=False) for _ in range(budget.steps)]

    def loss_of(batch):
        return backward_answer_nll(model, [prompts[i] for i in batch], [targets[i] for i in batch], pad,
                                   micro_batch=budget.micro_batch)
    _fit(model, method, torch.optim.Adam(method.router.parameters(), lr=budget.lr), batches, loss_of, budget,
         checkpoint, json.dumps(key or budget.recipe, sort_keys=True), progress)
    return method


@dataclass
class ReferenceTraining:
    """MoICE's training as its reference script runs it (``training/train.sh``): only the gates, the
    whole-sequence language-model loss, AdamW at a constant lr 1e-4 (its ``warmup_ratio`` is ignored
    by the ``constant`` schedule it names), 7 steps of 128 sequences (32 accumulated on each of 4 GPUs).
    Its data is general instruction text (OpenHermes) up to 4,096 tokens; ours is
    :func:`lpes_nb.store.data.general_text` (NQ passages with question and answer, the MDQA-20 questions left
    out) in sequences of ``tokens`` tokens. Its router loss term (0.3 × load balance) is constant when
    every base is kept (top 7 of 7), so it adds no gradient and is left out."""

    steps: int = 7
    batch_size: int = 128
    lr: float = 1e-4
    tokens: int = 1024
    seed: int = 0
    micro_batch: int | None = None  # memory only, not in the recipe
    history: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def recipe(self) -> dict:
        return dict(router="reference", steps=self.steps, batch_size=self.batch_size, lr=self.lr, tokens=self.tokens,
                    seed=self.seed, data="NQ-open oracle passages without the MDQA-20 questions")


def train_reference_router(model, tokenizer, budget: ReferenceTraining = ReferenceTraining(), progress: bool = True,
                           checkpoint: Path | None = None, key: dict | None = None) -> MoICE:
    """MoICE with :class:`ReferenceRouter` trained as published (:class:`ReferenceTraining`), the model
    frozen; checkpointed and resumable as :func:`train_router`. Returns the method."""
    method = MoICE()
    method.router = method.new_reference_router(model, seed=budget.seed)
    text = general_text(tokenizer, budget.steps * budget.batch_size, budget.tokens)
    batches = [text[i * budget.batch_size:(i + 1) * budget.batch_size] for i in range(budget.steps)]
    optimiser = torch.optim.AdamW(method.router.parameters(), lr=budget.lr, weight_decay=0.0)
    _fit(model, method, optimiser, batches, lambda batch: backward_lm_nll(model, batch, budget.micro_batch), budget,
         checkpoint, json.dumps(key or budget.recipe, sort_keys=True), progress)
    return method


def _fit(model, method: MoICE, optimiser, batches: list, loss_of: Callable, budget, checkpoint: Path | None, key: str,
         progress: bool) -> None:
    """The routers' training loop: per batch, ``loss_of(batch)`` (its backward pass, returning the loss)
    under the method, then one optimiser step; ``budget.history`` and ``.seconds`` record it. With
    ``checkpoint``, resumable step for step from the state written after every step; a checkpoint made
    for another ``key`` is refused."""
    if checkpoint is not None and Path(checkpoint).exists():
        state = torch.load(checkpoint, weights_only=True)
        if state["key"] != key:
            raise ValueError(f"MoICE router checkpoint {checkpoint} was made for {state['key']}, this training is "
                             f"{key}; delete the checkpoint to train this recipe from its first step")
        method.router.load_state_dict(state["router"])
        optimiser.load_state_dict(state["adam"])
        budget.history[:], budget.seconds = state["history"], state["seconds"]
    with frozen(model):
        for batch in tqdm(batches[len(budget.history):], desc="MoICE router", initial=len(budget.history),
                          total=len(batches), disable=not progress):
            start = time.perf_counter()
            optimiser.zero_grad()
            with method.context(model, 0, None):
                loss = loss_of(batch)
            optimiser.step()
            budget.history.append(loss)
            budget.seconds += time.perf_counter() - start
            if checkpoint is not None:
                state = io.BytesIO()
                torch.save(dict(key=key, router=method.router.state_dict(), adam=optimiser.state_dict(),
                                history=budget.history, seconds=budget.seconds), state)
                atomic_write(checkpoint, state.getvalue())


def router_files(path: Path) -> tuple[Path, Path, Path]:
    """The weights, the JSON and the training checkpoint of the router named by ``path``, a stem whose
    name may hold dots ("..._qwen2.5-coder-0.5b_float32": a suffix swap would cut it at "0.")."""
    path = Path(path)
    return tuple(path.with_name(path.name + suffix) for suffix in (".safetensors", ".json", ".ckpt.pt"))


def router_digest(router: Router) -> str:
    """The router's weights in 16 hex digits: two routers answer alike only where these agree."""
    return hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in router.parameters())).hexdigest()[:16]


def save_router(method: MoICE, path: Path, budget: RouterTraining | ReferenceTraining, **meta) -> Path:
    """Weights (``.safetensors``) and a JSON beside them with the bases, the budget, the loss
    history, the weights' digest and ``meta``; the JSON is written last, so it exists only beside
    complete weights."""
    weights, info, _ = router_files(path)
    atomic_write(weights, safetensors.torch.save({k: v.contiguous() for k, v in method.router.state_dict().items()}))
    write_json(info, dict(bases=method.bases, **budget.recipe, loss=budget.history,
                          router_digest=router_digest(method.router), **meta))
    return weights


def load_or_train(model, tokenizer, samples, budget: RouterTraining | ReferenceTraining, path: Path, meta: dict | None = None,
                  progress: bool = True) -> MoICE:
    """MoICE with the router trained with this budget and ``meta`` (model, task), known by that recipe:
    on ``samples``' answers (:func:`train_router`), or with a :class:`ReferenceTraining` budget the
    reference router as published, on general text (:func:`train_reference_router`; ``samples`` unused).

    If ``path``'s JSON records this recipe, its loss history is read back and the weights are loaded
    when present; without them they are retrained only when the method first runs, and refused if
    they differ from the weights the JSON's digest names (a retraining on other hardware or library
    versions need not give the same bits, and the results stored under the recipe came from those).
    Otherwise the router is trained now and saved (weights + JSON with budget, loss history, digest
    and wall time). Training writes a checkpoint after every step beside the weights (``.ckpt.pt``),
    resumes from it when stopped part-way (it can take longer than a sitting), and removes it once
    the weights are saved."""
    meta = meta or {}
    weights, info_path, checkpoint = router_files(path)
    wanted = budget.recipe | meta

    def train(made: str | None = None) -> Router:
        will_compute("MoICE router training", weights)
        budget.history.clear()
        budget.seconds = 0.0
        with footprint.study("MoICE router training", steps=budget.steps):
            trained = (train_reference_router(model, tokenizer, budget, progress, checkpoint, wanted)
                       if isinstance(budget, ReferenceTraining) else
                       train_router(model, tokenizer, samples, budget, progress, checkpoint, wanted))
        if made is not None and (digest := router_digest(trained.router)) != made:
            raise RuntimeError(f"MoICE router {path}: retrained from its recipe, its weights are {digest}, "
                               f"but the results stored under this recipe were made by weights {made}; restore "
                               f"{weights.name}, or move this recipe's stored results aside to remake them all with the new router")
        save_router(trained, path, budget, seconds=round(budget.seconds, 1), threads=torch.get_num_threads(), **meta)
        checkpoint.unlink(missing_ok=True)
        return trained.router

    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    if info and all(info.get(k) == v for k, v in wanted.items()):
        budget.history[:] = info["loss"]
        method = (load_router(model, path) if weights.exists()
                  else MoICE(bases=info["bases"], train=lambda: train(info.get("router_digest"))))
    else:
        method = MoICE(router=train())
    method.recipe = cache_key(**wanted)
    method.reference = isinstance(budget, ReferenceTraining)
    return method


def load_router(model, path: Path) -> MoICE:
    weights, info_path, _ = router_files(path)
    info = json.loads(info_path.read_text())
    method = MoICE(bases=info["bases"])
    router = (method.new_reference_router(model, seed=info["seed"]) if info.get("router") == "reference"
              else method.new_router(model, info["hidden"], info["seed"]))
    router.load_state_dict(safetensors.torch.load_file(weights))
    digest = router_digest(router)
    if info.get("router_digest", digest) != digest:
        raise ValueError(f"MoICE router {weights}: its weights are {digest}, "
                         f"its JSON names {info['router_digest']} (the weights its results were made with)")
    method.router = router
    return method

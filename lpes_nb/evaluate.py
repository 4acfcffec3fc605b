"""From "a model under a RoPE configuration" to accuracy by gold position.

Two ways to judge a sample:

* ``generate``: greedy decoding (batched, left padding, stop at the first newline), then the task
  metric on the text: what the papers report.
* ``score``: one teacher-forced forward over prompt + gold answer. "Every gold token is the argmax"
  is exactly "greedy decoding starts with the gold answer", so this gives the same correctness as
  decoding for the answer's canonical tokenisation, plus the gold log-probability, at the cost of a
  single forward with logits kept only for the answer tokens. It is what the searches use.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .data import Sample
from .metrics import (
    accuracy_table,
    kv_correct,
    mdqa_correct,
    passkey_correct,
    u_shape_rho,
)
from .models import model_fingerprint
from .results import cache_key, write_csv
from .rope import RopePatch, RopeSpec, scale_specs

LAMBDAS = (0.2, 0.3, 0.5)  # fitness weights of begin / middle / end accuracy


# --- tokenisation -------------------------------------------------------------------------------


def encode(tokenizer, sample: Sample, chat: bool = False) -> list[int]:
    """Prompt token ids, optionally wrapped in the tokenizer's chat template."""
    if chat:
        return tokenizer.apply_chat_template([{"role": "user", "content": sample.prompt}], add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"]
    return tokenizer(sample.prompt).input_ids


def target_ids(tokenizer, answer: str, chat: bool = False) -> list[int]:
    """The gold answer as the model continues the prompt: after "Answer:" / "Corresponding value:" a
    space, then the answer (SmolLM2 answers the KV prompt with ' 7219\\n', for example); after a chat
    template's assistant header the answer itself, which starts a new line."""
    ids = tokenizer(answer if chat else " " + answer, add_special_tokens=False).input_ids
    if not ids:
        raise ValueError(f"answer {answer!r} tokenises to nothing")
    return ids


def check_lengths(lengths, extra, max_positions: int, on_overflow: str) -> np.ndarray:
    """Boolean mask of prompts that fit; raise (``on_overflow="error"``) or skip (``"skip"``) the rest.
    Never truncates."""
    if on_overflow not in ("error", "skip"):
        raise ValueError(f"on_overflow must be 'error' or 'skip', got {on_overflow!r}")
    needed = np.asarray(lengths) + np.asarray(extra)
    fits = needed <= max_positions
    if not fits.all() and on_overflow == "error":
        raise ValueError(
            f"{int((~fits).sum())} prompt(s) need up to {int(needed.max())} positions (prompt + answer), "
            f"beyond the model's {max_positions}; shorten the task or pass on_overflow='skip'"
        )
    return fits


def _left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return ids, mask


def _batches(order: Sequence[int], batch_size: int):
    for start in range(0, len(order), batch_size):
        yield list(order[start : start + batch_size])


# --- the two judges ------------------------------------------------------------------------------


@torch.inference_mode()
def score_targets(model, prompts: list[list[int]], targets: list[list[int]], batch_size: int = 8,
                  pad_id: int = 0, progress: bool = False, batch_context=None, forward=None) -> tuple[np.ndarray, np.ndarray]:
    """For each (prompt, target): is every target token the argmax under teacher forcing, and the
    target's total log-probability. Batches are left-padded so that all answers end at the last
    position and only ``max(len(target)) + 1`` logits are computed per row. ``batch_context(rows,
    length)``, if given, is entered around each batch (methods that depend on the batch's inputs);
    ``forward(ids, mask, positions, keep)`` replaces the model call (methods that combine passes)."""
    correct = np.zeros(len(prompts), dtype=bool)
    logprob = np.zeros(len(prompts))
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + len(targets[i]))
    for batch in tqdm(list(_batches(order, batch_size)), desc="scoring", disable=not progress, leave=False):
        ids, mask, positions, keep = _forced_inputs([prompts[i] for i in batch], [targets[i] for i in batch], pad_id)
        with batch_context(batch, ids.shape[1]) if batch_context else nullcontext():
            if forward is not None:
                logits = forward(ids, mask, positions, keep)
            else:
                logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep).logits
        logp = torch.log_softmax(logits.float(), dim=-1)
        for row, i in enumerate(batch):
            tgt = torch.tensor(targets[i])
            pred = _target_rows(logp[row], len(tgt), keep)
            correct[i] = bool((pred.argmax(-1) == tgt).all())
            logprob[i] = float(pred.gather(1, tgt[:, None]).sum())
    return correct, logprob


def _forced_inputs(prompts: list[list[int]], targets: list[list[int]], pad_id: int):
    """Left-padded prompt + target ids, mask, positions, and how many final logits cover the targets."""
    ids, mask = _left_pad([p + t for p, t in zip(prompts, targets)], pad_id)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions, max(len(t) for t in targets) + 1


def _target_rows(logp_row: torch.Tensor, target_len: int, keep: int) -> torch.Tensor:
    """The rows of the kept log-probabilities that predict each target token."""
    return logp_row[keep - 1 - target_len : keep - 1]


@contextmanager
def frozen(model):
    """The model's parameters without gradients for a while (training only something beside it),
    restored afterwards."""
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        yield model
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)


def answer_batch(tokenizer, samples: Sequence[Sample]) -> tuple[list[list[int]], list[list[int]], int]:
    """(prompt ids, first gold answer ids, pad id) of samples, as :func:`answer_nll` takes them."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return [encode(tokenizer, s) for s in samples], [target_ids(tokenizer, s.answers[0]) for s in samples], pad


def answer_nll(model, prompts: list[list[int]], targets: list[list[int]], pad_id: int = 0,
               weights: Sequence[float] | None = None) -> torch.Tensor:
    """Differentiable teacher-forced loss of the targets: per sample the mean negative
    log-likelihood of its answer tokens, averaged over the batch with optional ``weights`` (what
    trainable methods, the MoICE router and the gradient-based scale search, minimise)."""
    ids, mask, positions, keep = _forced_inputs(prompts, targets, pad_id)
    logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                   logits_to_keep=keep).logits.float(), dim=-1)
    losses = torch.stack([-_target_rows(logp[row], len(t), keep).gather(1, torch.tensor(t)[:, None]).mean()
                          for row, t in enumerate(targets)])
    w = torch.ones(len(targets)) if weights is None else torch.as_tensor(weights, dtype=torch.float)
    return (losses * w).sum() / w.sum()


@torch.inference_mode()
def greedy_generate(model, tokenizer, prompts: list[list[int]], max_new_tokens: int = 8, batch_size: int = 8,
                    stop_at_newline: bool = True, progress: bool = False, batch_context=None,
                    generate=None) -> list[str]:
    """Greedy continuations (text), batched with left padding, each stopping at its first newline;
    ``batch_context`` as in :func:`score_targets`; ``generate(ids, mask, max_new_tokens)`` -> new token
    ids replaces ``model.generate`` (methods that combine passes)."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    texts: list[str] = [""] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    # without the newline stop, decode exactly max_new_tokens (fixed work, e.g. for latency tables)
    extra = dict(stop_strings=["\n"], tokenizer=tokenizer) if stop_at_newline else dict(min_new_tokens=max_new_tokens)
    for batch in tqdm(list(_batches(order, batch_size)), desc="generating", disable=not progress, leave=False):
        ids, mask = _left_pad([prompts[i] for i in batch], pad_id)
        with batch_context(batch, ids.shape[1]) if batch_context else nullcontext():
            if generate is not None:
                new = generate(ids, mask, max_new_tokens)
            else:
                new = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=pad_id, top_p=None, top_k=None, temperature=None, **extra)[:, ids.shape[1]:]
        for row, i in enumerate(batch):
            text = tokenizer.decode(new[row], skip_special_tokens=True)
            texts[i] = text[: text.index("\n") + 1] if stop_at_newline and "\n" in text else text
    return texts


CORRECT = {"mdqa": mdqa_correct, "passkey": lambda pred, answers: passkey_correct(pred, answers[0]),
           "kv": lambda pred, answers: kv_correct(pred, answers[0]),
           "two_fact": lambda pred, answers: kv_correct(pred, answers[0])}


# --- evaluation of a task under a RoPE configuration -----------------------------------------------


@dataclass(frozen=True)
class EvalSettings:
    mode: str = "score"  # "score" (one forward) or "generate" (greedy decoding)
    max_new_tokens: int = 8
    batch_size: int = 8
    chat: bool = False
    on_overflow: str = "error"
    stop_at_newline: bool = True  # generate mode: stop each answer at its first newline

    def __post_init__(self):
        if self.mode not in ("score", "generate"):
            raise ValueError(f"mode must be 'score' or 'generate', got {self.mode!r}")
        for name in ("max_new_tokens", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"EvalSettings.{name} must be an integer >= 1, got {value!r}")
        if self.on_overflow not in ("error", "skip"):
            raise ValueError(f"on_overflow must be 'error' or 'skip', got {self.on_overflow!r}")
        for name in ("chat", "stop_at_newline"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"EvalSettings.{name} must be True or False, got {getattr(self, name)!r}")


def rope_context(model, specs: Sequence[RopeSpec | None] | None):
    return RopePatch(model, specs) if specs is not None else nullcontext()


def token_segments(tokenizer, sample: Sample) -> list[int]:
    """Per prompt token, the context item it belongs to: 0 before the first item, k + 1 inside item k
    (and the separator after it), len(spans) + 1 after the last item (the question)."""
    offsets = tokenizer(sample.prompt, return_offsets_mapping=True)["offset_mapping"]
    starts = [a for a, _ in sample.spans]
    last_end = sample.spans[-1][1] if sample.spans else 0
    out = []
    for start, _ in offsets:
        seg = sum(1 for a in starts if a <= start)
        out.append(len(starts) + 1 if sample.spans and start >= last_end else seg)
    return out


def evaluate_samples(model, tokenizer, samples: Sequence[Sample], specs: Sequence[RopeSpec | None] | None = None,
                     settings: EvalSettings = EvalSettings(), progress: bool = True, method=None) -> pd.DataFrame:
    """One row per sample: task, position, sample, correct (+ gold_logprob or prediction).

    The model runs under per-layer ``specs`` or under a ``method`` from :mod:`lpes_nb.methods` (whose
    context may depend on each batch's inputs, e.g. document membership), not both."""
    if specs is not None and method is not None:
        raise ValueError("give either specs or a method, not both")
    prompts = [encode(tokenizer, s, settings.chat) for s in samples]
    segments = None
    if method is not None and method.needs_segments:
        if settings.chat:
            raise ValueError(f"{method.name} remaps positions by document and needs prompts without a chat template")
        segments = [token_segments(tokenizer, s) for s in samples]
    if settings.mode == "score":
        # several gold aliases (MDQA): score each, correct if any is; log-prob of the best alias
        pairs = [(i, target_ids(tokenizer, a, settings.chat)) for i, s in enumerate(samples) for a in dict.fromkeys(s.answers)]
        extra = [len(t) for _, t in pairs]
        lengths = [len(prompts[i]) for i, _ in pairs]
    else:
        extra = [settings.max_new_tokens] * len(samples)
        lengths = [len(p) for p in prompts]
    fits = check_lengths(lengths, extra, model.config.max_position_embeddings, settings.on_overflow)
    rows = [{"task": s.task, "position": s.position, "num_items": s.num_items, "sample": s.sample_id,
             "prompt_tokens": len(p)} for s, p in zip(samples, prompts)]
    def method_context(sample_index):
        if method is None:
            return None
        return lambda rows, length: method.context(
            model, None if segments is None else [segments[sample_index[r]] for r in rows], length)

    with rope_context(model, specs):
        if settings.mode == "score":
            kept = [pair for pair, ok in zip(pairs, fits) if ok]
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
            correct, logprob = score_targets(model, [prompts[i] for i, _ in kept], [t for _, t in kept],
                                             settings.batch_size, pad, progress, method_context([i for i, _ in kept]),
                                             forward=getattr(method, "forward", None) and (lambda *a: method.forward(model, *a)))
            for row in rows:
                row.update(correct=0.0, gold_logprob=-np.inf, skipped=True)
            for (i, _), c, lp in zip(kept, correct, logprob):
                rows[i]["correct"] = max(rows[i]["correct"], float(c))
                rows[i]["gold_logprob"] = max(rows[i]["gold_logprob"], lp)
                rows[i]["skipped"] = False
        else:
            keep = [i for i in range(len(samples)) if fits[i]]
            texts = greedy_generate(model, tokenizer, [prompts[i] for i in keep], settings.max_new_tokens,
                                    settings.batch_size, settings.stop_at_newline, progress=progress,
                                    batch_context=method_context(keep),
                                    generate=getattr(method, "generate", None) and (lambda *a: method.generate(model, *a)))
            for row in rows:
                row.update(correct=0.0, prediction=None, skipped=True)
            for i, text in zip(keep, texts):
                s = samples[i]
                rows[i].update(correct=CORRECT[s.task](text, s.answers), prediction=text, skipped=False)
    df = pd.DataFrame(rows)
    skipped = int(df["skipped"].sum())
    if skipped:
        print(f"[evaluate] skipped {skipped} of {len(df)} samples longer than the model's positions")
    out = df[~df["skipped"]].drop(columns="skipped").reset_index(drop=True)
    out.attrs["skipped"] = skipped
    return out


def position_table(df: pd.DataFrame, lambdas: Sequence[float] = LAMBDAS, **labels) -> pd.DataFrame:
    """The summary every study reports for one evaluated setting: accuracy by gold position (n,
    mean, 95 % CI), ρ(δ, a), the λ-fitness (NaN unless there are exactly 3 positions), mean prompt
    tokens, and the ``labels`` (method, task, ...) as leading columns."""
    table = accuracy_table(df, by="position")
    for i, (name, value) in enumerate(labels.items()):
        table.insert(i, name, value)
    table["prompt_tokens"] = df.groupby("position")["prompt_tokens"].mean().to_numpy().round()
    table["rho"] = u_shape_rho(table["position"], table["mean"]) if len(table) >= 3 else np.nan
    table["fitness"] = weighted_fitness(df, lambdas) if len(table) == 3 else np.nan
    return table


def weighted_fitness(df: pd.DataFrame, lambdas: Sequence[float] = LAMBDAS) -> float:
    """λ_B·acc(begin) + λ_M·acc(middle) + λ_E·acc(end): positions sorted, the first / median / last."""
    acc = df.groupby("position")["correct"].mean().sort_index()
    if len(acc) != 3:
        raise ValueError(f"the fitness needs exactly 3 gold positions (begin, middle, end), got {list(acc.index)}")
    return float(np.dot(lambdas, acc.to_numpy()))


# --- results cache and the GA fitness --------------------------------------------------------------


class ResultCache:
    """Evaluation tables on disk under ``directory``, one CSV per key, written atomically."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.csv"

    def get(self, key: str) -> pd.DataFrame | None:
        path = self.path(key)
        return pd.read_csv(path) if path.exists() else None

    def put(self, key: str, df: pd.DataFrame) -> None:
        write_csv(self.path(key), df)


class PositionFitness:
    """The GA's fitness: per-layer scales (B, L) -> λ-weighted accuracy at begin / middle / end.

    ``tie_break`` adds a tiny multiple of the mean gold log-probability so that individuals with the
    same accuracy are ordered by confidence (0 reproduces the paper's pure accuracy fitness)."""

    def __init__(self, model, tokenizer, samples: Sequence[Sample], settings: EvalSettings = EvalSettings(),
                 lambdas: Sequence[float] = LAMBDAS, cache: ResultCache | None = None, model_name: str = "",
                 tie_break: float = 0.0):
        if len({s.position for s in samples}) != 3:
            raise ValueError("PositionFitness needs samples at exactly 3 gold positions (begin, middle, end)")
        if len(lambdas) != 3 or any(l < 0 for l in lambdas):
            raise ValueError(f"lambdas must be 3 non-negative weights, got {lambdas!r}")
        self.model, self.tokenizer, self.samples = model, tokenizer, list(samples)
        self.settings, self.lambdas, self.cache, self.tie_break = settings, tuple(lambdas), cache, tie_break
        self._task_key = dict(model=model_name, weights=model_fingerprint(model), settings=asdict(settings),
                              samples=hashlib.sha256("".join(s.prompt + "|".join(s.answers) for s in samples).encode()).hexdigest())

    def fingerprint(self) -> str:
        """What this fitness measures (model weights and dtype, samples, settings, weights of the
        positions): a GA checkpoint resumes only under the same fingerprint."""
        return cache_key(**self._task_key, lambdas=self.lambdas, tie_break=self.tie_break)

    def table(self, scales: Sequence[float]) -> pd.DataFrame:
        key = cache_key(scales=[round(float(s), 10) for s in scales], **self._task_key)
        if self.cache is not None and (hit := self.cache.get(key)) is not None:
            return hit
        df = evaluate_samples(self.model, self.tokenizer, self.samples, scale_specs(scales), self.settings, progress=False)
        if self.cache is not None:
            self.cache.put(key, df)
        return df

    def __call__(self, scales_batch: np.ndarray) -> np.ndarray:
        out = []
        for scales in tqdm(np.atleast_2d(scales_batch), desc="fitness", leave=False):
            df = self.table(scales)
            fit = weighted_fitness(df, self.lambdas)
            if self.tie_break and "gold_logprob" in df:
                fit += self.tie_break * float(df["gold_logprob"].mean())
            out.append(fit)
        return np.array(out)

"""Training beside a frozen model: the differentiable answer loss that the trainable methods (the
MoICE router, the gradient-based scale search) minimise, and freezing the model meanwhile."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import torch

from ..store.data import Sample
from .evaluate import encode, forced_inputs, target_ids, target_rows


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
    ids, mask, positions, keep = forced_inputs(prompts, targets, pad_id, model.device)
    logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                   logits_to_keep=keep).logits.float(), dim=-1)
    losses = torch.stack([-target_rows(logp[row], len(t), keep).gather(1, torch.tensor(t, device=logp.device)[:, None]).mean()
                          for row, t in enumerate(targets)])
    w = torch.ones(len(targets)) if weights is None else torch.as_tensor(weights, dtype=torch.float)
    w = w.to(logp.device)
    return (losses * w).sum() / w.sum()


def backward_answer_nll(model, prompts: list[list[int]], targets: list[list[int]], pad_id: int = 0,
                        weights: Sequence[float] | None = None, micro_batch: int | None = None) -> float:
    """``answer_nll(...).backward()``, returning the loss. With ``micro_batch``, in chunks of that many
    samples, each chunk's weighted loss scaled by its share of the weights: the same gradient (the
    weighted mean is the sum of those parts), with the activations of only ``micro_batch`` prompts
    kept for the backward pass at a time (a 7B model would keep ~418 GiB for 16 prompts of 5.5k
    tokens, 26 GiB for one: docs/gpu.md, "What the paper profile costs")."""
    if micro_batch is not None and (isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1):
        raise ValueError(f"micro_batch must be None (the whole batch) or an integer >= 1, got {micro_batch!r}")
    if micro_batch is None or micro_batch >= len(prompts):
        loss = answer_nll(model, prompts, targets, pad_id, weights)
        loss.backward()
        return float(loss.detach())
    w = [1.0] * len(prompts) if weights is None else [float(v) for v in weights]
    total, value = sum(w), 0.0
    for start in range(0, len(prompts), micro_batch):
        part = slice(start, start + micro_batch)
        loss = answer_nll(model, prompts[part], targets[part], pad_id, w[part]) * (sum(w[part]) / total)
        loss.backward()
        value += float(loss.detach())
    return value


def backward_lm_nll(model, sequences: list[list[int]], micro_batch: int | None = None) -> float:
    """The whole-sequence language-model loss (mean negative log-likelihood of every next token, as the
    reference MoICE trains its router: ``pretrain_loss``) over equally long ``sequences``, backward in
    chunks of ``micro_batch`` sequences (the same gradient); returns the loss."""
    if len({len(s) for s in sequences}) != 1 or len(sequences[0]) < 2:
        raise ValueError(f"sequences must be equally long, of >= 2 tokens; got lengths {sorted({len(s) for s in sequences})}")
    step = micro_batch or len(sequences)
    value = 0.0
    for start in range(0, len(sequences), step):
        ids = torch.tensor(sequences[start:start + step], device=model.device)
        logits = model(input_ids=ids).logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss = loss * (len(ids) / len(sequences))
        loss.backward()
        value += float(loss.detach())
    return value

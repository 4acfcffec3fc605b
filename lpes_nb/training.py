"""Training beside a frozen model: the differentiable answer loss that the trainable methods (the
MoICE router, the gradient-based scale search) minimise, and freezing the model meanwhile."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import torch

from .data import Sample
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
    ids, mask, positions, keep = forced_inputs(prompts, targets, pad_id)
    logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                   logits_to_keep=keep).logits.float(), dim=-1)
    losses = torch.stack([-target_rows(logp[row], len(t), keep).gather(1, torch.tensor(t)[:, None]).mean()
                          for row, t in enumerate(targets)])
    w = torch.ones(len(targets)) if weights is None else torch.as_tensor(weights, dtype=torch.float)
    return (losses * w).sum() / w.sum()

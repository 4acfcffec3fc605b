"""Shared-prefix evaluation: the prompts of one record at several gold positions are identical up to
the first place they differ (instruction + the items before the earlier gold position), so their
keys and values there are identical too under any method whose angles depend only on each token's
own position. Per record, one *anchor* prompt is computed in full; every other prompt continues from
the anchor's keys and values cropped to their common prefix. Decoding is then batched across prompts
(left-padded caches) as in the plain path.

Exact up to floating-point summation order (float32: last-token logits within 1e-4 of the plain path
and identical answers, tested on tiny and both embedded models). A method declares whether it may
share (``Method.shares_prefix``): not where its angles depend on the whole prompt (Dynamic NTK: the
length; Ms-PoE: the last query; CALIOPE: document membership) or where it runs passes of its own
(Attention Buckets). Models with sliding-window layers (whose caches drop old keys) take the plain
path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [B, H_kv, T, D]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n


@dataclass(frozen=True)
class PrefixPlan:
    """For one group of prompts: the anchor (computed in full) and, per prompt, how many of its
    leading tokens are taken from the anchor's cache (at most its length − 1: the last prompt token
    is always computed, its logits start the answer). The anchor maximises the tokens saved."""

    anchor: int
    shared: tuple[int, ...]

    @staticmethod
    def of(prompts: Sequence[Sequence[int]]) -> "PrefixPlan":
        def reuse(i: int) -> list[int]:
            return [0 if j == i else min(common_prefix(prompts[i], p), len(p) - 1) for j, p in enumerate(prompts)]

        plans = [reuse(i) for i in range(len(prompts))]
        anchor = int(np.argmax([sum(p) for p in plans]))
        return PrefixPlan(anchor, tuple(plans[anchor]))


def token_ratio(groups: Sequence[Sequence[Sequence[int]]]) -> float:
    """Tokens a shared-prefix pass computes ÷ tokens the plain path computes, over groups of prompts."""
    total = sum(len(p) for g in groups for p in g)
    shared = sum(sum(PrefixPlan.of(g).shared) for g in groups)
    return (total - shared) / total


def supports_sharing(model) -> bool:
    """Whether every layer keeps all its keys (no sliding window), so a cache can be cropped, and the
    model's own greedy decoding is plain argmax (no repetition penalty or n-gram ban in its generation
    config, which :func:`greedy_decode` does not apply)."""
    gen = model.generation_config
    plain = ((gen.repetition_penalty or 1.0) == 1.0 and not gen.no_repeat_ngram_size and not gen.bad_words_ids
             and (gen.encoder_repetition_penalty or 1.0) == 1.0)
    return plain and not any(layer.is_sliding for layer in DynamicCache(config=model.config).layers)


def _cache(kv: KV, upto: int | None = None) -> DynamicCache:
    return DynamicCache([(k[..., :upto, :], v[..., :upto, :]) for k, v in kv])


def _kv(cache: DynamicCache) -> KV:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _forward(model, ids: Sequence[int], start: int, kv: KV | None, keep: int):
    """Forward ``ids[start:]`` after the cached first ``start`` tokens of ``kv`` (none if start = 0):
    the last ``keep`` logits and the full keys and values."""
    tail = torch.tensor([list(ids[start:])], device=model.device)
    cache = _cache(kv, start) if start else DynamicCache(config=model.config)
    out = model(input_ids=tail, position_ids=torch.arange(start, len(ids), device=model.device)[None], past_key_values=cache,
                use_cache=True, logits_to_keep=keep)
    return out.logits[0], _kv(out.past_key_values)


def prefill(model, prompts: Sequence[Sequence[int]], extra: Sequence[Sequence[int]] | None = None):
    """Every prompt of one group through the anchor's prefix: per prompt, the last ``len(extra) + 1``
    logits of prompt + ``extra`` (teacher-forced continuation; default none) and the keys and values of
    the prompt alone. Call inside the method's context."""
    plan = PrefixPlan.of(prompts)
    extra = extra or [[] for _ in prompts]
    order = [plan.anchor] + [i for i in range(len(prompts)) if i != plan.anchor]
    logits, kvs = [None] * len(prompts), [None] * len(prompts)
    anchor_kv = None
    for i in order:
        ids = list(prompts[i]) + list(extra[i])
        logits[i], kv = _forward(model, ids, plan.shared[i], anchor_kv, len(extra[i]) + 1)
        # causal attention: the prompt's own keys and values do not see what follows it
        kvs[i] = [(k[..., : len(prompts[i]), :], v[..., : len(prompts[i]), :]) for k, v in kv]
        if i == plan.anchor:
            anchor_kv = kvs[i]
    return logits, kvs


def continuation_logprob(model, prompt_kv: KV, prompt_len: int, last_logits: torch.Tensor, target: Sequence[int]):
    """Teacher-forced (all target tokens are the argmax, total log-probability) of ``target`` after a
    prefilled prompt, from its keys and values and its last logits (one forward of the target's
    first len − 1 tokens)."""
    rows = [last_logits[-1]]
    if len(target) > 1:
        out = model(input_ids=torch.tensor([list(target[:-1])], device=model.device),
                    position_ids=torch.arange(prompt_len, prompt_len + len(target) - 1, device=model.device)[None],
                    past_key_values=_cache(prompt_kv), use_cache=True, logits_to_keep=len(target) - 1)
        rows += list(out.logits[0])
    logp = torch.log_softmax(torch.stack(rows).float(), dim=-1)
    tgt = torch.tensor(list(target), device=logp.device)
    return bool((logp.argmax(-1) == tgt).all()), float(logp.gather(1, tgt[:, None]).sum())


def stop_ids(model, tokenizer) -> set[int]:
    """The tokens that end generation as ``model.generate`` ends it (the generation config's eos ids)."""
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
    return ids | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())


def greedy_decode(model, tokenizer, kvs: Sequence[KV], lengths: Sequence[int], first_logits: Sequence[torch.Tensor],
                  max_new_tokens: int, stop_at_newline: bool) -> list[tuple[str, bool]]:
    """Batched greedy decoding from prefilled prompts (their keys and values, left-padded into one
    cache, and their last logits): per prompt the text (cut after its first newline where decoding
    stops at one) and whether it ended by itself, as :func:`lpes_nb.evaluate.generate_answers`."""
    width = max(lengths)
    pad = [width - n for n in lengths]

    def padded(t: torch.Tensor, p: int) -> torch.Tensor:
        return torch.cat([t.new_zeros(*t.shape[:-2], p, t.shape[-1]), t], dim=-2) if p else t

    kv = [(torch.cat([padded(kvs[b][layer][0], pad[b]) for b in range(len(kvs))]),
           torch.cat([padded(kvs[b][layer][1], pad[b]) for b in range(len(kvs))])) for layer in range(len(kvs[0]))]
    cache = _cache(kv)
    mask = torch.tensor([[0] * p + [1] * n for p, n in zip(pad, lengths)], device=model.device)
    position = torch.tensor(lengths, device=model.device)[:, None]
    ends = stop_ids(model, tokenizer)
    token = torch.stack([l[-1] for l in first_logits]).argmax(-1)
    tokens: list[list[int]] = [[] for _ in lengths]
    done = [False] * len(lengths)
    for step in range(max_new_tokens):
        for b, t in enumerate(token.tolist()):
            if not done[b]:
                tokens[b].append(t)
                done[b] = t in ends or (stop_at_newline and "\n" in tokenizer.decode(tokens[b], skip_special_tokens=True))
        if all(done) or step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones(len(lengths), 1, dtype=mask.dtype, device=mask.device)], dim=1)
        out = model(input_ids=token[:, None], attention_mask=mask, position_ids=position + step, past_key_values=cache,
                    use_cache=True, logits_to_keep=1)
        cache, token = out.past_key_values, out.logits[:, -1].argmax(-1)
    answers = []
    for toks in tokens:
        text = tokenizer.decode(toks, skip_special_tokens=True)
        ended = bool(ends & set(toks)) or (stop_at_newline and "\n" in text)
        answers.append((text[: text.index("\n") + 1] if stop_at_newline and "\n" in text else text, ended))
    return answers

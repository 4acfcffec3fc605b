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

from collections.abc import Iterable, Iterator, Sequence
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


def _cache(kv: Iterable[tuple[torch.Tensor, torch.Tensor]], upto: int | None = None) -> DynamicCache:
    """A cache of ``kv``'s layers (cut at ``upto`` positions). transformers copies each layer into the
    cache (it concatenates onto an empty tensor), so a caller that builds a batch's layers passes them
    as a generator: each layer's source is then freed once copied, where a list of them held the
    batch's keys and values twice (measured on an H200: a 7B-shaped model at batch 16 peaked at
    70.9 GiB, 29 GiB of it that second copy)."""
    return DynamicCache((k[..., :upto, :], v[..., :upto, :]) for k, v in kv)


def _kv(cache: DynamicCache) -> KV:
    return [(layer.keys, layer.values) for layer in cache.layers]


def check_chunk(chunk) -> None:
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise ValueError(f"prefill_chunk must be None (one pass) or an integer >= 1 (tokens per piece), got {chunk!r}")


def _pieces(model, ids: torch.Tensor, positions: torch.Tensor, cache: DynamicCache, keep: int, chunk: int | None,
            mask: torch.Tensor | None = None):
    """Forward ``ids`` [B, N] after ``cache`` (which grows in place), in pieces of at most ``chunk``
    tokens (None: one pass), the last piece holding the ``keep`` logits asked for; ``mask`` covers the
    cache and all N new columns. Why pieces: once a cache precedes the queries, attention gets an
    explicit mask and SDPA computes the whole query x key rectangle, the masked upper triangle of
    the new block included (15.3 s vs 11.3 s in 512-token pieces for a 3.2k-token continuation of
    Qwen in bf16 on 2 AMD EPYC cores). Pieces are exact up to summation order but not bitwise equal
    in bf16 (other matmul shapes), so a stored result names its chunk."""
    check_chunk(chunk)
    n = ids.shape[1]
    tail = n if chunk is None else min(n, max(chunk, keep))
    edges = [*range(0, n - tail, chunk or 1), n - tail, n]
    for a, b in zip(edges, edges[1:]):
        out = model(input_ids=ids[:, a:b], position_ids=positions[:, a:b], past_key_values=cache, use_cache=True,
                    attention_mask=None if mask is None else mask[:, : mask.shape[1] - n + b],
                    logits_to_keep=keep if b == n else 1)
        cache = out.past_key_values
    return out


def _forward(model, ids: Sequence[int], start: int, kv: KV | None, keep: int, chunk: int | None = None):
    """Forward ``ids[start:]`` after the cached first ``start`` tokens of ``kv`` (none if start = 0):
    the last ``keep`` logits and the full keys and values."""
    tail = torch.tensor([list(ids[start:])], device=model.device)
    cache = _cache(kv, start) if start else DynamicCache(config=model.config)
    out = _pieces(model, tail, torch.arange(start, len(ids), device=model.device)[None], cache, keep,
                  chunk if start else None)
    return out.logits[0], _kv(out.past_key_values)


def prefill(model, prompts: Sequence[Sequence[int]], extra: Sequence[Sequence[int]] | None = None,
            chunk: int | None = None):
    """Every prompt of one group through the anchor's prefix: per prompt, the last ``len(extra) + 1``
    logits of prompt + ``extra`` (teacher-forced continuation; default none) and the keys and values of
    the prompt alone; continuations in pieces of ``chunk`` tokens (:func:`_pieces`). Call inside the
    method's context."""
    plan = PrefixPlan.of(prompts)
    extra = extra or [[] for _ in prompts]
    order = [plan.anchor] + [i for i in range(len(prompts)) if i != plan.anchor]
    logits, kvs = [None] * len(prompts), [None] * len(prompts)
    anchor_kv = None
    for i in order:
        ids = list(prompts[i]) + list(extra[i])
        logits[i], kv = _forward(model, ids, plan.shared[i], anchor_kv, len(extra[i]) + 1, chunk)
        # causal attention: the prompt's own keys and values do not see what follows it
        kvs[i] = [(k[..., : len(prompts[i]), :], v[..., : len(prompts[i]), :]) for k, v in kv]
        if i == plan.anchor:
            anchor_kv = kvs[i]
    return logits, kvs


# rows of one batched continuation, at most this many tokens (rows x longest row, cache included): on
# a 2-core CPU a padded batch of long prompts costs more per prompt than one prompt alone (the padding
# mask takes attention off its fast path: 6.2 vs 3.3 s per 3.2k-token Qwen bf16 prompt on an Intel Xeon
# with AMX, 9.1 vs 6.3 s on an AMD EPYC with AVX512-BF16), so long prompts run one
# at a time and short ones (a KV fitness: ~300 tokens) in batches
TOKEN_BUDGET = 4096
# one forward's fixed cost (Python, per-layer kernel launches) in tokens' worth of compute: SmolLM2 on
# 2 AMD EPYC cores, one row of 16 tokens 140 ms against ~2.7 ms per token in rows of 150-280 tokens
FORWARD_OVERHEAD_TOKENS = 48


def partition(widths: Sequence[tuple[int, int]], max_batch: int, token_budget: int = TOKEN_BUDGET,
              overhead: int = FORWARD_OVERHEAD_TOKENS) -> list[list[int]]:
    """Batches (runs of consecutive indices) of rows given in order of their new tokens, each row as
    (cached tokens, new tokens), that compute the fewest tokens: every row of a batch is padded to its
    longest continuation, and each batch costs ``overhead`` tokens more. A batch holds at most
    ``max_batch`` rows and ``token_budget`` tokens (rows x (longest cache + longest continuation)).
    Why not fill batches greedily: a batch boundary that falls inside a run of similar lengths pads the
    short rows left over to the next run's length (a KV fitness: 2 continuations of 151 tokens padded
    to 276, 5 % of the evaluation's tokens)."""
    n = len(widths)
    best, cut = [0.0] + [np.inf] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        cached = new = 0
        for i in range(j - 1, -1, -1):  # the batch i..j-1
            cached, new = max(cached, widths[i][0]), max(new, widths[i][1])
            rows = j - i
            if rows > 1 and (rows > max_batch or rows * (cached + new) > token_budget):
                break
            cost = best[i] + rows * new + overhead
            if cost < best[j]:
                best[j], cut[j] = cost, i
    batches, j = [], n
    while j:
        batches.append(list(range(cut[j], j)))
        j = cut[j]
    return batches[::-1]


def _continue_batch(model, rows, keep: int, chunk: int | None = None):
    """One forward over ``rows`` = [(ids, start, anchor_kv or None)]: each row continues ``ids[start:]``
    after the first ``start`` keys and values of its anchor. Caches are left-padded to the longest
    ``start`` and the new tokens to the longest continuation (masked, positions explicit), so every
    row's last token sits at the end: the last ``keep`` logits per row, and the batch's keys and
    values with the mask that says which columns are a row's own."""
    width_cached = max(start for _, start, _ in rows)
    width_new = max(len(ids) - start for ids, start, _ in rows)
    device = model.device
    mask, ids_in, positions = [], [], []
    for ids, start, _ in rows:
        n = len(ids) - start
        mask.append([0] * (width_cached - start) + [1] * start + [0] * (width_new - n) + [1] * n)
        ids_in.append([0] * (width_new - n) + list(ids[start:]))
        positions.append([start] * (width_new - n) + list(range(start, len(ids))))
    cache = DynamicCache(config=model.config)
    if width_cached:
        layers = len(next(kv for _, _, kv in rows if kv is not None))

        def padded(kv, start, which, layer):
            if not start:
                ref = next(kv for _, _, kv in rows if kv is not None)[layer][which]
                return ref.new_zeros(*ref.shape[:-2], width_cached, ref.shape[-1])
            t = kv[layer][which][..., :start, :]
            return torch.cat([t.new_zeros(*t.shape[:-2], width_cached - start, t.shape[-1]), t], dim=-2)

        cache = _cache((torch.cat([padded(kv, start, 0, layer) for _, start, kv in rows]),
                        torch.cat([padded(kv, start, 1, layer) for _, start, kv in rows])) for layer in range(layers))
    mask = torch.tensor(mask, device=device)
    out = _pieces(model, torch.tensor(ids_in, device=device), torch.tensor(positions, device=device), cache, keep,
                  chunk if width_cached else None, mask)
    return out.logits, _kv(out.past_key_values), mask


def prefill_many(model, groups: Sequence[Sequence[Sequence[int]]], extras=None, token_budget: int = TOKEN_BUDGET,
                 max_batch: int = 8, chunk: int | None = None):
    """:func:`prefill` for many groups at once, batched across groups: first every group's anchor, then
    every other prompt from its anchor's cache, in batches of at most ``max_batch`` rows and
    ``token_budget`` tokens (rows sorted by length, cut where padding costs least: :func:`partition`).
    Per group, per prompt: the last ``len(extra) + 1`` logits of prompt + extra; continuations in
    pieces of ``chunk`` tokens (:func:`_pieces`). A prompt that repeats one before it in its group (another target scored after
    the same prompt: MDQA's answer aliases) continues from that prompt's own keys and values, so only
    its last prompt token and its extra are computed. Call inside the method's context."""
    extras = extras or [[[] for _ in g] for g in groups]
    if len(extras) != len(groups) or any(len(x) != len(g) for g, x in zip(groups, extras)):
        raise ValueError(f"extras must hold one list of extra tokens per prompt of each group: {len(groups)} groups of "
                         f"{[len(g) for g in groups]} prompts, got {len(extras)} groups of {[len(x) for x in extras]}")
    plans, source = [], {}  # source: a repeated prompt -> its first occurrence
    for g, group in enumerate(groups):
        first: dict[tuple, int] = {}
        for i, p in enumerate(group):
            if first.setdefault(tuple(p), i) != i:
                source[(g, i)] = (g, first[tuple(p)])
        # the anchor among the distinct prompts: a repeat saves its prompt whichever the anchor is
        distinct = list(first.values())
        plan, shared = PrefixPlan.of([group[i] for i in distinct]), [0] * len(group)
        for d, i in enumerate(distinct):
            shared[i] = plan.shared[d]
        plans.append(PrefixPlan(distinct[plan.anchor], tuple(shared)))
    full = [[list(p) + list(e) for p, e in zip(g, x)] for g, x in zip(groups, extras)]
    logits: list[list] = [[None] * len(g) for g in groups]
    kept: dict[tuple[int, int], KV] = {}  # the prompt-only keys and values a later row continues from
    needed = {(g, plan.anchor) for g, plan in enumerate(plans)} | set(source.values())

    def run(items, start_of, kv_of):
        items = sorted(items, key=lambda gi: len(full[gi[0]][gi[1]]) - start_of(gi))
        widths = [(start_of(gi), len(full[gi[0]][gi[1]]) - start_of(gi)) for gi in items]
        for rows_of_batch in partition(widths, max_batch, token_budget):
            batch = [items[r] for r in rows_of_batch]
            rows = [(full[g][i], start_of((g, i)), kv_of((g, i))) for g, i in batch]
            keep = max(len(extras[g][i]) + 1 for g, i in batch)
            out, kv, mask = _continue_batch(model, rows, keep, chunk)
            for r, (g, i) in enumerate(batch):
                logits[g][i] = out[r, keep - len(extras[g][i]) - 1:]
                if (g, i) in needed:  # its own columns, its prompt only (not its extra tokens)
                    cols = mask[r].bool().nonzero().squeeze(-1)[: len(groups[g][i])]
                    kept[(g, i)] = [(k[r:r + 1, :, cols, :], v[r:r + 1, :, cols, :]) for k, v in kv]

    run([(g, plan.anchor) for g, plan in enumerate(plans)], lambda gi: 0, lambda gi: None)
    others = [(g, i) for g, plan in enumerate(plans) for i in range(len(groups[g])) if i != plan.anchor and (g, i) not in source]
    run(others, lambda gi: plans[gi[0]].shared[gi[1]], lambda gi: kept[(gi[0], plans[gi[0]].anchor)])
    # a repeat takes all but the last token of its prompt from its first occurrence (the last one's
    # logits start its extra, as for every row)
    run(list(source), lambda gi: len(groups[gi[0]][gi[1]]) - 1, lambda gi: kept[source[gi]])
    return logits


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


def _batch_kv(kvs: Sequence[KV], lengths: Sequence[int]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The prompts' keys and values left-padded (zeros) into one [B, H_kv, width, D] pair per layer,
    yielded layer by layer for :func:`_cache`. Each prompt's layer is released as soon as it is copied
    (its entry in ``kvs`` set to None): holding every prompt's cache beside the batch's doubles
    decoding's memory (a 7B MHA model, 18 MDQA-20 prompts: out of memory on an 80 GB H100, where the
    plain path fits)."""
    width = max(lengths)
    for layer in range(len(kvs[0])):
        k0, v0 = kvs[0][layer]
        keys = k0.new_zeros(len(kvs), k0.shape[1], width, k0.shape[-1])
        values = v0.new_zeros(len(kvs), v0.shape[1], width, v0.shape[-1])
        for b, n in enumerate(lengths):
            k, v = kvs[b][layer]
            keys[b, :, width - n:], values[b, :, width - n:] = k[0], v[0]
            kvs[b][layer] = None
        yield keys, values


def greedy_decode(model, tokenizer, kvs: Sequence[KV], lengths: Sequence[int], first_logits: Sequence[torch.Tensor],
                  max_new_tokens: int, stop_at_newline: bool) -> list[tuple[str, bool]]:
    """Batched greedy decoding from prefilled prompts (their keys and values, left-padded into one
    cache, and their last logits): per prompt the text (cut after its first newline where decoding
    stops at one) and whether it ended by itself, as :func:`lpes_nb.evaluation.evaluate.generate_answers`.
    Consumes ``kvs``: each prompt's keys and values are released into the batch's cache."""
    pad = [max(lengths) - n for n in lengths]
    cache = _cache(_batch_kv(kvs, lengths))
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

"""From "a model under a RoPE configuration" to accuracy by gold position.

Two ways to judge a sample:

* ``generate``: greedy decoding (batched, left padding, stop at the first newline), then the task
  metric on the text: what the papers report.
* ``score``: one teacher-forced forward over prompt + gold answer, the answer written in each of
  its task's surface forms (:attr:`lpes_nb.evaluation.tasks.Task.answer_forms`: a KV value with or without the
  prompt's quotes). "Every token of one form is the argmax" is "greedy decoding starts with the gold
  answer in that form" (for the form's canonical tokenisation), so this gives greedy decoding's
  correctness on that prefix, plus the gold log-probability (of the likeliest form), at the cost of a
  single forward with logits kept only for the answer tokens. It is what the searches use;
  ``tests/test_answer_forms.py`` holds it against stored and live greedy answers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..core.methods import Baseline, Method
from ..store.data import Sample
from . import prefix
from .tasks import TASKS, EvalSettings, copy_columns

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


def answer_targets(tokenizer, sample: Sample, chat: bool = False) -> list[list[int]]:
    """The token ids of every way the sample's gold answer is written: each alias in each surface
    form of its task (:meth:`lpes_nb.evaluation.tasks.Task.surface_forms`), without repeats."""
    forms = (f for a in dict.fromkeys(sample.answers) for f in TASKS[sample.task].surface_forms(a))
    return [list(ids) for ids in dict.fromkeys(tuple(target_ids(tokenizer, f, chat)) for f in forms)]


def check_answer_budget(tokenizer, samples: Sequence[Sample], settings: EvalSettings) -> None:
    """Generate mode: every sample's shortest gold answer must fit in ``max_new_tokens``, or an answer
    cut before its end is judged wrong for want of tokens, not of retrieval (a UUID value takes 27-38
    tokens in these tokenizers; 32 new tokens would fail most of them silently)."""
    need = [min(len(t) for t in answer_targets(tokenizer, s, settings.chat)) for s in samples]
    over = [(n, s) for n, s in zip(need, samples) if n > settings.max_new_tokens]
    if over:
        n, s = max(over, key=lambda ns: ns[0])
        raise ValueError(f"max_new_tokens={settings.max_new_tokens} cannot hold the gold answer of {len(over)} of "
                         f"{len(samples)} samples (the longest: {s.task} sample {s.sample_id}, {s.answers[0]!r}, {n} tokens); "
                         f"allow at least {n} new tokens")


def check_lengths(lengths, extra, max_positions: int, on_overflow: str, prompts=None) -> np.ndarray:
    """Boolean mask of prompts that fit; raise (``on_overflow="error"``) or skip (``"skip"``) the rest.
    Never truncates. ``prompts``: the prompt of each entry, where several entries (a prompt's answer
    targets) share one, so that the error counts prompts."""
    if on_overflow not in ("error", "skip"):
        raise ValueError(f"on_overflow must be 'error' or 'skip', got {on_overflow!r}")
    needed = np.asarray(lengths) + np.asarray(extra)
    fits = needed <= max_positions
    if not fits.all() and on_overflow == "error":
        over = len({p for p, ok in zip(prompts, fits) if not ok}) if prompts is not None else int((~fits).sum())
        raise ValueError(
            f"{over} prompt(s) need up to {int(needed.max())} positions (prompt + answer), "
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


def plain_batches(lengths: Sequence[int], batch_size: int, mode: str) -> list[list[int]]:
    """The plain path's batches (indices of ``lengths``, shortest first). Score mode: at most
    ``batch_size`` rows and :data:`lpes_nb.evaluation.prefix.TOKEN_BUDGET` tokens, cut where padding costs least
    (:func:`lpes_nb.evaluation.prefix.partition`): on a CPU a padded batch of long prompts costs more per prompt
    than one prompt alone (9.1 vs 6.3 s per 3.2k-token Qwen bf16 scoring on 2 AMD EPYC cores), so a
    ~3k-token prompt runs by itself. Generate mode: batches of ``batch_size``, whose decoding steps
    gain from rows (5 MDQA-20 prompts, answers of up to 100 tokens: 110 s in one batch, 132 s one at
    a time, on the same CPU beside another job)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    if mode == "generate":
        return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
    return [[order[r] for r in rows] for rows in prefix.partition([(0, lengths[i]) for i in order], batch_size)]


# --- the two judges ------------------------------------------------------------------------------


@torch.inference_mode()
def score_targets(model, prompts: list[list[int]], targets: list[list[int]], batch_size: int = 8,
                  pad_id: int = 0, progress: bool = False, method: Method | None = None,
                  segments: list[list[int]] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """For each (prompt, target): is every target token the argmax under teacher forcing, and the
    target's total log-probability. Batches are left-padded so that all answers end at the last
    position and only ``max(len(target)) + 1`` logits are computed per row (:func:`plain_batches`:
    at most ``batch_size`` rows and a token budget). Each batch runs in
    ``method``'s context and through its ``forward`` (default: the unmodified model); ``segments``
    (one list per prompt) are handed to methods that need document membership. A method whose state
    comes from the prompt (``Method.state_from_prompt``) is scored one prompt at a time, the target fed
    after the prompt's cache (:func:`prefix.continuation_logprob`), as decoding sees it."""
    method = method or Baseline()
    correct = np.zeros(len(prompts), dtype=bool)
    logprob = np.zeros(len(prompts))

    if method.state_from_prompt:
        if type(method).forward is not Method.forward:  # the steps below run the model's own forward
            raise NotImplementedError(f"{method.name} keeps state from the prompt and has a forward of its own: no scorer takes both")
        for i in tqdm(range(len(prompts)), desc="scoring (after each prompt)", disable=not progress, leave=False):
            with method.context(model, len(prompts[i]) + len(targets[i]), None if segments is None else [segments[i]]):
                (last,), (kv,) = prefix.prefill(model, [prompts[i]])
                correct[i], logprob[i] = prefix.continuation_logprob(model, kv, len(prompts[i]), last, targets[i])
        return correct, logprob
    batches = plain_batches([len(p) + len(t) for p, t in zip(prompts, targets)], batch_size, "score")
    for batch in tqdm(batches, desc="scoring", disable=not progress, leave=False):
        ids, mask, positions, keep = forced_inputs([prompts[i] for i in batch], [targets[i] for i in batch], pad_id,
                                                   model.device)
        with method.context(model, ids.shape[1], None if segments is None else [segments[i] for i in batch]):
            logits = method.forward(model, ids, mask, positions, keep)
        logp = torch.log_softmax(logits.float(), dim=-1)
        for row, i in enumerate(batch):
            tgt = torch.tensor(targets[i], device=logp.device)
            pred = target_rows(logp[row], len(tgt), keep)
            correct[i] = bool((pred.argmax(-1) == tgt).all())
            logprob[i] = float(pred.gather(1, tgt[:, None]).sum())
    return correct, logprob


def forced_inputs(prompts: list[list[int]], targets: list[list[int]], pad_id: int, device=None):
    """Left-padded prompt + target ids, mask, positions (on ``device``), and how many final logits
    cover the targets."""
    ids, mask = (t.to(device) for t in _left_pad([p + t for p, t in zip(prompts, targets)], pad_id))
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions, max(len(t) for t in targets) + 1


def target_rows(logp_row: torch.Tensor, target_len: int, keep: int) -> torch.Tensor:
    """The rows of the kept log-probabilities that predict each target token."""
    return logp_row[keep - 1 - target_len : keep - 1]


@torch.inference_mode()
def generate_answers(model, tokenizer, prompts: list[list[int]], max_new_tokens: int = 8, batch_size: int = 8,
                     stop_at_newline: bool = True, progress: bool = False, method: Method | None = None,
                     segments: list[list[int]] | None = None, fixed_length: bool = False) -> list[tuple[str, bool]]:
    """Greedy continuations (text), batched with left padding, each stopping at its first newline
    (``stop_at_newline``), with whether each answer ended by itself (a newline where the decoding
    stops at one, or the end-of-sequence token) rather than by running out of ``max_new_tokens``;
    ``method`` and ``segments`` as in :func:`score_targets` (the method's ``generate`` decodes).
    ``fixed_length`` decodes exactly ``max_new_tokens`` whatever the model says (fixed work, for
    latency tables)."""
    method = method or Baseline()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out: list[tuple[str, bool]] = [("", False)] * len(prompts)
    extra = dict(min_new_tokens=max_new_tokens) if fixed_length else {}
    if stop_at_newline and not fixed_length:
        extra.update(stop_strings=["\n"], tokenizer=tokenizer)
    for batch in tqdm(plain_batches([len(p) for p in prompts], batch_size, "generate"), desc="generating",
                      disable=not progress, leave=False):
        ids, mask = (t.to(model.device) for t in _left_pad([prompts[i] for i in batch], pad_id))
        with method.context(model, ids.shape[1], None if segments is None else [segments[i] for i in batch]):
            new = method.generate(model, ids, mask, max_new_tokens, pad_token_id=pad_id, **extra)
        for row, i in enumerate(batch):
            tokens = new[row].tolist()
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            ended = tokenizer.eos_token_id in tokens or (stop_at_newline and "\n" in text)
            out[i] = (text[: text.index("\n") + 1] if stop_at_newline and "\n" in text else text, ended)
    return out


# --- evaluation of a task under a RoPE configuration -----------------------------------------------


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


def evaluate_samples(model, tokenizer, samples: Sequence[Sample], method: Method | None = None,
                     settings: EvalSettings = EvalSettings(), progress: bool = True,
                     fixed_length: bool = False, shared_prefix: bool = True, gold_logprob: bool = False,
                     prefill_chunk: int | None = None) -> pd.DataFrame:
    """One row per sample: task, position, sample, correct (+ gold_logprob or prediction).

    The model runs under ``method`` (:mod:`lpes_nb.core.methods`; None: the unmodified model): every
    RoPE configuration is a method — per-layer scales (:class:`~lpes_nb.core.methods.LayerScales`), given
    per-layer specs (:class:`~lpes_nb.core.methods.FixedSpecs`), or one whose context depends on each
    batch's inputs (e.g. document membership).

    ``shared_prefix``: the prompts of one record (same task, record and size, at several gold
    positions) share the keys and values of their common prefix (:mod:`lpes_nb.evaluation.prefix`) where the
    method and the model allow it; otherwise, and for ``fixed_length`` decoding, the plain batched
    path. ``gold_logprob`` (generate mode, shared path): also the teacher-forced log-probability of
    the gold answer (best alias) and whether greedy decoding would start with it. ``prefill_chunk``
    (shared path): continue each prompt from its anchor in pieces of this many tokens
    (:func:`lpes_nb.evaluation.prefix._pieces`: faster for long continuations, not bitwise equal in bf16)."""
    prompts = [encode(tokenizer, s, settings.chat) for s in samples]
    segments = None
    if method is not None and method.needs_segments:
        if settings.chat:
            raise ValueError(f"{method.name} remaps positions by document and needs prompts without a chat template")
        segments = [token_segments(tokenizer, s) for s in samples]
    if settings.mode == "score":
        # several gold aliases (MDQA) or surface forms (KV): score each, correct if any is; log-prob of the best
        pairs = [(i, t) for i, s in enumerate(samples) for t in answer_targets(tokenizer, s, settings.chat)]
        extra = [len(t) for _, t in pairs]
        lengths = [len(prompts[i]) for i, _ in pairs]
    else:
        if not fixed_length:  # a timing run decodes fixed work; its answers are not the point
            check_answer_budget(tokenizer, samples, settings)
        extra = [settings.max_new_tokens] * len(samples)
        lengths = [len(p) for p in prompts]
    fits = check_lengths(lengths, extra, model.config.max_position_embeddings, settings.on_overflow,
                         [i for i, _ in pairs] if settings.mode == "score" else None)
    rows = [{"task": s.task, "position": s.position, "num_items": s.num_items, "sample": s.sample_id,
             "prompt_tokens": len(p)} for s, p in zip(samples, prompts)]
    method = method or Baseline()
    shared = (shared_prefix and method.shares_prefix and not fixed_length and not settings.chat
              and prefix.supports_sharing(model))
    if gold_logprob and (settings.mode != "generate" or not shared):
        raise ValueError("gold_logprob comes with generate mode on the shared-prefix path (score mode has it anyway); "
                         f"got mode={settings.mode!r}, method {method.name} shares_prefix={method.shares_prefix}")
    prefix.check_chunk(prefill_chunk)
    if prefill_chunk is not None and not shared:
        raise ValueError(f"prefill_chunk={prefill_chunk} applies to the shared-prefix path, which {method.name} does not "
                         f"take here (shared_prefix={shared_prefix}, shares_prefix={method.shares_prefix}): leave it None")
    if settings.mode == "score":
        kept = [pair for pair, ok in zip(pairs, fits) if ok]
        if shared:
            correct, logprob = _score_shared(model, prompts, kept, record_groups(samples), method, progress, settings.batch_size,
                                             prefill_chunk)
        else:
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
            correct, logprob = score_targets(model, [prompts[i] for i, _ in kept], [t for _, t in kept], settings.batch_size,
                                             pad, progress, method, None if segments is None else [segments[i] for i, _ in kept])
        for row in rows:
            row.update(correct=0.0, gold_logprob=-np.inf, skipped=True)
        for (i, _), c, lp in zip(kept, correct, logprob):
            rows[i]["correct"] = max(rows[i]["correct"], float(c))
            rows[i]["gold_logprob"] = max(rows[i]["gold_logprob"], lp)
            rows[i]["skipped"] = False
    else:
        keep = [i for i in range(len(samples)) if fits[i]]
        scores = {}
        if shared:
            targets = [answer_targets(tokenizer, s, settings.chat) for s in samples] if gold_logprob else None
            answers, scores = _generate_shared(model, tokenizer, prompts, keep, record_groups(samples), method, settings,
                                               targets, progress, prefill_chunk)
        else:
            answers = generate_answers(model, tokenizer, [prompts[i] for i in keep], settings.max_new_tokens, settings.batch_size,
                                       settings.stop_at_newline, progress, method,
                                       None if segments is None else [segments[i] for i in keep], fixed_length)
        for row in rows:
            row.update(correct=0.0, prediction=None, skipped=True)
        for i, (text, ended) in zip(keep, answers):
            s = samples[i]
            rows[i].update(correct=TASKS[s.task].correct(text, s.answers), prediction=text, skipped=False,
                           truncated=not ended, **copy_columns(s, text))
            if i in scores:
                rows[i].update(gold_first=float(scores[i][0]), gold_logprob=scores[i][1])
    df = pd.DataFrame(rows)
    skipped = int(df["skipped"].sum())
    truncated = int(df["truncated"].fillna(False).astype(bool).sum()) if "truncated" in df else 0
    if truncated and progress:  # quiet callers (a GA's thousands of scorings) keep the count in the column
        print(f"[evaluate] {truncated} of {len(df)} answers ran out of max_new_tokens={settings.max_new_tokens} before "
              "ending (column 'truncated'); they are judged on what was generated")
    if skipped:
        print(f"[evaluate] skipped {skipped} of {len(df)} samples longer than the model's positions")
    out = df[~df["skipped"]].drop(columns="skipped").reset_index(drop=True)
    out.attrs.update(skipped=skipped, shared_prefix=shared)
    return out


def record_groups(samples: Sequence[Sample]) -> list[list[int]]:
    """Indices of the samples that are one record at several gold positions (same task, record, size)."""
    groups: dict[tuple, list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault((s.task, s.sample_id, s.num_items), []).append(i)
    return list(groups.values())


@torch.inference_mode()
def _score_shared(model, prompts, pairs, groups, method: Method, progress: bool, batch_size: int = 8,
                  chunk: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`score_targets` through shared prefixes, batched across records
    (:func:`lpes_nb.evaluation.prefix.prefill_many`): per (sample, target) pair, correct and log-prob."""
    correct, logprob = np.zeros(len(pairs), dtype=bool), np.zeros(len(pairs))
    by_sample: dict[int, list[int]] = {}
    for k, (i, _) in enumerate(pairs):
        by_sample.setdefault(i, []).append(k)
    pair_groups = [ks for ks in ([k for i in group for k in by_sample.get(i, [])] for group in groups) if ks]
    per_call = 16  # groups per call: bounds the anchors' keys and values held at once
    with (method.context(model, max(len(p) for p in prompts), None),
          tqdm(total=len(pair_groups), desc="scoring (shared prefixes)", unit="record", disable=not progress, leave=False) as bar):
        for start in range(0, len(pair_groups), per_call):
            part = pair_groups[start:start + per_call]
            logits = prefix.prefill_many(model, [[prompts[pairs[k][0]] for k in ks] for ks in part],
                                         [[pairs[k][1] for k in ks] for ks in part], max_batch=batch_size, chunk=chunk)
            for ks, rows_of in zip(part, logits):
                for k, rows in zip(ks, rows_of):
                    target = torch.tensor(pairs[k][1], device=rows.device)
                    logp = torch.log_softmax(rows[:-1].float(), dim=-1)
                    correct[k] = bool((logp.argmax(-1) == target).all())
                    logprob[k] = float(logp.gather(1, target[:, None]).sum())
            bar.update(len(part))
    return correct, logprob


def best_target(model, kv, prompt_len: int, last_logits, targets: list[list[int]]) -> tuple[bool, float]:
    """After one prefilled prompt: whether greedy decoding starts with any of ``targets`` (a gold
    answer's aliases and surface forms) and the best one's teacher-forced log-probability."""
    judged = [prefix.continuation_logprob(model, kv, prompt_len, last_logits, t) for t in targets]
    return any(c for c, _ in judged), max(lp for _, lp in judged)


@torch.inference_mode()
def gold_scores(model, tokenizer, samples: Sequence[Sample], chunk: int | None = None) -> list[tuple[bool, float]]:
    """Per sample, (gold first, gold log-probability) exactly as the shared path computes them beside
    decoding (``gold_logprob=True``), without decoding: the unmodified model, one record at a time
    through its shared prefix. Re-scores stored answers under a new answer target."""
    prompts = [encode(tokenizer, s) for s in samples]
    out: list = [None] * len(samples)
    for group in record_groups(samples):
        logits, kvs = prefix.prefill(model, [prompts[i] for i in group], chunk=chunk)
        for i, last, kv in zip(group, logits, kvs):
            out[i] = best_target(model, kv, len(prompts[i]), last, answer_targets(tokenizer, samples[i]))
    return out


@torch.inference_mode()
def _generate_shared(model, tokenizer, prompts, keep, groups, method: Method, settings: EvalSettings, targets, progress: bool,
                     chunk: int | None = None):
    """:func:`generate_answers` through shared prefixes (decoding batched ``settings.batch_size`` at a
    time): the answers of the ``keep`` prompts in their order, and per sample index (gold first,
    best gold log-prob) where ``targets`` are given."""
    kept = set(keep)
    answers: dict[int, tuple[str, bool]] = {}
    scores: dict[int, tuple[bool, float]] = {}
    pending: list[tuple[int, list, int, torch.Tensor]] = []

    def decode():
        done = prefix.greedy_decode(model, tokenizer, [p[1] for p in pending], [p[2] for p in pending], [p[3] for p in pending],
                                    settings.max_new_tokens, settings.stop_at_newline)
        answers.update({p[0]: a for p, a in zip(pending, done)})
        pending.clear()

    with method.context(model, max(len(p) for p in prompts), None):
        for group in tqdm(groups, desc="generating (shared prefixes)", disable=not progress, leave=False):
            group = [i for i in group if i in kept]
            if not group:
                continue
            logits, kvs = prefix.prefill(model, [prompts[i] for i in group], chunk=chunk)
            for i, last, kv in zip(group, logits, kvs):
                if targets is not None:
                    scores[i] = best_target(model, kv, len(prompts[i]), last, targets[i])
                pending.append((i, kv, len(prompts[i]), last))
            if len(pending) >= settings.batch_size:
                decode()
        if pending:
            decode()
    return [answers[i] for i in keep], scores

"""Score mode scores what the model writes: each task's answer surface forms, held against stored and
live greedy answers (issue #99).

"The greedy answer starts with the gold in one of its surface forms" and score mode's "every token of
one form is the argmax" must agree; a target the model never writes is a failure, not a number."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from lpes_nb.evaluation.evaluate import answer_targets, evaluate_samples, target_ids
from lpes_nb.evaluation.tasks import KV_WRITTEN_FORMS, TASKS, EvalSettings, Task, TaskConfig, scoring_key
from lpes_nb.store.data import load_kv, load_mdqa
from lpes_nb.store.models import QWEN, load_tokenizer

RESULTS = Path(__file__).resolve().parents[1] / "results"
MDQA20_MAP = RESULTS / "position_map_records-31ea4e6ebdd16ab1b249.jsonl"  # Qwen-0.5B bf16, MDQA-20, generate + gold scores
KV_MAPS = {75: RESULTS / "position_map_records-74a0683627cde0f9923c.jsonl", 140: RESULTS / "position_map_records-2f61eb6c9f6eb3d177c6.jsonl"}


def stored_rows(path: Path) -> list[tuple[int, dict]]:
    return [(line["record"], row) for line in map(json.loads, path.read_text().splitlines()) for row in line["rows"]]


def starts_with_a_target(tokenizer, text: str, targets: list[list[int]]) -> bool:
    ids = tokenizer(text, add_special_tokens=False).input_ids
    return any(ids[:len(t)] == t for t in targets)


def test_a_task_declares_its_surface_forms_and_they_key_score_mode_results():
    assert TASKS["kv"].answer_forms == KV_WRITTEN_FORMS
    assert TASKS["kv"].surface_forms("7219") == ('"7219', "7219")
    assert TASKS["mdqa"].surface_forms("Paris") == ("Paris",)
    assert scoring_key(["kv", "mdqa"]) == {"answer_forms": {"kv": ['"{}', "{}"]}}
    assert scoring_key(["mdqa", "passkey"]) == {}  # tasks scored as given keep their stored keys


@pytest.mark.parametrize("forms", [(), ("{}{}",), ("x",), ("{}", "  ")])
def test_answer_forms_are_checked(forms):
    with pytest.raises(ValueError, match="answer_forms"):
        Task(TASKS["kv"].build, TASKS["kv"].correct, 8, True, answer_forms=forms)


def test_answer_targets_hold_every_form_of_every_alias_once():
    tok = load_tokenizer(QWEN)
    kv = TaskConfig("kv", 4, n=1, positions=(0,)).samples()[0]
    assert answer_targets(tok, kv) == [target_ids(tok, '"' + kv.answers[0]), target_ids(tok, kv.answers[0])]
    mdqa = next(s for s in TaskConfig("mdqa", 3, n=30, positions=(0,)).samples() if len(set(s.answers)) > 1)
    assert answer_targets(tok, mdqa) == [target_ids(tok, a) for a in dict.fromkeys(mdqa.answers)]


@pytest.mark.parametrize("pairs", sorted(KV_MAPS))
def test_stored_kv_answers_start_with_the_quoted_form_and_never_with_the_old_target(pairs):
    """The 800 stored Qwen KV-75/140 greedy answers: every one that starts with the quoted gold value
    (as text) starts with the new first form's tokens; the old target (the bare value) is a prefix
    of none, so the old score-mode accuracy was 0 by construction."""
    tok, data = load_tokenizer(QWEN), load_kv(None, None, pairs)
    rows = stored_rows(KV_MAPS[pairs])
    assert len(rows) >= 300 and all(r["prediction"].startswith(' "') for _, r in rows)
    quoted = [(record, r) for record, r in rows if r["prediction"].startswith(' "' + data[record]["value"])]
    assert len(quoted) > 150
    for record, r in quoted:
        value = data[record]["value"]
        assert starts_with_a_target(tok, r["prediction"], [target_ids(tok, '"' + value)]), r["prediction"]
        assert not starts_with_a_target(tok, r["prediction"], [target_ids(tok, value)])


def test_stored_mdqa_gold_scores_agree_with_the_greedy_answers():
    """Qwen MDQA-20 (every stored row, > 2,500): the teacher-forced "every gold token is the argmax"
    (``gold_first``, scored beside decoding) against "the greedy answer's tokens start with a gold
    alias". One row of 2,814 disagrees (' Raymond Unwin and …': a near-tie of the bf16 scoring and
    decoding passes), hence the 99.5 % floor; every disagreement is printed."""
    tok, data = load_tokenizer(QWEN), load_mdqa(None)
    rows = stored_rows(MDQA20_MAP)
    assert len(rows) >= 500
    cache = {}
    agree, differ = 0, []
    for record, r in rows:
        if record not in cache:
            cache[record] = [target_ids(tok, a) for a in dict.fromkeys(data[record]["answers"])]
        greedy = starts_with_a_target(tok, r["prediction"], cache[record])
        agree += greedy == bool(r["gold_first"])
        if greedy != bool(r["gold_first"]):
            differ.append((record, r["prediction"][:40]))
    print(f"stored MDQA-20 rows: {agree} of {len(rows)} agree; differ: {differ}")
    assert agree >= 0.995 * len(rows), differ


LIVE = {  # task -> (config, max new tokens): short prompts, >= 20 samples each, answers of the kinds the studies score
    "kv-uuid": (TaskConfig("kv", 8, n=10, positions=(0, 7), seed=5, key_format="uuid", value_format="uuid"), 48),
    "kv-digits": (TaskConfig("kv", 10, n=10, positions=(0, 9), seed=5), 12),
    "mdqa": (TaskConfig("mdqa", 3, n=10, positions=(0, 2), offset=300), 40),
}


def writes_gold(sample, text: str) -> bool:
    """The greedy answer starts with the gold answer, written any way the prompt suggests (a KV value
    in its quotes or bare; an MDQA alias after the space)."""
    start = text.lstrip()
    return any((start.lstrip('"') if sample.task == "kv" else start).startswith(a) for a in sample.answers)


def agreement(model, tokenizer, cfg: TaskConfig, new_tokens: int) -> tuple[int, int, list]:
    """On ``cfg``'s samples: score mode's correctness against :func:`writes_gold` of the greedy answer."""
    samples = cfg.samples()
    generated = evaluate_samples(model, tokenizer, samples, settings=EvalSettings(mode="generate", max_new_tokens=new_tokens),
                                 progress=False)
    scored = evaluate_samples(model, tokenizer, samples, settings=EvalSettings(mode="score"), progress=False)
    rows = [(writes_gold(s, text), bool(c), text) for s, text, c in zip(samples, generated["prediction"], scored["correct"])]
    return sum(g == c for g, c, _ in rows), len(rows), [r for r in rows if r[0] != r[1]]


# the bare KV value as the only target (the registry's before issue #99) misses every quoted answer:
# Qwen quotes every UUID, and SmolLM2 some digit values; under the registry's written forms score mode
# counts every answer that writes the gold
MISSED = {("smollm2", "kv-uuid"), ("smollm2", "kv-digits"), ("qwen", "kv-uuid"), ("qwen", "kv-digits")}


@pytest.mark.slow
@pytest.mark.parametrize("forms", ["bare", "registry"])
@pytest.mark.parametrize("which", ["smollm2", "qwen"])
@pytest.mark.parametrize("task", sorted(LIVE))
def test_live_score_mode_counts_exactly_the_greedy_answers_that_write_the_gold(request, which, task, forms, monkeypatch):
    if forms == "bare":
        monkeypatch.setitem(TASKS, "kv", replace(TASKS["kv"], answer_forms=("{}",)))
    if forms == "bare" and (which, task) in MISSED:
        request.applymarker(pytest.mark.xfail(strict=True, reason="issue #99: the bare KV target misses quoted answers"))
    model = request.getfixturevalue(which)
    tokenizer = load_tokenizer(QWEN) if which == "qwen" else load_tokenizer()
    cfg, new_tokens = LIVE[task]
    agree, n, differ = agreement(model, tokenizer, cfg, new_tokens)
    assert n >= 20 and agree == n, differ

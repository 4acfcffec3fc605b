"""The evaluator: single-forward scorer == greedy decoding, batching, overflow, chat mode."""

import numpy as np
import pytest
import torch

from lpes_nb.store.data import Sample, generate_kv, kv_sample
from lpes_nb.evaluation.evaluate import (
    EvalSettings,
    encode,
    evaluate_samples,
    generate_answers,
    score_targets,
    target_ids,
)
from lpes_nb.core.rope import RopePatch, scale_specs


def _greedy_ids(model, prompt, steps):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                             pad_token_id=0, top_p=None, top_k=None, temperature=None)
    return out[0, len(prompt):].tolist()


def _equivalence_cases(model, prompts, steps=3):
    """Targets that greedy decoding produces, and the same with one token changed (not produced)."""
    cases = []
    for p in prompts:
        g = _greedy_ids(model, p, steps)
        cases.append((p, g, True))
        cases.append((p, g[:-1] + [(g[-1] + 1) % 49152], False))
        cases.append((p, [(g[0] + 7) % 49152] + g[1:], False))
    return cases


def _assert_scorer_matches_greedy(model, prompts):
    cases = _equivalence_cases(model, prompts)
    correct, logprob = score_targets(model, [c[0] for c in cases], [c[1] for c in cases], batch_size=4)
    # independent check of "greedy starts with the target", by decoding as long as each target
    decoded = [_greedy_ids(model, p, len(t))[: len(t)] == t for p, t, _ in cases]
    assert correct.tolist() == decoded == [c[2] for c in cases]
    assert np.all(logprob <= 0) and np.all(np.isfinite(logprob))


def test_scorer_equals_greedy_decoding_on_a_tiny_model(tiny_llama, tokenizer):
    prompts = [tokenizer(t).input_ids for t in ["Hello there, how", "A much longer prompt with several words in it", "x"]]
    _assert_scorer_matches_greedy(tiny_llama, prompts)
    with RopePatch(tiny_llama, scale_specs([2.0, 1.0, 1.5, 1.2])):
        _assert_scorer_matches_greedy(tiny_llama, prompts)


def test_scorer_runs_long_prompts_one_at_a_time_and_batches_short_ones(tiny_llama):
    """The plain scorer's batches hold at most TOKEN_BUDGET tokens (a padded batch of ~3k-token
    prompts costs ~3x per prompt on a 2-core CPU), and the results do not depend on the batching."""
    from lpes_nb.core.methods import Baseline
    from lpes_nb.evaluation.prefix import TOKEN_BUDGET

    shapes = []

    class Spy(Baseline):
        def forward(self, model, ids, mask, positions, keep):
            shapes.append(tuple(ids.shape))
            return super().forward(model, ids, mask, positions, keep)

    rng = np.random.default_rng(0)
    lengths = [2100, 2200, 2150, 40, 45, 50, 42, 48, 41, 44, 47]  # any two long rows: > TOKEN_BUDGET
    prompts = [rng.integers(5, 1000, n).tolist() for n in lengths]
    targets = [rng.integers(5, 1000, 2).tolist() for _ in lengths]
    correct, logprob = score_targets(tiny_llama, prompts, targets, batch_size=8, method=Spy())
    assert all(rows * width <= TOKEN_BUDGET for rows, width in shapes if rows > 1)
    assert sorted(rows for rows, width in shapes if width > 1000) == [1, 1, 1]  # each long prompt alone
    assert [rows for rows, width in shapes if width < 100] == [8]  # the short ones in one batch of batch_size
    single = [score_targets(tiny_llama, [p], [t], batch_size=1) for p, t in zip(prompts, targets)]
    assert correct.tolist() == [bool(c[0]) for c, _ in single]
    np.testing.assert_allclose(logprob, [lp[0] for _, lp in single], atol=1e-4)


@pytest.mark.slow
def test_scorer_equals_greedy_decoding_on_smollm2(smollm2, tokenizer):
    records = generate_kv(10, 4, seed=11, key_format="letters6", value_format="digits4")
    samples = [kv_sample(r, pos, i) for i, r in enumerate(records) for pos in (0, 5, 9)]
    prompts = [tokenizer(s.prompt).input_ids for s in samples]
    targets = [target_ids(tokenizer, s.answers[0]) for s in samples]
    correct, _ = score_targets(smollm2, prompts, targets, batch_size=6)
    decoded = [_greedy_ids(smollm2, p, len(t)) == t for p, t in zip(prompts, targets)]
    assert correct.tolist() == decoded
    assert 0 < sum(decoded) < len(decoded)  # both outcomes occur, so the comparison has teeth
    # and the generate-mode evaluation agrees with it sample by sample on this task
    gen = evaluate_samples(smollm2, tokenizer, samples, settings=EvalSettings(mode="generate"), progress=False)
    assert (gen["correct"].to_numpy() >= correct).all()  # starting with the value implies containing it


@pytest.mark.slow
def test_batched_generation_equals_one_by_one(smollm2, tokenizer):
    records = generate_kv(10, 3, seed=5, key_format="letters6", value_format="digits4")
    prompts = [tokenizer(kv_sample(r, pos).prompt).input_ids for r in records for pos in (0, 9)]
    batched = [text for text, _ in generate_answers(smollm2, tokenizer, prompts, max_new_tokens=6, batch_size=6)]
    single = [generate_answers(smollm2, tokenizer, [p], max_new_tokens=6, batch_size=1)[0][0] for p in prompts]
    assert batched == single
    assert all("\n" not in t[:-1] for t in batched)  # stopped at the first newline


def _toy_samples(n_per_pos=2):
    return [Sample("kv", i, pos, 3, f"Key {i} at {pos}: value is", ("7",)) for pos in (0, 1, 2) for i in range(n_per_pos)]


def test_evaluate_table_shape_and_by_position(tiny_llama, tokenizer):
    df = evaluate_samples(tiny_llama, tokenizer, _toy_samples(), progress=False)
    assert list(df.columns[:6]) == ["task", "position", "num_items", "sample", "prompt_tokens", "correct"]
    assert len(df) == 6 and df.attrs["skipped"] == 0


def test_over_long_prompts_error_or_are_counted_never_truncated(tiny_llama, tokenizer):
    long = Sample("kv", 0, 0, 3, "word " * 2100, ("7",))
    samples = _toy_samples(1) + [long]
    with pytest.raises(ValueError, match=r"1 prompt\(s\) need up to \d+ positions .* beyond the model's 2048"):
        evaluate_samples(tiny_llama, tokenizer, samples, progress=False)
    df = evaluate_samples(tiny_llama, tokenizer, samples, settings=EvalSettings(on_overflow="skip"), progress=False)
    assert len(df) == 3 and df.attrs["skipped"] == 1
    df = evaluate_samples(tiny_llama, tokenizer, samples, settings=EvalSettings(mode="generate", on_overflow="skip",
                          max_new_tokens=2), progress=False)
    assert len(df) == 3 and df.attrs["skipped"] == 1


@pytest.mark.slow
def test_chat_mode_scores_what_greedy_decoding_says_after_the_assistant_header(smollm2, tokenizer):
    """transformers 5's apply_chat_template returns a dict, and after the assistant header the answer
    starts without the space that follows "Answer:". Targets: the start of the model's own greedy
    chat reply (must score correct) and a wrong word (must not)."""
    from lpes_nb.store.data import Sample

    questions = ["Reply with the number 3580 and nothing else.", "What is the capital of France? Answer with one word.",
                 "Say the word banana."]
    probe = [Sample("kv", i, 0, 3, q, ("x",)) for i, q in enumerate(questions)]
    replies = evaluate_samples(smollm2, tokenizer, probe, settings=EvalSettings(mode="generate", chat=True, max_new_tokens=4),
                               progress=False)["prediction"]
    starts = [" ".join(r.split()[:2]) for r in replies]
    samples = [Sample("kv", 2 * i + k, k, 3, q, (a,)) for i, (q, s) in enumerate(zip(questions, starts))
               for k, a in enumerate((s, "zebra"))]
    scored = evaluate_samples(smollm2, tokenizer, samples, settings=EvalSettings(chat=True), progress=False)
    assert scored["correct"].tolist() == [1.0, 0.0] * len(questions)
    prompts = [encode(tokenizer, s, chat=True) for s in samples]
    targets = [target_ids(tokenizer, s.answers[0], chat=True) for s in samples]
    decoded = [_greedy_ids(smollm2, p, len(t)) == t for p, t in zip(prompts, targets)]
    assert decoded == [bool(c) for c in scored["correct"]]



def test_a_method_whose_state_comes_from_the_prompt_scores_what_its_decoding_sees(tiny_llama, tokenizer):
    """Ms-PoE chooses its head scales from the prompt's last query and keeps them while decoding. The
    teacher-forced score of a greedy continuation must be what decoding saw: every token the argmax,
    the log-probabilities those of ``generate``'s own scores. (Scored in one pass over prompt and
    target, the scales came from the target's last token: on Qwen, MDQA-20 test record 0 with the gold
    last, -34.0 nats against -15.1 fed after the prompt.) On random weights Ms-PoE's outlier ranking
    barely moves with the query, so a head scaler that follows the query closely makes the check bite."""
    from lpes_nb.core.methods import FixedSpecs, MsPoE
    from lpes_nb.core.rope import RopeSpec

    def follows_the_query(q_last, keys, valid, scaling):  # [B, H_kv] scales in (1, 4), a smooth function of the query
        return 1.0 + 3.0 * torch.sigmoid(300 * q_last.float().reshape(q_last.shape[0], keys.shape[1], -1).mean(-1))

    sensitive = FixedSpecs([None] + [RopeSpec(heads=follows_the_query)] * 3)
    prompts = [tokenizer(t).input_ids for t in ["Hello there, how are you doing on this", "A much longer prompt with several words in it"]]
    for method in (MsPoE(min_scale=1.2, max_scale=4.0, first_layer=1), sensitive):
        assert method.state_from_prompt and not method.shares_prefix
        for prompt in prompts:
            ids = torch.tensor([prompt])
            with method.context(tiny_llama, ids.shape[1], None):
                out = tiny_llama.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4,
                                          do_sample=False, output_scores=True, return_dict_in_generate=True, pad_token_id=0)
            target = out.sequences[0, ids.shape[1]:].tolist()
            decoded = sum(float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(out.scores, target))
            correct, logprob = score_targets(tiny_llama, [prompt], [target], method=method)
            assert correct.tolist() == [True]
            assert logprob[0] == pytest.approx(decoded, abs=1e-4)


def test_a_method_with_prompt_state_and_a_forward_of_its_own_is_refused(tiny_llama):
    from lpes_nb.core.methods import MsPoE

    class TwoPass(MsPoE):
        def forward(self, model, ids, mask, positions, keep):
            return super().forward(model, ids, mask, positions, keep)

    with pytest.raises(NotImplementedError, match="Ms-PoE keeps state from the prompt and has a forward of its own"):
        score_targets(tiny_llama, [[5, 6, 7]], [[8]], method=TwoPass())

"""Fitness-evaluation throughput: the batched single-forward scorer vs a naive per-sample
``model.generate`` loop, on the same KV samples, checking that both give the same correctness.

Two naive loops are timed: one decodes exactly as many tokens as the gold answer has (the
strictest baseline), one a fixed budget of 8 tokens (as a plain evaluation does); both judge
"greedy output starts with the gold tokens", so their correctness is the scorer's by definition.
Writes results/evaluator_speed_<dtype>.json.
Usage: python scripts/bench_evaluator.py [--num-pairs 10] [--n 10] [--batch-size 8] [--dtype float32]
"""

import argparse
import json
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from lpes_nb.evaluation.evaluate import score_targets, target_ids
from lpes_nb.evaluation.tasks import TaskConfig
from lpes_nb.store.models import load_model, load_tokenizer
from lpes_nb.store.results import write_json


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-pairs", type=int, default=20)
    parser.add_argument("--n", type=int, default=10, help="samples per gold position (3 positions)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    model, tok = load_model(dtype=dtype), load_tokenizer()
    samples = TaskConfig("kv", args.num_pairs, n=args.n, seed=7).samples()
    prompts = [tok(s.prompt).input_ids for s in samples]
    targets = [target_ids(tok, s.answers[0]) for s in samples]

    def naive_loop(budget):
        start, correct = time.perf_counter(), []
        with torch.inference_mode():
            for p, t in tqdm(list(zip(prompts, targets)), desc=f"naive generate loop ({budget or 'answer length'})"):
                steps = budget or len(t)
                out = model.generate(torch.tensor([p]), max_new_tokens=steps, min_new_tokens=steps, do_sample=False,
                                     pad_token_id=tok.eos_token_id, top_p=None, top_k=None, temperature=None)
                correct.append(out[0, len(p): len(p) + len(t)].tolist() == t)
        return correct, time.perf_counter() - start

    naive, naive_s = naive_loop(None)
    naive8, naive8_s = naive_loop(8)

    start = time.perf_counter()
    scored, _ = score_targets(model, prompts, targets, batch_size=args.batch_size, pad_id=tok.pad_token_id or 0, progress=True)
    scorer_s = time.perf_counter() - start

    agree = sum(a == b == c for a, b, c in zip(naive, naive8, scored.tolist()))
    result = {
        "model": "smollm2-135m", "dtype": args.dtype, "threads": torch.get_num_threads(), "task": f"kv letters6/digits4, {args.num_pairs} pairs",
        "samples": len(samples), "mean_prompt_tokens": round(sum(map(len, prompts)) / len(prompts), 1),
        "naive_answer_length_s": round(naive_s, 2), "naive_8_tokens_s": round(naive8_s, 2), "scorer_s": round(scorer_s, 2),
        "speedup_vs_answer_length": round(naive_s / scorer_s, 2), "speedup_vs_8_tokens": round(naive8_s / scorer_s, 2),
        "agreement": f"{agree}/{len(samples)}", "accuracy": round(float(scored.mean()), 3), "batch_size": args.batch_size,
    }
    print(json.dumps(result, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / f"evaluator_speed_{args.dtype}.json", result)


if __name__ == "__main__":
    main()

"""The arithmetic of the GPU cost model: a decoder's shape, a GPU's sustained throughput and
bandwidth, and what prompts (prefill and greedy decoding) and a GA's evaluations cost on it.

Nothing here imports the notebook runner: the GPU kit (:mod:`lpes_nb.operations.gpu_kit`) predicts its timings
with it on a GPU machine that has torch and transformers but not papermill; :mod:`lpes_nb.operations.costs`
builds the ``paper`` profile's cost table on it from the measured dry run."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    """What the cost model needs of a Llama-type decoder."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    head_dim: int
    vocab: int
    kv_heads: int | None = None  # grouped-query attention: key/value heads (None: as many as query heads)

    @property
    def matmul_parameters(self) -> float:  # q, k, v, o and the three MLP matrices of every layer
        return self.layers * (4 * self.hidden * self.hidden + 3 * self.hidden * self.intermediate)

    @property
    def parameters(self) -> float:  # plus the untied embedding and output head (6.74e9 for Vicuna-7B)
        return self.matmul_parameters + 2 * self.vocab * self.hidden

    @classmethod
    def of(cls, config) -> Shape:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.num_hidden_layers, config.hidden_size, config.intermediate_size, config.num_attention_heads,
                   head_dim, config.vocab_size, getattr(config, "num_key_value_heads", None))

    def prefill_flops(self, tokens: float) -> float:
        """One causal forward over ``tokens`` tokens with the logits of the last only: the matrix
        products, QKᵀ and AV over the causal half (2 · layers · heads · head size · T²), the head."""
        return 2 * self.matmul_parameters * tokens + 2 * self.layers * self.heads * self.head_dim * tokens**2 + 2 * self.vocab * self.hidden

    def kv_cache_bytes(self, tokens: float) -> float:  # bf16 keys and values of every layer
        return 2 * 2 * self.layers * (self.kv_heads or self.heads) * self.head_dim * tokens


VICUNA_7B = Shape(layers=32, hidden=4096, intermediate=11008, heads=32, head_dim=128, vocab=32000)
# the embedded models, from their converted configs (tests/test_costs.py checks them against the configs)
SHAPES = {
    "smollm2-135m": Shape(layers=30, hidden=576, intermediate=1536, heads=9, head_dim=64, vocab=49152, kv_heads=3),
    "qwen2.5-coder-0.5b": Shape(layers=24, hidden=896, intermediate=4864, heads=14, head_dim=64, vocab=151936, kv_heads=2),
    "qwen2.5-coder-1.5b": Shape(layers=28, hidden=1536, intermediate=8960, heads=12, head_dim=128, vocab=151936, kv_heads=2),
    "lmsys/vicuna-7b-v1.5-16k": VICUNA_7B,
    # LPES Table 1's Qwen (its hub config.json: 28 layers, width 3584, MLP 18944, 28 / 4 heads, vocabulary 152064)
    "Qwen/Qwen2.5-7B-Instruct": Shape(layers=28, hidden=3584, intermediate=18944, heads=28, head_dim=128, vocab=152064, kv_heads=4),
}


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float
    sustained_flops: float  # bf16 matmul throughput reached by a 7B prefill, not the datasheet peak
    bandwidth: float  # bytes/s
    # a decoding step of a small model is bound by kernel launches, not by bytes: eager PyTorch
    # issues ~15 kernels per layer at ~5-10 µs each
    step_per_layer_s: float = 1e-4


# H100 SXM: 989 TFLOP/s dense bf16 peak, 3.35 TB/s HBM3; 40 % of the peak is what a 7B forward over
# 2-4k-token prompts typically sustains in eager PyTorch with sdpa (no kernel fusion, no CUDA graphs)
H100 = Gpu("H100 80GB (assumed 40 % of 989 TFLOP/s, 3.35 TB/s)", 80, 0.4 * 989e12, 3.35e12)
# the embedded models' products are narrow (width 576-896), so they reach a smaller share of the peak
H100_SMALL_MODELS = Gpu("H100 80GB, 0.1-0.5B models (assumed 20 % of 989 TFLOP/s, 3.35 TB/s)", 80, 0.2 * 989e12, 3.35e12)


def prompt_cost(shape: Shape, gpu: Gpu, prompts: float, tokens: float, new_tokens: int, batch: int) -> tuple[float, float]:
    """(FLOPs, seconds) of ``prompts`` prompts of ``tokens`` tokens, each followed by ``new_tokens``
    greedy steps (0: a scoring pass), in batches of ``batch``."""
    flops = prompts * shape.prefill_flops(tokens)
    steps = -(-prompts // batch) * new_tokens
    step_s = max(shape.layers * gpu.step_per_layer_s,
                 (2 * shape.parameters + batch * shape.kv_cache_bytes(tokens + new_tokens)) / gpu.bandwidth)
    return flops, flops / gpu.sustained_flops + steps * step_s


def ga_evaluations(cfg) -> int:
    """Individuals a GA scores at most: the first population, then in each generation its mutations and
    *both* children of every crossover (the fitter is kept: :meth:`lpes_nb.core.ga.GeneticSearch._next_generation`);
    duplicates are read from the fitness cache, so this is an upper bound."""
    return cfg.population + cfg.generations * (cfg.mutations + 2 * cfg.crossovers)

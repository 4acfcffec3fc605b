"""lpes_nb: layer-specific RoPE scaling (LPES) workbook — all logic behind the notebooks."""

import importlib

from .system.machine import ensure_bf16_safety

# before anything imports torch: a CPU that advertises AMX without granting it needs oneDNN's ISA
# capped before torch loads, or the first bf16 matmul kills the process (lpes_nb.system.machine)
ensure_bf16_safety()

__version__ = "0.1.0"


# the public API, each name from its module; loaded on first use, so `import lpes_nb` stays light
# and the bf16 decision above comes before torch
PUBLIC = {
    "apply": "store.stored_curve",        # a stored curve (scales JSON or control points) on any RoPE model
    "load_model": "store.models",         # an embedded model by name, or any Hugging Face path
    "load_tokenizer": "store.models",
    "layer_scales": "core.bezier",        # control points -> one scale per layer
    "scale_specs": "core.rope",           # per-layer scales -> the RoPE patch's specs
    "RopePatch": "core.rope",
}


def __getattr__(name):
    if name in PUBLIC:
        return getattr(importlib.import_module(f".{PUBLIC[name]}", __name__), name)
    raise AttributeError(f"module 'lpes_nb' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *PUBLIC])

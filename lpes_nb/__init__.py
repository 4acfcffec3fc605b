"""lpes_nb: layer-specific RoPE scaling (LPES) workbook — all logic behind the notebooks."""

from .system.machine import ensure_bf16_safety

# before anything imports torch: a CPU that advertises AMX without granting it needs oneDNN's ISA
# capped before torch loads, or the first bf16 matmul kills the process (lpes_nb.system.machine)
ensure_bf16_safety()

__version__ = "0.1.0"


def __getattr__(name):
    # the public API without loading torch at `import lpes_nb` (the bf16 decision above must come first)
    if name == "apply":
        from .store.stored_curve import apply

        return apply
    raise AttributeError(f"module 'lpes_nb' has no attribute {name!r}")

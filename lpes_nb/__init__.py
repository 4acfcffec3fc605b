"""lpes_nb: layer-specific RoPE scaling (LPES) workbook — all logic behind the notebooks."""

from .machine import ensure_bf16_safety

# before anything imports torch: a CPU that advertises AMX without granting it needs oneDNN's ISA
# capped before torch loads, or the first bf16 matmul kills the process (lpes_nb.machine)
ensure_bf16_safety()

__version__ = "0.1.0"

"""lpes_nb: layer-specific RoPE scaling (LPES) workbook — all logic behind the notebooks."""

__version__ = "0.1.0"

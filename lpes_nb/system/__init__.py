"""What the workbook runs on: the CPU and its bf16 decision (machine, bf16_gemm), memory and time
(footprint), and files written whole (files). Imports nothing else of the package."""

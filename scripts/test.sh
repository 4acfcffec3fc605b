#!/usr/bin/env bash
# The whole test suite, in the project's virtual environment (created on first use):
# unit tests, then every notebook executed under the `smoke` profile and checked with nbval.
source "$(dirname "$0")/env.sh"
python -m lpes_nb.models --prepare   # converts the embedded model once (cached afterwards)
# the explorer's browser test drives Debian's chromium; install it where missing and possible
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    (apt-get install -y -q chromium || (apt-get update -q && apt-get install -y -q chromium)) >/dev/null 2>&1 \
        || echo "[test] could not install chromium: the browser test will be skipped" >&2
fi
# smoke outputs go to a fresh folder, so every run recomputes them instead of reading old results
export LPES_OUTPUT_ROOT="$(mktemp -d)"
python -m lpes_nb.run --profile smoke --out "$LPES_OUTPUT_ROOT/runs"
exec python -m pytest tests "$LPES_OUTPUT_ROOT/runs" --nbval-lax -p no:cacheprovider "$@"

#!/usr/bin/env bash
# The whole test suite, in the project's virtual environment (created on first use):
# the published `cpu` notebooks re-executed from the result store and compared in strict nbval mode,
# then every notebook under the `smoke` profile, the GPU kit dry (notebook 9 under `gpu-dry` among it), and the unit tests.
source "$(dirname "$0")/env.sh"
lpes models --prepare smollm2-135m qwen2.5-coder-0.5b   # converts the embedded models once (cached afterwards)
# the explorer's browser test drives Debian's chromium; install it where missing and possible
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    (apt-get install -y -q chromium || (apt-get update -q && apt-get install -y -q chromium)) >/dev/null 2>&1 \
        || echo "[test] could not install chromium: the browser test will be skipped" >&2
fi
# 1. The published `cpu` run: nbval re-executes the committed notebooks against the committed result
#    store and compares every output (strict mode; volatile text via the sanitizers). Cache hits only:
#    a step that would recompute fails at once, naming itself. Redrawn figures and rewritten tables
#    must be byte-identical to the committed files.
snapshot() { find results figures -type f -not -path '*/fitness_cache/*' -print0 | sort -z | xargs -0 sha256sum; }
before="$(snapshot)"
LPES_CACHED_ONLY=1 python -m pytest notebooks --nbval --nbval-current-env \
    --nbval-sanitize-with tests/nbval_sanitize.cfg -p no:cacheprovider -q
after="$(snapshot)"
if [[ "$before" != "$after" ]]; then
    diff <(echo "$before") <(echo "$after") >&2 || true
    echo "[test] re-executing the published notebooks changed committed results/figures (above)" >&2
    exit 1
fi
# 2. Every notebook once under the `smoke` profile (the code paths the store cannot cover; papermill
#    stops at the first failing cell), into a fresh folder so every run recomputes instead of reading
#    old results; then the unit tests.
export LPES_OUTPUT_ROOT="$(mktemp -d)"
lpes run --profile smoke --out "$LPES_OUTPUT_ROOT/runs"
# 3. The GPU kit dry on tiny random models (carry, parity, latency, GA throughput, and as its regime
#    step the `gpu` profile's notebook 9 under `gpu-dry`); the acceptance is under two minutes
start=$SECONDS
bash scripts/gpu_kit.sh --out "$LPES_OUTPUT_ROOT/gpu_kit" --dry
echo "[test] gpu_kit --dry took $((SECONDS - start)) s" >&2
exec python -m pytest tests -p no:cacheprovider "$@"

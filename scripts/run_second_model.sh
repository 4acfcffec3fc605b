#!/usr/bin/env bash
# The second job: notebook 08, the search and its comparisons on Qwen2.5-Coder-0.5B (profile `cpu`).
source "$(dirname "$0")/env.sh"
python -m lpes_nb.models --prepare qwen2.5-coder-0.5b
exec python -m lpes_nb.run --profile "${PROFILE:-cpu}" --only 08 "$@"

#!/usr/bin/env bash
# The whole test suite, in the project's virtual environment (created on first use).
source "$(dirname "$0")/env.sh"
python -m lpes_nb.models --prepare   # converts the embedded model once (cached afterwards)
exec python -m pytest "$@"

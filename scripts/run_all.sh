#!/usr/bin/env bash
# The main job: every notebook, in order, under papermill, on the embedded model (profile `cpu`).
source "$(dirname "$0")/env.sh"
python -m lpes_nb.models --prepare
exec python -m lpes_nb.run --profile "${PROFILE:-cpu}" "$@"

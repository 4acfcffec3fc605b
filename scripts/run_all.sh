#!/usr/bin/env bash
# The main job: notebooks 01-07 in order under papermill, on SmolLM2-135M (profile `cpu`).
# Notebook 08 (the second model, Qwen2.5-Coder-0.5B) is its own job: scripts/run_second_model.sh.
# Arguments go to `python -m lpes_nb.run` (a later --only replaces this one).
source "$(dirname "$0")/env.sh"
python -m lpes_nb.models --prepare
exec python -m lpes_nb.run --profile "${PROFILE:-cpu}" --only 01 02 03 04 05 06 07 "$@"

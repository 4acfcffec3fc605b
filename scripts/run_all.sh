#!/usr/bin/env bash
# The main job: every numbered notebook (01-10) in order under papermill, profile `cpu` by default
# (PROFILE=smoke|cpu|paper|...). Arguments go to `lpes run`: --only 02 05, --from 03,
# --publish, -p NAME VALUE, --dry-run.
source "$(dirname "$0")/env.sh"
lpes models --prepare smollm2-135m qwen2.5-coder-0.5b
exec lpes run --profile "${PROFILE:-cpu}" "$@"

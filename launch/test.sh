#!/usr/bin/env bash
# The test command: installs what it needs into .venv (dstoolkit[dev]: pytest plus the train, bench, tune and hf
# extras, so transformers too), then runs every tier that this machine can run.
# GPU tests (marker gpu) skip themselves when no CUDA device is present.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh" dev
cd "$ROOT"
exec "$PY" -m pytest "$@"

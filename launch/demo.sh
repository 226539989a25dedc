#!/usr/bin/env bash
# The main job on the embedded default. Creates or reuses .venv, installs, then runs.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
cd "$ROOT"
echo "[demo] validating the bundled DeepSpeed configs under ds_configs/"
dstoolkit validate ds_configs --world-size 2

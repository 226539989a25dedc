# Sourced by launch/demo.sh and launch/test.sh: create or reuse .venv and install dstoolkit into it.
# Re-installs only when pyproject.toml changed since the last install (stamp file), so reruns are fast.
# $1 is the extra to install: train (default; what launch/demo.sh needs), dev (the test suite), bench, tune,
# hf, te, or core (no extra: no torch, no deepspeed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DSTOOLKIT_VENV:-$ROOT/.venv}"
PY_BOOT="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[dstoolkit] creating virtualenv $VENV"
  "$PY_BOOT" -m venv "$VENV"
fi
PY="$VENV/bin/python"
STAMP="$VENV/.dstoolkit-installed"
EXTRA="${1:-train}"
if [ "$EXTRA" = core ]; then EXTRA=""; fi
want="$(sha256sum < "$ROOT/pyproject.toml" | cut -c1-16)-$EXTRA"
# dev holds train, bench, tune, hf and megatron: a venv installed for the tests serves the demo as it is
case "$EXTRA" in train|bench|tune|hf|megatron)
  if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "${want%-*}-dev" ]; then want="${want%-*}-dev"; fi ;;
esac
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
  echo "[dstoolkit] installing dstoolkit${EXTRA:+[$EXTRA]} into $VENV (first run takes a few minutes)"
  # Keep an existing torch (a CUDA build, say); only a venv with no torch gets the pinned CPU-capable wheel.
  # Every extra but tune pulls torch==2.13.0: install that pin first, on its own, never an unpinned torch.
  if [ -n "$EXTRA" ] && [ "$EXTRA" != tune ] && ! "$PY" -c "import torch" >/dev/null 2>&1; then
    "$PY" -m pip install -q --disable-pip-version-check "torch==2.13.0"
  fi
  "$PY" -m pip install -q --disable-pip-version-check -e "$ROOT${EXTRA:+[$EXTRA]}"
  echo "$want" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
# One BLAS thread per rank: 2-rank CPU jobs on a 2-core machine otherwise oversubscribe.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

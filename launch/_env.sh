# Sourced by launch/demo.sh and launch/test.sh: create or reuse .venv and install dstoolkit into it.
# Re-installs only when setup.py changed since the last install (stamp file), so reruns are fast.
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
EXTRA="${1:-}"
want="$(cat "$ROOT/setup.py" | sha256sum | cut -c1-16)-$EXTRA"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
  echo "[dstoolkit] installing dstoolkit${EXTRA:+[$EXTRA]} into $VENV (first run takes a few minutes)"
  # Keep an existing torch (a CUDA build, say); only a venv with no torch gets the pinned CPU-capable wheel.
  if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    "$PY" -m pip install -q --disable-pip-version-check "torch==2.13.0"
  fi
  "$PY" -m pip install -q --disable-pip-version-check -e "$ROOT${EXTRA:+[$EXTRA]}"
  echo "$want" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
# One BLAS thread per rank: 2-rank CPU jobs on a 2-core machine otherwise oversubscribe.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

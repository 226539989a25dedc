"""`dstoolkit fp8 plan ... | head` stops quietly when the reader leaves (s32 validate/fp8 report, finding 12): no
'error: Broken pipe', exit as the plan did."""
from __future__ import annotations

import os
import subprocess
import sys


def test_fp8_plan_into_a_closed_pipe_exits_quietly():
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the plan is printed: every write is EPIPE
    try:
        proc = subprocess.run([sys.executable, "-m", "dstoolkit", "fp8", "plan", "llama-3-8b", "--seq-len", "1024"],
                              stdout=w, stderr=subprocess.PIPE, text=True, timeout=120,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        os.close(w)
    assert proc.stderr == ""
    assert proc.returncode == 0

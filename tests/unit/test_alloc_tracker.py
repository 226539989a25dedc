"""The continuous CPU memory tracker (dstoolkit/runtime/alloc_tracker.py) counts every allocation and free, on
every thread, and charges the maximum to the phase it was reached in. Run in a child process: installing it
replaces the CPU allocator for the rest of that process."""
import subprocess
import sys

import pytest

pytest.importorskip("torch")

CHILD = r"""
import json, threading, time, torch
from dstoolkit.runtime.alloc_tracker import AllocTracker
tr = AllocTracker.install()
assert AllocTracker.install() is tr  # idempotent
base = tr.live_bytes(); tr.reset_peak()
with tr.phase("a"):
    x = torch.empty(1 << 20); y = torch.empty(1 << 20); del x          # 4 MiB each, fp32
def other_thread():
    z = torch.empty(4 << 20); time.sleep(0.01); del z                   # 16 MiB on another thread
with tr.phase("thread"):
    t = threading.Thread(target=other_thread); t.start(); t.join()
with tr.phase("b"):
    w = torch.empty(1 << 18)                                            # 1 MiB
r = tr.result(base)
print(json.dumps(dict(peak=r.peak_bytes, phase=r.peak_phase, per=r.phase_max_bytes, live=tr.live_bytes() - base)))
"""


def test_tracker_counts_every_thread_and_names_the_phase(repo_root):
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300, cwd=repo_root)
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    r = json.loads(out.stdout.strip().splitlines()[-1])
    mib = 2**20
    assert r["peak"] == 4 * mib + 16 * mib and r["phase"] == "thread"  # y alive + the other thread's tensor
    assert r["per"]["a"] == 8 * mib and r["per"]["b"] == 5 * mib  # x and y together; y + w
    assert r["live"] == 5 * mib  # x and z were freed, y and w are alive

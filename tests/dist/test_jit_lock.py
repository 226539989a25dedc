"""A rank killed while holding a torch-extension lock leaves it behind; the next job the project starts (a
real 2-rank launch of the example trainer) removes it with a one-line message naming the op, and runs.

The lock sits in the real extensions folder under an op name nobody loads (a stale lock on a real op there
would stall other jobs on this shared machine until their own check ran); the holder takes it with torch's own
FileBaton and is SIGKILLed while holding it."""
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import yaml

from dstoolkit.runtime import jitlock
from dstoolkit.runtime.train.launch import run_local

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

HOLDER = textwrap.dedent("""
    import os, sys, time
    from torch.utils.file_baton import FileBaton
    b = FileBaton(sys.argv[1])
    assert b.try_acquire()
    os.chdir(os.path.dirname(sys.argv[1]))  # like the build (ninja) running in the build dir
    print("held", flush=True)
    time.sleep(600)
""")


def test_killed_holder_leaves_stale_lock_next_job_removes_it_with_message(tmp_path):
    op = f"dstoolkit_test_op_{os.getpid()}"
    build = jitlock.extensions_root() / "py311_cpu" / op
    build.mkdir(parents=True, exist_ok=True)
    lock = build / "lock"
    lock.unlink(missing_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        msgs = []
        rep = jitlock.check_locks(min_age_s=0.0, wait_timeout_s=1.0, log=msgs.append, who="probe")
        assert rep.still_held == [str(lock)], msgs  # live: waited on with a message, not removed
        assert f"op {op}" in msgs[0] and f"pid {holder.pid}" in msgs[0]
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        assert lock.exists()  # the kill left it behind

        spec = {"name": "lock", "model": {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                                          "num_attention_heads": 4, "num_key_value_heads": 2,
                                          "intermediate_size": 128, "vocab_size": 256},
                "cluster": {"nodes": 1, "gpus_per_node": 2, "gpu": "cpu"},
                "training": {"seq_len": 32, "global_batch": 4, "micro_batch": 2, "precision": "fp32",
                             "zero_stage": 1}}
        ds = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
              "zero_optimization": {"stage": 1}}
        (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
        (tmp_path / "ds.json").write_text(json.dumps(ds))
        # check_locks writes to this process's stderr: capture it via a child running the launch
        code = ("import sys; from dstoolkit.runtime.train.launch import run_local; "
                f"p = run_local(sys.argv[1:], timeout_s=500); sys.stderr.write(p.stdout[-1500:] + p.stderr[-2000:]); sys.exit(p.returncode)")
        proc = subprocess.run([sys.executable, "-c", code, "--deepspeed_config", str(tmp_path / "ds.json"),
                               "--spec", str(tmp_path / "spec.yaml"), "--steps", "2", "--no-progress",
                               "--metrics-out", str(tmp_path / "m.jsonl"),
                               "--peak-flops", "1e11", "--no-spike-guard"],
                              capture_output=True, text=True, timeout=560)
        first = proc.stderr.strip().splitlines()[:3]
        print("\n".join(first))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert any(f"removed stale torch-extension lock for op {op}" in ln and "no live process" in ln
                   for ln in first), first
        assert not lock.exists()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        lock.unlink(missing_ok=True)
        try:
            build.rmdir()
        except OSError:
            pass

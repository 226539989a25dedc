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
from tests.dist.locks import plant_lock, remove_planted

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
        assert str(lock) in rep.still_held, msgs  # live: waited on with a message, not removed
        mine = [m for m in msgs if f"op {op} " in m]
        assert f"pid {holder.pid}" in mine[0] and str(lock) in mine[0], msgs
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        assert lock.exists()  # the kill left it behind: a second old when the launch starts
        old = plant_lock(f"{op}_minute", age_s=60.0)  # and one a killed build left a minute ago

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
        first = proc.stderr.strip().splitlines()[:4]
        print("\n".join(first))
        assert proc.returncode == 0, proc.stderr[-3000:]
        for name in (op, f"{op}_minute"):
            assert any(f"removed stale torch-extension lock for op {name} " in ln and "no live process" in ln
                       for ln in proc.stderr.splitlines()), (name, first)
        assert not lock.exists() and not old.exists()
    finally:
        remove_planted(f"{op}_minute")
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        lock.unlink(missing_ok=True)
        try:
            build.rmdir()
        except OSError:
            pass


def test_generated_launch_sh_removes_second_old_and_minute_old_locks_before_it_starts_the_ranks(tmp_path):
    """The generated launch.sh checks the locks before it starts the ranks: a lock a killed build left a second
    ago and one left a minute ago are both removed, each with a line naming it. The locks sit in a private
    TORCH_EXTENSIONS_DIR (in the shared one every other job's check would remove them first) and the ranks run
    a module that does nothing (dstoolkit.runtime.rankexit), so the test costs a torchrun start, not a build."""
    import time

    from dstoolkit.runtime.train.launch import free_port

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ext = tmp_path / "ext"
    env = dict(os.environ, OMP_NUM_THREADS="1", STEPS="1", MASTER_PORT=str(free_port()), LAUNCHER="torchrun",
               TRAIN_MODULE="dstoolkit.runtime.rankexit", TORCH_EXTENSIONS_DIR=str(ext), PYTHON=sys.executable)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    g = subprocess.run([sys.executable, "-m", "dstoolkit", "generate", os.path.join(repo, "ds_configs", "tiny_cpu.yaml"),
                        "--out", str(tmp_path / "gen")], capture_output=True, text=True, timeout=300, env=env)
    assert g.returncode == 0, g.stderr[-2000:]
    locks = {}
    for age, age_s in (("second", 1.0), ("minute", 60.0)):
        build = ext / "py311_cpu" / f"op_{age}_old"
        build.mkdir(parents=True)
        locks[age] = build / "lock"
        locks[age].write_text("")
        t = time.time() - age_s
        os.utime(locks[age], (t, t))
    p = subprocess.run(["bash", str(tmp_path / "gen" / "zero1" / "launch.sh")], capture_output=True, text=True,
                       timeout=300, env=env)
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if "torch-extension lock" in ln]
    print("\n".join(lines))
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    for age, lock in locks.items():
        assert not lock.exists(), age
        assert any(ln.startswith(f"launch.sh: removed stale torch-extension lock for op {lock.parent.name} ({lock})")
                   and "no live process holds or builds it" in ln for ln in lines), (age, lines)

"""The trainer's process-group timeout reaches DeepSpeed's own groups, with real gloo ranks.

Two ranks go through `dstoolkit.runtime.train.pgroups.init_distributed("gloo", 5 s)` (what `--dist-timeout-s 5` does),
then DeepSpeed 0.19.8 creates its ZeRO data-parallel group and its expert / expert-data groups with
`dist.new_group`, as `deepspeed.initialize` and an MoE layer do. Rank 1 then freezes (SIGSTOP: its sockets
stay open and nothing answers, like a host behind a cut link) and rank 0 starts one all-reduce on each group.
Each must fail after about 5 s. Without the trainer's default-group timeout the new_group ones would wait
torch's gloo default, 30 min (checked once by hand: they were still waiting at 60 s), and the world group
DeepSpeed's 10 min.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dstoolkit.runtime.train.launch import free_port

pytestmark = [pytest.mark.dist, pytest.mark.timeout(120)]

TIMEOUT_S = 5.0
"""--dist-timeout-s for the run: short, so the test is cheap."""
SLACK_S = 10.0
"""Allowed lateness beyond TIMEOUT_S (2 shared cores under load: thread wake-up, exception unwinding)."""
HANG_S = 60.0
"""Rank 0 not finished by then: a collective is hanging, the timeout did not reach its group."""

WORKER = r'''
import json, os, signal, sys, time
import torch
import deepspeed.comm as dist
from deepspeed.utils import groups
from dstoolkit.runtime.train.pgroups import init_distributed

timeout_s, out = float(sys.argv[1]), sys.argv[2]
init_distributed("gloo", timeout_s)
named = {"world": dist.get_world_group(),
         "zero_data_parallel": groups._get_data_parallel_group()}  # ZeRO's group: a new_group clone of the world
groups._create_expert_and_data_parallel(2)  # what deepspeed.moe.layer.MoE(ep_size=2) does
named["expert_parallel"] = groups._get_expert_parallel_group("ep_size_2")
dist.barrier()
if dist.get_rank() == 1:
    os.kill(os.getpid(), signal.SIGSTOP)  # frozen peer: sockets stay open, nothing answers
    time.sleep(3600)
t0 = time.monotonic()
works = {name: dist.all_reduce(torch.ones(8), group=g, async_op=True) for name, g in named.items()}
result = {}
for name, work in works.items():
    try:
        work.wait()
        result[name] = {"completed": True}
    except Exception as e:  # the timeout error (gloo raises RuntimeError / DistBackendError)
        result[name] = {"completed": False, "failed_after_s": time.monotonic() - t0,
                        "error": f"{type(e).__name__}: {e}"[:300]}
with open(out, "w") as f:
    json.dump(result, f)
os._exit(0)  # do not tear down process groups that a frozen peer still holds
'''


def test_collective_on_deepspeed_groups_fails_after_the_dist_timeout(tmp_path, repo_root):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "result.json"
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": f"{repo_root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        procs.append(subprocess.Popen([sys.executable, str(script), str(TIMEOUT_S), str(out)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    t_start = time.monotonic()
    try:
        try:
            procs[0].wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"rank 0 still running after {HANG_S:.0f} s: a collective hangs past --dist-timeout-s")
        log0 = procs[0].stdout.read()
        assert procs[0].returncode == 0, log0[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)  # SIGKILL also ends the SIGSTOPped rank
            p.wait(timeout=30)
    wall_s = time.monotonic() - t_start
    result = json.loads(out.read_text())
    print({"timeout_s": TIMEOUT_S, "wall_s": round(wall_s, 1),
           **{k: round(v["failed_after_s"], 2) for k, v in result.items() if "failed_after_s" in v}})
    assert sorted(result) == ["expert_parallel", "world", "zero_data_parallel"]
    for name, r in result.items():
        assert not r["completed"], f"{name}: an all-reduce without rank 1 completed: {r}"
        # It failed because the timeout ran out (not earlier, for another reason), and not much later.
        assert "timed out" in r["error"].lower() or "timeout" in r["error"].lower(), (name, r)
        assert 0.8 * TIMEOUT_S <= r["failed_after_s"] <= TIMEOUT_S + SLACK_S, (name, r)

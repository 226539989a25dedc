"""launch.sh (deepspeed target) on several nodes refuses, before anything starts (exit 2, one line), a launch run on
every node (LAUNCHER=torchrun, NO_SSH=1) without NODE_RANK, and a MASTER_ADDR that would be the unedited hostfile's
placeholder host; launch_hf.sh keeps its wording, now from the shared helper (shell.require_set).

Before: launch.sh ran `torchrun ... --node_rank 0 --master_addr node-0` (every node rank 0, rendezvous at a host that
does not exist) and `deepspeed --no_ssh --node_rank 0 --master_addr node-0`.
"""
from __future__ import annotations

import os
import subprocess

import pytest

from dstoolkit.cli import main

SPEC = """\
name: two_nodes
model: {preset: tiny}
cluster: {nodes: 2, gpus_per_node: 2, gpu: cpu}
training: {seq_len: 128, global_batch: 8, precision: bf16, zero_stage: 1}
"""
NODE_RANK_MSG = ("launch.sh: NODE_RANK is not set: a 2-node launch runs this script on every node with "
                 "NODE_RANK=<this node's rank, 0..1>\n")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("s32nodes")
    (tmp / "spec.yaml").write_text(SPEC)
    assert main(["generate", str(tmp / "spec.yaml"), "-o", str(tmp / "out"), "--strategy", "zero1",
                 "--target", "deepspeed", "--target", "hf"]) == 0
    return tmp / "out" / "zero1"


def _run(folder, script, env, *args):
    e = {k: v for k, v in os.environ.items() if k not in ("NODE_RANK", "MASTER_ADDR", "LAUNCHER", "NO_SSH")}
    return subprocess.run(["bash", str(folder / script), *args], env={**e, "DRY_RUN": "1", **env},
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("env", [{"LAUNCHER": "torchrun"}, {"NO_SSH": "1"},
                                 {"LAUNCHER": "torchrun", "MASTER_ADDR": "h0"}])
def test_every_node_launch_without_node_rank_is_refused(folder, env):
    r = _run(folder, "launch.sh", env)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", NODE_RANK_MSG)


@pytest.mark.parametrize("env", [{}, {"LAUNCHER": "torchrun", "NODE_RANK": "1"}, {"NO_SSH": "1", "NODE_RANK": "0"}])
def test_placeholder_master_addr_is_refused(folder, env):
    r = _run(folder, "launch.sh", env)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (f"launch.sh: MASTER_ADDR is not set and {folder}/hostfile still names the placeholder host "
                        "node-0: write your host names into it (node 0 first), or set MASTER_ADDR=<node 0's address, "
                        "the same on every node>\n")


def test_set_node_rank_and_master_addr_launch(folder):
    r = _run(folder, "launch.sh", {"LAUNCHER": "torchrun", "NODE_RANK": "1", "MASTER_ADDR": "h0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("torchrun --nnodes 2 --nproc_per_node 2 --node_rank 1 --master_addr h0 ")


def test_edited_hostfile_gives_master_addr(folder, tmp_path):
    hf = tmp_path / "hostfile"
    hf.write_text("# my hosts\nnode-0 slots=2\nnode-1 slots=2\n")  # real hosts that happen to be named node-N
    r = _run(folder, "launch.sh", {"NO_SSH": "1", "NODE_RANK": "0", "HOSTFILE": str(hf)})
    assert r.returncode == 0, r.stderr
    assert " --no_ssh --node_rank 0 --master_addr node-0 " in r.stdout


def test_hf_launch_wording_unchanged(folder):
    r = _run(folder, "launch_hf.sh", {}, "t.py")
    assert (r.returncode, r.stderr) == (2, "launch_hf.sh: NODE_RANK is not set: a 2-node launch runs this script on "
                                           "every node with NODE_RANK=<this node's rank, 0..1>\n")
    r = _run(folder, "launch_hf.sh", {"NODE_RANK": "1"}, "t.py")
    assert (r.returncode, r.stderr) == (2, "launch_hf.sh: MASTER_ADDR is not set: a 2-node launch runs this script "
                                           "on every node with MASTER_ADDR=<node 0's address, the same on every node>\n")

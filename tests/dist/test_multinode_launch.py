"""Generated multi-node launches really run across two test hosts (network namespaces), 2 nodes x 2 CPU ranks.

From one generated strategy folder (`dstoolkit generate`, spec with nodes: 2, gpus_per_node: 2, gpu: cpu):
- the torchrun form, run once per host (LAUNCHER=torchrun NODE_RANK=k bash launch.sh);
- the deepspeed launcher's per-node form (`--hostfile H --no_ssh --node_rank k`, DeepSpeed 0.19.8);
both give the loss trajectory of a single-host 4-rank run with the same seed and data order, bitwise.
The Slurm script's srun line is run through stand-in `scontrol`/`srun` (no Slurm here) that record what
they get: the script must parse, and every variable must have expanded to the test hosts' values.
Needs root (network namespaces); skips otherwise.
"""
from __future__ import annotations

import os
import pathlib
import shlex
import subprocess

import pytest

from dstoolkit.runtime.cpu_precision import precision_for_this_cpu
from dstoolkit.runtime.testhosts import jobs, scenarios
from tests.dist.multinode.fixtures import two_hosts  # noqa: F401  (fixture)

STEPS = 6
STRATEGY = "zero2"


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> pathlib.Path:
    d = tmp_path_factory.mktemp("mn_gen")
    spec = d / "two_node_cpu.yaml"
    spec.write_text(scenarios.two_node_spec_text(precision=precision_for_this_cpu("bf16")))
    out = scenarios.generate(spec, d / "out", [STRATEGY])
    return out / STRATEGY


@pytest.mark.dist
@pytest.mark.slow
def test_generated_launches_on_two_hosts_equal_single_host(two_hosts, generated, tmp_path):  # noqa: F811
    sdir = generated
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{a} slots={scenarios.NPROC_PER_NODE}\n" for a in two_hosts.addrs))
    # Reference: the same trainer, config and spec with all 4 ranks on one host.
    ref_metrics = tmp_path / "single.jsonl"
    # a 2-node launch.sh under torchrun needs NODE_RANK (f7961ec); only the trainer part of its argv is used here
    argv = scenarios.launch_dry_run(sdir, {"LAUNCHER": "torchrun", "METRICS_OUT": str(ref_metrics), "STEPS": str(STEPS),
                                           "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                                               # the trainer saves its last step: its own folder, not the cwd's
                                               "CKPT_DIR": str(tmp_path / "checkpoints_single")})
    script = argv[argv.index("-m"):] + scenarios.trainer_extra()
    res = jobs.run_single_host(4, script, tmp_path, "single", 300)
    assert res.ok, res.tail()
    ref = jobs.read_losses(ref_metrics)
    assert sorted(ref) == list(range(1, STEPS + 1)) or sorted(ref) == list(range(STEPS)), ref

    results = {}
    for launcher in ("torchrun", "deepspeed"):
        metrics = tmp_path / f"{launcher}.jsonl"
        argvs = scenarios.node_commands(two_hosts, sdir, launcher, metrics, STEPS, scenarios.trainer_extra(),
                                        hostfile=hostfile)
        r = jobs.run_on_hosts(two_hosts, argvs, tmp_path, launcher, 300)
        assert r.ok, f"{launcher}:\n{r.tail()}"
        results[launcher] = jobs.read_losses(metrics)
    print({"single_host_4_ranks": ref, **results})
    assert results["torchrun"] == ref
    assert results["deepspeed"] == ref


FAKE_SCONTROL = """#!/usr/bin/env bash
# Stand-in for `scontrol show hostnames LIST` (comma list only).
[ "$1 $2" = "show hostnames" ] || { echo "fake scontrol: unsupported: $*" >&2; exit 2; }
tr ',' '\\n' <<< "$3"
"""

FAKE_SRUN = """#!/usr/bin/env bash
# Stand-in for srun: checks its options, records argv, then runs the command once per node with the
# SLURM_NODEID that node would get and DRY_RUN=1 (launch.sh prints the per-node command instead of running it).
set -euo pipefail
nodes=()
while [ $# -gt 0 ]; do
  case "$1" in
    --ntasks-per-node=*|--kill-on-bad-exit=*|--nodes=*|--ntasks=*|--cpu-bind=*|--export=*) shift ;;
    --*) echo "fake srun: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
printf '%s\\0' "$@" > "$FAKE_SLURM_LOG/srun.argv"
for k in $(seq 0 $(( SLURM_NNODES - 1 ))); do
  SLURM_NODEID=$k SLURM_PROCID=$k DRY_RUN=1 "$@" > "$FAKE_SLURM_LOG/node$k.cmd"
done
"""


def test_generated_sbatch_srun_line_expands(generated, tmp_path):
    """The sbatch script parses, writes a hostfile from the allocation, and its srun line expands per node."""
    sdir = generated
    sb = sdir / "slurm.sbatch"
    assert subprocess.run(["bash", "-n", str(sb)], capture_output=True).returncode == 0
    text = sb.read_text()
    assert "#SBATCH --nodes=2" in text
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN)):
        (bindir / name).write_text(body)
        (bindir / name).chmod(0o755)
    hosts = ["10.213.7.1", "10.213.7.2"]  # only printed (DRY_RUN): nothing is contacted
    env = dict(os.environ)
    env.update(jobs.base_env())
    env.update({"PATH": f"{bindir}:{env['PATH']}", "FAKE_SLURM_LOG": str(tmp_path), "SLURM_JOB_ID": "4242",
                "SLURM_JOB_NODELIST": ",".join(hosts), "SLURM_NNODES": "2", "SLURM_SUBMIT_DIR": str(sdir),
                "SLURM_LAUNCHER": "torchrun", "STEPS": "3"})
    r = subprocess.run(["bash", str(sb)], capture_output=True, text=True, env=env, timeout=60, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    hf = (sdir / "hostfile.slurm-4242").read_text().split("\n")
    assert hf[:2] == [f"{h} slots={scenarios.NPROC_PER_NODE}" for h in hosts]
    argv = (tmp_path / "srun.argv").read_bytes().split(b"\0")[:-1]
    assert argv[0] == b"bash" and argv[-1] == str(sdir).encode(), argv
    for k in range(2):
        cmd = shlex.split((tmp_path / f"node{k}.cmd").read_text().strip().splitlines()[-1])
        assert "$" not in " ".join(cmd), cmd  # every variable expanded
        assert os.path.basename(cmd[0]) == "torchrun", cmd
        def opt(name: str) -> str:
            return cmd[cmd.index(name) + 1]

        assert (opt("--node_rank"), opt("--nnodes"), opt("--nproc_per_node")) == (str(k), "2", "2"), cmd
        assert opt("--master_addr") == hosts[0], cmd
        assert "--deepspeed_config" in cmd and str(sdir / "ds_config.json") in cmd, cmd
    (sdir / "hostfile.slurm-4242").unlink()

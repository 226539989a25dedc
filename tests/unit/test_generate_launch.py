"""launch.sh / hostfile / slurm.sbatch: the commands they run, and that no spec value can inject a command."""
from __future__ import annotations

import os
import shlex
import subprocess

import pytest
import yaml

from dstoolkit.cli import main
from dstoolkit.generate import launch
from dstoolkit.runtime.train import trainer_inputs

EVIL_NAME = "x'; touch PWNED1; echo '$(touch PWNED2)`touch PWNED3`\ntouch PWNED4 #"


def _bash(args, cwd, env=None):
    e = {**os.environ, **(env or {})}
    return subprocess.run(["bash", *args], cwd=cwd, env=e, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def tiny_out(tmp_path_factory, repo_root):
    out = tmp_path_factory.mktemp("gen") / "tiny"
    assert main(["generate", str(repo_root / "ds_configs" / "tiny_moe_cpu.yaml"), "--out", str(out)]) == 0
    return out


def test_dry_run_deepspeed_command(tiny_out):
    r = _bash(["launch.sh"], cwd=tiny_out / "zero1-ep", env={"DRY_RUN": "1", "STEPS": "7", "MASTER_PORT": "12345"})
    assert r.returncode == 0, r.stderr
    argv = shlex.split(r.stdout)
    assert argv[0] == "deepspeed"
    assert argv[argv.index("--hostfile") + 1] == str(tiny_out / "zero1-ep" / "hostfile")
    assert "--no_ssh_check" in argv  # one node
    assert argv[argv.index("--master_port") + 1] == "12345"
    assert argv[argv.index("--module") + 1] == "dstoolkit.runtime.train.trainer"
    assert argv[argv.index("--steps") + 1] == "7"
    assert argv[argv.index("--ep-size") + 1] == "2"
    assert argv[argv.index("--deepspeed_config") + 1] == str(tiny_out / "zero1-ep" / "ds_config.json")
    assert argv[argv.index("--dist-timeout-s") + 1] == str(launch.DEFAULT_DIST_TIMEOUT_S)
    assert "--no_ssh" not in argv and "--node_rank" not in argv  # NO_SSH unset: the launcher starts every node


def test_checkpoint_saving_follows_the_spec_and_the_environment(tmp_path, tiny_out, repo_root):
    """launch.sh saves where and how often the spec says (training.save_dir / save_interval), like the HF and
    Megatron targets; CKPT_DIR / SAVE_EVERY override; the trainer parses both."""
    from dstoolkit.runtime.train.trainer_inputs import build_parser
    from dstoolkit.spec import load_spec

    spec = load_spec(repo_root / "ds_configs" / "tiny_moe_cpu.yaml")
    r = _bash(["launch.sh"], cwd=tiny_out / "zero2", env={"DRY_RUN": "1"})
    assert r.returncode == 0, r.stderr
    argv = shlex.split(r.stdout)
    assert argv[argv.index("--checkpoint-dir") + 1] == spec.training.save_dir == "checkpoints"
    assert argv[argv.index("--save-every") + 1] == str(spec.training.save_interval())
    r = _bash(["launch.sh"], cwd=tiny_out / "zero2", env={"DRY_RUN": "1", "CKPT_DIR": "/ck pt", "SAVE_EVERY": "5"})
    argv = shlex.split(r.stdout)
    assert argv[argv.index("--checkpoint-dir") + 1] == "/ck pt" and argv[argv.index("--save-every") + 1] == "5"
    trainer_args = build_parser().parse_args(argv[argv.index("--module") + 2:])
    assert (trainer_args.checkpoint_dir, trainer_args.save_every) == ("/ck pt", 5)

    own = tmp_path / "spec.yaml"  # a spec that names its own folder and interval
    own.write_text((repo_root / "ds_configs" / "tiny_moe_cpu.yaml").read_text().replace(
        "training:\n", "training:\n  save_dir: /data/run 1/ckpt\n  save_interval_steps: 250\n", 1))
    assert main(["generate", str(own), "--out", str(tmp_path / "g")]) == 0
    r = _bash(["launch.sh"], cwd=tmp_path / "g" / "zero2", env={"DRY_RUN": "1"})
    argv = shlex.split(r.stdout)
    assert argv[argv.index("--checkpoint-dir") + 1] == "/data/run 1/ckpt" and argv[argv.index("--save-every") + 1] == "250"


def test_launch_default_timeout_is_the_trainers():
    assert float(launch.DEFAULT_DIST_TIMEOUT_S) == trainer_inputs.DEFAULT_DIST_TIMEOUT_S


def test_dry_run_deepspeed_no_ssh_timeout_and_passthrough(tiny_out):
    """The restart path: NO_SSH=1 per node, DIST_TIMEOUT_S, and extra arguments reach the trainer."""
    r = _bash(["launch.sh", "--checkpoint-dir", "/ck pt", "--save-every", "2", "--resume"], cwd=tiny_out / "zero2",
              env={"DRY_RUN": "1", "NO_SSH": "1", "NODE_RANK": "1", "DIST_TIMEOUT_S": "42"})
    assert r.returncode == 0, r.stderr
    argv = shlex.split(r.stdout)
    assert argv[0] == "deepspeed"
    # Launcher options, before the module: DeepSpeed 0.19.8's per-node form.
    module_at = argv.index("--module")
    assert argv.index("--no_ssh") < module_at and argv[argv.index("--node_rank") + 1] == "1"
    assert argv.index("--node_rank") < module_at
    assert argv[argv.index("--dist-timeout-s") + 1] == "42"
    assert argv[-5:] == ["--checkpoint-dir", "/ck pt", "--save-every", "2", "--resume"]


def test_no_ssh_flags_parse_with_deepspeed_launcher(tiny_out):
    from deepspeed.launcher.runner import parse_args

    r = _bash(["launch.sh"], cwd=tiny_out / "zero2", env={"DRY_RUN": "1", "NO_SSH": "1", "NODE_RANK": "0"})
    argv = shlex.split(r.stdout)
    args = parse_args(argv[1:])
    assert args.no_ssh and args.node_rank == 0 and args.module and args.user_script == "dstoolkit.runtime.train.trainer"
    assert args.user_args[args.user_args.index("--dist-timeout-s") + 1] == "600"


def test_sbatch_passes_its_arguments_to_launch(tiny_out, tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text('#!/usr/bin/env bash\necho "$3"\n')  # stand-in: `show hostnames LIST`
    (bindir / "scontrol").chmod(0o755)
    folder = tiny_out / "zero2"
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": "7",
           "STRATEGY_DIR": str(folder), "DRY_RUN": "1"}
    r = _bash([str(folder / "slurm.sbatch"), "--resume", "--save-every", "3"], cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert (folder / "hostfile.slurm-7").read_text() == "localhost slots=2\n"
    (folder / "hostfile.slurm-7").unlink()
    argv = shlex.split(r.stdout)
    assert argv[0] == "deepspeed" and argv[-3:] == ["--resume", "--save-every", "3"]


def test_dry_run_torchrun_alternative_and_passthrough(tiny_out):
    r = _bash(["launch.sh", "--no-progress"], cwd=tiny_out / "zero2",
              env={"DRY_RUN": "1", "LAUNCHER": "torchrun"})
    assert r.returncode == 0, r.stderr
    argv = shlex.split(r.stdout)
    assert argv[:1] == ["torchrun"] and argv[argv.index("--nproc_per_node") + 1] == "2"
    assert argv[argv.index("-m") + 1] == "dstoolkit.runtime.train.trainer" and argv[-1] == "--no-progress"
    assert argv[argv.index("--ep-size") + 1] == "1"


def test_unknown_launcher_exits_2(tiny_out):
    r = _bash(["launch.sh"], cwd=tiny_out / "zero2", env={"DRY_RUN": "1", "LAUNCHER": "mpirun"})
    assert r.returncode == 2 and "LAUNCHER must be deepspeed or torchrun" in r.stderr


def test_cpu_launch_sets_one_omp_thread(tiny_out):
    text = (tiny_out / "zero2" / "launch.sh").read_text()
    assert 'export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"' in text
    assert (tiny_out / "zero2" / "hostfile").read_text() == "localhost slots=2\n"
    assert os.access(tiny_out / "zero2" / "launch.sh", os.X_OK)


def test_malicious_spec_name_cannot_inject(tmp_path, repo_root):
    spec = yaml.safe_load((repo_root / "ds_configs" / "tiny_cpu.yaml").read_text())
    spec["name"] = EVIL_NAME
    path = tmp_path / "evil.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    assert main(["generate", str(path), "--out", str(out), "--strategy", "zero1"]) == 0
    folder = out / "zero1"
    for script in ("launch.sh", "slurm.sbatch"):
        r = _bash(["-n", script], cwd=folder)
        assert r.returncode == 0, f"{script} is not valid bash: {r.stderr}"
    r = _bash(["launch.sh"], cwd=folder, env={"DRY_RUN": "1"})
    assert r.returncode == 0, r.stderr
    # Environment overrides and extra arguments stay data too, with either launcher.
    for launcher in ("deepspeed", "torchrun"):
        r = _bash(["launch.sh", "; touch PWNED5", "$(touch PWNED6)"], cwd=folder,
                  env={"DRY_RUN": "1", "LAUNCHER": launcher, "NO_SSH": "1", "NODE_RANK": "$(touch PWNED7)",
                       "DIST_TIMEOUT_S": "1; touch PWNED8"})
        assert r.returncode == 0, r.stderr
        argv = shlex.split(r.stdout)
        assert argv[-2:] == ["; touch PWNED5", "$(touch PWNED6)"]
        assert argv[argv.index("--dist-timeout-s") + 1] == "1; touch PWNED8"
        assert argv[argv.index("--node_rank") + 1] == "$(touch PWNED7)"
    # the name round-trips as data
    r2 = _bash(["-c", 'source <(sed -n "/^RUN_NAME=/,/^NNODES=/p" launch.sh); printf %s "$RUN_NAME"'], cwd=folder)
    assert r2.stdout == EVIL_NAME
    for n in range(1, 9):
        assert not (folder / f"PWNED{n}").exists() and not (tmp_path / f"PWNED{n}").exists()
    sbatch = (folder / "slurm.sbatch").read_text()
    job = next(ln for ln in sbatch.splitlines() if ln.startswith("#SBATCH --job-name="))
    assert set(job.split("=", 1)[1]) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-+")
    assert "PWNED" not in "\n".join(ln for ln in sbatch.splitlines() if ln.startswith("#") and "job-name" not in ln)


def test_multi_node_hostfile_parses_with_deepspeed(repo_root):
    from deepspeed.launcher.runner import _parse_hostfile

    from dstoolkit.generate.bundled import cached_bundled

    res = cached_bundled(str(repo_root / "ds_configs"), "deepseek_v3_32x8_h800")
    text = res.generated[0].files["hostfile"]
    pool = _parse_hostfile(text.splitlines(keepends=True))
    assert len(pool) == 32 and set(pool.values()) == {8}
    launch = res.generated[0].files["launch.sh"]
    assert "--no_ssh_check" not in launch  # several nodes: keep DeepSpeed's ssh check
    assert "#SBATCH --nodes=32" in res.generated[0].files["slurm.sbatch"]
    assert "#SBATCH --gpus-per-node=8" in res.generated[0].files["slurm.sbatch"]

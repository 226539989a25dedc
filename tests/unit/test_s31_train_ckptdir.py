"""s31 fixes in `dstoolkit train`, the pure parts (no rank starts): a fresh run into a folder that holds checkpoints,
a --resume from a checkpoint saved at another ZeRO stage / dp size, from a universal checkpoint or from unfinished
saves only, the advice for a tp/pp config, a checkpoint save that fails on a full disk, and SIGTERM forwarding.
Each is refused or handled before any launcher starts (the launcher seam `subprocess.run` fails the test)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dstoolkit.cli import main
from dstoolkit.cli import train as train_cli
from dstoolkit.runtime.train import ckpt as ckpt_mod
from dstoolkit.runtime.train.ckpt import CheckpointManager


@pytest.fixture
def no_launch(monkeypatch):
    def launch(*a, **k):
        raise AssertionError(f"ranks started: {a}")

    monkeypatch.setattr(train_cli.subprocess, "run", launch)


def _tag(root: Path, step: int, *, stage: int = 2, dp: int = 2, manifest: bool = True) -> Path:
    """A tag folder as DeepSpeed 0.19.8 names its files, with the metadata `ckpt inspect` reads (torch.save)."""
    import torch

    d = root / f"step_{step:08d}"
    d.mkdir(parents=True)
    torch.save({"dp_world_size": dp, "ds_config": {"zero_optimization": {"stage": stage}}},
               d / "mp_rank_00_model_states.pt")
    for r in range(dp):
        torch.save({"optimizer_state_dict": {"zero_stage": stage}},
                   d / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
    if manifest:
        (d / "dstoolkit_manifest.json").write_text(json.dumps({"format": 1, "files": {}, "step": step}))
    (root / "latest").write_text(d.name)
    return d


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _train(spec, ds, *extra, nproc: int = 2) -> int:
    return main(["train", "--spec", str(spec), "--config", str(ds), "--steps", "4", "--nproc", str(nproc),
                 "--metrics-out", str(Path(ds).parent / "m.jsonl"), "--", *extra])


def test_fresh_run_into_a_folder_with_checkpoints_is_refused(train_files, no_launch, tmp_path, capsys):
    spec, ds = train_files
    ck = tmp_path / "ck"
    _tag(ck, 3)
    _tag(ck, 6)
    before = _tree(ck)
    assert _train(spec, ds, "--checkpoint-dir", str(ck), "--save-every", "2") == 2  # before: launched, overwrote
    err = capsys.readouterr().err
    assert err == (f"dstoolkit train: error: --checkpoint-dir {ck}: already holds checkpoints (step_00000006, "
                   "step_00000003, latest) and this run has no --resume: it would overwrite the tags it saves again "
                   "and prune the others; add --resume (to continue from them), or give a new --checkpoint-dir\n")
    assert _tree(ck) == before


def test_fresh_run_into_an_empty_or_new_folder_is_not_refused(train_files, tmp_path, monkeypatch):
    spec, ds = train_files
    calls = []
    monkeypatch.setattr(train_cli.subprocess, "run", lambda cmd, **k: calls.append(cmd) or
                        subprocess.CompletedProcess(cmd, 1))
    (tmp_path / "empty").mkdir()
    for ck in (tmp_path / "empty", tmp_path / "new"):
        _train(spec, ds, "--checkpoint-dir", str(ck), "--save-every", "2")
    assert len(calls) == 2


def test_resume_from_another_zero_stage_is_refused_before_launch(train_files, no_launch, tmp_path, capsys):
    spec, ds = train_files
    cfg = json.loads(ds.read_text())
    cfg["zero_optimization"] = {"stage": 3}
    ds.write_text(json.dumps(cfg))
    ck = tmp_path / "ck"
    _tag(ck, 6, stage=2, dp=2)
    assert _train(spec, ds, "--checkpoint-dir", str(ck), "--resume") == 2  # before: launched, AssertionError per rank
    err = capsys.readouterr().err
    assert err.startswith(f"dstoolkit train: error: --checkpoint-dir {ck}: --resume would load step_00000006, saved "
                          "at ZeRO-2, dp 2, but this run is ZeRO-3; ")
    assert "Resume with a ZeRO-2 config and --nproc 2, or `dstoolkit ckpt reshard` it" in err
    assert "checkpoint.load_universal" in err and err.count("\n") == 1


def test_resume_at_another_dp_size_is_refused_before_launch(train_files, no_launch, tmp_path, capsys):
    spec, ds = train_files
    ds.write_text(json.dumps({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4,
                              "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2}}))
    ck = tmp_path / "ck"
    _tag(ck, 6, stage=2, dp=2)
    assert _train(spec, ds, "--checkpoint-dir", str(ck), "--resume", nproc=1) == 2
    err = capsys.readouterr().err
    assert "saved at ZeRO-2, dp 2, but this run is dp 1;" in err and "--nproc 2" in err


def test_zero0_checkpoint_resumes_at_another_dp_size(tmp_path):
    from dstoolkit.runtime.train.resume_check import resume_refusal

    ck = tmp_path / "ck"
    d = _tag(ck, 4, stage=0, dp=2)
    for p in d.glob("*optim_states.pt"):
        p.unlink()  # ZeRO-0 keeps the optimizer in the model states
    assert resume_refusal(ck, {"zero_optimization": {"stage": 0}}, 1) is None
    assert resume_refusal(ck, {}, 1) is None  # no zero_optimization: stage 0
    assert "but this run is ZeRO-1" in resume_refusal(ck, {"zero_optimization": {"stage": 1}}, 2)


def test_resume_from_a_universal_checkpoint_is_refused_naming_it(train_files, no_launch, tmp_path, capsys):
    spec, ds = train_files
    ck = tmp_path / "uni"
    (ck / "step_00000006" / "zero" / "lm_head.weight").mkdir(parents=True)
    (ck / "latest_universal").write_text("step_00000006")
    assert _train(spec, ds, "--checkpoint-dir", str(ck), "--resume") == 2  # before: retrained from step 0, exit 0
    err = capsys.readouterr().err
    assert f"--checkpoint-dir {ck}: holds a DeepSpeed universal checkpoint (step_00000006: `dstoolkit ckpt reshard` " \
           "output" in err
    assert "checkpoint.load_universal true" in err and "did not finish" not in err


def test_resume_whose_every_checkpoint_is_unfinished_is_refused(train_files, no_launch, tmp_path, capsys):
    spec, ds = train_files
    ck = tmp_path / "ck"
    _tag(ck, 2, manifest=False)
    assert _train(spec, ds, "--checkpoint-dir", str(ck), "--resume") == 2  # before: "starting from step 0", exit 0
    err = capsys.readouterr().err
    assert err.startswith(f"dstoolkit train: error: --checkpoint-dir {ck}: --resume found no checkpoint it can load "
                          "(1 rejected: step_00000002: dstoolkit_manifest.json is missing")
    assert "start afresh without --resume in a new --checkpoint-dir" in err


def test_rank_side_resume_refuses_when_every_checkpoint_is_rejected(tmp_path):
    """The ranks (a launch.sh or torchrun started by hand) say the same: Checkpoints.resume raises, never a silent
    fresh start."""
    from types import SimpleNamespace

    from dstoolkit.runtime.train.run_state import Checkpoints, RunState
    from dstoolkit.runtime.train.trainer_inputs import UsageError

    ck = tmp_path / "ck"
    _tag(ck, 2, manifest=False)
    events = []
    writer = SimpleNamespace(write=events.append)
    cp = Checkpoints(CheckpointManager(ck), SimpleNamespace(max_rollbacks=3), None, RunState(), object(), writer,
                     lambda m: None)
    with pytest.raises(UsageError, match="--resume found no checkpoint it can load"):
        cp.resume()
    assert events == []  # before: {"event": "resume", "tag": None, ...} and training from step 0


def test_tp_config_refusal_names_fixes_train_has(tmp_path, no_launch, capsys):
    gen = tmp_path / "gen" / "zero1"
    gen.mkdir(parents=True)
    spec = tmp_path / "gen" / "spec.yaml"
    spec.write_text("name: t\nmodel: {preset: tiny}\ncluster: {nodes: 1, gpus_per_node: 2, gpu: cpu}\n"
                    "training: {seq_len: 16, global_batch: 8, micro_batch: 8, tp: 2}\n")
    ds = gen / "ds_config.json"
    ds.write_text(json.dumps({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8,
                              "gradient_accumulation_steps": 1}))
    (gen / "layout.json").write_text(json.dumps({"world_size": 2, "gpus_per_node": 2, "nodes": 1, "files": {
        "ds_config.json": {"tp": 2, "pp": 1, "ep": 1, "label": "zero1 tp2 pp1 mb8", "targets": ["deepspeed"],
                           "num_experts": None}}}))
    assert main(["train", "--spec", str(spec), "--config", str(ds), "--steps", "2", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--tp / --pp" not in err and "--nproc 1" not in err  # before: both, and `train` has neither fix
    assert f"it was made for tp 2 x pp 1 ({gen / 'layout.json'}), and the bundled example trainer is data parallel " \
           "only" in err
    assert "launch.sh with TRAIN_MODULE set to it" in err and "training.tp: 1, training.pp: 1" in err


class _Engine:
    """save_checkpoint writes part of a file into staging, then fails as torch's zip writer does on a full disk."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def save_checkpoint(self, save_dir, tag, client_state, save_latest):
        d = Path(save_dir) / tag
        d.mkdir(parents=True)
        (d / "mp_rank_00_model_states.pt").write_bytes(b"PK" + b"\0" * 100)
        raise self.exc


def test_disk_full_save_removes_staging_and_says_no_space(tmp_path, monkeypatch):
    usage = ckpt_mod.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(ckpt_mod.shutil, "disk_usage", lambda p: usage._replace(free=4096, total=2 << 20))
    mgr = CheckpointManager(tmp_path / "ck")
    exc = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 3968 vs 3860")
    with pytest.raises(ckpt_mod.CheckpointSaveError) as info:  # before: that RuntimeError, .staging/step_* left
        mgr.save(_Engine(exc), 2, {}, healthy=True, barrier=lambda: None)
    assert str(info.value) == (
        f"checkpoint {tmp_path / 'ck' / 'step_00000002'}: no space left on device (0.0 MiB free of 2.0 MiB); the "
        f"partial save ({tmp_path / 'ck' / '.staging' / 'step_00000002'}) is removed. Free space, keep fewer "
        "checkpoints (a lower --keep-checkpoints), or give --checkpoint-dir a folder on a larger disk, then rerun with "
        "--resume")
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == []


def test_other_save_failure_names_the_error(tmp_path):
    mgr = CheckpointManager(tmp_path / "ck")
    with pytest.raises(ckpt_mod.CheckpointSaveError,
                       match=r"step_00000002: could not be written \(PermissionError: denied\); the partial save .* is "
                             r"removed"):
        mgr.save(_Engine(PermissionError("denied")), 2, {}, healthy=True, barrier=lambda: None)
    assert not (tmp_path / "ck" / ".staging").exists()


def test_errno_enospc_is_no_space_whatever_the_free_space(tmp_path):
    mgr = CheckpointManager(tmp_path / "ck")
    with pytest.raises(ckpt_mod.CheckpointSaveError, match="no space left on device"):
        mgr.save(_Engine(OSError(28, "No space left on device")), 2, {}, healthy=True, barrier=lambda: None)


LAUNCHER = textwrap.dedent("""
    import signal, subprocess, sys, time
    # like torchrun: the rank in its own session; a signal to the launcher is passed on, then it waits
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    open(sys.argv[1], "w").write(str(rank.pid))
    def stop(signum, frame):
        rank.send_signal(signum); rank.wait(); sys.exit(1)
    signal.signal(signal.SIGTERM, stop)
    time.sleep(120)
""")


def test_sigterm_is_forwarded_to_the_launcher_and_nothing_is_left(train_files, tmp_path):
    spec, ds = train_files
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    pidfile = tmp_path / "rank.pid"
    code = textwrap.dedent(f"""
        import sys
        from dstoolkit.cli import main, train
        train.launch_command = lambda args: [sys.executable, {str(tmp_path / 'launcher.py')!r}, {str(pidfile)!r}]
        sys.exit(main(["train", "--spec", {str(spec)!r}, "--config", {str(ds)!r}, "--steps", "2"]))
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (pidfile.is_file() and pidfile.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    rank = int(pidfile.read_text())
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    finally:  # before the fix the launcher and its rank outlive the command: kill what this test started
        import psutil

        alive = psutil.pid_exists(rank) and psutil.Process(rank).status() != psutil.STATUS_ZOMBIE
        for p in psutil.process_iter(["cmdline"]):
            if any(str(tmp_path) in c for c in (p.info["cmdline"] or [])) or p.pid == rank:
                p.kill()
    assert proc.returncode == 143  # before: -15, the launcher and its rank left running
    assert not alive
    assert err.strip().splitlines()[-1] == ("dstoolkit train: error: interrupted by SIGTERM: the launcher and its "
                                            "ranks were stopped")


def test_interrupted_line_offers_resume_with_a_checkpoint_dir():
    assert train_cli.interrupted_line(signal.SIGINT, ["--checkpoint-dir", "ck"]).endswith(
        "rerun with `-- --resume` (and the same --checkpoint-dir) to continue from its last checkpoint")
    assert "resume" not in train_cli.interrupted_line(signal.SIGTERM, [])

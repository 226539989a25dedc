"""Review mends of the s33 post-launch fixes (review findings 1-3, 5, 6): the writer lock survives neither an
empty lock file nor a SIGTERM, the precision refusal no longer offers a fix this resume refuses, a checkpoint whose
saved list leaves frozen parameters out is not "another model", and launch scripts give their launcher /dev/null as
stdin (under a terminal a background job that reads it is stopped by SIGTTIN and the launch hangs)."""
from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import termios
import time

from dstoolkit.runtime.train import run_match
from dstoolkit.runtime.train.writer_lock import WRITER_LOCK, take


def test_an_empty_lock_file_is_taken_over_with_a_note(tmp_path):
    (tmp_path / WRITER_LOCK).write_text("")
    notes = []
    lock, problem = take(tmp_path, note=notes.append)
    assert problem is None and lock is not None
    assert len(notes) == 1 and "taking over the writer lock of a run that is gone" in notes[0]
    assert json.loads((tmp_path / WRITER_LOCK).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / WRITER_LOCK).exists()


def test_sigterm_releases_the_lock(tmp_path):
    code = ("import sys, time; from dstoolkit.runtime.train.writer_lock import take; "
            f"lock, p = take({str(tmp_path)!r}); assert p is None; print('held', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        assert (tmp_path / WRITER_LOCK).exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM  # still ends by SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (tmp_path / WRITER_LOCK).exists()


def test_precision_refusal_offers_only_what_this_resume_loads():
    saved, current = run_match.RunMatch("bf16"), run_match.RunMatch("fp32")
    msg = run_match.run_refusal("--checkpoint-dir c", "--resume", "step_00000003", saved, current, "", "")
    assert "Resume with bf16.enabled true in the DeepSpeed config" in msg
    assert "this resume does not load universal checkpoints" in msg and "or reshard to universal" not in msg


def test_frozen_parameters_left_out_of_an_old_saved_list_are_not_another_model():
    # DeepSpeed's param_shapes lists the optimizer's parameters; frozen_param_shapes only at ZeRO 2 / 3
    zero1 = run_match.from_meta({"param_shapes": [{"w": [4, 4]}]}, bf16_files=False)
    zero2 = run_match.from_meta({"param_shapes": [{"w": [4, 4]}], "frozen_param_shapes": {}}, bf16_files=False)
    current = run_match.RunMatch("fp32", 1, {"w": (4, 4), "emb": (8, 4)}, frozenset({"emb"}))
    assert run_match.run_refusal("c", "--resume", "t", zero1, current, "", "") is None
    # a list that does hold the frozen ones, or a trainable parameter missing: still another model
    assert "this run's parameter emb [8, 4] is not in it" in run_match.run_refusal("c", "--resume", "t", zero2,
                                                                                  current, "", "")
    trainable = run_match.RunMatch("fp32", 1, {"w": (4, 4), "emb": (8, 4)})
    assert "this run's parameter emb [8, 4] is not in it" in run_match.run_refusal("c", "--resume", "t", zero1,
                                                                                  trainable, "", "")


def test_of_engine_names_the_frozen_parameters():
    import torch

    class Engine:
        module = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 4))

        def bfloat16_enabled(self):
            return False

        def fp16_enabled(self):
            return False

    Engine.module[0].weight.requires_grad_(False)
    run = run_match.of_engine(Engine())
    assert run.frozen == frozenset({"0.weight"}) and set(run.params) == {"0.weight", "1.weight", "1.bias"}


def test_launch_script_under_a_terminal_does_not_hang_on_a_launcher_that_reads_stdin(tmp_path, repo_root):
    from dstoolkit.cli import main

    out = tmp_path / "gen"
    assert main(["generate", str(repo_root / "ds_configs" / "tiny_cpu.yaml"), "--out", str(out)]) == 0
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "deepspeed").write_text("#!/usr/bin/env bash\nread -r line\necho read-done\n")
    (bindir / "deepspeed").chmod(0o755)
    master, slave = os.openpty()

    def own_terminal():  # the pty becomes the script's controlling terminal, as in an interactive shell
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "LAUNCHER": "deepspeed"}
    proc = subprocess.Popen(["bash", str(out / "zero2" / "launch.sh")], cwd=tmp_path, env=env, stdin=slave,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=own_terminal, text=True)
    os.close(slave)
    try:
        stdout, _ = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError("launch.sh hung: its launcher was stopped reading the terminal (SIGTTIN)")
    finally:
        os.close(master)
    assert "read-done" in stdout

"""Fuzz fixes in `dstoolkit tune`: a relative --out in real mode, and option values refused with the flag named."""
from __future__ import annotations

import pathlib

import pytest

from dstoolkit.cli import main
from dstoolkit.models import resolve_spec_model
from dstoolkit.spec import load_spec
from dstoolkit.tune import objective
from dstoolkit.tune.space import TuneSpace


class _FakeProc:
    """What subprocess.Popen returns: exits 1 at once (no metrics), so the trial is an "error"."""

    pid = -1

    def wait(self, timeout=None):
        return 1


def test_real_trial_paths_resolve_from_the_ranks_working_directory(repo_root, tmp_path, monkeypatch):
    spec = load_spec(repo_root / "ds_configs" / "tiny_cpu.yaml")
    space = TuneSpace.from_spec(spec, resolve_spec_model(spec), data_parallel_only=True)
    check = next(c for c in (space.check(p, world_size=2) for p in space.points()) if not c.pruned)
    seen = {}

    def fake_popen(cmd, *, cwd, **kw):
        seen["cmd"], seen["cwd"] = cmd, pathlib.Path(cwd)
        return _FakeProc()

    monkeypatch.setattr(objective.subprocess, "Popen", fake_popen)
    monkeypatch.chdir(tmp_path)
    out = objective.run_real_trial(space, check, pathlib.Path("tune_r") / "trials" / "0000", steps=3, skip_steps=1)
    assert out.status == "error"
    work = (tmp_path / "tune_r" / "trials" / "0000").resolve()
    assert seen["cwd"] == work
    cmd = seen["cmd"]
    args = {flag: cmd[cmd.index(flag) + 1] for flag in ("--deepspeed_config", "--spec", "--metrics-out")}
    # What the ranks open, read from the folder they run in, is the file the tuner wrote.
    assert args == {"--deepspeed_config": str(work / "ds_config.json"), "--spec": str(work / "spec.yaml"),
                    "--metrics-out": str(work / "metrics.jsonl")}
    assert (seen["cwd"] / args["--deepspeed_config"]).is_file()
    assert (seen["cwd"] / args["--spec"]).is_file()


@pytest.mark.parametrize("flags, message", [
    (["--skip-steps", "-1"], "--skip-steps -1: must be >= 0"),
    (["--seed-trials", "0"], "--seed-trials 0: choose 1 to 5"),
    (["--seed-trials", "6"], "--seed-trials 6: choose 1 to 5"),
    (["--seed", "-5"], "--seed -5: must be an integer from 0 to 4294967295"),
    (["--steps", "0"], "--steps 0: must be >= 1"),
    (["--trial-timeout", "nan"], "--trial-timeout nan: must be > 0 seconds"),
])
def test_tune_refuses_out_of_range_options_naming_the_flag(repo_root, tmp_path, capsys, flags, message):
    out = tmp_path / "o"
    rc = main(["tune", str(repo_root / "ds_configs" / "tiny_cpu.yaml"), "--budget", "1", "--out", str(out),
               "--mode", "estimate", "--no-progress", *flags])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("dstoolkit tune: error: " + message), err
    assert not out.exists()  # refused before anything was written

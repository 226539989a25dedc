"""Fuzz fixes in `dstoolkit train`: inputs every rank would refuse are refused once, before the launcher starts
(a config made for another --nproc, swapped --spec / --config, a bad trainer flag); a metrics file that already
holds an earlier run is summarised for the new run only."""
from __future__ import annotations

import json
import subprocess

import pytest

from dstoolkit.cli import main
from dstoolkit.cli import train as train_cli


@pytest.fixture
def launches(monkeypatch):
    """subprocess.run as `dstoolkit train` calls it: recorded, no ranks started; writes two step lines."""
    calls = []

    def fake_run(cmd, env=None):
        calls.append(cmd)
        out = cmd[cmd.index("--metrics-out") + 1]
        with open(out, "a") as fh:
            for step, loss in ((1, 7.5), (2, 7.0)):
                fh.write(json.dumps({"step": step, "loss": loss, "step_time_s": 0.5, "tokens_per_s": 64.0}) + "\n")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(train_cli.subprocess, "run", fake_run)
    return calls


def test_nproc_that_does_not_fit_the_config_is_refused_before_launch(train_files, launches, capsys):
    spec, ds = train_files
    rc = main(["train", "--spec", str(spec), "--config", str(ds), "--steps", "2", "--nproc", "3"])
    assert rc == 2 and launches == []
    assert capsys.readouterr().err == (
        f"dstoolkit train: error: --nproc 3 does not fit --config {ds}: train_batch_size 8 != "
        "train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 1 x data-parallel size 3 (world size 3) = 12 "
        '[DS201]; set "train_batch_size": 12, or run with --nproc 2 (the ranks it was made for). `dstoolkit validate '
        "CONFIG --world-size N` checks a config for N ranks\n")


def test_swapped_spec_and_config_are_refused_before_launch(train_files, launches, capsys):
    spec, ds = train_files
    assert main(["train", "--spec", str(ds), "--config", str(spec), "--steps", "2"]) == 2
    assert launches == []
    assert capsys.readouterr().err == (f"dstoolkit train: error: --config {spec} is YAML and --spec {ds} is JSON: "
                                       "swapped? --spec takes the spec YAML, --config the DeepSpeed JSON\n")
    not_json = ds.with_name("cfg.txt")
    not_json.write_text("name: t\n")
    assert main(["train", "--spec", str(spec), "--config", str(not_json), "--steps", "2"]) == 2
    assert launches == []
    assert capsys.readouterr().err.startswith(f"dstoolkit train: error: --config {not_json}: not valid JSON")


def test_bad_trainer_flags_after_the_separator_are_refused_before_launch(train_files, launches, capsys):
    spec, ds = train_files
    assert main(["train", "--spec", str(spec), "--config", str(ds), "--steps", "2", "--", "--bogus"]) == 2
    assert launches == []
    assert capsys.readouterr().err == (
        "dstoolkit train: error: the trainer's command line: unrecognized arguments: --bogus "
        "(`python -m dstoolkit.runtime.train.trainer --help` lists its flags)\n")


def test_a_fitting_launch_runs_and_summarises_only_its_own_metrics(train_files, launches, tmp_path, capsys):
    spec, ds = train_files
    metrics = tmp_path / "m.jsonl"
    metrics.write_text(json.dumps({"step": 1, "loss": 9.9, "step_time_s": 9.0, "tokens_per_s": 1.0}) + "\n")
    rc = main(["train", "--spec", str(spec), "--config", str(ds), "--steps", "2", "--metrics-out", str(metrics),
               "--format", "json"])
    assert rc == 0 and len(launches) == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 2 and summary["first_loss"] == 7.5 and summary["median_step_time_s"] == 0.5


def test_world_size_errors_counts_only_what_the_rank_count_adds():
    from dstoolkit.runtime.train.preflight import world_size_errors

    both = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
            "fp16": {"enabled": True}, "bf16": {"enabled": True}}  # DS203 at any world size
    assert [f.code for f in world_size_errors(both, 3)] == ["DS201"]
    assert world_size_errors(both, 2) == []

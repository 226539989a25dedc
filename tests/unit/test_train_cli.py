"""`dstoolkit train` and the trainer's input errors (no launch: the real runs are in tests/dist)."""
import json
import subprocess
import sys

import pytest

from dstoolkit.cli import main
from dstoolkit.runtime.train import trainer


@pytest.fixture
def files(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: t\nmodel: {preset: tiny}\ncluster: {nodes: 1, gpus_per_node: 2, gpu: cpu}\n"
                    "training: {seq_len: 16, global_batch: 4, micro_batch: 2}\n")
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2}))
    return spec, ds


def test_dry_run_prints_the_launch_command(files, capsys):
    spec, ds = files
    rc = main(["train", "--spec", str(spec), "--config", str(ds), "--steps", "3", "--launcher", "deepspeed",
               "--dry-run", "--", "--save-every", "2", "--checkpoint-dir", "ck"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "--num_gpus 2" in out and "--module dstoolkit.runtime.train.trainer" in out
    assert out.rstrip().endswith("--save-every 2 --checkpoint-dir ck") and f"--spec {spec}" in out
    # what the trainer refuses is refused before the command is printed (--save-every without --checkpoint-dir)
    assert main(["train", "--spec", str(spec), "--config", str(ds), "--steps", "3", "--dry-run", "--",
                 "--save-every", "2"]) == 2
    assert ("--save-every 2 needs --checkpoint-dir: without one no checkpoint is ever saved"
            in capsys.readouterr().err)  # names.Names.missing_dir, the rule Guard shares


def test_dry_run_checks_what_the_ranks_would_refuse(files, capsys):
    spec, ds = files
    assert main(["train", "--spec", str(spec), "--config", str(ds), "--steps", "3", "--nproc", "3", "--dry-run"]) == 2
    assert "--nproc 3 does not fit --config" in capsys.readouterr().err
    assert main(["train", "--spec", str(spec), "--config", str(ds), "--steps", "0"]) == 2
    assert capsys.readouterr().err.rstrip().endswith("--steps=0 must be > 0")


def test_missing_files_exit_2(files, capsys):
    spec, _ = files
    assert main(["train", "--spec", str(spec), "--config", "nope.json", "--steps", "3"]) == 2
    assert "--config nope.json: no such file" in capsys.readouterr().err


def test_cli_parser_and_pure_helpers_do_not_import_torch():
    code = ("import sys, dstoolkit.cli.train, dstoolkit.runtime.train, dstoolkit.runtime.train.ramp, dstoolkit.runtime.train.spike, "
            "dstoolkit.runtime.train.monitor, dstoolkit.runtime.train.ckpt, dstoolkit.runtime.train.launch; "
            "print(sorted(m for m in ('torch', 'deepspeed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("extra, match", [
    (["--steps", "0"], "--steps=0 must be > 0"),
    (["--steps", "3", "--save-every", "2"], "needs --checkpoint-dir"),
    (["--steps", "3", "--inject-lr-blowup", "x"], "expected STEP:FACTOR"),
    (["--steps", "3", "--dist-timeout-s", "0"], "--dist-timeout-s=0.0 must be a positive number of seconds"),
])
def test_trainer_usage_errors_exit_2(files, tmp_path, capsys, extra, match):
    spec, ds = files
    rc = trainer.main(["--deepspeed_config", str(ds), "--spec", str(spec), "--metrics-out",
                       str(tmp_path / "m.jsonl"), *extra])
    assert rc == 2 and match in capsys.readouterr().err


def test_trainer_bad_spec_names_the_field(files, tmp_path, capsys):
    _, ds = files
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {preset: tiny}\ntraining: {seq_len: 0, global_batch: 4}\n")
    rc = trainer.main(["--deepspeed_config", str(ds), "--spec", str(bad), "--steps", "1",
                       "--metrics-out", str(tmp_path / "m.jsonl")])
    assert rc == 2 and "seq_len" in capsys.readouterr().err

"""s34 helpers finding 5: `dstoolkit train ... -- --metrics-out X` launched `--metrics-out train_metrics.jsonl
--metrics-out X`: the rank wrote X (argparse takes the last), the verb summarised train_metrics.jsonl and ended 'the
run wrote no metrics', exit 1, after a good run. The trainer flags the verb sets itself are refused after `--`,
before any rank starts, naming the verb's own flag."""
from __future__ import annotations

import pytest

from dstoolkit.cli import main


@pytest.mark.parametrize("extra, own", [(["--metrics-out", "tm.jsonl"], "--metrics-out"),
                                        (["--metrics-out=tm.jsonl"], "--metrics-out"),
                                        (["--save-every", "5", "--steps", "9"], "--steps"),
                                        (["--deepspeed_config", "x.json"], "--config"),
                                        (["--spec=y.yaml"], "--spec")])
def test_flags_the_verb_sets_are_refused_after_the_separator(repo_root, tmp_path, capsys, extra, own):
    spec = repo_root / "ds_configs" / "tiny_cpu.yaml"
    cfg = repo_root / "ds_configs" / "generated" / "tiny_cpu" / "zero2" / "ds_config.json"
    rc = main(["train", "--spec", str(spec), "--config", str(cfg), "--steps", "3", "--dry-run",
               "--metrics-out", str(tmp_path / "m.jsonl"), "--", *extra])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"after `--`: dstoolkit train sets the trainer's" in err and f"from its own {own}" in err
    assert f"give it before `--`: dstoolkit train {own} VALUE" in err


def test_other_trainer_flags_still_pass(repo_root, tmp_path, capsys):
    spec = repo_root / "ds_configs" / "tiny_cpu.yaml"
    cfg = repo_root / "ds_configs" / "generated" / "tiny_cpu" / "zero2" / "ds_config.json"
    rc = main(["train", "--spec", str(spec), "--config", str(cfg), "--steps", "3", "--dry-run",
               "--metrics-out", str(tmp_path / "m.jsonl"), "--", "--save-every", "5",
               "--checkpoint-dir", str(tmp_path / "ck")])
    assert rc == 0
    assert "--save-every 5" in capsys.readouterr().out

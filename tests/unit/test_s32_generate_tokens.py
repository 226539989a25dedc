"""`generate --tokens N` says, in the printed output, summary.md and --format json, that the files train the spec's
run length and not the plan, and which spec change trains the plan.

Before: summary.md and the output showed "to train: 977 steps" while every file trained 20 steps, and nothing said so.
"""
from __future__ import annotations

import json

from dstoolkit.cli import main

SPEC = """\
name: tok
model: {{preset: tiny}}
cluster: {{nodes: 1, gpus_per_node: 2, gpu: cpu}}
training: {{seq_len: 128, global_batch: 8, precision: bf16, zero_stage: 1{extra}}}
"""


def _note(now, steps=977):
    return (f"the generated files train {now}, not this plan: to train 1M tokens set training.train_steps: {steps} in "
            f"the spec and regenerate (Megatron --train-iters, HF max_steps and the LR schedule follow it), and run "
            f"launch.sh with STEPS={steps}")


def test_tokens_plan_says_what_the_files_train(tmp_path, capsys):
    (tmp_path / "spec.yaml").write_text(SPEC.format(extra=""))
    out = tmp_path / "out"
    assert main(["generate", str(tmp_path / "spec.yaml"), "-o", str(out), "--strategy", "zero1", "--tokens", "1e6"]) == 0
    note = _note("a 20-step smoke run (training.train_steps is unset)")
    text = capsys.readouterr().out
    assert "         to train: 977 steps, 0.0 days, 0 GPU-hours\n" f"         note: {note}\n" in text
    assert (out / "zero1" / "summary.md").read_text().endswith(f"\n- {note}\n")


def test_tokens_plan_json(tmp_path, capsys):
    (tmp_path / "spec.yaml").write_text(SPEC.format(extra=", train_steps: 50"))
    assert main(["generate", str(tmp_path / "spec.yaml"), "-o", str(tmp_path / "out"), "--strategy", "zero1",
                 "--tokens", "1e6", "--format", "json"]) == 0
    [g] = json.loads(capsys.readouterr().out)["generated"]
    assert g["training_plan"]["steps"] == 977
    assert g["files_train_steps"] == 50
    assert g["training_plan_note"] == _note("training.train_steps=50 steps")

"""`generate`: a target that got no files (out.targets_skipped, e.g. megatron-deepspeed for a model with biases on
q/k/v only) is not listed as a target of the folder: not in --format json's `targets` / `per_target`, not in
layout.json, not in the text table; the JSON says why under `no_files`.

Before: the JSON listed megatron-deepspeed in `targets` and `per_target` of a folder without its files, with no
reason anywhere in the JSON, and layout.json gave ds_config.json's targets as ['deepspeed', 'megatron-deepspeed'].
"""
from __future__ import annotations

import json

from dstoolkit.cli import main

SPEC = """\
name: qkvbias
model:
  hf_config: {root}/tests/golden/hf_configs/qwen2-7b.json
cluster: {{nodes: 1, gpus_per_node: 6, gpu: H100-SXM}}
training:
  seq_len: 4096
  global_batch: 60
  precision: bf16
"""
WHY = ("megatron-deepspeed: cannot express biases on q/k/v only (--disable-bias-linear turns all of them off; there "
       "is no --add-qkv-bias)")


def _spec(tmp_path):
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    p = tmp_path / "spec.yaml"
    p.write_text(SPEC.format(root=root))
    return p


def test_json_leaves_out_targets_without_files_and_says_why(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["generate", str(_spec(tmp_path)), "-o", str(out), "--strategy", "zero2", "--target", "deepspeed",
               "--target", "megatron-deepspeed", "--target", "hf", "--format", "json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    [g] = doc["generated"]
    assert g["targets"] == ["deepspeed", "hf"]
    assert list(g["per_target"]) == ["deepspeed", "hf"]
    assert g["no_files"] == {"megatron-deepspeed": WHY}
    assert not [f for f in g["files"] if "megatron" in f]
    layout = json.loads((out / "zero2" / "layout.json").read_text())
    assert layout["files"]["ds_config.json"]["targets"] == ["deepspeed"]
    assert layout["files"]["ds_config_hf.json"]["targets"] == ["hf"]


def test_text_table_leaves_out_targets_without_files(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["generate", str(_spec(tmp_path)), "-o", str(out), "--strategy", "zero2", "--target", "deepspeed",
               "--target", "megatron-deepspeed", "--target", "megatron-lm"])
    assert rc == 0
    text = capsys.readouterr().out
    # megatron-lm's figures are Megatron-Core's: the folder's row names the targets it is for
    row = [line for line in text.splitlines() if line.startswith("  zero2  zero2 ")]
    assert len(row) == 1 and row[0].endswith(" s/step  deepspeed")
    assert "megatron-deepspeed" not in text.replace(f"zero2: no megatron-deepspeed files: {WHY}", "")
    assert f"  zero2: no megatron-deepspeed files: {WHY}\n" in text

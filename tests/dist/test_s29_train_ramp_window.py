"""The batch ramp and DeepSpeed's accumulation window, real 2-rank gloo runs (ZeRO-2 bf16, ramp 4 -> 8 -> 12 by
micro-batch 2 x dp 2, so gradient accumulation 1 -> 2 -> 3). DeepSpeed counts micro-steps to find the boundary
((micro_steps + 1) % gas == 0) and `set_train_batch_size` leaves the count alone: after 3 steps at gas 1 the first
gas-2 window closed after its first micro-batch, and from then on each step's last micro-batch trained in the next
step. A resume starts the count at 0, so the uninterrupted run and a run resumed from its step-3 checkpoint (just
before the ramp's first change) must be the same run; before the fix they differed from step 4 on."""
from __future__ import annotations

import json
import shutil

import pytest
import yaml

from dstoolkit.runtime.train.ckpt import tag_for
from dstoolkit.runtime.train.launch import read_metrics, run_local

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(900)]

MODEL = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256}
RAMP = {"kind": "megatron", "start_batch": 4, "increment": 4, "ramp_samples": 24}
STEPS, SAVE_EVERY = 9, 3


def test_ramp_run_equals_its_resume_from_before_the_first_change(tmp_path):
    import torch

    spec = {"name": "rampw", "model": MODEL, "cluster": {"nodes": 1, "gpus_per_node": 2, "gpu": "cpu"},
            "training": {"seq_len": 32, "global_batch": 12, "micro_batch": 2, "precision": "bf16", "lr": 0.01,
                         "zero_stage": 2, "batch_ramp": RAMP}}
    ds = {"train_batch_size": 12, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
          "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    common = ["--deepspeed_config", str(tmp_path / "ds.json"), "--spec", str(tmp_path / "spec.yaml"), "--steps",
              str(STEPS), "--save-every", str(SAVE_EVERY), "--keep-checkpoints", "10", "--no-progress",
              "--monitor-every", "100", "--no-spike-guard"]
    a = run_local(common + ["--metrics-out", str(tmp_path / "a.jsonl"), "--checkpoint-dir", str(tmp_path / "cka")],
                  timeout_s=600)
    assert a.returncode == 0, a.stderr[-3000:]
    ma = read_metrics(tmp_path / "a.jsonl")
    assert [s["grad_accum"] for s in ma.steps] == [1, 1, 1, 2, 2, 3, 3, 3, 3]

    shutil.copytree(tmp_path / "cka", tmp_path / "ckb")
    for d in (tmp_path / "ckb").glob("step_*"):
        if d.name != tag_for(SAVE_EVERY):
            shutil.rmtree(d)
    (tmp_path / "ckb" / "latest").write_text(tag_for(SAVE_EVERY))
    b = run_local(common + ["--metrics-out", str(tmp_path / "b.jsonl"), "--checkpoint-dir", str(tmp_path / "ckb"),
                            "--resume"], timeout_s=600)
    assert b.returncode == 0, b.stderr[-3000:]
    mb = read_metrics(tmp_path / "b.jsonl")
    assert mb.of("resume")[0]["step"] == SAVE_EVERY
    key = ("step", "loss", "grad_norm", "data_pos", "grad_accum")
    assert [tuple(s[k] for k in key) for s in ma.steps[SAVE_EVERY:]] == [tuple(s[k] for k in key) for s in mb.steps]
    last = f"{tag_for(STEPS)}/mp_rank_00_model_states.pt"
    wa = torch.load(tmp_path / "cka" / last, map_location="cpu", weights_only=False)["module"]
    wb = torch.load(tmp_path / "ckb" / last, map_location="cpu", weights_only=False)["module"]
    assert wa.keys() == wb.keys() and all(wa[k].equal(wb[k]) for k in wa)

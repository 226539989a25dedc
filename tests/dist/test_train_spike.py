"""Loss-spike guard in a real 2-rank DeepSpeed run (torchrun, gloo, ZeRO-2 bf16): a poisoned batch is
detected and skipped; an LR blow-up is detected, escalates to a rollback to the last good checkpoint with
the offending batches skipped and the LR cooled down; the loss returns to the pre-spike band."""
import json

import pytest
import yaml

from dstoolkit.runtime.train.launch import read_metrics, run_local

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(600)]

MODEL = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256}
POISON_STEP, BLOWUP_STEP, BLOWUP_FACTOR, STEPS, SAVE_EVERY = 14, 22, 1000, 30, 4
LR, LR_SCALE, LR_SCALE_STEPS = 0.01, 0.1, 5


def _band(steps, before, n=3):
    """Loss band of the n accepted steps before `before` (first pass only)."""
    losses = [s["loss"] for s in steps if before - n <= s["step"] < before]
    return min(losses), max(losses)


def test_poisoned_batch_and_lr_blowup_are_detected_acted_on_and_recovered(tmp_path):
    spec = {"name": "spike", "model": MODEL, "cluster": {"nodes": 1, "gpus_per_node": 2, "gpu": "cpu"},
            "training": {"seq_len": 32, "global_batch": 8, "micro_batch": 4, "precision": "bf16", "lr": LR,
                         "zero_stage": 2}}
    ds = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
          "optimizer": {"type": "AdamW", "params": {"lr": LR, "torch_adam": True}},
          "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    metrics = tmp_path / "m.jsonl"
    proc = run_local(["--deepspeed_config", str(tmp_path / "ds.json"), "--spec", str(tmp_path / "spec.yaml"),
                      "--steps", str(STEPS), "--metrics-out", str(metrics), "--no-progress",
                      "--checkpoint-dir", str(tmp_path / "ckpt"), "--save-every", str(SAVE_EVERY),
                      "--inject-poison", str(POISON_STEP), "--inject-lr-blowup", f"{BLOWUP_STEP}:{BLOWUP_FACTOR}",
                      "--lr-scale", str(LR_SCALE), "--lr-scale-steps", str(LR_SCALE_STEPS)], timeout_s=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    m = read_metrics(metrics)
    lines = m.lines

    # --- poisoned batch: detected before its backward, skipped, loss back in band on the next batch ---
    poison = m.of("inject")[0]
    assert poison["kind"] == "poison" and poison["step"] == POISON_STEP
    spikes = m.of("spike")
    first = spikes[0]
    assert (first["step"], first["data_pos"], first["kind"], first["action"]) == (
        POISON_STEP, poison["data_pos"], "loss_spike", "skip")
    assert first["z"] > 6 and "robust sigmas above the trend" in first["reason"]
    lo, hi = _band(m.steps, POISON_STEP)
    step_p = next(s for s in m.steps if s["step"] == POISON_STEP)
    assert step_p["loss"] <= hi < first["value"] / 2  # trained on the next batch; the poisoned one never
    assert step_p["data_pos"] == poison["data_pos"] + 2  # one skipped + one trained

    # --- LR blow-up: skip, escalate to rollback, offending batches skipped, LR cooled down, recovery ---
    blow = m.of("inject")[1]
    assert blow["kind"] == "lr_blowup" and blow["step"] == BLOWUP_STEP
    blow_step = next(s for s in m.steps if s["step"] == BLOWUP_STEP)
    assert blow_step["lr"] == pytest.approx(LR * BLOWUP_FACTOR)
    later = [s for s in spikes if s["step"] == BLOWUP_STEP + 1]
    assert [s["action"] for s in later] == ["skip", "rollback"]
    assert all(s["value"] > 10 * hi for s in later)
    rb = m.of("rollback")[0]
    assert "consecutive skipped batches -> rollback" in rb["reason"]
    assert rb["to_step"] <= BLOWUP_STEP - 2 and rb["to_step"] % SAVE_EVERY == 0
    assert rb["skip_positions"] == [s["data_pos"] for s in later]
    after = lines[lines.index(rb) + 1:]
    replay = [d for d in after if "event" not in d]
    assert replay[0]["step"] == rb["to_step"] + 1
    assert all(s["lr"] == pytest.approx(LR * LR_SCALE) for s in replay[:LR_SCALE_STEPS])
    assert replay[LR_SCALE_STEPS]["lr"] == pytest.approx(LR)
    trained_after = {s["data_pos"] - 1 for s in replay}  # the last position each step consumed
    assert not trained_after & set(rb["skip_positions"])
    pre_lo, pre_hi = _band(m.steps, BLOWUP_STEP)
    assert max(s["loss"] for s in replay) <= pre_hi * 1.5
    assert replay[-1]["loss"] <= pre_hi  # back in (or below) the pre-spike band
    done = m.of("done")[0]
    assert done["steps"] == STEPS
    # Every action is logged on rank 0's stderr with its reason too.
    assert "ROLLBACK to step_" in proc.stderr and "loss_spike -> skip" in proc.stderr

"""Fault tolerance with real ranks: SIGKILL one rank mid-run, corrupt the newest checkpoint, relaunch with
--resume. The relaunch rejects the truncated checkpoint, resumes from the previous one, and reproduces the
uninterrupted run's loss trajectory bitwise with no data position lost or repeated (ZeRO-2 bf16, gloo)."""
import json

import pytest
import yaml

from dstoolkit.runtime.train.ckpt import tag_for
from dstoolkit.runtime.train.launch import read_metrics, run_local, start_local

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(900)]

MODEL = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256}
STEPS, SAVE_EVERY, KILL_AT = 12, 3, 7


def test_sigkill_then_resume_from_previous_intact_checkpoint_is_bitwise(tmp_path):
    spec = {"name": "fault", "model": MODEL, "cluster": {"nodes": 1, "gpus_per_node": 2, "gpu": "cpu"},
            "training": {"seq_len": 32, "global_batch": 8, "micro_batch": 2, "precision": "bf16", "lr": 0.01,
                         "zero_stage": 2}}
    ds = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
          "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    common = ["--deepspeed_config", str(tmp_path / "ds.json"), "--spec", str(tmp_path / "spec.yaml"),
              "--steps", str(STEPS), "--save-every", str(SAVE_EVERY), "--no-progress", "--monitor-every", "100"]
    ref_m, run_m, run_ck = tmp_path / "ref.jsonl", tmp_path / "run.jsonl", tmp_path / "ck"
    # The uninterrupted reference and the run that loses a rank, side by side.
    ref = start_local(common + ["--metrics-out", str(ref_m), "--checkpoint-dir", str(tmp_path / "ck_ref")],
                      log_path=tmp_path / "ref.log")
    killed = start_local(common + ["--metrics-out", str(run_m), "--checkpoint-dir", str(run_ck),
                                   "--kill-at-step", str(KILL_AT), "--kill-rank", "1"], log_path=tmp_path / "kill.log")
    assert killed.wait(timeout=600) != 0  # the launcher reports the dead rank
    assert ref.wait(timeout=600) == 0, (tmp_path / "ref.log").read_text()[-3000:]
    before = read_metrics(run_m)
    assert before.steps[-1]["step"] == KILL_AT and not before.of("done")
    # Two checkpoints survived (3 and 6); truncate one shard of the newest, as a crash mid-copy would.
    newest = run_ck / tag_for(6)
    assert (run_ck / tag_for(3)).is_dir() and newest.is_dir()
    shard = sorted(newest.glob("*optim_states.pt"))[-1]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])

    proc = run_local(common + ["--metrics-out", str(run_m), "--checkpoint-dir", str(run_ck), "--resume"],
                     timeout_s=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    after = read_metrics(run_m)
    resume = after.of("resume")[0]
    assert resume["tag"] == tag_for(3) and resume["step"] == 3
    assert len(resume["rejected"]) == 1 and "truncated" in resume["rejected"][0] and shard.name in resume["rejected"][0]

    ref_steps = {s["step"]: s for s in read_metrics(ref_m).steps}
    resumed = after.lines[after.lines.index(resume) + 1:]
    resumed_steps = [d for d in resumed if "event" not in d]
    assert [s["step"] for s in resumed_steps] == list(range(4, STEPS + 1))
    diffs = [abs(s["loss"] - ref_steps[s["step"]]["loss"]) for s in resumed_steps]
    assert max(diffs) == 0.0, diffs  # bitwise: same seed, same data order, DeepSpeed state restored
    assert all(s["grad_norm"] == ref_steps[s["step"]]["grad_norm"] for s in resumed_steps)
    # Data position: each step consumed exactly grad_accum micro-batches, continuing from the checkpoint.
    assert [s["data_pos"] for s in resumed_steps] == [ref_steps[s["step"]]["data_pos"] for s in resumed_steps]
    assert [s["data_pos"] for s in resumed_steps] == [2 * k for k in range(4, STEPS + 1)]
    assert after.of("done")[0]["final_loss"] == ref_steps[STEPS]["loss"]
    # The run's pre-kill steps matched the reference too (the kill did not perturb earlier state).
    assert all(s["loss"] == ref_steps[s["step"]]["loss"] for s in before.steps)

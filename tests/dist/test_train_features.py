"""One real 2-rank DeepSpeed run (the deepspeed launcher, gloo, ZeRO-2 bf16) of the example trainer that
checks several helpers at once: the batch ramp drives set_train_batch_size, the spec's checkpoint policy
trains, the monitor flags a deliberately slow data iterator as input-bound with evidence, reads the
communication share from DeepSpeed's comms_logger, and writes
through DeepSpeed's csv monitor, the progress bar shows an ETA, and the loss falls."""
import json
import re

import pytest
import yaml

from dstoolkit.spec import BatchRampSpec
from dstoolkit.runtime.train.launch import read_metrics, run_local
from dstoolkit.runtime.train.ramp import BatchRamp

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

MODEL = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256}
RAMP = {"kind": "megatron", "start_batch": 4, "increment": 4, "ramp_samples": 24}
STEPS = 12
DATA_DELAY_S = 0.15  # per micro-batch; far above a tiny step's compute, so input wait dominates


def test_ramp_policy_monitor_progress_in_one_run(tmp_path):
    spec = {"name": "feat", "model": MODEL, "cluster": {"nodes": 1, "gpus_per_node": 2, "gpu": "cpu"},
            "training": {"seq_len": 32, "global_batch": 12, "micro_batch": 2, "precision": "bf16", "lr": 0.01,
                         "activation_checkpointing": "every-k", "checkpoint_every_k": 2, "zero_stage": 2,
                         "batch_ramp": RAMP}}
    ds = {"train_batch_size": 12, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
          "zero_optimization": {"stage": 2}, "bf16": {"enabled": True},
          "comms_logger": {"enabled": True, "prof_all": True, "verbose": False}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    metrics, mon_dir = tmp_path / "m.jsonl", tmp_path / "monitor"
    proc = run_local(["--deepspeed_config", str(tmp_path / "ds.json"), "--spec", str(tmp_path / "spec.yaml"),
                      "--steps", str(STEPS), "--metrics-out", str(metrics), "--monitor-every", "4",
                      "--monitor-dir", str(mon_dir), "--data-delay-s", str(DATA_DELAY_S)],
                     launcher="deepspeed", timeout_s=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    m = read_metrics(metrics)

    # Batch ramp 4 -> 12 by +4: 2 increments over 24 samples, one per 12 consumed (micro 2 x dp 2 = unit 4).
    # Consumed before each step: 0, 4, 8 -> 4; 12, 20 -> 8; 28 > 24 -> 12 (hand-computed, Megatron rule).
    expected = [4, 4, 4, 8, 8, 12, 12, 12, 12, 12, 12, 12]
    assert [s["global_batch"] for s in m.steps] == expected
    assert [s["grad_accum"] for s in m.steps] == [g // 4 for g in expected]
    assert all(s["micro_batch"] == 2 for s in m.steps)
    ramp = BatchRamp.from_spec(BatchRampSpec(**RAMP), global_batch=12, micro_batch=2, dp_size=2, seq_len=32)
    assert [p.global_batch for p in ramp.schedule(STEPS)] == expected  # library schedule == engine's
    assert [s["data_pos"] for s in m.steps] == [sum(g // 4 for g in expected[: i + 1]) for i in range(STEPS)]

    # Loss falls (every-k checkpointing on, ZeRO-2 bf16).
    losses = [s["loss"] for s in m.steps]
    assert losses[-1] < losses[0] - 0.5, losses

    # Monitor: input-bound with its evidence, via the metrics and DeepSpeed's csv monitor.
    reports = m.of("monitor")
    assert len(reports) == STEPS // 4
    for r in reports:
        assert r["input_wait_share"] > 0.2  # INPUT_BOUND_SHARE
        flag = [f for f in r["flags"] if f["name"] == "input-bound"]
        assert flag and "on the data iterator" in flag[0]["evidence"]
        assert r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1 and r["peak_rss_bytes"] > 0
        assert 0 < r["comm_share"] < 1  # ZeRO-2 reduce/all-gather time from DeepSpeed's comms_logger
    csvs = {p.name for p in mon_dir.rglob("*.csv")}
    assert "Monitor_input_wait_share.csv" in csvs and "Monitor_flag_input-bound.csv" in csvs, csvs

    # Progress bar with an ETA on rank 0 (tqdm "elapsed<remaining").
    assert re.search(r"train:.*\d+/12 \[\d\d:\d\d<\d\d:\d\d", proc.stdout + proc.stderr)

    done = m.of("done")[0]
    assert done["steps"] == STEPS and done["world_size"] == 2 and done["final_loss"] == losses[-1]
    for key in ("step", "loss", "step_time_s", "tokens_per_s", "global_batch", "micro_batch", "grad_accum",
                "peak_rss_bytes", "lr"):
        assert key in m.steps[0]

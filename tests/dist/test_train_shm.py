"""DeepSpeed 0.19.8 never unlinks its CPU all-reduce buffers (/dev/shm, ~66 MB per rank per run); the trainer
unlinks them once every rank has mapped them. A real 2-rank run through the deepspeed launcher (which sets
LOCAL_SIZE, so the shared-memory path is used) must leave none of its buffers behind and still train."""
import json
import subprocess

import pytest
import yaml

from dstoolkit.runtime.train import shm
from dstoolkit.runtime.train.launch import free_port, launch_command, launch_env, read_metrics

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]


def test_trainer_leaves_no_shm_buffers(tmp_path):
    spec = {"name": "shm", "model": {"preset": "tiny"}, "cluster": {"nodes": 1, "gpus_per_node": 2, "gpu": "cpu"},
            "training": {"seq_len": 32, "global_batch": 4, "micro_batch": 2, "precision": "bf16", "lr": 0.01,
                         "zero_stage": 2}}
    ds = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
          "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    port = free_port()
    cmd = launch_command(["--deepspeed_config", str(tmp_path / "ds.json"), "--spec", str(tmp_path / "spec.yaml"),
                          "--steps", "3", "--metrics-out", str(tmp_path / "m.jsonl"), "--no-progress"],
                         launcher="deepspeed", port=port)
    proc = subprocess.run(cmd, env=launch_env(2, "deepspeed"), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    done = read_metrics(tmp_path / "m.jsonl").of("done")[0]
    assert done["steps"] == 3
    # the shared-memory path was in use (one buffer per rank existed) and rank 0 removed both names
    assert done["shm_buffers_unlinked"] == 2
    # the deepspeed launcher passes --master_addr as given to it (localhost by default)
    leftovers = [p.name for p in shm.SHM_DIR.iterdir() if p.name.startswith(shm.BUFFER_PREFIX) and f"_{port}_" in p.name]
    assert leftovers == []

"""`dstoolkit ckpt export` of a `dstoolkit train --shrink` run needs no --config: the trainer leaves the model's
config.json beside its checkpoint tags (real 2-rank gloo run, ZeRO-2 bf16). Was: exit 2, "config.json does not
exist ... pass --config". A resume keeps the file; a different config.json in --checkpoint-dir is never
overwritten, the run is refused before training (exit 2 on the ranks, the file named)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(900)]

HF_CONFIG = Path(__file__).resolve().parents[1] / "golden" / "hf_configs" / "llama-3.2-1b.json"
SHRINK = "layers=2,hidden=32,heads=2,head_dim=16,vocab=128,seq_len=32"
STEPS = 2


def _files(tmp_path: Path) -> tuple[Path, Path]:
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: exp\nmodel: {{hf_config: {HF_CONFIG}}}\ncluster: {{nodes: 1, gpus_per_node: 2, gpu: cpu}}\n"
                    "training: {seq_len: 32, global_batch: 8, micro_batch: 2, precision: bf16, zero_stage: 2, "
                    "lr: 0.003}\n")
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
                              "gradient_accumulation_steps": 2, "bf16": {"enabled": True},
                              "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "torch_adam": True}},
                              "zero_optimization": {"stage": 2}}))
    return spec, ds


def _train(spec: Path, ds: Path, metrics: Path, ck: Path, *more: str) -> int:
    from dstoolkit.cli import main

    return main(["train", "--spec", str(spec), "--config", str(ds), "--steps", str(STEPS), "--metrics-out",
                 str(metrics), "--", "--shrink", SHRINK, "--checkpoint-dir", str(ck), "--save-every", str(STEPS),
                 "--no-progress", "--no-spike-guard", *more])


def test_export_of_a_shrunk_train_run_needs_no_config(tmp_path, capsys):
    import torch
    import transformers as tf

    from dstoolkit.cli import main

    spec, ds = _files(tmp_path)
    ck, metrics = tmp_path / "ck", tmp_path / "m.jsonl"
    assert _train(spec, ds, metrics, ck) == 0, capsys.readouterr().err[-3000:]
    model_event = json.loads(metrics.read_text().splitlines()[0])
    written = json.loads((ck / "config.json").read_text())
    assert (written["model_type"], written["hidden_size"], written["num_hidden_layers"], written["vocab_size"]) == (
        "llama", 32, 2, 128)
    capsys.readouterr()

    out = tmp_path / "hf"
    assert main(["ckpt", "export", str(ck), "--hf", str(out)]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert f"from {ck / 'step_00000002'}" in printed and "prefix stripped: 'hf.'" in printed, printed
    model = tf.AutoModelForCausalLM.from_pretrained(str(out))
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == model_event["params"]
    with torch.no_grad():
        logits = model(input_ids=torch.arange(16).reshape(1, 16)).logits
    assert logits.shape == (1, 16, 128) and bool(torch.isfinite(logits).all())

    # a resume regenerates the same config: kept, the run goes on
    before = (ck / "config.json").read_bytes()
    assert _train(spec, ds, metrics, ck, "--resume") == 0
    assert (ck / "config.json").read_bytes() == before


def test_a_different_config_json_in_the_checkpoint_dir_is_not_overwritten(tmp_path, capsys):
    from dstoolkit.runtime.train.launch import run_local

    spec, ds = _files(tmp_path)
    ck = tmp_path / "ck"
    ck.mkdir()
    users = HF_CONFIG.read_text()  # the full-size config: not the shrunk model this run trains
    (ck / "config.json").write_text(users)
    proc = run_local(["--deepspeed_config", str(ds), "--spec", str(spec), "--steps", str(STEPS), "--metrics-out",
                      str(tmp_path / "m.jsonl"), "--shrink", SHRINK, "--checkpoint-dir", str(ck), "--save-every",
                      str(STEPS), "--no-progress"], timeout_s=300)
    assert proc.returncode != 0
    line = (f"dstoolkit.runtime.train.trainer: error: --checkpoint-dir {ck}: {ck / 'config.json'} describes another "
            "model: ")
    assert line in proc.stderr, proc.stderr[-3000:]
    assert ("`dstoolkit ckpt export` reads the config.json beside the tags, so it is not overwritten: move it away "
            "or give this run another --checkpoint-dir") in proc.stderr
    assert (ck / "config.json").read_text() == users and not list(ck.glob("step_*"))

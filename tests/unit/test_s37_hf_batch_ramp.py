"""training.batch_ramp under the hf / accelerate targets: HF Trainer and Accelerate cannot ramp the batch
(TrainingArguments holds one batch size and accumulation for the whole run), so their files train at
training.global_batch from step 0. Their launch notes say so, naming training.batch_ramp and the fix, and a
--tokens plan for them counts every step at the full batch (`generate.costing.batch_ramp_of_targets`), as the files
train.

Before: nothing in the HF files mentioned the ramp, and `generate --target hf --tokens 10B` of this spec planned 41 ramp
steps (25,452 steps in all) for files that run 25,432 steps of 96 x 4096 tokens.
"""
from __future__ import annotations

import json
import textwrap

from dstoolkit.cli import main
from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.costing import batch_ramp_of_targets
from dstoolkit.generate.hf_targets import hf_batch_ramp_note, launch_notes
from dstoolkit.generate.io import load_spec_and_shape

SPEC = """\
name: l2ramp
model: {{model_type: llama, hidden_size: 4096, intermediate_size: 11008, num_hidden_layers: 30,
        num_attention_heads: 32, num_key_value_heads: 32, vocab_size: 32000, max_position_embeddings: 4096}}
cluster: {{nodes: 2, gpus_per_node: 8, gpu: A100-80G}}
training: {{seq_len: 4096, global_batch: 96, micro_batch: 1, precision: bf16, lr: 0.0002, warmup_steps: 50,
            train_steps: 400, tp: 1, pp: 1, zero_stage: 1{ramp}}}
"""
RAMP = ", batch_ramp: {kind: megatron, start_batch: 32, increment: 16, ramp_samples: 2000}"
NOTE = ("training.batch_ramp is not applied: HF Trainer / Accelerate cannot ramp the batch, so these files train at "
        "training.global_batch=96 from step 0; fix: remove training.batch_ramp, or ramp with --target deepspeed / "
        "megatron-lm / megatron-deepspeed.")


def _write(tmp_path, ramp=RAMP):
    p = tmp_path / "s.yaml"
    p.write_text(textwrap.dedent(SPEC.format(ramp=ramp)))
    return p


def test_hf_launch_notes_name_the_ramp(tmp_path):
    spec, shape = load_spec_and_shape(_write(tmp_path))
    assert hf_batch_ramp_note(spec) == NOTE
    assert launch_notes(spec, shape, Candidate(zero_stage=1, micro_batch=1))[0] == NOTE
    spec0, shape0 = load_spec_and_shape(_write(tmp_path, ramp=""))
    assert hf_batch_ramp_note(spec0) is None
    assert NOTE not in launch_notes(spec0, shape0, Candidate(zero_stage=1, micro_batch=1))


def test_batch_ramp_of_targets(tmp_path):
    spec, _ = load_spec_and_shape(_write(tmp_path))
    assert batch_ramp_of_targets(spec, ["hf"]) is None
    assert batch_ramp_of_targets(spec, ("hf", "accelerate")) is None
    assert batch_ramp_of_targets(spec, ["deepspeed"]) is spec.training.batch_ramp is not None
    assert batch_ramp_of_targets(spec, ["deepspeed", "hf"]) is spec.training.batch_ramp
    assert batch_ramp_of_targets(spec, ()) is spec.training.batch_ramp


def _plan(tmp_path, capsys, *targets):
    out = tmp_path / ("out_" + "_".join(targets))
    argv = ["generate", str(_write(tmp_path)), "-o", str(out), "--tokens", "10B", "--format", "json"]
    for t in targets:
        argv += ["--target", t]
    assert main(argv) == 0
    [g] = json.loads(capsys.readouterr().out)["generated"]
    return g, out


def test_hf_tokens_plan_counts_full_batch_steps(tmp_path, capsys):
    g, out = _plan(tmp_path, capsys, "hf", "accelerate")
    tp = g["training_plan"]
    # 10e9 tokens / (96 x 4096) = 25,431.6 -> 25,432 steps, none of them ramp steps
    assert (tp["ramp_steps"], tp["steps"], tp["steady_steps"]) == (0, 25432, 25432)
    for script in ("launch_hf.sh", "launch_accelerate.sh"):
        assert f"# NOTE: {NOTE}" in (out / "zero1" / script).read_text().splitlines()
    # the DeepSpeed engine's trainer does ramp: its plan keeps the 41 ramp steps
    g, _ = _plan(tmp_path, capsys, "deepspeed")
    assert (g["training_plan"]["ramp_steps"], g["training_plan"]["steps"]) == (41, 25452)


def test_sweep_and_estimate_plans_for_hf_have_no_ramp(tmp_path, capsys):
    spec = str(_write(tmp_path))
    assert main(["sweep", spec, "--target", "hf", "--target", "deepspeed", "--tokens", "10B", "--top", "1",
                 "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ramps = {tuple(g["targets"]): [r["training_plan"]["ramp_steps"] for r in g["ranked"]] for g in doc["groups"]}
    assert ramps == {("deepspeed",): [41], ("hf",): [0]}
    assert main(["estimate", spec, "--target", "hf", "--tokens", "10B", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["training_plan"]["ramp_steps"] == 0

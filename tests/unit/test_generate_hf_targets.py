"""The hf / accelerate target writers (dstoolkit.generate.hf_targets): HF-style JSON with "auto" where HF fills
it, numbers where it must not, TrainingArguments that match, launch lines, accelerate YAML; every JSON passes
`validate --mode hf`, and resolves (dstoolkit.dsconfig.auto.resolve_auto, HF's own fill rules) to a config
that passes strict validation."""
from __future__ import annotations

import json
import textwrap

import pytest

from dstoolkit.dsconfig.auto import find_auto, resolve_auto
from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.hf_launch import (accelerate_config, accelerate_launch_line, hf_launch_line,
                                          training_args_flags)
from dstoolkit.generate.hf_targets import (MOE_BLOCK_CLASSES, build_hf_ds_config, hf_target_files,
                                           hf_unavailable_reason, training_args, write_hf_target)
from dstoolkit.generate.io import load_spec_and_shape
from dstoolkit.spec.checkpoint import CheckpointPolicy
from dstoolkit.validate import validate_config

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 128}
QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 4,
             "num_experts_per_tok": 2, "vocab_size": 256, "max_position_embeddings": 128, "head_dim": 16}

STRATEGIES = {
    "zero0": Candidate(zero_stage=0, micro_batch=2),
    "zero1": Candidate(zero_stage=1, micro_batch=2),
    "zero2": Candidate(zero_stage=2, micro_batch=2),
    "zero2-offload": Candidate(zero_stage=2, offload_optimizer=True, micro_batch=2),
    "zero3": Candidate(zero_stage=3, micro_batch=2),
    "zero3-offload": Candidate(zero_stage=3, offload_optimizer=True, offload_param=True, micro_batch=2),
    "autotp2-zero1": Candidate(zero_stage=1, tp=2, micro_batch=2),
}


def _spec(tmp_path, model=LLAMA, gpu="cpu", nodes=1, gpn=2, precision="fp32", extra="", global_batch=8):
    (tmp_path / "config.json").write_text(json.dumps(model))
    (tmp_path / "s.yaml").write_text(textwrap.dedent(f"""\
        name: hf_tiny
        model: {{hf_config: config.json}}
        cluster: {{nodes: {nodes}, gpus_per_node: {gpn}, gpu: {gpu}}}
        training: {{seq_len: 32, global_batch: {global_batch}, micro_batch: 2, precision: {precision}, lr: 0.001,
                    warmup_steps: 1, train_steps: 6{extra}}}
        """))
    return load_spec_and_shape(tmp_path / "s.yaml")


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_hf_json_passes_validate_hf_and_resolves_to_a_strict_config(tmp_path, name):
    spec, shape = _spec(tmp_path)
    cand = STRATEGIES[name]
    ds = build_hf_ds_config(spec, shape, cand)
    assert [f for f in validate_config(ds, mode="hf", world_size=2, num_heads=4, num_kv_heads=2)
            if f.severity == "error"] == []
    # "auto" exactly where HF fills it; the stage and offload are numbers
    autos = {"/" + "/".join(map(str, p)) for p in find_auto(ds)}
    assert {"/train_batch_size", "/train_micro_batch_size_per_gpu", "/gradient_accumulation_steps",
            "/gradient_clipping", "/optimizer/params/lr", "/optimizer/params/betas", "/optimizer/params/eps",
            "/optimizer/params/weight_decay", "/scheduler/params/total_num_steps"} <= autos
    assert ds["zero_optimization"]["stage"] == cand.zero_stage
    if cand.zero_stage:
        assert ds["zero_optimization"]["reduce_bucket_size"] == "auto"
    if cand.zero_stage == 3:
        assert "/zero_optimization/stage3_prefetch_bucket_size" in autos
    assert ("offload_param" in ds["zero_optimization"]) == cand.offload_param
    # resolved the way HF does, with the TrainingArguments we write, the config is strictly valid
    args = training_args(spec, shape, cand)
    rep = resolve_auto(ds, world_size=2, hidden_size=shape.hidden_size, micro_batch=args["per_device_train_batch_size"],
                       grad_accum=args["gradient_accumulation_steps"], lr=args["learning_rate"],
                       warmup_steps=args["warmup_steps"], total_steps=args["max_steps"], precision="fp32")
    assert rep.unfilled == []
    assert [f for f in validate_config(rep.config, world_size=2) if f.severity == "error"] == []
    dp = cand.dp(2)
    assert args["per_device_train_batch_size"] * args["gradient_accumulation_steps"] * dp == spec.training.global_batch


def test_autotp_writes_tensor_parallel_and_an_allowed_stage(tmp_path):
    spec, shape = _spec(tmp_path)
    ds = build_hf_ds_config(spec, shape, STRATEGIES["autotp2-zero1"])
    assert ds["tensor_parallel"] == {"autotp_size": 2} and ds["zero_optimization"]["stage"] == 1
    args = training_args(spec, shape, STRATEGIES["autotp2-zero1"])
    assert args["gradient_accumulation_steps"] == 4  # 8 / (2 x dp 1)
    # autotp 4 at world 2: refused by the validator (DS223) and by the writer's own check
    spec4, shape4 = _spec(tmp_path)
    with pytest.raises(ValueError, match="DS223|does not divide"):
        hf_target_files(spec4, shape4, Candidate(zero_stage=1, tp=3, micro_batch=1))


def test_moe_zero3_names_the_leaf_module(tmp_path):
    spec, shape = _spec(tmp_path, model=QWEN3_MOE)
    cand = Candidate(zero_stage=3, micro_batch=2)
    ds = build_hf_ds_config(spec, shape, cand)
    assert ds["zero_optimization"]["leaf_module"] == {"classes": [MOE_BLOCK_CLASSES["qwen3_moe"]]}
    files = hf_target_files(spec, shape, cand)
    assert "set_z3_leaf_modules(model, [Qwen3MoeSparseMoeBlock])" in files["launch_hf.sh"]


def test_no_hf_form_for_pipeline_and_autoep(tmp_path):
    spec, shape = _spec(tmp_path, model=QWEN3_MOE)
    assert "PipelineModule" in hf_unavailable_reason(Candidate(zero_stage=1, pp=2, micro_batch=1), shape)
    reason = hf_unavailable_reason(Candidate(zero_stage=1, ep=2, micro_batch=1), shape)
    assert "_CanRecordRegistry.get()" in reason and "4.57.1" in reason
    with pytest.raises(ValueError, match="PipelineModule"):
        build_hf_ds_config(spec, shape, Candidate(zero_stage=1, pp=2, micro_batch=1))


def test_launch_lines_flags_and_accelerate_yaml(tmp_path):
    spec, shape = _spec(tmp_path, gpu="H100-SXM", nodes=2, gpn=8, precision="bf16",
                        extra=", activation_checkpointing: full", global_batch=32)
    cand = Candidate(zero_stage=3, micro_batch=1, checkpoint=CheckpointPolicy(kind="full"))
    ds = build_hf_ds_config(spec, shape, cand)
    assert ds["bf16"] == {"enabled": "auto"} and "torch_adam" not in ds["optimizer"]["params"]
    assert ds["zero_optimization"]["overlap_comm"] is True
    args = training_args(spec, shape, cand)
    assert args["bf16"] is True and args["gradient_checkpointing"] is True and "use_cpu" not in args
    flags = training_args_flags(args)
    assert flags[flags.index("--deepspeed") + 1] == "ds_config_hf.json" and "--bf16" in flags
    line = hf_launch_line(spec, args)
    assert line.startswith('torchrun "${NODE_ARGS[@]}" --nproc_per_node 8 "$SCRIPT" --deepspeed "$HERE/ds_config_hf.json"')
    assert line.endswith('"$@"')
    acc = accelerate_config(spec, cand)
    assert acc["distributed_type"] == "DEEPSPEED" and acc["num_processes"] == 16 and acc["num_machines"] == 2
    assert acc["deepspeed_config"] == {"deepspeed_config_file": "ds_config_hf.json", "zero3_init_flag": True,
                                       "deepspeed_multinode_launcher": "standard"}
    aline = accelerate_launch_line(spec, training_args(spec, shape, cand, deepspeed=None))
    assert aline.startswith('accelerate launch --config_file "$HERE/accelerate_config.yaml" '
                            '--deepspeed_config_file "$HERE/ds_config_hf.json" "${NODE_ARGS[@]}" "$SCRIPT"')
    assert "--deepspeed " not in aline
    paths = write_hf_target(tmp_path / "zero3", spec, shape, cand, accelerate=True)
    names = sorted(p.name for p in paths)
    assert names == ["accelerate_config.yaml", "ds_config_hf.json", "launch_accelerate.sh", "launch_hf.sh",
                     "training_args.json"]
    yaml_text = (tmp_path / "zero3" / "accelerate_config.yaml").read_text()
    assert "  deepspeed_config_file: ds_config_hf.json\n" in yaml_text and "distributed_type: DEEPSPEED\n" in yaml_text
    yaml = pytest.importorskip("yaml")
    assert yaml.safe_load(yaml_text) == acc


def test_hf_targets_for_is_the_generate_hook(tmp_path):
    from dstoolkit.generate.hf_targets import hf_targets_for

    spec, shape = _spec(tmp_path)
    assert hf_targets_for(spec, shape, STRATEGIES["zero2"], ["deepspeed"]).files == {}
    hf = hf_targets_for(spec, shape, STRATEGIES["zero2"], ["deepspeed", "hf"])
    assert set(hf.files) == {"ds_config_hf.json", "training_args.json", "launch_hf.sh"} and hf.skipped == {}
    acc = hf_targets_for(spec, shape, STRATEGIES["zero2"], ["accelerate"])
    assert {"accelerate_config.yaml", "launch_accelerate.sh", "ds_config_hf.json"} <= set(acc.files)
    pp = hf_targets_for(spec, shape, Candidate(zero_stage=1, pp=2, micro_batch=2), ["hf", "accelerate"])
    assert pp.files == {} and set(pp.skipped) == {"hf", "accelerate"} and "PipelineModule" in pp.skipped["hf"]

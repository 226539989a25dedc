"""Every generated DeepSpeed JSON passes `validate_config` at its spec's world size and is accepted by
deepspeed 0.19.8's own `DeepSpeedConfig`; MoE facts stay out of the JSON."""
from __future__ import annotations

import json

import pytest

from dstoolkit.generate.bundled import BUNDLED_SPECS, cached_bundled
from dstoolkit.generate.io import load_spec_and_shape
from dstoolkit.validate.engine import validate_config


def _configs(repo_root):
    out = []
    for stem in BUNDLED_SPECS:
        res = cached_bundled(str(repo_root / "ds_configs"), stem)
        spec, shape = load_spec_and_shape(repo_root / "ds_configs" / f"{stem}.yaml")
        for o in res.generated:
            if "ds_config.json" in o.files:  # HF-only folders (an HF MoE model at ZeRO-3) have ds_config_hf.json
                out.append((stem, spec, shape, o))
    return out


def _walk(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v)
    else:
        yield obj


def test_every_bundled_spec_generates_something(repo_root):
    for stem in BUNDLED_SPECS:
        assert cached_bundled(str(repo_root / "ds_configs"), stem).generated, stem


def test_no_error_findings_at_spec_world_size(repo_root):
    for stem, spec, shape, o in _configs(repo_root):
        cfg = json.loads(o.files["ds_config.json"])
        c = o.chosen.candidate
        findings = validate_config(cfg, source=f"{stem}/{o.name}", world_size=spec.cluster.world_size,
                                   gpus_per_node=spec.cluster.gpus_per_node, tp=c.tp, pp=c.pp,
                                   num_experts=shape.num_experts or None, ep_size=c.ep if shape.is_moe else None)
        errors = [f for f in findings if f.severity == "error"]
        assert not errors, f"{stem}/{o.name}: {[(f.code, f.pointer, f.message) for f in errors]}"


def test_batch_triad_matches_world_size(repo_root):
    for stem, spec, shape, o in _configs(repo_root):
        cfg = json.loads(o.files["ds_config.json"])
        c = o.chosen.candidate
        dp = spec.cluster.world_size // (c.tp * c.pp)
        assert cfg["train_batch_size"] == spec.training.global_batch
        assert cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * dp == \
            cfg["train_batch_size"], f"{stem}/{o.name}"


def test_pure_deepspeed_json_without_auto_or_moe_keys(repo_root):
    for stem, spec, shape, o in _configs(repo_root):
        cfg = json.loads(o.files["ds_config.json"])
        assert "auto" not in list(_walk(cfg)), f"{stem}/{o.name} has an 'auto' value"
        assert "dstoolkit" not in cfg and "moe" not in cfg, f"{stem}/{o.name} carries non-DeepSpeed keys"


def test_moe_stage_1_2_sets_what_deepspeed_requires(repo_root):
    # deepspeed/runtime/zero/stage_1_and_2.py _configure_moe_settings asserts both for MoE.
    for stem, spec, shape, o in _configs(repo_root):
        if not shape.is_moe:
            continue
        cfg = json.loads(o.files["ds_config.json"])
        z = cfg["zero_optimization"]
        assert z["stage"] in (0, 1, 2), f"{stem}/{o.name}: MoE must not be stage 3"
        if z["stage"] in (1, 2):
            assert z["contiguous_gradients"] is True and z["reduce_scatter"] is True


def test_deepspeed_config_accepts_every_generated_json(repo_root):
    """deepspeed.runtime.config.DeepSpeedConfig with mpu=None and no process group derives world_size = 1
    (its dist.get_rank() raises, config.py falls back to 1), so its batch check is
    train_batch == micro * grad_accum * 1. We hand it the per-data-parallel-rank share of the batch; the
    triad at the real world size is checked in test_batch_triad_matches_world_size."""
    deepspeed_config = pytest.importorskip("deepspeed.runtime.config")
    import deepspeed.comm as dist

    assert not dist.is_initialized()
    for stem, spec, shape, o in _configs(repo_root):
        cfg = json.loads(o.files["ds_config.json"])
        cfg["train_batch_size"] = cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"]
        ds = deepspeed_config.DeepSpeedConfig(cfg, mpu=None)
        assert ds.world_size == 1
        assert ds.zero_optimization_stage == cfg["zero_optimization"]["stage"], f"{stem}/{o.name}"
        assert ds.bfloat16_config.enabled == ("bf16" in cfg), f"{stem}/{o.name}"
        assert ds.gradient_accumulation_steps == cfg["gradient_accumulation_steps"]
        off = cfg["zero_optimization"].get("offload_optimizer")
        if off:
            assert ds.zero_config.offload_optimizer is not None
            assert ds.zero_config.offload_optimizer.device == "cpu"
        if cfg["zero_optimization"].get("zero_quantized_weights"):
            assert ds.zero_config.zero_quantized_weights and ds.zero_config.zero_quantized_gradients
            assert ds.zero_config.zero_hpz_partition_size == cfg["zero_optimization"]["zero_hpz_partition_size"]


def test_cpu_spec_avoids_fused_adam_but_offload_keeps_cpu_adam(repo_root):
    res = cached_bundled(str(repo_root / "ds_configs"), "tiny_cpu")
    by_name = {o.name: json.loads(o.files["ds_config.json"]) for o in res.generated}
    assert by_name["zero2"]["optimizer"]["params"]["torch_adam"] is True
    # ZeRO-Offload must use DeepSpeedCPUAdam (engine.py raises for other optimizers with offload).
    assert "torch_adam" not in by_name["zero2-offload"]["optimizer"]["params"]
    assert by_name["zero2-offload"]["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert by_name["zero3-offload"]["zero_optimization"]["offload_param"]["device"] == "cpu"



def test_fp32_gradient_accumulation_reaches_both_deepspeed_files(repo_root, tmp_path):
    from dstoolkit.generate.core import generate
    from dstoolkit.models.params import count_params

    def shape_params(shape):
        return count_params(shape).total

    text = (repo_root / "ds_configs" / "tiny_cpu.yaml").read_text(encoding="utf-8")
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(text.replace("  offload: true", "  grad_accum_dtype: fp32\n  offload: true"), encoding="utf-8")
    spec, shape = load_spec_and_shape(spec_path)
    assert spec.training.grad_accum_dtype == "fp32"
    res = generate(spec, shape, strategies=["zero1"], targets=("deepspeed", "hf"))
    (o,) = res.generated
    for name in ("ds_config.json", "ds_config_hf.json"):
        cfg = json.loads(o.files[name])
        assert cfg["data_types"] == {"grad_accum_dtype": "fp32"}, name
    # bf16 + fp32 accumulation at ZeRO 1 without offload: DeepSpeed runs BF16_Optimizer, whose full-size fp32
    # gradient buffer (4 bytes per parameter) the estimate holds beside the bf16 .grad tensors (2): 6 bytes per
    # parameter, where ZeRO-1 without it holds the bf16 gradients and a 1/dp fp32 partition (2 + 4 / 2 ranks)
    base_spec, _ = load_spec_and_shape(repo_root / "ds_configs" / "tiny_cpu.yaml")
    (base,) = generate(base_spec, shape, strategies=["zero1"]).generated
    n = shape_params(shape)
    grads, base_grads = (x.chosen.estimate.memory_breakdown_bytes["grads"] for x in (o, base))
    assert abs(grads - 6 * n) <= 0.001 * 6 * n and abs(base_grads - 4 * n) <= 0.001 * 4 * n


def test_fp32_gradient_accumulation_needs_a_16_bit_precision(repo_root, tmp_path):
    from dstoolkit.generate.io import SpecLoadError

    text = (repo_root / "ds_configs" / "tiny_cpu.yaml").read_text(encoding="utf-8")
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(text.replace("  precision: bf16", "  precision: fp16\n  grad_accum_dtype: fp32"),
                         encoding="utf-8")
    with pytest.raises(SpecLoadError) as exc:
        load_spec_and_shape(spec_path)
    msg = str(exc.value)
    assert "training.grad_accum_dtype" in msg and "not 'fp16'" in msg and "set precision: bf16" in msg


def test_fp32_gradient_accumulation_leaves_zero0_out(repo_root, tmp_path):
    from dstoolkit.generate.core import default_strategy_names
    from dstoolkit.generate.io import SpecLoadError

    text = (repo_root / "ds_configs" / "tiny_cpu.yaml").read_text(encoding="utf-8")
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(text.replace("  offload: true", "  grad_accum_dtype: fp32\n  offload: true"), encoding="utf-8")
    spec, shape = load_spec_and_shape(spec_path)
    names, skipped = default_strategy_names(spec, shape)
    assert "zero0" not in names and {"zero1", "zero2", "zero3"} <= set(names)
    why = {s.name: s.reason for s in skipped}["zero0"]
    assert "grad_accum_dtype=fp32" in why and "DS229" in why
    # asked for explicitly, stage 0 with it is the spec's error, with the field named
    spec_path.write_text(text.replace("  offload: true", "  grad_accum_dtype: fp32\n  offload: true")
                         .replace("  zero_stage: auto", "  zero_stage: 0"), encoding="utf-8")
    with pytest.raises(SpecLoadError) as exc:
        load_spec_and_shape(spec_path)
    assert "training.grad_accum_dtype" in str(exc.value) and "set zero_stage: 1" in str(exc.value)

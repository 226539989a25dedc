"""`dstoolkit fp8 plan`: same layer decisions as convert, hand-computed memory deltas, speed classes, CLI."""
import json

import pytest

from dstoolkit.cli import main
from dstoolkit.fp8.plan import gemm_speedup, plan_from_shape, speed_class
from dstoolkit.models.presets import get_preset
from dstoolkit.models.shape import ModelShape
from dstoolkit.dsconfig.fp8 import Fp8Config
from dstoolkit.hardware.table import get_gpu

H100 = get_gpu("H100-SXM")
SMALL = ModelShape(name="small", model_type="llama", hidden_size=128, num_hidden_layers=1, num_attention_heads=4,
                   intermediate_size=256, vocab_size=512)


def test_plan_names_equal_the_converters_report_for_tiny():
    torch = pytest.importorskip("torch")  # noqa: F841
    from dstoolkit.runtime.fp8 import convert
    from dstoolkit.runtime.model import build_model

    cfg = Fp8Config(recipe="block", format="e4m3", layers={"skip_last_layers": 1})
    plan = plan_from_shape(get_preset("tiny"), cfg, gpu=H100, micro_batch=2, seq_len=64)
    rep = convert(build_model(get_preset("tiny")), cfg, backend="emulated")
    assert [e.name for e in plan.report.swapped] == [e.name for e in rep.swapped]
    assert len(plan.report.swapped) == 21  # 3 of 4 blocks x 7 linears
    lin_skips = {s.name: s.reason for s in rep.skipped if s.type == "Linear"}
    assert {s.name: s.reason for s in plan.report.skipped} == lin_skips
    assert plan.report.swapped_params == rep.swapped_params


def test_memory_delta_hand_computed_per_tensor():
    # M = 16 tokens, h = 128, ffn = 256. Swapped: q, k, v, o (128x128), gate, up (128x256), down (256x128).
    p = plan_from_shape(SMALL, Fp8Config(recipe="current"), gpu=H100, micro_batch=1, seq_len=16)
    # Weights: 4 * 16384 + 3 * 32768 = 163840 params, 2 FP8 copies (rowwise + transpose), 1 byte each.
    assert p.memory.weight_cache_bytes == 327_680
    # Saved inputs: q/k/v share a 16x128 bf16 input -> three 1-byte copies (+2048); o_proj's input is also
    # kept by attention (+2048); gate/up: two copies replace one bf16 (0); down: 16x256 -> -4096. Sum 0.
    assert p.memory.activation_bytes_per_micro_batch == 0
    assert p.memory.net_bytes == 327_680


def test_memory_delta_hand_computed_block_scales():
    p = plan_from_shape(SMALL, Fp8Config(recipe="block", format="e4m3"), gpu=H100, micro_batch=1, seq_len=16)
    # One fp32 scale per 128x128 weight block: 163840 * 2 * (1 + 4/16384) = 327760.
    assert p.memory.weight_cache_bytes == 327_760
    # Activation tiles 1x128 add 4/128 byte per element: 2240 + 2112 + 128 - 3968 = 512.
    assert p.memory.activation_bytes_per_micro_batch == 512


def test_full_recompute_and_zero3_and_pp():
    shape = get_preset("llama-3-8b")
    base = plan_from_shape(shape, gpu=H100, micro_batch=1, seq_len=4096)
    full = plan_from_shape(shape, gpu=H100, micro_batch=1, seq_len=4096, activation_checkpointing="full")
    assert full.memory.activation_bytes_per_micro_batch * 32 == pytest.approx(
        base.memory.activation_bytes_per_micro_batch, abs=32)
    z3 = plan_from_shape(shape, gpu=H100, micro_batch=1, seq_len=4096, zero_stage=3)
    assert z3.memory.weight_cache_bytes * 32 == pytest.approx(base.memory.weight_cache_bytes, rel=1e-9)
    pp4 = plan_from_shape(shape, gpu=H100, micro_batch=1, seq_len=4096, pp=4)
    assert pp4.memory.weight_cache_bytes == pytest.approx(base.memory.weight_cache_bytes / 4, rel=1e-9)
    assert pp4.memory.micro_batches_in_flight == 4


def test_speed_classes_small_gemms_slower_large_faster():
    assert speed_class(gemm_speedup(16, 256, 256, H100)) == "slower"
    big = gemm_speedup(8192, 8192, 8192, H100)
    assert speed_class(big) == "large"
    assert big < H100.peak_fp8_flops / H100.peak_bf16_flops  # never beats the tensor-core ratio (2x)
    sizes = [gemm_speedup(n, n, n, H100) for n in (256, 1024, 4096, 16384)]
    assert sizes == sorted(sizes)
    assert gemm_speedup(4096, 4096, 4096, get_gpu("A100-80G")) is None


def test_moe_shape_groups_experts_and_keeps_router():
    p = plan_from_shape(get_preset("deepseek-v3"), Fp8Config(recipe="block", format="e4m3"),
                        gpu=get_gpu("H800"), micro_batch=1, seq_len=4096, ep=64, pp=16, cuda_version="12.9")
    kinds = {g.kind: g for g in p.groups}
    router = kinds["blocks.{3..60}.mlp.moe.deepspeed_moe.gate.wg"]
    assert not router.swapped and router.reason == "excluded by pattern '*.gate.wg'"
    experts = kinds["blocks.{3..60}.mlp.moe.deepspeed_moe.experts.deepspeed_experts.{0..3}.gate_proj"]
    # 58 MoE layers x 256/64 local experts; rows per expert = 4096 tokens x 64 EP ranks x top-8 / 256 = 8192.
    assert (experts.count, experts.tokens, experts.in_features, experts.out_features) == (232, 8192, 7168, 2048)
    # Without EP the same expert sees 4096 x 8 / 256 = 128 rows: a small GEMM that FP8 slows down.
    p1 = plan_from_shape(get_preset("deepseek-v3"), Fp8Config(recipe="block"), gpu=get_gpu("H800"), seq_len=4096)
    small = [g for g in p1.groups if g.kind.endswith("deepspeed_experts.{0..255}.gate_proj")][0]
    assert small.tokens == 128 and small.speed_class == "slower"
    assert p.hardware_problems == []


def _spec(tmp_path, gpu="H100-SXM"):
    path = tmp_path / "spec.yaml"
    path.write_text(f"model:\n  preset: tiny\ncluster:\n  gpus_per_node: 2\n  gpu: {gpu}\ntraining:\n"
                    "  seq_len: 64\n  global_batch: 8\n  micro_batch: 4\n  zero_stage: 2\n")
    return path


def test_cli_plan_json_and_table(tmp_path, capsys):
    assert main(["fp8", "plan", str(_spec(tmp_path)), "--recipe", "block", "--cuda", "12.9", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["tokens_per_micro_batch"] == 4 * 64 and d["format"] == "e4m3"
    # Per block: q, o 256x256; k, v 256x128 (4 KV heads of 32); gate, up, down 256x688 -> 724,992 params.
    assert len(d["report"]["swapped"]) == 28 and d["report"]["swapped_params"] == 4 * 724_992
    assert main(["fp8", "plan", "tiny", "--gpu", "H100-SXM"]) == 0
    out = capsys.readouterr().out
    assert "blocks.{0..3}.self_attn.q_proj" in out and "kept: excluded by pattern '*lm_head*'" in out
    assert "Memory change per rank" in out


def test_cli_plan_hardware_gate_and_bad_input(tmp_path, capsys):
    assert main(["fp8", "plan", str(_spec(tmp_path, "A100-80G"))]) == 1
    assert "needs compute capability sm_89+ but 'A100-80G' is sm_80" in capsys.readouterr().out
    assert main(["fp8", "plan", "tinyy"]) == 2
    assert "did you mean 'tiny'" in capsys.readouterr().err
    bad = tmp_path / "fp8.json"
    bad.write_text(json.dumps({"dstoolkit": {"fp8": {"recipe": "current", "amax_history_len": 8}}}))
    assert main(["fp8", "plan", "tiny", "--config", str(bad)]) == 2
    assert "fp8.amax_history_len=8 only apply to fp8.recipe='delayed'" in capsys.readouterr().err

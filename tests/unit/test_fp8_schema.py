"""Fp8Config: validators, TE kwargs, Megatron flags, hardware gates (no torch needed)."""
import subprocess
import sys

import pytest
from pydantic import ValidationError

from dstoolkit.dsconfig.fp8 import (
    E4M3_MAX,
    E5M2_MAX,
    Fp8Config,
    Fp8LayerSelection,
    check_fp8_hardware,
    parse_version,
)
from dstoolkit.hardware.table import get_gpu
from dstoolkit.hardware.table import GpuSpec


def _gpu(cc):
    return GpuSpec(name=f"sm{cc}", memory_bytes=1, peak_bf16_flops=1.0, intra_node_bw_bytes_per_s=1.0,
                   inter_node_bw_bytes_per_s=1.0, compute_capability=cc)


def test_defaults_are_transformer_engines():
    # TE docs, common.recipe.DelayedScaling: HYBRID, amax_history_len=1024, amax_compute_algo="max", margin=0.
    c = Fp8Config()
    assert (c.format, c.recipe, c.amax_history_len, c.amax_compute_algo, c.margin) == (
        "hybrid", "delayed", 1024, "max", 0)
    assert c.forward_max == 448.0 and c.backward_max == 57344.0
    assert Fp8Config(format="e4m3").backward_max == E4M3_MAX
    assert (E4M3_MAX, E5M2_MAX) == (448.0, 57344.0)


def test_format_default_follows_te_per_recipe():
    # TE: DelayedScaling / Float8CurrentScaling default HYBRID; Float8BlockScaling / MXFP8BlockScaling E4M3.
    assert [Fp8Config(recipe=r).format for r in ("delayed", "current", "block", "mxfp8")] == [
        "hybrid", "hybrid", "e4m3", "e4m3"]
    assert Fp8Config(recipe="block", format="hybrid").format == "hybrid"


def test_history_fields_rejected_for_non_delayed_recipe():
    with pytest.raises(ValidationError, match=r"fp8.amax_history_len=16 only apply to fp8.recipe='delayed'"):
        Fp8Config(recipe="current", amax_history_len=16)
    with pytest.raises(ValidationError, match=r"fp8.margin=1 has no effect with fp8.recipe='block'"):
        Fp8Config(recipe="block", margin=1)
    with pytest.raises(ValidationError, match=r"fp8.block_size=64 only applies to fp8.recipe='block'"):
        Fp8Config(recipe="delayed", block_size=64)
    with pytest.raises(ValidationError, match=r"fp8.block_size=72 must be a multiple of 16"):
        Fp8Config(recipe="block", block_size=72)
    with pytest.raises(ValidationError, match=r"include and fp8.layers.exclude both list \['\*q_proj'\]"):
        Fp8LayerSelection(include=["*q_proj"], exclude=["*q_proj"])
    with pytest.raises(ValidationError, match="extra"):
        Fp8Config(recipee="block")


def test_full_dump_round_trips():
    c = Fp8Config(recipe="block", format="e4m3", layers={"skip_first_layers": 1})
    assert Fp8Config.model_validate(c.model_dump()) == c


def test_te_recipe_kwargs():
    assert Fp8Config().te_recipe_kwargs() == {
        "fp8_format": "HYBRID", "margin": 0, "amax_history_len": 1024, "amax_compute_algo": "max"}
    # TE Float8BlockScaling: 1-D (1x128) activation/grad scaling, 2-D (128x128) weight scaling.
    assert Fp8Config(recipe="block", format="e4m3").te_recipe_kwargs() == {
        "fp8_format": "E4M3", "x_block_scaling_dim": 1, "w_block_scaling_dim": 2, "grad_block_scaling_dim": 1}
    assert Fp8Config(recipe="mxfp8", format="e4m3").te_recipe_kwargs() == {"fp8_format": "E4M3"}


def test_megatron_flags_and_default_mismatch_warnings():
    # Megatron-LM defaults: --fp8-amax-history-len 1, --fp8-amax-compute-algo most_recent (TE: 1024, max).
    m = Fp8Config().to_megatron_args()
    assert m.args == ["--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-margin", "0",
                      "--fp8-amax-history-len", "1024", "--fp8-amax-compute-algo", "max"]
    joined = "\n".join(m.warnings)
    assert "Megatron's default is 1 but Transformer Engine's is 1024" in joined
    assert "Megatron's default is 'most_recent' but Transformer Engine's is 'max'" in joined
    # Set explicitly: no history warnings.
    m2 = Fp8Config(format="hybrid", amax_history_len=16, amax_compute_algo="max").to_megatron_args()
    assert m2.warnings == []
    m3 = Fp8Config(recipe="block", format="e4m3", layers={"skip_first_layers": 2, "skip_last_layers": 1}
                   ).to_megatron_args()
    assert m3.args == ["--fp8-format", "e4m3", "--fp8-recipe", "blockwise", "--first-last-layers-bf16",
                       "--num-layers-at-start-in-bf16", "2", "--num-layers-at-end-in-bf16", "1"]
    assert Fp8Config(recipe="current", format="e4m3").to_megatron_args().args[3] == "tensorwise"
    assert Fp8Config(enabled=False).to_megatron_args().args == []


@pytest.mark.parametrize("recipe,gpu,cuda,expect", [
    ("delayed", "H100-SXM", "12.4", []),
    ("delayed", "L40S", "12.4", []),
    ("delayed", "L40S", "12.0", ["needs CUDA >= 12.1"]),
    ("delayed", "A100-80G", None, ["needs compute capability sm_89+ but 'A100-80G' is sm_80"]),
    ("block", "H100-SXM", "12.9", []),
    ("block", "H800", "12.8", ["fp8.recipe='block' needs CUDA >= 12.9 but CUDA is 12.8"]),
    ("block", "L40S", None, ["needs compute capability sm_90+ but 'L40S' is sm_89"]),
    ("mxfp8", "H200", None, ["needs compute capability sm_100+ but 'H200' is sm_90"]),
    ("delayed", "cpu", None, ["has no CUDA compute capability"]),
])
def test_hardware_gates(recipe, gpu, cuda, expect):
    fmt = "hybrid" if recipe == "delayed" else "e4m3"
    problems = check_fp8_hardware(Fp8Config(recipe=recipe, format=fmt), get_gpu(gpu), cuda)
    assert len(problems) == len(expect), problems
    for p, e in zip(problems, expect):
        assert e in p


def test_hardware_gates_blackwell():
    cfg = Fp8Config(recipe="mxfp8", format="e4m3")
    assert check_fp8_hardware(cfg, _gpu("10.0"), "12.8") == []
    assert "refused by Transformer Engine on sm_120" in check_fp8_hardware(cfg, _gpu("12.0"))[0]
    assert check_fp8_hardware(Fp8Config(enabled=False), _gpu("7.0")) == []
    with pytest.raises(ValueError, match="cannot read version 'x.y'"):
        parse_version("x.y")


def test_layer_selection_patterns():
    sel = Fp8LayerSelection()
    assert sel.name_reason("lm_head") == "excluded by pattern '*lm_head*'"
    assert sel.name_reason("blocks.0.mlp.deepspeed_moe.gate.wg") == "excluded by pattern '*.gate.wg'"
    assert sel.name_reason("blocks.0.mlp.gate_proj") is None
    inc = Fp8LayerSelection(include=["*.mlp.*"])
    assert "not matched by include" in inc.name_reason("blocks.0.self_attn.q_proj")


def test_schema_import_does_not_import_torch():
    code = "import sys, dstoolkit.dsconfig.fp8, dstoolkit.fp8.report; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

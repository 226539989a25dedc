"""`dstoolkit fp8 plan` refuses a tp / pp / ep the model cannot be split by (the layout constraints LY003, LY004,
LY005, LY007, LY008 that every other verb asks) and layer skips that keep every block in bf16, instead of printing
a plan of 0 swapped layers."""
from __future__ import annotations

import pytest

from dstoolkit.cli import main
from dstoolkit.dsconfig.fp8 import Fp8Config
from dstoolkit.fp8.plan import plan_from_shape
from dstoolkit.fp8.report import layer_skip_problem
from dstoolkit.hardware.table import get_gpu
from dstoolkit.models import get_preset

H100 = get_gpu("H100-SXM")
ERR = "dstoolkit fp8 plan: error: "


def run(capsys, *argv):
    rc = main(["fp8", "plan", *argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.mark.parametrize("argv, err", [
    (["llama-3-8b", "--gpu", "H100-SXM", "--tp", "3"],
     "--tp=3 does not divide num_attention_heads=32 (choose tp from the divisors of 32; layout rule LY003, "
     "`dstoolkit validate --explain LY003`)"),
    (["llama-3-8b", "--tp", "64"],
     "--tp=64 does not divide num_attention_heads=32 (choose tp from the divisors of 32; layout rule LY003, "
     "`dstoolkit validate --explain LY003`)"),
    (["llama-3-8b", "--tp", "16"],
     "--tp=16 does not divide num_key_value_heads=8 (choose tp from the divisors of 8 (Megatron --num-query-groups "
     "must be a multiple of tp); layout rule LY004, `dstoolkit validate --explain LY004`)"),
    (["llama-3-8b", "--pp", "40"],
     "--pp=40 exceeds num_hidden_layers=32 (pick pp between 1 and 32: each pipeline stage needs a layer; layout "
     "rule LY005, `dstoolkit validate --explain LY005`)"),
    (["llama-3-8b", "--ep", "2"],
     "--ep=2 but the model has no experts (dense model) (use ep 1; layout rule LY007, "
     "`dstoolkit validate --explain LY007`)"),
    (["mixtral-8x7b", "--ep", "3"],
     "--ep=3 does not divide the number of experts 8 (choose ep from the divisors of 8; layout rule LY008, "
     "`dstoolkit validate --explain LY008`)"),
    (["llama-3-8b", "--gpu", "H100-SXM", "--skip-first", "40"],
     "--skip-first=40 keeps all 32 transformer blocks of llama-3-8b in bf16 (40 >= 32), so no block would run in "
     "FP8 (pick at most 31 in total; to train without FP8 set fp8.enabled false)"),
    (["llama-3-8b", "--skip-first", "16", "--skip-last", "16"],
     "--skip-first=16 + --skip-last=16 keeps all 32 transformer blocks of llama-3-8b in bf16 (32 >= 32), so no "
     "block would run in FP8 (pick at most 31 in total; to train without FP8 set fp8.enabled false)"),
])
def test_refused_with_the_flag_its_value_and_the_fix(capsys, argv, err):
    rc, out, stderr = run(capsys, *argv)
    assert (rc, out, stderr) == (2, "", ERR + err + "\n")


def test_skips_from_a_config_file_are_named_as_fields(tmp_path, capsys):
    cfg = tmp_path / "fp8.json"
    cfg.write_text('{"layers": {"skip_last_layers": 33}}')
    rc, out, stderr = run(capsys, "llama-3-8b", "--config", str(cfg))
    assert (rc, out) == (2, "")
    assert stderr == (ERR + "fp8.layers.skip_last_layers=33 keeps all 32 transformer blocks of llama-3-8b in bf16 "
                      "(33 >= 32), so no block would run in FP8 (pick at most 31 in total; to train without FP8 set "
                      "fp8.enabled false)\n")


@pytest.mark.parametrize("argv, line2", [
    (["llama-3-8b", "--gpu", "H100-SXM", "--tp", "8", "--pp", "4"],
     "224 linear layers swapped (872,415,232 params; all pipeline stages, dims per TP rank, this EP rank's experts), "
     "1 kept"),
    (["llama-3-8b", "--pp", "3"],  # uneven stages are legal (LY005: any L >= pp)
     "224 linear layers swapped (6,979,321,856 params; all pipeline stages, dims per TP rank, this EP rank's "
     "experts), 1 kept"),
    (["llama-3-8b", "--skip-first", "16", "--skip-last", "15"],  # one block left: 7 linears of block 16
     "7 linear layers swapped (218,103,808 params; all pipeline stages, dims per TP rank, this EP rank's experts), "
     "218 kept"),
    (["mixtral-8x7b", "--ep", "8"],
     "224 linear layers swapped (6,979,321,856 params; all pipeline stages, dims per TP rank, this EP rank's "
     "experts), 33 kept"),
])
def test_legal_layouts_still_plan(capsys, argv, line2):
    rc, out, _ = run(capsys, *argv)
    assert rc == 0 and out.splitlines()[1] == line2


def test_library_call_names_the_arguments():
    shape = get_preset("llama-3-8b")
    with pytest.raises(ValueError) as info:
        plan_from_shape(shape, gpu=H100, tp=3)
    assert str(info.value) == ("tp=3 does not divide num_attention_heads=32 (choose tp from the divisors of 32; "
                               "layout rule LY003, `dstoolkit validate --explain LY003`)")
    with pytest.raises(ValueError, match=r"^fp8.layers.skip_first_layers=32 keeps all 32 transformer blocks"):
        plan_from_shape(shape, Fp8Config(layers={"skip_first_layers": 32}), gpu=H100)


def test_layer_skip_problem_edges():
    assert layer_skip_problem(Fp8Config(layers={"skip_first_layers": 31}), 32) is None
    assert layer_skip_problem(Fp8Config(enabled=False, layers={"skip_first_layers": 40}), 32) is None
    assert layer_skip_problem(Fp8Config(layers={"skip_first_layers": 40}), None) is None
    assert layer_skip_problem(Fp8Config(layers={"skip_first_layers": 1, "skip_last_layers": 1}), 2) == (
        "fp8.layers.skip_first_layers=1 + fp8.layers.skip_last_layers=1 keeps all 2 transformer blocks of the model "
        "in bf16 (2 >= 2), so no block would run in FP8 (pick at most 1 in total; to train without FP8 set "
        "fp8.enabled false)")

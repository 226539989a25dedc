"""`fp8 plan` checks tokens per micro batch against Transformer Engine's FP8 GEMM requirement (s32 validate/fp8
report, finding 8): micro_batch x seq_len a multiple of 8 (TE assert_dim_for_fp8_exec), of 32 for MXFP8."""
from __future__ import annotations

import pytest

from dstoolkit.cli import main
from dstoolkit.dsconfig.fp8 import Fp8Config
from dstoolkit.fp8.plan import plan_from_shape, token_problem
from dstoolkit.hardware.table import get_gpu
from dstoolkit.models import get_preset


def test_cli_names_the_numbers_and_the_nearest_seq_len(capsys):
    rc = main(["fp8", "plan", "llama-3-8b", "--seq-len", "1001"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.splitlines() == [
        "dstoolkit fp8 plan: error: --micro-batch=1 x --seq-len=1001 = 1001 tokens per micro-batch is not a multiple "
        "of 8, which Transformer Engine's FP8 GEMMs need (transformer_engine/pytorch/utils.py "
        "assert_dim_for_fp8_exec): use --seq-len 1000 (or 1008)"]


def test_rule_per_recipe_and_micro_batch():
    delayed, mx = Fp8Config(), Fp8Config(recipe="mxfp8")
    assert token_problem(delayed, 1, 1000) is None
    assert token_problem(delayed, 2, 1004) is None  # 2008 tokens
    assert token_problem(delayed, 1, 5).endswith("use seq_len 8")
    assert token_problem(Fp8Config(enabled=False), 1, 1001) is None
    assert token_problem(mx, 1, 1000) == (
        "micro_batch=1 x seq_len=1000 = 1000 tokens per micro-batch is not a multiple of 32, which fp8.recipe "
        "'mxfp8' needs (its scales cover blocks of 32 tokens, OCP MX spec v1.0): use seq_len 992 (or 1024)")
    assert token_problem(mx, 4, 1000) is None  # 4000 = 125 x 32
    with pytest.raises(ValueError, match="1001 tokens per micro-batch is not a multiple of 8"):
        plan_from_shape(get_preset("llama-3-8b"), gpu=get_gpu("H100-SXM"), seq_len=1001)

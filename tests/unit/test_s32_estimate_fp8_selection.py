"""`estimate --precision fp8` uses `fp8 plan`'s layer selection (s32 validate/fp8 report, finding 3): layers the
config's dstoolkit.fp8 keeps in bf16 get no FP8 GEMM speed-up and no FP8 weight cache, and a selection `fp8 plan`
refuses is refused with its message."""
from __future__ import annotations

import json

import pytest

from dstoolkit.cli import main
from dstoolkit.dsconfig.fp8 import Fp8Config
from dstoolkit.estimate import estimate_run
from dstoolkit.fp8.plan import plan_from_shape
from dstoolkit.fp8.selection import fp8_selection
from dstoolkit.hardware.table import get_gpu
from dstoolkit.models import get_preset
from dstoolkit.runplan import Fp8Selection, RunPlan

DS = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
      "zero_optimization": {"stage": 2}}
ARGS = ["--model", "llama-3-8b", "--world-size", "8", "--seq-len", "2048", "--format", "json"]


def _estimate(tmp_path, capsys, fp8=None, precision="fp8"):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({**DS, **({"dstoolkit": {"fp8": fp8}} if fp8 is not None else {})}))
    rc = main(["estimate", "--config", str(cfg), *ARGS, *(["--precision", precision] if precision else [])])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else None), err


def test_skipped_blocks_stay_bf16_in_time_and_weight_cache(tmp_path, capsys):
    _, bf16, _ = _estimate(tmp_path, capsys, precision=None)
    _, full, _ = _estimate(tmp_path, capsys)
    _, one, _ = _estimate(tmp_path, capsys, {"layers": {"skip_first_layers": 16, "skip_last_layers": 15}})
    # the plan swaps 7 linears of block 16: 218,103,808 weights, cached as fp8 rowwise + columnwise
    plan = plan_from_shape(get_preset("llama-3-8b"), Fp8Config(layers={"skip_first_layers": 16, "skip_last_layers": 15}),
                           gpu=get_gpu("H100-SXM"), seq_len=2048)
    assert plan.report.swapped_params == 218_103_808
    assert one["memory_per_rank_bytes"]["detail"]["fp8_weight_cache"] == 2 * 218_103_808
    assert full["memory_per_rank_bytes"]["detail"]["fp8_weight_cache"] == 32 * 2 * 218_103_808
    assert bf16["step_time_s"] > one["step_time_s"] > full["step_time_s"]
    # one block of 32 in FP8: about 1/32 of the full FP8 gain
    gain_one = bf16["step_time_s"] - one["step_time_s"]
    gain_full = bf16["step_time_s"] - full["step_time_s"]
    assert gain_one == pytest.approx(gain_full / 32, rel=0.05)


def test_selection_fp8_plan_refuses_is_refused_with_its_message(tmp_path, capsys):
    rc, _, err = _estimate(tmp_path, capsys, {"layers": {"skip_first_layers": 40}})
    assert rc == 2
    assert err.splitlines() == [
        "dstoolkit estimate: error: fp8.layers.skip_first_layers=40 keeps all 32 transformer blocks of llama-3-8b in "
        "bf16 (40 >= 32), so no block would run in FP8 (pick at most 31 in total; to train without FP8 set "
        "fp8.enabled false)"]


def test_selection_shares_and_plan_defaults():
    shape = get_preset("llama-3-8b")
    sel = fp8_selection(shape, Fp8Config(layers={"skip_first_layers": 2}), micro_batch=1, seq_len=2048)
    assert sel.blocks == (0.0, 0.0) + (1.0,) * 30
    assert sel.lm_head is False  # the default selection excludes '*lm_head*'
    with pytest.raises(ValueError, match="2001 tokens per micro-batch is not a multiple of 8"):
        fp8_selection(shape, Fp8Config(), micro_batch=1, seq_len=2001)
    base = dict(shape=shape, ds_config=DS, world_size=8, gpus_per_node=8, gpu=get_gpu("H100-SXM"), seq_len=2048)
    bf16 = estimate_run(RunPlan(**base))
    none_fp8 = estimate_run(RunPlan(**base, precision="fp8", fp8_selection=Fp8Selection(blocks=(0.0,) * 32)))
    assert none_fp8.memory.fp8_weight_cache == 0
    assert none_fp8.step_time_s == pytest.approx(bf16.step_time_s, rel=1e-12)

"""Time and cost to train (dstoolkit/estimate/training_plan.py, `dstoolkit estimate --tokens`).

Exact results are hand-computed from the schedule's definition (Megatron-LM's ramp calculator, as
`BatchRamp.batch_at` implements it); the two published anchors are compared, not pinned: the plan is not tuned to
them, and the test only bounds how far it may land (the gap and its reasons are in the README's estimates table).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dstoolkit.cli import main
from dstoolkit.estimate.batch_ramp import BatchRamp
from dstoolkit.estimate.training_plan import (StepCost, TrainingPlanError, batch_schedule, check_gpu_hour_price,
                                              parse_token_count, plan_training, training_plan)

REPO = Path(__file__).resolve().parents[2]
LLAMA_405B_SPEC = REPO / "ds_configs" / "llama31_405b_2048x8_h100.yaml"
DEEPSEEK_V3_SPEC = REPO / "ds_configs" / "deepseek_v3_32x8_h800.yaml"

# DeepSeek-V3 Technical Report (arXiv 2412.19437), Table 1: pre-training 2664K H800 GPU-hours; §1: 14.8T tokens,
# "each trillion tokens ... 180K H800 GPU hours, i.e., 3.7 days on our cluster with 2048 H800 GPUs".
DEEPSEEK_V3_PRETRAIN_GPU_HOURS = 2_664_000
DEEPSEEK_V3_PRETRAIN_TOKENS = 14.8e12
DEEPSEEK_V3_GPU_HOURS_PER_T = 180_000
DEEPSEEK_V3_GPUS = 2048
# Llama 3.1 model card (meta-llama/llama-models, models/llama3_1/MODEL_CARD.md, "Training Energy Use"): 405B,
# 30.84M H100-80GB GPU-hours; The Llama 3 Herd of Models (arXiv 2407.21783) §1 / §3.1: 405B pre-trained on 15.6T
# tokens. The card's hours are "the total GPU time required for training each model" (not pre-training only).
LLAMA_31_405B_GPU_HOURS = 30_840_000
LLAMA_31_405B_TOKENS = 15.6e12
ANCHOR_BAND = 2.0
"""The plan must land within a factor 2 of each published total: a sanity bound, not a fit. The step-time model's
error on the Llama 3 405B rows is up to -25% (benchmarks/results/published_runs_202612.md); the bundled DeepSeek-V3
spec runs on 256 GPUs, not DeepSeek's 2048, with the layout the sweep picks for that (full recompute, 1F1B, no
DualPipe overlap); restarts and evaluation are not counted. Where each lands is in the README's estimates table."""


@pytest.mark.parametrize("text,tokens", [
    ("14.8T", 14_800_000_000_000), ("300B", 300_000_000_000), ("2e12", 2_000_000_000_000),
    ("469000000000", 469_000_000_000), ("1.5k", 1500), ("0.5M", 500_000), ("2.5e3B", 2_500_000_000_000), ("7G", 7e9),
])
def test_token_counts_parse(text, tokens):
    assert parse_token_count(text) == tokens


@pytest.mark.parametrize("text", ["14.8X", "T", "", "-5T", "1..2T", "14.8 TT", "nan", "0", "0.0001", "1e300T", "1e400"])
def test_bad_token_counts_name_the_flag_and_the_fix(text):
    with pytest.raises(TrainingPlanError, match=r"^--tokens .*(e\.g\. 14\.8T)"):
        parse_token_count(text)


def test_price_must_be_non_negative():
    assert check_gpu_hour_price(None) is None and check_gpu_hour_price(0.0) == 0.0
    with pytest.raises(TrainingPlanError, match=r"^--gpu-hour-price -1.0: .*>= 0"):
        check_gpu_hour_price(-1.0)


def _ramp() -> BatchRamp:
    # start 2, increment 2, 12 samples, end 8 at micro 1 x dp 2: n = ceil(6 / 2) = 3 increments;
    # batch(c) = 2 + floor(3c / 12) * 2 for c <= 12: c = 0 -> 2, 2 -> 2, 4 -> 4, 8 -> 6, 14 -> 8 (past the ramp)
    return BatchRamp(start_batch=2, end_batch=8, increment=2, ramp_samples=12, micro_batch=1, dp_size=2)


def test_schedule_counts_the_ramp_step_by_step():
    assert batch_schedule(30, 1, 8, 2, _ramp()) == [(2, 2), (4, 1), (6, 1), (8, 2)]  # 14 in the ramp + 2 x 8
    assert batch_schedule(31, 1, 8, 2, _ramp()) == [(2, 2), (4, 1), (6, 1), (8, 3)]  # the last step runs a whole batch
    assert batch_schedule(31, 1, 8, 2, None) == [(8, 4)]
    assert batch_schedule(62, 2, 8, 2, _ramp()) == [(2, 2), (4, 1), (6, 1), (8, 3)]  # 31 samples of 2 tokens


def test_ramp_longer_than_the_run_is_refused():
    with pytest.raises(TrainingPlanError, match=r"^--tokens 10: the run ends inside training.batch_ramp.*"
                                                r"give more --tokens, or shorten the ramp"):
        batch_schedule(10, 1, 8, 2, _ramp())


def test_plan_sums_each_batch_at_its_own_step_time():
    calls = []

    def cost(gb):  # a fixed 1 s per step plus 0.5 s per sequence; 0.25 s exposed comm
        calls.append(gb)
        return StepCost(1.0 + 0.5 * gb, 0.25)

    tp = training_plan(30, seq_len=1, global_batch=8, unit=2, gpus=4, step_cost=cost, ramp=_ramp(),
                       gpu_hour_price=3.0)
    # ramp: 2 x 2.0 + 1 x 3.0 + 1 x 4.0 = 11 s; steady: 2 x 5.0 = 10 s
    assert (tp.steps, tp.ramp_steps, tp.steady_steps) == (6, 4, 2)
    assert (tp.ramp_tokens, tp.steady_tokens, tp.tokens_trained) == (14, 16, 30)
    assert (tp.ramp_wall_s, tp.steady_wall_s, tp.wall_s) == (11.0, 10.0, 21.0)
    assert tp.gpu_hours == pytest.approx(21.0 * 4 / 3600) and tp.cost == pytest.approx(21.0 * 4 / 3600 * 3.0)
    assert tp.steady_exposed_comm_share == pytest.approx(0.25 / 5.0)
    assert [p.grad_accum for p in tp.phases] == [1, 2, 3, 4]
    assert sorted(calls) == [2, 4, 6, 8]  # once per distinct batch
    js = tp.to_json()
    assert js["wall_days"] == pytest.approx(21.0 / 86400) and js["ramp_step_times"] == "estimated at every batch"
    assert training_plan(30, seq_len=1, global_batch=8, unit=2, gpus=4, step_cost=cost).cost is None


def test_hours_arithmetic_against_deepseek_published_rate():
    # DeepSeek-V3 §1: 180K GPU-hours per trillion tokens = 3.7 days on 2048 GPUs. A step cost with that throughput
    # must give back both published figures (the conversion, not the step-time model).
    seconds_per_token = DEEPSEEK_V3_GPU_HOURS_PER_T * 3600 / DEEPSEEK_V3_GPUS / 1e12
    tp = training_plan(10**12, seq_len=4096, global_batch=15360, unit=64, gpus=DEEPSEEK_V3_GPUS,
                       step_cost=lambda gb: StepCost(gb * 4096 * seconds_per_token, 0.0))
    assert tp.gpu_hours_per_trillion_tokens == pytest.approx(DEEPSEEK_V3_GPU_HOURS_PER_T, rel=1e-4)
    assert round(tp.wall_days, 1) == 3.7
    assert DEEPSEEK_V3_PRETRAIN_GPU_HOURS / (DEEPSEEK_V3_PRETRAIN_TOKENS / 1e12) == pytest.approx(180_000, rel=1e-3)


def _run_json(capsys, *argv) -> dict:
    assert main(["estimate", *argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)["training_plan"]


def test_llama_31_405b_anchor(capsys):
    tp = _run_json(capsys, str(LLAMA_405B_SPEC), "--tokens", "15.6T", "--gpu-hour-price", "2.0")
    # the spec's ramp: 1024 sequences until 2.87T tokens (350,341,797 samples), then 2048
    assert [p["global_batch"] for p in tp["phases"]] == [1024, 2048]
    assert tp["ramp_steps"] == -(-350_341_797 // 1024)
    assert tp["steps"] == tp["ramp_steps"] + tp["steady_steps"]
    assert tp["tokens_trained"] >= 15.6e12 and tp["gpus"] == 16384
    assert tp["cost"] == pytest.approx(tp["gpu_hours"] * 2.0)
    ratio = tp["gpu_hours"] / LLAMA_31_405B_GPU_HOURS
    assert 1 / ANCHOR_BAND < ratio < ANCHOR_BAND, f"predicted {tp['gpu_hours']:,.0f} vs published 30.84M"


@pytest.mark.slow
def test_deepseek_v3_anchor(capsys):
    tp = _run_json(capsys, str(DEEPSEEK_V3_SPEC), "--tokens", "14.8T")
    assert tp["ramp_steps"] > 0 and tp["phases"][0]["global_batch"] == 3072 and tp["global_batch"] == 15360
    # small ramp batches run fewer micro-batches per step: their step is shorter, not the full step scaled down
    first = tp["phases"][0]
    assert first["step_time_s"] < tp["steady_step_time_s"]
    ratio = tp["gpu_hours"] / DEEPSEEK_V3_PRETRAIN_GPU_HOURS
    assert 1 / ANCHOR_BAND < ratio < ANCHOR_BAND, f"predicted {tp['gpu_hours']:,.0f} vs published 2.664M"
    per_t = tp["gpu_hours_per_trillion_tokens"] / DEEPSEEK_V3_GPU_HOURS_PER_T
    assert 1 / ANCHOR_BAND < per_t < ANCHOR_BAND


@pytest.mark.parametrize("argv,msg", [
    (["--tokens", "14.8X"], r"--tokens '14.8X': not a token count"),
    (["--tokens", "15.6T", "--gpu-hour-price", "-2"], r"--gpu-hour-price -2.0: .*>= 0"),
    (["--tokens", "1T"], r"--tokens 1T: the run ends inside training.batch_ramp"),
    (["--gpu-hour-price", "2"], r"--gpu-hour-price needs --tokens"),
])
def test_cli_bad_input_exits_2(capsys, argv, msg):
    import re

    assert main(["estimate", str(LLAMA_405B_SPEC), *argv]) == 2
    err = capsys.readouterr().err
    assert re.search(msg, err) and "Traceback" not in err


def test_interpolated_ramp_matches_every_batch_estimate():
    from dstoolkit.generate.io import load_spec_and_shape
    from dstoolkit.generate.planner import resolve_spec

    spec, shape = load_spec_and_shape(LLAMA_405B_SPEC)
    spec.training.batch_ramp.increment = 256  # 1024, 1280, ..., 1792: four ramp batches
    plan = resolve_spec(spec, shape).plan
    exact = plan_training(plan, parse_token_count("15.6T"), ramp=spec.training.batch_ramp)
    interp = plan_training(plan, parse_token_count("15.6T"), ramp=spec.training.batch_ramp, max_estimates=3)
    assert [p.global_batch for p in exact.phases] == [1024, 1280, 1536, 1792, 2048]
    assert interp.ramp_step_times == "interpolated in grad_accum between 3 estimated batches"
    assert interp.steps == exact.steps
    assert interp.wall_s == pytest.approx(exact.wall_s, rel=0.01)


def test_sweep_and_generate_print_the_plan(capsys, tmp_path):
    assert main(["sweep", str(LLAMA_405B_SPEC), "--tokens", "15.6T", "--gpu-hour-price", "2", "--top", "1",
                 "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["ranked"]
    tp = row["training_plan"]
    assert tp["ramp_steps"] == -(-350_341_797 // 1024) and tp["cost"] == pytest.approx(2 * tp["gpu_hours"])
    out = tmp_path / "gen"
    assert main(["generate", str(LLAMA_405B_SPEC), "--out", str(out), "--tokens", "15.6T"]) == 0
    text = capsys.readouterr().out
    assert "to train: " in text and "GPU-hours" in text
    summary = (out / "zero1" / "summary.md").read_text()
    assert "## Time and cost to train" in summary and "15.6T tokens on 16384 GPUs" in summary
    assert main(["generate", str(LLAMA_405B_SPEC), "--out", str(tmp_path / "bad"), "--tokens", "1T"]) == 2
    assert not (tmp_path / "bad").exists()  # refused before anything is written

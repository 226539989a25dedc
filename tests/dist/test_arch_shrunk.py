"""Real 2-rank gloo runs of released architectures without a hand-written formula, each built by transformers from
its own config.json and shrunk by `dstoolkit.runtime.shrink` (trainer --shrink): Gemma-4 MoE (sliding/full
pattern), Qwen3-Next (linear attention + full attention, shared expert), Nemotron-H (Mamba/MoE/attention hybrid),
DeepSeek-R1 (MLA, grouped routing, dense-first layer) at ZeRO 0-3; GPT-OSS through `bench train` on a strategy
`dstoolkit generate` wrote for 8 H100s; Qwen3-MoE through `tune --mode real` (budget 1).

Each run: what ran is asserted exactly (class, parameter count of the shrunk build, shrunk sizes), the loss is
finite and falls. Run with -s for the figures. All runs use torch's AdamW (no DeepSpeed op to JIT-build)."""
from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.timeout(600)]

RELEASED = pathlib.Path(__file__).resolve().parents[1] / "golden" / "hf_configs" / "released"
STEPS = 6


def _spec(tmp: pathlib.Path, config: str, zero, *, micro="2", extra: str = "") -> pathlib.Path:
    path = tmp / "spec.yaml"
    path.write_text(f"name: {config.split('--')[-1].lower()}\n"
                    f"model: {{hf_config: {RELEASED / (config + '.json')}}}\n"
                    "cluster: {nodes: 1, gpus_per_node: 2, gpu: cpu}\n"
                    f"training: {{seq_len: 32, global_batch: 4, micro_batch: {micro}, precision: bf16, "
                    f"zero_stage: {zero}, lr: 0.003{extra}}}\n")
    return path


def _expected_params(config: str) -> tuple[int, dict]:
    from dstoolkit.runtime.hf_model import build_hf_model
    from dstoolkit.runtime.shrink import shrink_config

    s = shrink_config(json.loads((RELEASED / f"{config}.json").read_text()))
    return build_hf_model(s.config).info["params"], s.sizes()


def _losses(rows: list[dict]) -> list[float]:
    return [r["loss"] for r in rows if r.get("event") is None and "loss" in r]


ARCHS = [  # config, class transformers builds, ZeRO stage, shrunk sizes that must hold
    ("google--gemma-4-26B-A4B", "Gemma4ForCausalLM", 1, {"layers": 6, "experts": 16, "top_k": 8, "kv_heads": 2}),
    ("Qwen--Qwen3-Next-80B-A3B-Thinking", "Qwen3NextForCausalLM", 2, {"layers": 4, "experts": 20, "top_k": 10}),
    ("nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "NemotronHForCausalLM", 0, {"layers": 6, "experts": 12, "top_k": 6}),
    ("deepseek-ai--DeepSeek-R1", "DeepseekV3ForCausalLM", 3, {"layers": 2, "experts": 16, "top_k": 8}),
]


@pytest.mark.parametrize("config,cls,zero,sizes", ARCHS, ids=[a[0].split("--")[1] for a in ARCHS])
def test_trainer_trains_the_shrunk_architecture(tmp_path, config, cls, zero, sizes):
    from dstoolkit.runtime.bench.harness import free_port

    spec = _spec(tmp_path, config, zero)
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
                              "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
                              "zero_optimization": {"stage": zero}}))
    metrics = tmp_path / "metrics.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "-m", "dstoolkit.runtime.train.trainer", "--deepspeed_config", str(ds),
           "--spec", str(spec), "--steps", str(STEPS), "--metrics-out", str(metrics), "--shrink", "auto",
           "--no-progress", "--no-spike-guard", "--peak-flops", "1e11"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    wall = time.perf_counter() - t0
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    model = rows[0]
    params, shrunk = _expected_params(config)
    assert model["event"] == "model" and model["builder"] == "transformers" and model["model_class"] == cls
    assert model["params"] == params
    assert model["shrunk_sizes"] == shrunk and {k: shrunk[k] for k in sizes} == sizes
    assert model["seq_len"] == 32 and model["world_size"] == 2
    losses = _losses(rows)
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
    print(f"[{config}] {cls} ZeRO-{zero}: {params / 1e6:.2f}M params, {shrunk}, {STEPS} steps, loss "
          f"{losses[0]:.3f} -> {losses[-1]:.3f}, wall {wall:.1f} s")


def test_bench_train_runs_a_generated_strategy_shrunk(tmp_path):
    """`dstoolkit generate` for GPT-OSS-20B on 8 H100s, then its zero2 strategy through `bench train --shrink`
    on 2 CPU ranks: the batch is fitted to the ranks, the architecture is GPT-OSS's own."""
    from dstoolkit.runtime.bench.train import run_train

    gen_spec = tmp_path / "gen.yaml"
    gen_spec.write_text(f"name: gptoss-h100\nmodel: {{hf_config: {RELEASED / 'openai--gpt-oss-20b.json'}}}\n"
                        "cluster: {nodes: 1, gpus_per_node: 8, gpu: H100-SXM}\n"
                        "training: {seq_len: 4096, global_batch: 64, micro_batch: auto, precision: bf16, "
                        "zero_stage: auto, tp: auto, pp: auto, ep: auto, activation_checkpointing: auto}\n")
    out = tmp_path / "gen"
    t0 = time.perf_counter()
    g = subprocess.run([sys.executable, "-m", "dstoolkit", "generate", str(gen_spec), "--out", str(out),
                        "--strategy", "zero2", "--force"], capture_output=True, text=True, timeout=300)
    assert g.returncode == 0, g.stdout[-2000:] + g.stderr[-2000:]
    generated = json.loads((out / "zero2" / "ds_config.json").read_text())
    recs = run_train([str(out / "zero2")], spec=None, strategies=None, steps=4, skip_steps=1, world_size=2,
                     out=None, resume=False, timeout_s=300, calibration_path="auto", progress=False, shrink="auto")
    wall = time.perf_counter() - t0
    r = recs[0]
    assert r["status"] == "ok", r.get("error_tail")
    assert r["model_ran"]["model_class"] == "GptOssForCausalLM" and r["model_ran"]["builder"] == "transformers"
    assert r["shrink"]["shrunk_sizes"]["top_k"] == 4 and r["shrink"]["seq_len"] == 64
    assert r["ds_config"]["zero_optimization"] == generated["zero_optimization"]  # the strategy itself is kept
    assert r["ds_config"]["train_batch_size"] == 2 * r["ds_config"]["train_micro_batch_size_per_gpu"] * \
        r["ds_config"]["gradient_accumulation_steps"]
    m = r["measured"]
    assert math.isfinite(m["loss_last"]) and m["loss_last"] < m["loss_first"], m
    assert r["estimate"]["peak_flops_per_rank"] < 1e13  # estimated for this machine's CPU ranks, not an H100
    print(f"[bench train gpt-oss-20b zero2 (generated for 8xH100)] {r['model_ran']['model_class']} "
          f"{r['model_ran']['params'] / 1e6:.2f}M params, {r['shrink']['shrunk_sizes']}, config changes "
          f"{r['shrink']['config_changes']}, {m['steps']} steps, loss {m['loss_first']:.3f} -> {m['loss_last']:.3f}, "
          f"wall {wall:.1f} s (generate + bench)")


def test_tune_real_trains_the_shrunk_architecture(tmp_path):
    from dstoolkit.tune.options import TuneOptions
    from dstoolkit.tune.study import run_study

    spec = _spec(tmp_path, "Qwen--Qwen3-235B-A22B", 0, micro="auto", extra=", ep: auto")
    t0 = time.perf_counter()
    res = run_study(TuneOptions(spec_path=spec, out_dir=tmp_path / "tune", budget=1, mode="real", steps=4,
                                skip_steps=1, bucket_scales=(1.0,), progress=False, shrink="auto"))
    wall = time.perf_counter() - t0
    assert res.best is not None, res.trials
    trial = next(t for t in res.trials if t.get("status") == "ok")
    ran = trial["measured"]["model_ran"]
    params, shrunk = _expected_params("Qwen--Qwen3-235B-A22B")
    assert ran["model_class"] == "Qwen3MoeForCausalLM" and ran["params"] == params and ran["shrunk_sizes"] == shrunk
    report = (tmp_path / "tune" / "report.md").read_text()
    assert "ep fixed: --shrink" in report and "shrunk (--shrink" in report
    print(f"[tune real qwen3_moe] best {res.best['label']}: {res.best['value']:.0f} tok/s; {ran['model_class']} "
          f"{params / 1e6:.2f}M params {shrunk}; wall {wall:.1f} s")

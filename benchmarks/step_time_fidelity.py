#!/usr/bin/env python
"""Step-time fidelity: predict DeepSpeed step time on this machine, then run the configs and compare.

One 2-rank gloo launch (torchrun) does everything, in this order:

1. Calibration probes (dstoolkit.runtime.probe, small, and on shapes that are NOT the test configs):
   - compute: forward+backward of one transformer block of a probe shape, per precision -> effective FLOP/s;
   - memory: torch AdamW step on a flat fp32 tensor -> bytes/s of optimizer traffic;
   - gloo: all_reduce at two sizes on both ranks -> bus bandwidth (nccl-tests busbw) and per-call latency;
   - framework: a 1-block DeepSpeed engine step (tiny) -> fixed per-step and per-block overheads.
2. Predict with `dstoolkit.estimate.estimate_run` (its step-time model, fed the measured `Calibration`).
3. Run each config (>= 8, generated with `dstoolkit.generate.planner.ds_config_for` from the tiny CPU spec with
   varied stage / precision / micro batch / accumulation / recompute / offload / width, then pinned to what the
   committed readings ran: 2e6-element buckets, no gradient clipping, DeepSpeed's default stage-3 overlap and
   persistence threshold) for warm-up + timed steps and take the median.
4. Report MAPE and Spearman rank correlation, with os.getloadavg() before and after (other processes on the
   machine make CPU timing noisy: rerun when the machine is quiet).

Usage (about 3-6 minutes on 2 quiet cores):
    python benchmarks/step_time_fidelity.py            # writes benchmarks/results/step_time_fidelity_cpu_<yyyymm>.{json,md}
    python benchmarks/step_time_fidelity.py --quick    # 8 configs, fewer steps
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from dstoolkit.runtime.bench.harness import capture_env, free_port
from dstoolkit.runtime.bench.stats import spearman  # noqa: E402
from dstoolkit.runtime.bench.report import env_brief, render_markdown_table, write_json, write_report  # noqa: E402

MAPE_GOAL = 0.15
SPEARMAN_GOAL = 0.9

SHAPES = {
    "s256": dict(name="s256", model_type="llama", hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=4, intermediate_size=704, vocab_size=4096),
    "s384": dict(name="s384", model_type="llama", hidden_size=384, num_hidden_layers=4, num_attention_heads=6,
                 num_key_value_heads=2, intermediate_size=1024, vocab_size=4096),
    "s512": dict(name="s512", model_type="llama", hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
                 num_key_value_heads=4, intermediate_size=1376, vocab_size=8192),
}
SEQ = 128


def configs(quick: bool) -> list[dict]:
    rows = [
        dict(name="s256-z1-bf16-mb4", shape="s256", stage=1, prec="bf16", mb=4, ga=1),
        dict(name="s256-z2-fp32-mb4", shape="s256", stage=2, prec="fp32", mb=4, ga=1),
        dict(name="s384-z0-fp32-mb2", shape="s384", stage=0, prec="fp32", mb=2, ga=1),
        dict(name="s384-z2-bf16-mb4", shape="s384", stage=2, prec="bf16", mb=4, ga=1),
        dict(name="s384-z3-bf16-mb4", shape="s384", stage=3, prec="bf16", mb=4, ga=1),
        dict(name="s384-z1-bf16-mb2-ga2-ckpt", shape="s384", stage=1, prec="bf16", mb=2, ga=2, ckpt="full"),
        dict(name="s512-z2-bf16-mb4", shape="s512", stage=2, prec="bf16", mb=4, ga=1),
        dict(name="s512-z1-fp32-mb8-ckpt", shape="s512", stage=1, prec="fp32", mb=8, ga=1, ckpt="full"),
    ]
    if not quick:
        rows += [
            dict(name="s256-z2-bf16-offload-mb8", shape="s256", stage=2, prec="bf16", mb=8, ga=1, offload=True),
            dict(name="s512-z3-fp32-mb2-ga2", shape="s512", stage=3, prec="fp32", mb=2, ga=2),
        ]
    return rows


def _ds_config(c: dict) -> dict:
    from dstoolkit.generate.planner import Candidate, ds_config_for
    from dstoolkit.models.shape import ModelShape
    from dstoolkit.spec import Spec
    from dstoolkit.spec.checkpoint import CheckpointPolicy

    spec = Spec.model_validate({
        "name": "steptime", "model": {"preset": "tiny"},
        "cluster": {"nodes": 1, "gpus_per_node": 2, "gpu": "cpu"},
        "training": {"seq_len": SEQ, "global_batch": c["mb"] * c["ga"] * 2, "precision": c["prec"],
                     "optimizer": "adamw", "lr": 1e-3, "zero_stage": c["stage"], "offload": bool(c.get("offload")),
                     "tp": 1, "pp": 1, "ep": 1, "micro_batch": c["mb"]},
    })
    cand = Candidate(zero_stage=c["stage"], offload_optimizer=bool(c.get("offload")), micro_batch=c["mb"],
                     checkpoint=CheckpointPolicy(kind=c.get("ckpt", "none")))
    cfg = ds_config_for(spec, ModelShape(**SHAPES[c["shape"]]), cand)
    # pinned to the configs the committed readings ran (DeepSpeed's defaults where the generator differs)
    cfg["gradient_clipping"] = 0.0
    if c["stage"] == 3:
        cfg["zero_optimization"].update(overlap_comm=True, stage3_param_persistence_threshold=100_000)
    cfg["optimizer"]["params"]["torch_adam"] = not c.get("offload")
    cfg["zero_optimization"].update(reduce_bucket_size=2_000_000, allgather_bucket_size=2_000_000)
    if c["stage"] == 3:
        cfg["zero_optimization"]["stage3_prefetch_bucket_size"] = 2_000_000
    if c.get("offload"):
        cfg["zero_optimization"]["offload_optimizer"]["pin_memory"] = False
    cfg["steps_per_print"] = 10_000
    return cfg


# ------------------------------------------------------------------------------------------------ worker


CLOCKS = ("wall", "cpu")
"""wall: elapsed time (what a user sees on a quiet machine). cpu: this process's CPU time, which excludes the
time other processes on the machine take from it (robust when the machine is shared, as during development)."""


def _median_time(fn, reps: int, warmup: int = 1) -> dict:
    import torch.distributed as dist

    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(reps):
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"wall": statistics.median(wall), "cpu": statistics.median(cpu)}


def _engine_step_time(shape_kw: dict, cfg: dict, ckpt: str, steps: int, warmup: int, rank: int) -> dict:
    import deepspeed
    import torch

    from dstoolkit.models.shape import ModelShape
    from dstoolkit.runtime.model import build_model
    from dstoolkit.runtime.synthetic import synthetic_batch
    from dstoolkit.spec.checkpoint import CheckpointPolicy

    shape = ModelShape(**shape_kw)
    model = build_model(shape, checkpoint=CheckpointPolicy(kind=ckpt) if ckpt != "none" else None, seed=0)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=cfg)
    mb, ga = cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]
    batches = [synthetic_batch(shape, mb, SEQ, step=i, rank=rank) for i in range(ga)]

    def one_step():
        for ids, labels in batches:
            loss = engine(ids, labels)
            engine.backward(loss)
            engine.step()

    t = _median_time(one_step, reps=steps, warmup=warmup)
    del engine, model
    import gc

    gc.collect()
    return t


def run_worker(cfgs: list[dict], out_path: str, steps: int, warmup: int) -> None:
    import deepspeed
    import torch

    from dstoolkit.estimate import RunPlan, estimate_run
    from dstoolkit.hardware.calibration import calibration_from_raw
    from dstoolkit.models.shape import ModelShape
    from dstoolkit.spec.checkpoint import CheckpointPolicy
    from dstoolkit.hardware.table import get_gpu

    torch.set_num_threads(1)
    from dstoolkit.runtime.rankexit import install_exit_guard

    install_exit_guard()  # the groups released before the interpreter exits (dstoolkit/runtime/rankexit.py)
    deepspeed.init_distributed(dist_backend="gloo")
    from dstoolkit.runtime.train.shm import unlink_after_rendezvous

    unlink_after_rendezvous()  # DeepSpeed never removes its CPU all-reduce buffers from /dev/shm
    rank = torch.distributed.get_rank()
    load_before = os.getloadavg()
    t0 = time.time()
    # the calibration probes are the package's (dstoolkit.runtime.probe: the one machine probe, also behind the
    # estimator's per-machine cache), on shapes that are not the test configs
    from dstoolkit.runtime.probe import probe_calibration

    cal = probe_calibration(torch.distributed.get_world_size())
    probe_s = round(time.time() - t0, 1)
    records = []
    for c in cfgs:
        cfg = _ds_config(c)
        shape = ModelShape(**SHAPES[c["shape"]])
        policy = CheckpointPolicy(kind=c.get("ckpt", "none"))
        rec = dict(config=c, predicted_s={}, breakdown={})
        for k in CLOCKS:
            # the one reader of the calibration format (per clock, per precision), as estimates of gpu: cpu use it
            calib = calibration_from_raw({**cal, "_source": "this run's probe"}, c["prec"], clock=k)
            plan = RunPlan(shape=shape, ds_config=cfg, world_size=2, gpus_per_node=2, gpu=get_gpu("cpu"),
                           seq_len=SEQ, checkpoint=policy, precision=c["prec"], calibration=calib)
            est = estimate_run(plan)
            rec["predicted_s"][k] = est.step_time_s
            rec["breakdown"][k] = est.step_time.model_dump()
        try:
            rec["measured_s"] = _engine_step_time(SHAPES[c["shape"]], cfg, c.get("ckpt", "none"), steps, warmup, rank)
        except Exception as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"
        records.append(rec)
    result = dict(calibration=cal, records=records, loadavg_before=load_before, loadavg_after=os.getloadavg(),
                  worker_s=round(time.time() - t0, 1), probe_s=probe_s)
    if rank == 0:
        pathlib.Path(out_path).write_text(json.dumps(result))
    torch.distributed.barrier()


# ------------------------------------------------------------------------------------------------ driver


def render_md(res: dict) -> str:
    lines = [
        "# Step-time fidelity: dstoolkit.estimate vs real DeepSpeed steps (2 gloo ranks, CPU)",
        "",
        f"{env_brief(res['env'])}.",
        f"loadavg before {tuple(round(x, 2) for x in res['loadavg_before'])}, after {tuple(round(x, 2) for x in res['loadavg_after'])} "
        "(2 cores: values well above 2 mean other processes competed for the CPU, and wall-clock timings are noisy).",
        "",
        "Two clocks, each with its own calibration: **wall** (elapsed; what matters on a quiet machine) and **cpu** "
        "(the rank's process CPU time, which excludes time other processes take, so it stays meaningful on a shared machine).",
        "",
    ]
    for k in CLOCKS:
        m = res["metrics"][k]
        lines.append(f"- **{k}**: MAPE {m['mape']:.1%} (goal <= {MAPE_GOAL:.0%}), Spearman {m['spearman']:.3f} "
                     f"(goal >= {SPEARMAN_GOAL}), {m['n']} configs.")
    lines += ["", f"Whole run {res['wall_s']} s (probes {res.get('probe_s')} s).", ""]
    for k in CLOCKS:
        cal = res["calibration"][k]
        lines += [
            f"## {k} clock",
            "",
            "Calibration (probes on shapes that are not test configs): "
            f"block fwd+bwd per rank fp32 {cal['matmul_flops_per_s_fp32'] / 1e9:.2f} -> {cal['matmul_flops_per_s_fp32_large'] / 1e9:.2f} GFLOP/s, "
            f"bf16 {cal['matmul_flops_per_s_bf16'] / 1e9:.2f} -> {cal['matmul_flops_per_s_bf16_large'] / 1e9:.2f} GFLOP/s "
            f"(tokens x hidden {cal['matmul_work']:.0f} -> {cal['matmul_work_large']:.0f}), optimizer traffic "
            f"{cal['mem_bw_bytes_per_s'] / 1e9:.2f} GB/s, gloo all-reduce busbw {cal['comm_busbw_bytes_per_s'] / 1e9:.3f} GB/s + "
            f"{cal['comm_latency_s'] * 1e6:.0f} us/call, DeepSpeed step overhead {cal['step_overhead_s'] * 1e3:.1f} ms.",
            "",
        ]
        rows = []
        for r in res["rows"]:
            b = r["breakdown"][k]
            rows.append([r["config"]["name"], f"{r['predicted_s'][k]:.3f}", f"{r['measured_s'][k]:.3f}", f"{r['err'][k]:+.1%}",
                         f"{b['compute_s']:.3f}", f"{b['comm_exposed_s']:.3f}", f"{b['optimizer_s']:.3f}",
                         f"{b['memory_s']:.3f}", f"{b['overhead_s']:.3f}"])
        for r in res.get("failed", []):
            rows.append([r["config"]["name"], f"{r['predicted_s'][k]:.3f}", f"FAILED: {r['error'][:60]}"])
        lines += render_markdown_table(rows, ("config", "predicted s", "measured s", "error", "compute s", "comm s",
                                              "optimizer s", "memory-bound s", "overhead s"))
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cfgs-file", help=argparse.SUPPRESS)
    ap.add_argument("--result-file", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="8 configs and fewer timed steps")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per config (default 5, quick 3)")
    ap.add_argument("--out", help="output directory (default benchmarks/results)")
    ap.add_argument("--render-from", metavar="JSON", help="print the markdown of an existing result JSON and exit "
                    "(nothing is run or written)")
    args = ap.parse_args(argv)
    if args.render_from:
        sys.stdout.write(render_md(json.loads(pathlib.Path(args.render_from).read_text())))
        return 0
    steps = args.steps or (3 if args.quick else 5)
    if args.worker:
        run_worker(json.loads(pathlib.Path(args.cfgs_file).read_text()), args.result_file, steps, warmup=2)
        return 0
    out = pathlib.Path(args.out) if args.out else REPO / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    work = out / "_step_time_work"
    work.mkdir(exist_ok=True)
    cfg_path, res_path = work / "cfgs.json", work / "result.json"
    cfg_path.write_text(json.dumps(configs(args.quick)))
    if res_path.exists():
        res_path.unlink()
    t0 = time.time()
    from dstoolkit.common.cpu_env import cpu_rank_env

    env = cpu_rank_env(dict(os.environ, OMP_NUM_THREADS="1",
                            PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(pathlib.Path(__file__).resolve()), "--worker",
           "--cfgs-file", str(cfg_path), "--result-file", str(res_path), "--steps", str(steps)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600, cwd=str(REPO))
    if not res_path.exists():
        print(proc.stderr[-4000:], file=sys.stderr)
        return 1
    res = json.loads(res_path.read_text())
    rows = [r for r in res["records"] if "measured_s" in r]
    for r in rows:
        r["err"] = {k: (r["predicted_s"][k] - r["measured_s"][k]) / r["measured_s"][k] for k in CLOCKS}
    res["rows"] = rows
    res["failed"] = [r for r in res["records"] if "measured_s" not in r]
    res["metrics"] = {
        k: dict(n=len(rows),
                mape=statistics.mean(abs(r["err"][k]) for r in rows) if rows else float("nan"),
                spearman=spearman([r["predicted_s"][k] for r in rows], [r["measured_s"][k] for r in rows])
                if len(rows) > 2 else float("nan"))
        for k in CLOCKS
    }
    res["wall_s"] = round(time.time() - t0, 1)
    res["env"] = capture_env(2, "gloo", {"quick": args.quick, "steps": steps})
    stamp = _dt.datetime.utcnow().strftime("%Y%m")
    write_json(out / f"step_time_fidelity_cpu_{stamp}.json", res)
    write_report(out / f"step_time_fidelity_cpu_{stamp}.md", render_md(res))
    # the probes alone, for `Calibration(**...)` in other estimates on this machine
    cal = res["calibration"]
    write_json(out / f"calibration_cpu_{stamp}.json", dict(
        calibration=cal, loadavg_before=res["loadavg_before"], env=res["env"],
        note="per-rank rates measured with 2 ranks on 2 cores; matmul_flops_per_s_<precision> is a block "
             "forward+backward rate; comm_busbw is gloo all_reduce busbw (nccl-tests convention)"))
    cfg_path.unlink()
    res_path.unlink()
    work.rmdir()
    print(render_md(res))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    sys.exit(main())

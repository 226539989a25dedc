#!/usr/bin/env python
"""Inter-node bandwidth fidelity: a tbf-throttled link between two test hosts, measured vs predicted.

Needs root (network namespaces + tc). Everything runs on two test hosts (launch/testhosts.sh) joined by one
veth pair, 2 gloo ranks per host (the 2 nodes x 2 ranks layout), and is torn down at the end:

1. `dstoolkit bench comm` across the hosts, unthrottled and with the link throttled (tbf on each host's
   egress) to --rate: busbw against the throttle.
2. Calibration on one host with 4 ranks (the per-rank compute share of the multi-node runs): the probes of
   benchmarks/step_time_fidelity.py (block forward+backward FLOP/s, AdamW bytes/s, gloo busbw + latency,
   DeepSpeed per-step overhead). They run on shapes that are not the measured configs.
3. For each strategy (ZeRO-2, ZeRO-3 on the tiny dense model; ZeRO-2 + expert parallel ep=2 on tiny-moe),
   `dstoolkit generate` a 2-node spec and run the generated torchrun launch on both hosts under the throttle;
   median step time over the timed steps.
4. Predict with `dstoolkit.estimate.estimate_run` fed the calibration. `Calibration` carries one busbw, so
   the estimator times every collective at it; the prediction reported here re-times the collectives that
   cross nodes (estimate.comm.comm_plan marks them) at the throttled inter-node busbw, which is what the
   GpuSpec's intra/inter split does for uncalibrated plans. Both numbers are written.

Usage:
    sudo .venv/bin/python benchmarks/multinode_throttle.py [--rate 200mbit] [--steps 8] [--skip 3]
writes benchmarks/results/multinode_throttle_cpu_<yyyymm>.{json,md}.
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
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

STRATEGIES = [("tiny", "1", "zero2"), ("tiny", "1", "zero3"), ("tiny-moe", "2", "zero2-ep")]
"""(model preset, spec ep, generated strategy folder) measured across hosts."""
SEQ_LEN = 32
GLOBAL_BATCH = 8
MICRO_BATCH = "2"
"""Small batches keep compute per step below the throttled communication, so the link decides the step time."""


def probe_worker(out_path: str) -> None:
    """Runs under torchrun with 4 local ranks: step_time_fidelity's calibration probes."""
    import deepspeed
    import torch

    from step_time_fidelity import TINY_SHAPE, _engine_step_time, probe

    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    cal = probe(rank)
    tiny_cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
                "zero_optimization": {"stage": 2}, "steps_per_print": 10_000}
    cal["step_overhead_s"] = _engine_step_time(TINY_SHAPE, tiny_cfg, "none", steps=5, warmup=2, rank=rank)
    if rank == 0:
        pathlib.Path(out_path).write_text(json.dumps(cal))
    torch.distributed.barrier()


def calibrate(work: pathlib.Path) -> dict:
    from tests.dist.multinode import jobs

    out = work / "calibration.json"
    res = jobs.run_single_host(4, [str(pathlib.Path(__file__).resolve()), "--probe-worker", str(out)], work,
                               "calibration", 900)
    if not res.ok:
        raise RuntimeError(f"calibration failed:\n{res.tail()}")
    return json.loads(out.read_text())


def predict(spec_path: pathlib.Path, ds_config: dict, cal: dict, inter_busbw: float) -> dict:
    from dstoolkit.estimate import Calibration, estimate_run
    from dstoolkit.estimate.comm import comm_plan, op_time_s
    from dstoolkit.estimate.plan import plan_from_spec
    from dstoolkit.models import resolve_model
    from dstoolkit.schemas.spec import load_spec

    spec = load_spec(spec_path)
    shape = resolve_model(spec.model, spec.base_dir)
    prec = "bf16" if (ds_config.get("bf16") or {}).get("enabled") else "fp32"
    calib = Calibration(matmul_flops_per_s=cal[f"matmul_flops_per_s_{prec}"], mem_bw_bytes_per_s=cal["mem_bw_bytes_per_s"],
                        comm_busbw_bytes_per_s=cal["comm_busbw_bytes_per_s"], comm_latency_s=cal["comm_latency_s"],
                        step_overhead_s=cal["step_overhead_s"])
    plan = plan_from_spec(spec, ds_config, shape)
    plan = plan.model_copy(update={"calibration": calib})
    est = estimate_run(plan)
    cp = comm_plan(plan)
    intra = calib.comm_busbw_bytes_per_s
    split = sum(op_time_s(op, intra, inter_busbw, calib.comm_latency_s) for op in cp.ops)
    ops = [dict(name=o.name, collective=o.collective, bytes=o.bytes, group_size=o.group_size, cross_node=o.cross_node,
                calls=o.calls, time_split_s=op_time_s(o, intra, inter_busbw, calib.comm_latency_s)) for o in cp.ops]
    # Diagnostic: DeepSpeed 0.19.8 stage 1/2 reduces gradients with dist.all_reduce per bucket
    # (zero_optimization.use_multi_rank_bucket_allreduce defaults to true; stage_1_and_2.py average_tensor ->
    # allreduce_and_scatter), not a reduce-scatter: twice the bus bytes of what the estimator assumes.
    import dataclasses

    as_run = [dataclasses.replace(o, collective="all_reduce") if o.name.startswith("zero_reduce_scatter") else o
              for o in cp.ops]
    split_as_run = sum(op_time_s(op, intra, inter_busbw, calib.comm_latency_s) for op in as_run)
    # Diagnostic: groups that run side by side over one node's link share it. The data-parallel ring over all
    # ranks crosses each node boundary once per direction; the expert-data-parallel groups (stride tp*ep) are
    # ep separate groups, each with its own flow over the same link, so each gets link / ep.
    shared = 0.0
    for op in as_run:
        stride = plan.tp * plan.ep if op.name.endswith("_experts") else plan.tp
        nodes_spanned = max(1, -(-op.group_size * stride // plan.gpus_per_node))
        per_node = max(1, op.group_size // nodes_spanned)
        concurrent = max(1, plan.gpus_per_node // (per_node * plan.tp)) if op.cross_node else 1
        shared += op_time_s(op, intra, inter_busbw / concurrent, calib.comm_latency_s)
    bd = est.step_time.model_dump()
    return {
        "predicted_grad_all_reduce_shared_link_s": est.step_time_s - bd["comm_exposed_s"] + shared,
        "predicted_grad_all_reduce_s": est.step_time_s - bd["comm_exposed_s"] + split_as_run,
        "estimator_step_time_s": est.step_time_s,
        "estimator_breakdown_s": bd,
        "comm_split_s": split,
        "predicted_step_time_s": est.step_time_s - bd["comm_exposed_s"] + split,
        "cross_node_bytes": sum(o.bytes for o in cp.ops if o.cross_node),
        "comm_ops": ops,
        "ep": plan.ep, "dp": plan.dp, "world_size": plan.world_size, "gpus_per_node": plan.gpus_per_node,
    }


def run_strategy(hosts, work: pathlib.Path, preset: str, ep: str, strategy: str, steps: int) -> dict:
    from tests.dist.multinode import jobs, scenarios

    d = work / strategy
    d.mkdir(parents=True, exist_ok=True)
    spec = d / "spec.yaml"
    spec.write_text(scenarios.two_node_spec_text(name=f"mn_{preset}", preset=preset, ep=ep, zero_stage="auto",
                                                 global_batch=GLOBAL_BATCH, seq_len=SEQ_LEN, micro_batch=MICRO_BATCH))
    out = scenarios.generate(spec, d / "gen", [strategy])
    sdir = out / strategy
    metrics = d / "metrics.jsonl"
    argvs = scenarios.node_commands(hosts, sdir, "torchrun", metrics, steps, scenarios.trainer_extra())
    t0 = time.time()
    res = jobs.run_on_hosts(hosts, argvs, d, "train", 900)
    if not res.ok:
        raise RuntimeError(f"{strategy} failed:\n{res.tail()}")
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip().startswith("{")]
    steps_rows = [r for r in rows if "step_time_s" in r and "event" not in r]
    return {"strategy": strategy, "preset": preset, "spec": str(spec), "strategy_dir": str(sdir), "wall_s": time.time() - t0,
            "ds_config": json.loads((sdir / "ds_config.json").read_text()), "steps": steps_rows}


def repredict(path: pathlib.Path) -> dict:
    """Recompute the predictions of a result JSON (same calibration, specs and configs) without rerunning."""
    res = json.loads(path.read_text())
    for r in res["runs"]:
        spec = pathlib.Path(r["prediction_inputs"]["spec"])
        ds = r["prediction_inputs"]["ds_config"]
        _fill_predictions(r, spec, ds, res["calibration_4_ranks_one_host"], res["rate_bytes_per_s"],
                          res["inter_busbw_measured_bytes_per_s"], res["inter_busbw_unthrottled_bytes_per_s"])
    _ratios(res)
    return res


def _fill_predictions(r: dict, spec: pathlib.Path, ds: dict, cal: dict, nominal_bw: float, measured_bw: float,
                      free_bw: float) -> None:
    measured = r["measured_step_time_s"]
    pn = predict(spec, ds, cal, nominal_bw)
    pm = predict(spec, ds, cal, measured_bw)
    pf = predict(spec, ds, cal, free_bw)
    # The throttle's share of the step: measured throttled - unthrottled median, against the same difference
    # of the predictions (compute, optimizer and overheads cancel; only the cross-node collectives remain).
    dm = measured - r["unthrottled_step_time_s"]
    dp = pn["predicted_step_time_s"] - pf["predicted_step_time_s"]
    dp_ar = pn["predicted_grad_all_reduce_s"] - pf["predicted_grad_all_reduce_s"]
    dp_sh = pn["predicted_grad_all_reduce_shared_link_s"] - pf["predicted_grad_all_reduce_shared_link_s"]
    r.update({
        "throttle_delta_predicted_grad_all_reduce_shared_link_s": dp_sh,
        "throttle_delta_error_grad_all_reduce_shared_link": dp_sh / dm - 1 if dm > 0 else None,
        "predicted_grad_all_reduce_shared_link_s": pn["predicted_grad_all_reduce_shared_link_s"],
        "error_grad_all_reduce_shared_link": pn["predicted_grad_all_reduce_shared_link_s"] / measured - 1,
        "throttle_delta_measured_s": dm,
        "throttle_delta_predicted_s": dp,
        "throttle_delta_error": dp / dm - 1 if dm > 0 else None,
        "throttle_delta_predicted_grad_all_reduce_s": dp_ar,
        "throttle_delta_error_grad_all_reduce": dp_ar / dm - 1 if dm > 0 else None,
        "predicted_step_time_s": pn["predicted_step_time_s"],
        "error": pn["predicted_step_time_s"] / measured - 1,
        "predicted_with_measured_busbw_s": pm["predicted_step_time_s"],
        "error_with_measured_busbw": pm["predicted_step_time_s"] / measured - 1,
        "estimator_as_is_s": pn["estimator_step_time_s"],
        "error_estimator_as_is": pn["estimator_step_time_s"] / measured - 1,
        "predicted_grad_all_reduce_s": pn["predicted_grad_all_reduce_s"],
        "error_grad_all_reduce": pn["predicted_grad_all_reduce_s"] / measured - 1,
        "prediction": pn,
        "prediction_inputs": {"spec": str(spec), "ds_config": ds},
    })


def _ratios(result: dict) -> None:
    runs = result["runs"]
    z2 = next(x for x in runs if x["strategy"] == "zero2")
    z3 = next(x for x in runs if x["strategy"] == "zero3")
    result["zero3_over_zero2"] = {
        "measured_step_time": z3["measured_step_time_s"] / z2["measured_step_time_s"],
        "predicted_cross_node_bytes": z3["prediction"]["cross_node_bytes"] / z2["prediction"]["cross_node_bytes"],
        "predicted_step_time": z3["predicted_step_time_s"] / z2["predicted_step_time_s"],
        "predicted_step_time_grads_as_all_reduce": z3["predicted_grad_all_reduce_s"] / z2["predicted_grad_all_reduce_s"],
        "measured_link_share": z3["throttle_delta_measured_s"] / z2["throttle_delta_measured_s"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--probe-worker", help=argparse.SUPPRESS)
    ap.add_argument("--rate", default="200mbit", help="tbf rate of the inter-host link (default 200mbit)")
    ap.add_argument("--steps", type=int, default=8, help="training steps per strategy (default 8)")
    ap.add_argument("--skip", type=int, default=3, help="first steps not timed (default 3)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--repredict", metavar="RESULT.json", help="recompute predictions of a result file and rewrite it")
    args = ap.parse_args(argv)
    if args.probe_worker:
        probe_worker(args.probe_worker)
        return 0
    if args.repredict:
        res = repredict(pathlib.Path(args.repredict))
        pathlib.Path(args.repredict).write_text(json.dumps(res, indent=1, default=str))
        md = render_md(res)
        pathlib.Path(args.repredict).with_suffix(".md").write_text(md)
        print(md)
        return 0
    from tests.dist.multinode import scenarios
    from tests.dist.multinode.hosts import TestHosts, unavailable_reason

    why = unavailable_reason()
    if why:
        print(f"multinode_throttle: {why}", file=sys.stderr)
        return 2
    t_start = time.time()
    load_before = os.getloadavg()
    limit = scenarios.rate_bytes_per_s(args.rate)
    result: dict = {"rate": args.rate, "rate_bytes_per_s": limit, "layout": "2 hosts x 2 gloo ranks, veth + tbf",
                    "seq_len": SEQ_LEN, "global_batch": GLOBAL_BATCH, "micro_batch": MICRO_BATCH}
    hosts = TestHosts(2)
    work = pathlib.Path(tempfile.mkdtemp(prefix="dstk-mn-throttle-"))
    try:
        hosts.up()
        comm = {}
        comm["unthrottled"] = scenarios.bench_comm_across_hosts(hosts, work, "comm_free", ops="all_reduce,all_gather",
                                                                 sizes="16M")
        hosts.throttle(args.rate)
        comm["throttled"] = scenarios.bench_comm_across_hosts(hosts, work, "comm_tbf", ops="all_reduce,all_gather,broadcast",
                                                               sizes="4M,16M")
        result["comm"] = {k: [dict(op=r["op"], size=r["size"], time_us=r["time_us"], algbw_GBps=r["algbw"],
                                   busbw_GBps=r["busbw"], busbw_over_rate=r["busbw"] * 1e9 / limit, wrong=r["#wrong"],
                                   world_size=r["world_size"]) for r in rows] for k, rows in comm.items()}
        ar = [r for r in comm["throttled"] if r["op"] == "all_reduce"]
        inter_busbw = max(r["busbw"] for r in ar) * 1e9
        result["inter_busbw_measured_bytes_per_s"] = inter_busbw
        hosts.unthrottle()
        free_busbw = max(r["busbw"] for r in comm["unthrottled"] if r["op"] == "all_reduce") * 1e9
        result["inter_busbw_unthrottled_bytes_per_s"] = free_busbw
        cal = calibrate(work)
        result["calibration_4_ranks_one_host"] = cal
        runs = []
        for preset, ep, strategy in STRATEGIES:
            # Unthrottled first (same hosts, same launch): the difference isolates the link's share of the step.
            free = run_strategy(hosts, work / "free", preset, ep, strategy, args.steps)
            free_timed = [s["step_time_s"] for s in free["steps"] if s["step"] > args.skip]
            hosts.throttle(args.rate)
            try:
                r = run_strategy(hosts, work, preset, ep, strategy, args.steps)
            finally:
                hosts.unthrottle()
            timed = [s["step_time_s"] for s in r["steps"] if s["step"] > args.skip]
            run = {"strategy": strategy, "model": preset, "zero_stage": r["ds_config"]["zero_optimization"]["stage"],
                   "measured_step_time_s": statistics.median(timed), "measured_steps_s": timed,
                   "measured_spread_s": [min(timed), max(timed)], "final_loss": r["steps"][-1]["loss"],
                   "wall_s": r["wall_s"], "unthrottled_step_time_s": statistics.median(free_timed),
                   "unthrottled_steps_s": free_timed}
            _fill_predictions(run, pathlib.Path(r["spec"]), r["ds_config"], cal, limit, inter_busbw, free_busbw)
            runs.append(run)
        result["runs"] = runs
        _ratios(result)
    finally:
        hosts.down()
    result["loadavg_before"] = load_before
    result["loadavg_after"] = os.getloadavg()
    result["wall_s"] = round(time.time() - t_start, 1)
    from memory_fidelity import _env

    result["env"] = _env()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m")
    (out / f"multinode_throttle_cpu_{stamp}.json").write_text(json.dumps(result, indent=1, default=str))
    md = render_md(result)
    (out / f"multinode_throttle_cpu_{stamp}.md").write_text(md)
    print(md)
    return 0


def render_md(res: dict) -> str:
    mb = res["rate_bytes_per_s"] / 1e6
    lines = [f"# Across nodes: throttled link ({res['rate']} = {mb:.1f} MB/s per direction), CPU test hosts",
             "",
             f"{res['layout']}; load average before {res['loadavg_before'][0]:.1f}, after {res['loadavg_after'][0]:.1f}"
             " (2 shared cores: CPU timings are noisy).", "",
             "## `dstoolkit bench comm` across hosts", "",
             "| link | op | size | time (us) | busbw (GB/s) | busbw / throttle | #wrong |", "|---|---|---|---|---|---|---|"]
    for k, rows in res["comm"].items():
        for r in rows:
            lines.append(f"| {k} | {r['op']} | {r['size']} | {r['time_us']:.0f} | {r['busbw_GBps']:.4f} | "
                         f"{r['busbw_over_rate']:.2f} | {r['wrong']} |")
    lines += ["", "## Step time under the throttle: predicted vs measured", "",
              "Predicted = `estimate_run` with a 4-rank calibration, cross-node collectives timed at the throttle "
              "rate (nominal) or at the measured cross-host all-reduce busbw; 'as is' = the estimator with its single "
              "calibrated busbw for every collective. Diagnostics (nominal bw): 'grads as all-reduce' times ZeRO-1/2 "
              "gradient reduction as DeepSpeed 0.19.8 runs it (dist.all_reduce per bucket, "
              "use_multi_rank_bucket_allreduce=true) instead of a reduce-scatter; '+ shared link' also divides the "
              "link among groups that cross it side by side (the ep expert-data-parallel groups).", "",
              "| strategy | ZeRO | measured median (s) | spread (s) | predicted, nominal bw (s) | error | "
              "predicted, measured bw (s) | error | estimator as is (s) | error | grads as all-reduce (s) | error | "
              "+ shared link (s) | error |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res.get("runs", []):
        lines.append(f"| {r['strategy']} | {r['zero_stage']} | {r['measured_step_time_s']:.3f} | "
                     f"{r['measured_spread_s'][0]:.3f}-{r['measured_spread_s'][1]:.3f} | {r['predicted_step_time_s']:.3f} | "
                     f"{100 * r['error']:+.0f}% | {r['predicted_with_measured_busbw_s']:.3f} | "
                     f"{100 * r['error_with_measured_busbw']:+.0f}% | {r['estimator_as_is_s']:.3f} | "
                     f"{100 * r['error_estimator_as_is']:+.0f}% | {r['predicted_grad_all_reduce_s']:.3f} | "
                     f"{100 * r['error_grad_all_reduce']:+.0f}% | {r['predicted_grad_all_reduce_shared_link_s']:.3f} | "
                     f"{100 * r['error_grad_all_reduce_shared_link']:+.0f}% |")
    lines += ["", "### The link's share: throttled minus unthrottled step time", "",
              "Compute, optimizer and framework overheads cancel in the difference; what remains is the time the "
              "cross-node collectives take at the throttled rate instead of the unthrottled one.", "",
              "| strategy | unthrottled median (s) | throttled median (s) | measured difference (s) | "
              "predicted difference (s) | error | grads as all-reduce (s) | error | + shared link (s) | error |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res.get("runs", []):
        e1 = "-" if r["throttle_delta_error"] is None else f"{100 * r['throttle_delta_error']:+.0f}%"
        e2 = "-" if r["throttle_delta_error_grad_all_reduce"] is None else \
            f"{100 * r['throttle_delta_error_grad_all_reduce']:+.0f}%"
        lines.append(f"| {r['strategy']} | {r['unthrottled_step_time_s']:.3f} | {r['measured_step_time_s']:.3f} | "
                     f"{r['throttle_delta_measured_s']:.3f} | {r['throttle_delta_predicted_s']:.3f} | {e1} | "
                     f"{r['throttle_delta_predicted_grad_all_reduce_s']:.3f} | {e2} | "
                     f"{r['throttle_delta_predicted_grad_all_reduce_shared_link_s']:.3f} | "
                     f"{100 * r['throttle_delta_error_grad_all_reduce_shared_link']:+.0f}% |")
    if "zero3_over_zero2" in res:
        z = res["zero3_over_zero2"]
        lines += ["", f"ZeRO-3 / ZeRO-2: measured step time x{z['measured_step_time']:.2f}, predicted x"
                      f"{z['predicted_step_time']:.2f} (x{z['predicted_step_time_grads_as_all_reduce']:.2f} with the "
                      f"gradients all-reduced as DeepSpeed does); the link's share (throttled - unthrottled) "
                      f"x{z['measured_link_share']:.2f}. Estimator cross-node bytes x{z['predicted_cross_node_bytes']:.2f} "
                      "(ZeRO paper: 3Ψ vs 2Ψ = 1.5); DeepSpeed 0.19.8's stage 2 all-reduces gradients (2Ψ) and "
                      "all-gathers parameters (Ψ), as many bytes as stage 3."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

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
4. Predict with `dstoolkit.estimate.estimate_run` fed the calibration plus the measured cross-host busbw as
   `Calibration.inter_node_busbw_bytes_per_s` ("estimator as is"). For comparison it also writes the model
   before issue #9's fixes (one busbw for every collective, ZeRO-1/2 gradients reduce-scattered as in the
   ZeRO paper) and the first run's prediction (paper-view collectives, cross-node ones at the tbf rate).
   `--repredict RESULT.json` recomputes the predictions of a result file without rerunning.

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
    from dstoolkit.runtime.rankexit import install_exit_guard

    install_exit_guard()  # the groups released before the interpreter exits (dstoolkit/runtime/rankexit.py)
    deepspeed.init_distributed(dist_backend="gloo")
    from dstoolkit.runtime.train.shm import unlink_after_rendezvous

    unlink_after_rendezvous()  # DeepSpeed never removes its CPU all-reduce buffers from /dev/shm
    rank = torch.distributed.get_rank()
    # step_time_fidelity.probe returns one dict per clock; the step times here are wall-clock medians
    cal = probe(rank)["wall"]
    tiny_cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
                "zero_optimization": {"stage": 2}, "steps_per_print": 10_000}
    cal["step_overhead_s"] = _engine_step_time(TINY_SHAPE, tiny_cfg, "none", steps=5, warmup=2, rank=rank)["wall"]
    if rank == 0:
        pathlib.Path(out_path).write_text(json.dumps(cal))
    torch.distributed.barrier()


def calibrate(work: pathlib.Path) -> dict:
    from dstoolkit.runtime.testhosts import jobs

    out = work / "calibration.json"
    res = jobs.run_single_host(4, [str(pathlib.Path(__file__).resolve()), "--probe-worker", str(out)], work,
                               "calibration", 900)
    if not res.ok:
        raise RuntimeError(f"calibration failed:\n{res.tail()}")
    return json.loads(out.read_text())


def predict(spec_path: pathlib.Path, ds_config: dict, cal: dict, inter_busbw: float) -> dict:
    """Step time of one strategy predicted several ways (`inter_busbw`: the cross-node busbw to assume).

    - estimator_step_time_s ("as is"): `estimate_run` with the 4-rank calibration plus
      `Calibration.inter_node_busbw_bytes_per_s = inter_busbw`: ZeRO-1/2 gradients all-reduced as DeepSpeed
      0.19.8 does, cross-node groups at the inter-node rate, side-by-side groups sharing the one link.
    - old_estimator_single_busbw_s: the estimator before that change (one calibrated busbw for every
      collective, ZeRO-1/2 gradients reduce-scattered as in the ZeRO paper); the "estimator as is" column of
      the first run of this benchmark.
    - predicted_step_time_s: the first run's "predicted" column: paper-view collectives, cross-node ones at
      inter_busbw, no link sharing.
    """
    from dstoolkit.estimate import Calibration, estimate_run
    from dstoolkit.estimate.collective_time import op_time_s
    from dstoolkit.estimate.comm import comm_plan
    from dstoolkit.runplan import plan_from_spec
    from dstoolkit.models import resolve_model
    from dstoolkit.spec import load_spec

    spec = load_spec(spec_path)
    shape = resolve_model(spec.model, spec.base_dir)
    prec = "bf16" if (ds_config.get("bf16") or {}).get("enabled") else "fp32"
    large = {}
    if f"matmul_flops_per_s_{prec}_large" in cal:  # two-size probe (step_time_fidelity since a74794e)
        large = dict(matmul_work=cal["matmul_work"], matmul_flops_per_s_large=cal[f"matmul_flops_per_s_{prec}_large"],
                     matmul_work_large=cal["matmul_work_large"])
    base = dict(matmul_flops_per_s=cal[f"matmul_flops_per_s_{prec}"], **large, mem_bw_bytes_per_s=cal["mem_bw_bytes_per_s"],
                comm_busbw_bytes_per_s=cal["comm_busbw_bytes_per_s"], comm_latency_s=cal["comm_latency_s"],
                step_overhead_s=cal["step_overhead_s"])
    # the test hosts have one veth uplink each: inter_node_links_per_node = 1
    calib = Calibration(**base, inter_node_busbw_bytes_per_s=inter_busbw, inter_node_links_per_node=1)
    plan = plan_from_spec(spec, ds_config, shape, calibration=calib)
    est = estimate_run(plan)
    cp = comm_plan(plan)
    intra, lat = calib.comm_busbw_bytes_per_s, calib.comm_latency_s
    bd = est.step_time.model_dump()
    non_comm = est.step_time_s - bd["comm_exposed_s"]  # calibrated CPU ranks: eta = 0, all comm exposed
    paper = comm_plan(plan, view="paper")
    old_single = sum(op_time_s(op, intra, intra, lat) for op in paper.ops)
    paper_split = sum(op_time_s(op, intra, inter_busbw, lat) for op in paper.ops)
    ops = [dict(name=o.name, collective=o.collective, bytes=o.bytes, group_size=o.group_size, cross_node=o.cross_node,
                concurrent_groups=o.concurrent_groups, calls=o.calls,
                time_s=op_time_s(o, intra, inter_busbw, lat, lat, calib.inter_node_links_per_node)) for o in cp.ops]
    return {
        "estimator_step_time_s": est.step_time_s,
        "estimator_breakdown_s": bd,
        "old_estimator_single_busbw_s": non_comm + old_single,
        "predicted_step_time_s": non_comm + paper_split,
        "cross_node_bytes": sum(o.bytes for o in cp.ops if o.cross_node),
        "cross_node_bus_bytes": sum(o["bytes"] * _factor(o) for o in ops if o["cross_node"]),
        "cross_node_bus_bytes_paper": sum(o.bytes * _factor(dict(collective=o.collective, group_size=o.group_size))
                                          for o in paper.ops if o.cross_node),
        "comm_ops": ops,
        "ep": plan.ep, "dp": plan.dp, "world_size": plan.world_size, "gpus_per_node": plan.gpus_per_node,
    }


def _factor(op: dict) -> float:
    from dstoolkit.estimate.collective_time import busbw_factor

    return busbw_factor(op["collective"], op["group_size"])


def run_strategy(hosts, work: pathlib.Path, preset: str, ep: str, strategy: str, steps: int) -> dict:
    from dstoolkit.runtime.testhosts import jobs, scenarios

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


def _spec_path(r: dict, work: pathlib.Path) -> pathlib.Path:
    """The run's spec; rebuilt from the same template when the run's temporary folder is gone."""
    spec = pathlib.Path(r["prediction_inputs"]["spec"])
    if spec.exists():
        return spec
    from dstoolkit.runtime.testhosts import scenarios

    ep = next(e for p, e, st in STRATEGIES if st == r["strategy"])
    spec = work / r["strategy"] / "spec.yaml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(scenarios.two_node_spec_text(name=f"mn_{r['model']}", preset=r["model"], ep=ep, zero_stage="auto",
                                                 global_batch=GLOBAL_BATCH, seq_len=SEQ_LEN, micro_batch=MICRO_BATCH))
    return spec


def repredict(path: pathlib.Path) -> dict:
    """Recompute the predictions of a result JSON (same calibration, specs and configs) without rerunning."""
    res = json.loads(path.read_text())
    work = pathlib.Path(tempfile.mkdtemp(prefix="dstk-mn-repredict-"))
    for r in res["runs"]:
        spec = _spec_path(r, work)
        ds = r["prediction_inputs"]["ds_config"]
        _fill_predictions(r, spec, ds, res["calibration_4_ranks_one_host"], res["rate_bytes_per_s"],
                          res["inter_busbw_measured_bytes_per_s"], res["inter_busbw_unthrottled_bytes_per_s"])
        r["prediction_inputs"]["spec"] = str(r["prediction_inputs"].get("spec"))
    _ratios(res)
    return res


def _fill_predictions(r: dict, spec: pathlib.Path, ds: dict, cal: dict, nominal_bw: float, measured_bw: float,
                      free_bw: float) -> None:
    measured = r["measured_step_time_s"]
    pn = predict(spec, ds, cal, nominal_bw)  # cross-node busbw = the tbf rate
    pm = predict(spec, ds, cal, measured_bw)  # = the measured throttled cross-host all-reduce busbw
    pf = predict(spec, ds, cal, free_bw)  # = the measured unthrottled cross-host busbw

    def err(x, ref):
        return x / ref - 1 if ref > 0 else None

    # The throttle's share of the step: measured throttled - unthrottled median, against the same difference
    # of the predictions (compute, optimizer and overheads cancel; only the cross-node collectives remain).
    dm = measured - r["unthrottled_step_time_s"]
    d_new = pm["estimator_step_time_s"] - pf["estimator_step_time_s"]
    d_old = pn["predicted_step_time_s"] - pf["predicted_step_time_s"]
    for k in [k for k in r if k.startswith(("predicted_", "error", "throttle_delta_", "estimator_"))]:
        del r[k]  # drop keys of the first run's diagnostics (now part of the estimator)
    r.update({
        "estimator_as_is_s": pm["estimator_step_time_s"],
        "error_estimator_as_is": err(pm["estimator_step_time_s"], measured),
        "estimator_as_is_nominal_bw_s": pn["estimator_step_time_s"],
        "error_estimator_as_is_nominal_bw": err(pn["estimator_step_time_s"], measured),
        "old_estimator_single_busbw_s": pn["old_estimator_single_busbw_s"],
        "error_old_estimator_single_busbw": err(pn["old_estimator_single_busbw_s"], measured),
        "predicted_paper_split_bw_s": pn["predicted_step_time_s"],
        "error_paper_split_bw": err(pn["predicted_step_time_s"], measured),
        "throttle_delta_measured_s": dm,
        "throttle_delta_estimator_s": d_new,
        "throttle_delta_error_estimator": err(d_new, dm),
        "throttle_delta_paper_split_bw_s": d_old,
        "throttle_delta_error_paper_split_bw": err(d_old, dm),
        "prediction": pm,
        "prediction_nominal_bw": pn,
        "prediction_inputs": {"spec": str(spec), "ds_config": ds},
    })


def _ratios(result: dict) -> None:
    runs = result["runs"]
    z2 = next(x for x in runs if x["strategy"] == "zero2")
    z3 = next(x for x in runs if x["strategy"] == "zero3")
    result["zero3_over_zero2"] = {
        "measured_step_time": z3["measured_step_time_s"] / z2["measured_step_time_s"],
        "measured_link_share": z3["throttle_delta_measured_s"] / z2["throttle_delta_measured_s"],
        "estimator_step_time": z3["estimator_as_is_s"] / z2["estimator_as_is_s"],
        "estimator_link_share": z3["throttle_delta_estimator_s"] / z2["throttle_delta_estimator_s"],
        "estimator_cross_node_bus_bytes": z3["prediction"]["cross_node_bus_bytes"] / z2["prediction"]["cross_node_bus_bytes"],
        "paper_cross_node_bus_bytes": z3["prediction"]["cross_node_bus_bytes_paper"]
        / z2["prediction"]["cross_node_bus_bytes_paper"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--probe-worker", help=argparse.SUPPRESS)
    ap.add_argument("--rate", default="200mbit", help="tbf rate of the inter-host link (default 200mbit)")
    ap.add_argument("--steps", type=int, default=8, help="training steps per strategy (default 8)")
    ap.add_argument("--skip", type=int, default=3, help="first steps not timed (default 3)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--repredict", metavar="RESULT.json", help="recompute predictions of a result file and rewrite it")
    ap.add_argument("--render-from", metavar="JSON", help="print the markdown of an existing result JSON and exit "
                    "(nothing is run or written; no root needed)")
    args = ap.parse_args(argv)
    if args.render_from:
        sys.stdout.write(render_md(json.loads(pathlib.Path(args.render_from).read_text())))
        return 0
    from dstoolkit.runtime.bench.harness import capture_env
    from dstoolkit.runtime.bench.report import write_json, write_report

    if args.probe_worker:
        probe_worker(args.probe_worker)
        return 0
    if args.repredict:
        res = repredict(pathlib.Path(args.repredict))
        write_json(args.repredict, res)
        md = render_md(res)
        write_report(pathlib.Path(args.repredict).with_suffix(".md"), md)
        print(md)
        return 0
    from dstoolkit.runtime.testhosts import scenarios
    from dstoolkit.runtime.testhosts.hosts import TestHosts, unavailable_reason

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
            run["prediction_inputs"] = {"spec": r["spec"], "ds_config": r["ds_config"]}
            runs.append(run)
            # keep the measurements even if a prediction fails later (--repredict recomputes them)
            write_json(work / "raw_result.json", dict(result, runs=runs))
        result["runs"] = runs
    finally:
        hosts.down()
    for run in result["runs"]:
        _fill_predictions(run, pathlib.Path(run["prediction_inputs"]["spec"]), run["prediction_inputs"]["ds_config"],
                          result["calibration_4_ranks_one_host"], limit, result["inter_busbw_measured_bytes_per_s"],
                          result["inter_busbw_unthrottled_bytes_per_s"])
    _ratios(result)
    result["loadavg_before"] = load_before
    result["loadavg_after"] = os.getloadavg()
    result["wall_s"] = round(time.time() - t_start, 1)
    result["env"] = capture_env(4, "gloo", {"rate": args.rate, "steps": args.steps, "skip": args.skip})
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m")
    write_json(out / f"multinode_throttle_cpu_{stamp}.json", result)
    md = render_md(result)
    write_report(out / f"multinode_throttle_cpu_{stamp}.md", md)
    print(md)
    return 0


def render_md(res: dict) -> str:
    from dstoolkit.runtime.bench.report import render_markdown_table

    mb = res["rate_bytes_per_s"] / 1e6
    lines = [f"# Across nodes: throttled link ({res['rate']} = {mb:.1f} MB/s per direction), CPU test hosts",
             "",
             f"{res['layout']}; load average before {res['loadavg_before'][0]:.1f}, after {res['loadavg_after'][0]:.1f}"
             " (2 shared cores: CPU timings are noisy).", "",
             "## `dstoolkit bench comm` across hosts", ""]
    lines += render_markdown_table(
        ([k, r["op"], r["size"], f"{r['time_us']:.0f}", f"{r['busbw_GBps']:.4f}", f"{r['busbw_over_rate']:.2f}", r["wrong"]]
         for k, rows in res["comm"].items() for r in rows),
        ("link", "op", "size", "time (us)", "busbw (GB/s)", "busbw / throttle", "#wrong"))
    lines += ["", "## Step time under the throttle: predicted vs measured", "",
              "'Estimator as is' = `estimate_run` fed the 4-rank one-host calibration plus "
              "`Calibration.inter_node_busbw_bytes_per_s` = the measured throttled cross-host all-reduce busbw "
              "(or the tbf rate: 'nominal'): ZeRO-1/2 gradients all-reduced per bucket as DeepSpeed 0.19.8 does "
              "(`zero_grad_all_reduce`), groups spanning the hosts at the inter-node rate, and the ep=2 "
              "expert-data-parallel groups sharing the one link (each gets half). 'Old estimator' = the model "
              "before that change (one calibrated busbw for every collective, gradients reduce-scattered as in "
              "the ZeRO paper; the first run's 'estimator as is' column, which predates the step-time model's memory-bound term, "
              "0.05-0.08 s here). 'Paper grads, link rate' = the first "
              "run's 'predicted, nominal bw' column (paper-view collectives, cross-node ones at the tbf rate, no "
              "link sharing).", ""]

    def pct(x):
        return "-" if x is None else f"{100 * x:+.0f}%"

    lines += render_markdown_table(
        ([r["strategy"], r["zero_stage"], f"{r['measured_step_time_s']:.3f}",
          f"{r['measured_spread_s'][0]:.3f}-{r['measured_spread_s'][1]:.3f}", f"{r['estimator_as_is_s']:.3f}",
          pct(r["error_estimator_as_is"]), f"{r['estimator_as_is_nominal_bw_s']:.3f}",
          pct(r["error_estimator_as_is_nominal_bw"]), f"{r['old_estimator_single_busbw_s']:.3f}",
          pct(r["error_old_estimator_single_busbw"]), f"{r['predicted_paper_split_bw_s']:.3f}",
          pct(r["error_paper_split_bw"])] for r in res.get("runs", [])),
        ("strategy", "ZeRO", "measured median (s)", "spread (s)", "estimator as is (s)", "error",
         "as is, nominal bw (s)", "error", "old estimator (s)", "error", "paper grads, link rate (s)", "error"))
    lines += ["", "### The link's share: throttled minus unthrottled step time", "",
              "Compute, optimizer and framework overheads cancel in the difference; what remains is the time the "
              "cross-node collectives take at the throttled rate instead of the unthrottled one (estimator: "
              "measured throttled busbw minus measured unthrottled busbw; paper: tbf rate minus unthrottled).", ""]
    lines += render_markdown_table(
        ([r["strategy"], f"{r['unthrottled_step_time_s']:.3f}", f"{r['measured_step_time_s']:.3f}",
          f"{r['throttle_delta_measured_s']:.3f}", f"{r['throttle_delta_estimator_s']:.3f}",
          pct(r["throttle_delta_error_estimator"]), f"{r['throttle_delta_paper_split_bw_s']:.3f}",
          pct(r["throttle_delta_error_paper_split_bw"])] for r in res.get("runs", [])),
        ("strategy", "unthrottled median (s)", "throttled median (s)", "measured difference (s)",
         "estimator as is (s)", "error", "paper grads, link rate (s)", "error"))
    if any(r["throttle_delta_measured_s"] <= 0 for r in res.get("runs", [])):
        lines += ["", "A measured difference <= 0 means the unthrottled run (CPU-bound: compute and gloo on the shared "
                      "cores) was slowed by other load on the machine more than the throttle slowed the other run; "
                      "that row's link share is not a measurement. Unthrottled step-time spreads: " + "; ".join(
                          f"{r['strategy']} {min(r['unthrottled_steps_s']):.3f}-{max(r['unthrottled_steps_s']):.3f} s"
                          for r in res["runs"]) + "."]
    if "zero3_over_zero2" in res:
        z = res["zero3_over_zero2"]
        lines += ["", f"ZeRO-3 / ZeRO-2: measured step time x{z['measured_step_time']:.2f}, estimator "
                      f"x{z['estimator_step_time']:.2f}; the link's share (throttled - unthrottled) measured "
                      f"x{z['measured_link_share']:.2f}, estimator x{z['estimator_link_share']:.2f}. Cross-node bus "
                      f"bytes x{z['estimator_cross_node_bus_bytes']:.2f} as DeepSpeed 0.19.8 runs them (stage 2 "
                      "all-reduces gradients, 2Ψ, and all-gathers parameters, Ψ: as many as stage 3), against "
                      f"x{z['paper_cross_node_bus_bytes']:.2f} in the ZeRO paper's accounting (3Ψ vs 2Ψ)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

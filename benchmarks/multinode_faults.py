#!/usr/bin/env python
"""Faults across two test hosts: time to detect a cut link / a lost host, and the resume comparison.

Needs root (network namespaces). The same scenarios as tests/dist/test_multinode_faults.py, recorded:
the generated 2 nodes x 2 ranks ZeRO-2 torchrun launch (example trainer, --save-every 2) runs uninterrupted
once; then (a) host 1's link is taken down mid-run, (b) every process on host 1 is SIGKILLed mid-run; each time
the seconds until every launcher has exited are measured, the link/host restored, the same launch relaunched
with --resume, and the final trajectory compared with the uninterrupted one.

Usage:
    sudo .venv/bin/python benchmarks/multinode_faults.py [--steps 8] [--pg-timeout-s 10]
writes benchmarks/results/multinode_faults_cpu_<yyyymm>.{json,md}.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import pathlib
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--save-every", type=int, default=2)
    ap.add_argument("--pg-timeout-s", type=int, default=10)
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--render-from", metavar="JSON", help="print the markdown of an existing result JSON and exit "
                    "(nothing is run or written; no root needed)")
    args = ap.parse_args(argv)
    if args.render_from:
        sys.stdout.write(render_md(json.loads(pathlib.Path(args.render_from).read_text())))
        return 0
    from dstoolkit.runtime.bench.harness import capture_env
    from dstoolkit.runtime.bench.report import write_json, write_report
    from dstoolkit.runtime.testhosts import jobs, scenarios
    from dstoolkit.runtime.testhosts.hosts import TestHosts, reap_stale, unavailable_reason

    why = unavailable_reason()
    if why:
        print(f"multinode_faults: {why}", file=sys.stderr)
        return 2
    reap_stale()
    scenarios.PG_TIMEOUT_S = args.pg_timeout_s
    t_start = time.time()
    load_before = os.getloadavg()
    work = pathlib.Path(tempfile.mkdtemp(prefix="dstk-mn-faults-"))
    spec = work / "two_node_cpu.yaml"
    spec.write_text(scenarios.two_node_spec_text())
    sdir = scenarios.generate(spec, work / "out", ["zero2"]) / "zero2"
    hosts = TestHosts(2)

    def commands(launch_env):
        def commands_for(metrics, ckpt, resume, slow):
            extra = ["--data-delay-s", "0.4"] if slow else []
            return scenarios.node_commands(hosts, sdir, "torchrun", metrics, args.steps,
                                           scenarios.trainer_extra(ckpt, args.save_every, resume, extra), env=launch_env)
        return commands_for

    result: dict = {"layout": "2 hosts x 2 gloo ranks (veth), generated zero2 torchrun launch, example trainer",
                    "steps": args.steps, "save_every": args.save_every, "pg_timeout_s": args.pg_timeout_s}
    try:
        hosts.up()
        ref_metrics = work / "ref.jsonl"
        t0 = time.time()
        res = jobs.run_on_hosts(hosts, commands({})(ref_metrics, work / "ref.ckpt", False, False), work, "ref", 900)
        if not res.ok:
            raise RuntimeError(res.tail())
        ref = jobs.read_losses(ref_metrics)
        result["reference"] = {"losses": ref, "wall_s": round(time.time() - t0, 1)}
        runs = []
        for fault, env in (("cut", {"DIST_TIMEOUT_S": str(args.pg_timeout_s)}), ("lost", {})):
            d = work / fault
            d.mkdir()
            fig = scenarios.fault_and_resume(hosts, d, fault, commands(env), ref)
            fig["resumed_losses"] = jobs.read_losses(d / f"{fault}.metrics.jsonl")
            runs.append(fig)
            print(json.dumps({k: v for k, v in fig.items() if k != "resumed_losses"}), flush=True)
        result["faults"] = runs
    finally:
        hosts.down()
    result["loadavg_before"] = load_before
    result["loadavg_after"] = os.getloadavg()
    result["wall_s"] = round(time.time() - t_start, 1)
    result["env"] = capture_env(4, "gloo", {k: result[k] for k in ("layout", "steps", "save_every", "pg_timeout_s")})
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m")
    write_json(out / f"multinode_faults_cpu_{stamp}.json", result)
    md = render_md(result)
    write_report(out / f"multinode_faults_cpu_{stamp}.md", md)
    print(md)
    return 0


def render_md(res: dict) -> str:
    from dstoolkit.runtime.bench.report import render_markdown_table

    lines = [f"# Across nodes: faults and resume ({res['layout']})", "",
             f"{res['steps']} steps, checkpoint every {res['save_every']}; process-group timeout "
             f"{res['pg_timeout_s']} s on every group (cut-link run); load average before "
             f"{res['loadavg_before'][0]:.1f}, after {res['loadavg_after'][0]:.1f}.", ""]
    lines += render_markdown_table(
        ([f["fault"], f["steps_logged_before_fault"], f["seconds_fault_to_all_exited"], f["fault_returncodes"],
          f["resumed_from_step"], f"{f['steps_compared']}/{f['steps_expected']}", f["max_abs_loss_diff"],
          f["bitwise_equal"]] for f in res.get("faults", [])),
        ("fault", "steps logged at fault", "all launchers exited after (s)", "exit codes (host 0, host 1)",
         "resumed from step", "steps compared", "max abs loss diff", "bitwise equal"))
    lines += ["", "cut: `ip link set tb0 down` inside host 1 (both launchers are left to notice by themselves); "
              "lost: SIGKILL of every process on host 1 (its launcher dies at once, exit -9; the time is host 0's "
              "launcher noticing). Resume: the same generated launch with `--resume` on both hosts; the steps after "
              "the last checkpoint are trained again and match the uninterrupted run."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())

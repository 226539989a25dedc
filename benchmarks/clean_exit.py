"""Clean exits (issue 25): many short real 2-rank jobs of each kind that aborted at interpreter exit after a
finished run (``terminate called without an active exception``, SIGABRT, exit -6), counting aborts.

Kinds (each a fresh torchrun launch of 2 gloo ranks, OMP_NUM_THREADS=1, a free port):

- ``zero3_moe``:   the example trainer, DeepSeek-R1's config.json shrunk by transformers (MLA, grouped routing,
                   16 experts), ZeRO-3, bf16, 2 steps (tests/dist/test_arch_shrunk.py's failing case, shorter);
- ``hf_callback``: tests/dist/user_scripts/hf_train.py (HF Trainer + DeepSpeed ZeRO-1 + DstoolkitCallback),
                   4 steps (tests/dist/test_user_scripts.py's failing case, shorter);
- ``trainer``:     the example trainer on a tiny Llama, ZeRO-1, fp32, 2 steps;
- ``bare_gloo``:   a 15-line torch script (init gloo, 20 all_reduce + all_gather, return) with nothing of
                   dstoolkit in it but, after the fix, `dstoolkit.runtime.rankexit.install_exit_guard()`:
                   the mechanism alone (dstoolkit/runtime/rankexit.py), cheap enough to run often.

``--tree DIR`` runs the jobs against another checkout's dstoolkit (the "before" figures: the tree at the commit
before the fix, e.g. ``git archive 15d2367 | tar -x -C /tmp/before``). A job counts as an abort when its log
says ``terminate called`` or a rank exited with -6 / SIGABRT; any other non-zero exit counts as a failure
(with its last line). Kinds run round-robin until ``--jobs`` per kind or ``--budget-s`` is spent, so a
shorter run still has every kind. Appends one JSON line per (tree, kind) to
benchmarks/results/clean_exit_cpu_<yyyymm>.jsonl (harness.capture_env: versions, CPU, commit, load) and
rewrites the .md table from all lines.

Usage: nice -n 10 python benchmarks/clean_exit.py [--jobs 50] [--budget-s 3600] [--kinds a,b] [--tree DIR]
       python benchmarks/clean_exit.py --render-from benchmarks/results/clean_exit_cpu_202612.jsonl
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO))

R1 = REPO / "tests" / "golden" / "hf_configs" / "released" / "deepseek-ai--DeepSeek-R1.json"
HF_SCRIPT = REPO / "tests" / "dist" / "user_scripts" / "hf_train.py"
HF_SPEC = REPO / "tests" / "dist" / "user_scripts" / "spec.yaml"
KINDS = ("zero3_moe", "hf_callback", "trainer", "bare_gloo")

BARE = """
import torch, torch.distributed as dist
try:
    from dstoolkit.runtime.rankexit import install_exit_guard
    install_exit_guard()
except ImportError:  # the tree before the fix
    pass
dist.init_process_group("gloo")
t = torch.ones(1000) * dist.get_rank()
for _ in range(20):
    dist.all_reduce(t)
    dist.all_gather([torch.empty(1000) for _ in range(2)], t)
"""


def _job(kind: str, d: pathlib.Path, port: int) -> list[str]:
    """The launch command of one job of `kind` in folder `d`."""
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port)]
    trainer = ["-m", "dstoolkit.runtime.train.trainer", "--steps", "2", "--no-progress", "--no-spike-guard",
               "--peak-flops", "1e11", "--metrics-out", str(d / "m.jsonl")]
    if kind == "zero3_moe":
        (d / "spec.yaml").write_text(f"name: r1\nmodel: {{hf_config: {R1}}}\ncluster: {{nodes: 1, gpus_per_node: 2, "
                                     "gpu: cpu}\ntraining: {seq_len: 32, global_batch: 4, micro_batch: 2, "
                                     "precision: bf16, zero_stage: 3, lr: 0.003}\n")
        (d / "ds.json").write_text(json.dumps({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
                                               "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
                                               "zero_optimization": {"stage": 3}}))
        return [*run, *trainer, "--deepspeed_config", str(d / "ds.json"), "--spec", str(d / "spec.yaml"),
                "--shrink", "auto"]
    if kind == "trainer":
        (d / "spec.yaml").write_text("name: tiny\nmodel: {model_type: llama, hidden_size: 64, num_hidden_layers: 2, "
                                     "num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 128, "
                                     "vocab_size: 256}\ncluster: {nodes: 1, gpus_per_node: 2, gpu: cpu}\n"
                                     "training: {seq_len: 32, global_batch: 4, micro_batch: 2, precision: fp32, "
                                     "zero_stage: 1}\n")
        (d / "ds.json").write_text(json.dumps({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
                                               "optimizer": {"type": "AdamW", "params": {"lr": 1e-3,
                                                                                         "torch_adam": True}},
                                               "zero_optimization": {"stage": 1}}))
        return [*run, *trainer, "--deepspeed_config", str(d / "ds.json"), "--spec", str(d / "spec.yaml")]
    if kind == "hf_callback":
        (d / "ds.json").write_text(json.dumps({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                                               "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
                                               "zero_optimization": {"stage": 1}}))
        return [*run, str(HF_SCRIPT), "--deepspeed", str(d / "ds.json"), "--per_device_train_batch_size", "4",
                "--learning_rate", "0.01", "--use_cpu", "--report_to", "none", "--save_strategy", "no",
                "--logging_steps", "1", "--max_steps", "4", "--dstoolkit_callback", "--spec", str(HF_SPEC),
                "--output_dir", str(d / "out")]
    if kind == "bare_gloo":
        (d / "bare.py").write_text(BARE)
        return [*run, str(d / "bare.py")]
    raise ValueError(f"kind {kind!r}: one of {', '.join(KINDS)}")


ABORT_MARKERS = ("terminate called", "exitcode: -6", "Signal 6 (SIGABRT)")
"""What torchrun / libstdc++ print for a rank that aborted."""
LOG_TAIL_LINES = 40
"""Lines of a job's log kept in the results for each abort or failure (the first five per kind)."""


def classify(rc: int, log: str) -> str:
    """'ok', 'abort' (std::terminate / SIGABRT at exit) or 'fail' (any other non-zero exit)."""
    if any(m in log for m in ABORT_MARKERS):
        return "abort"
    return "ok" if rc == 0 else "fail"


def run_one(kind: str, tree: pathlib.Path, timeout_s: float) -> dict:
    from dstoolkit.runtime.train.launch import free_port

    with tempfile.TemporaryDirectory(prefix=f"clean_exit_{kind}_") as tmp:
        d = pathlib.Path(tmp)
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        t0 = time.perf_counter()
        try:
            p = subprocess.run(_job(kind, d, free_port()), capture_output=True, text=True, timeout=timeout_s,
                               env=env, cwd=str(tree))
            rc, log = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            rc, log = 124, f"timed out after {timeout_s:.0f} s: {(e.stderr or b'')[-300:]!r}"
        wall = time.perf_counter() - t0
    verdict = classify(rc, log)
    lines = [ln for ln in log.splitlines() if ln.strip()] if verdict != "ok" else []
    # The line that says what happened, not torchrun's closing '=====' banner: the abort marker or the last error.
    said = [ln for ln in lines if any(m in ln for m in ABORT_MARKERS + ("Error", "error:"))]
    last = (said or lines)[-1:]
    return {"rc": rc, "verdict": verdict, "wall_s": round(wall, 1), "last_line": last[0][-300:] if last else None,
            "log_tail": [ln[-300:] for ln in lines[-LOG_TAIL_LINES:]] or None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=50, help="jobs per kind (default 50)")
    ap.add_argument("--budget-s", type=float, default=3600.0, help="stop starting jobs after this long")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--tree", type=pathlib.Path, default=REPO, help="the checkout whose dstoolkit the jobs run")
    ap.add_argument("--label", default=None, help="what the tree is (default: 'after' for this checkout)")
    ap.add_argument("--timeout-s", type=float, default=400.0)
    ap.add_argument("--render-from", metavar="JSONL", type=pathlib.Path)
    args = ap.parse_args(argv)
    if args.render_from:
        sys.stdout.write(render_md(args.render_from))
        return 0
    from dstoolkit.runtime.bench import harness, results_jsonl

    kinds = [k for k in args.kinds.split(",") if k]
    label = args.label or ("after" if args.tree.resolve() == REPO else f"before ({args.tree})")
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    load_before = os.getloadavg()
    t_end = time.monotonic() + args.budget_s
    while time.monotonic() < t_end and any(len(runs[k]) < args.jobs for k in kinds):
        for k in kinds:
            if len(runs[k]) >= args.jobs or time.monotonic() >= t_end:
                continue
            r = run_one(k, args.tree, args.timeout_s)
            runs[k].append(r)
            print(f"[clean_exit {label}] {k} #{len(runs[k])}: {r['verdict']} rc={r['rc']} {r['wall_s']} s"
                  + (f"  {r['last_line']}" if r["last_line"] else ""), file=sys.stderr, flush=True)
    env = harness.capture_env(2, "gloo", {"kinds": kinds, "tree": str(args.tree)})
    records = []
    for k in kinds:
        rs = runs[k]
        records.append({"bench": "clean_exit", "label": label, "kind": k, "jobs": len(rs),
                        "aborts": sum(r["verdict"] == "abort" for r in rs),
                        "failures": sum(r["verdict"] == "fail" for r in rs),
                        "wall_s_median": sorted(r["wall_s"] for r in rs)[len(rs) // 2] if rs else None,
                        "failed_lines": [r["last_line"] for r in rs if r["verdict"] != "ok"][:5],
                        "failed_log_tails": [r["log_tail"] for r in rs if r["verdict"] != "ok"][:5],
                        "loadavg_before": [round(x, 2) for x in load_before],
                        "loadavg_after": [round(x, 2) for x in os.getloadavg()], "env": env})
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"clean_exit_cpu_{_dt.date.today():%Y%m}"
    results_jsonl.append_records(stem.with_suffix(".jsonl"), records)
    stem.with_suffix(".md").write_text(render_md(stem.with_suffix(".jsonl")))
    for r in records:
        print(f"{r['label']:<10} {r['kind']:<12} jobs {r['jobs']:>3}  aborts {r['aborts']:>3}  other failures "
              f"{r['failures']:>3}")
    return 0


def render_md(path: pathlib.Path) -> str:
    rows = [json.loads(ln) for ln in pathlib.Path(path).read_text().splitlines() if ln.strip()]
    out = ["# Clean exits: short real 2-rank jobs, aborts at interpreter exit (benchmarks/clean_exit.py)", "",
           "| date | commit | tree | kind | jobs | aborts | other failures | median wall s | load before -> after |",
           "|---|---|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        e = r.get("env") or {}
        commit = (e.get("git_commit") or "")[:12]
        out.append(f"| {str(e.get('timestamp_utc') or '')[:10]} | {commit} | {r['label']} | {r['kind']} "
                   f"| {r['jobs']} | {r['aborts']} | {r['failures']} | {r['wall_s_median']} | "
                   f"{r['loadavg_before'][0]} -> {r['loadavg_after'][0]} |")
    out += ["", "An abort: `terminate called without an active exception` / a rank exiting -6 after the run "
            "finished (dstoolkit/runtime/rankexit.py has the cause). The machine is shared (2 cores, 7 engineers): "
            "wall times are noisy; the load column says how busy it was."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Megatron targets across two test hosts: the generated launch script run once per host forms one job (issue 30).

A 2 nodes x 2 CPU ranks spec (ds_configs/tiny_cpu.yaml with cluster.nodes 2, strategy zero1) is generated with
`dstoolkit generate SPEC --target megatron-deepspeed --target megatron-lm --strategy zero1`; each target's own
launch script is then run unchanged, once per test host (network namespaces, dstoolkit/runtime/testhosts), as its
summary says: `NODE_RANK=k MASTER_ADDR=<host 0> PRETRAIN=... DATA_ARGS=... bash launch_megatron_<t>.sh --log-interval
1`. Recorded per target: the world size the job reports (rank 0's "using world size: N" line, host 0's log), the
loss of every step (printed by the last rank, which lives on host 1), the checkpoint files the ranks wrote (one
ZeRO optimizer partition per data-parallel rank: ranks 2 and 3 are host 1's), exit codes and wall time.

The training trees are not part of this repo and CI cannot fetch them: pass bare git dirs from the `fetch` tool
(exported to --work) or exported trees. Megatron-DeepSpeed gets what benchmarks/megatron_deepspeed_runs.py gives it
(PATCH_GQA, the import stand-ins, its dataset helpers built, the synthetic indexed dataset; listed in the results).
Megatron-LM gets one stand-in: `typing.override` from typing_extensions (its tree uses Python 3.12's typing.override;
this venv is 3.11) and synthetic data (MOCK_DATA=1, the script's documented switch). Needs root (namespaces).
Extra packages for the trees, outside the venv: `pip install --target DEPS pybind11 six triton`.

    nice -n 10 .venv/bin/python benchmarks/megatron_two_host.py \\
        --mds /work/.mirror/deepspeedai+Megatron-DeepSpeed/repo --mlm /work/.mirror/NVIDIA+Megatron-LM/repo \\
        --deps /tmp/megatron_deps --work /tmp/megatron_two_host \\
        --out benchmarks/results/megatron_two_host_cpu_202612.jsonl
    .venv/bin/python benchmarks/megatron_two_host.py --render benchmarks/results/megatron_two_host_cpu_202612.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import megatron_deepspeed_runs as mdr  # noqa: E402  (the Megatron-DeepSpeed tree preparation and dataset)

STEPS = 10
NODES, RANKS_PER_NODE = 2, 2
STRATEGY = "zero1"
RUN_TIMEOUT_S = 900
WORLD = re.compile(r"using world size: (\d+), data-parallel[- ]size: (\d+)")
NOTES = [
    "Megatron-LM cannot train on CPU ranks: pretrain() calls initialize_megatron() without allow_no_cuda, and "
    "megatron/training/initialize.py:72 asserts torch.cuda.is_available() ('Megatron requires CUDA.'); "
    "allow_no_cuda is meant for CPU-only data processing (its docstring). Before that, the generated file as it is "
    "stops in TransformerConfig.__post_init__ (megatron/core/transformer/transformer_config.py:2518-2519: 'apply_rope_"
    "fusion is not available. Please install TE >= 1.4.'): Megatron-LM's --no-rope-fusion is store_false, so "
    "apply_rope_fusion defaults to True, and the CPU cluster's file has no --no-rope-fusion (the second Megatron-LM "
    "row passes it as an extra argument). Both rows still show the two hosts' ranks joined one job of world size 4 "
    "(rank 0 printed it after the rendezvous, before the stop).",
    "Megatron-DeepSpeed trains the generated files on the two hosts to the last step and saves a checkpoint with one "
    "ZeRO-1 optimizer partition per data-parallel rank (0-3).",
]
MLM_SHIM = '''"""dstoolkit benchmarks/megatron_two_host.py: Python 3.12's typing.override for Megatron-LM on 3.11."""
import typing

if not hasattr(typing, "override"):
    import typing_extensions

    typing.override = typing_extensions.override
'''


def two_host_spec(rdir: Path) -> Path:
    spec = yaml.safe_load((REPO / "ds_configs" / "tiny_cpu.yaml").read_text())
    spec["name"] = "tiny_cpu_two_host"
    spec["cluster"].update(nodes=NODES, gpus_per_node=RANKS_PER_NODE)
    spec["training"].update(train_steps=STEPS, zero_stage="auto")
    path = rdir / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def export_tree(src: Path, dest: Path) -> tuple[Path, str]:
    """A bare git dir is exported to dest (once); an exported tree is used as it is."""
    if (src / "HEAD").is_file() or (src / ".git").exists():
        gd = src if (src / "HEAD").is_file() else src / ".git"
        commit = mdr._sh(["git", f"--git-dir={gd}", "rev-parse", "HEAD"])
        if not dest.exists():
            dest.mkdir(parents=True)
            arch = subprocess.run(["git", f"--git-dir={gd}", "archive", "HEAD"], check=True, capture_output=True).stdout
            subprocess.run(["tar", "x", "-C", str(dest)], input=arch, check=True)
        return dest, commit
    return src, "(exported tree; commit unknown)"


def _first_error(text: str) -> Optional[str]:
    lines = text.splitlines()
    for i, ln in enumerate(lines):  # the first Python exception line of a rank, with the frame above it
        if re.match(r"^(\[rank\d+\]: )?\w+(Error|Exception)\b", ln):
            above = (lines[j].strip() for j in range(i - 1, max(i - 8, -1), -1))
            frame = next((f for f in above if f.startswith("File ")), "")
            return (f"{ln.strip()} ({frame})" if frame else ln.strip())[-500:]
    return None


def run_target(target: str, hosts, folder: Path, rdir: Path, env: dict, extra: list[str]) -> dict:
    """Run the target's launch script once per host, as its summary says; read world size, losses, checkpoints."""
    from dstoolkit.runtime.testhosts import jobs
    from dstoolkit.runtime.testhosts.hosts import kill_group, wait_all

    script = folder / f"launch_{target.replace('-', '_')}.sh"
    rdir.mkdir(parents=True, exist_ok=True)
    logs = [rdir / f"node{k}.log" for k in range(NODES)]
    for p in logs:
        p.unlink(missing_ok=True)
    base = jobs.base_env()
    base.update(env, MASTER_ADDR=hosts.addrs[0], MASTER_PORT=str(jobs.MASTER_PORT))
    argv = ["nice", "-n", "10", "bash", str(script), "--log-interval", "1", *extra]
    load0 = os.getloadavg()
    t0 = time.monotonic()
    procs = [hosts.popen(k, argv, {**base, "NODE_RANK": str(k)}, logs[k], cwd=str(rdir)) for k in range(NODES)]
    try:
        res = wait_all(procs, logs, RUN_TIMEOUT_S, t0)
    finally:
        for p in procs:
            kill_group(p)
    texts = [p.read_text(errors="replace") for p in logs]
    world = [(int(m[0]), int(m[1])) for m in WORLD.findall(texts[0])]
    steps_by_node = [[dict(step=int(m[0]), consumed=int(m[1]), ms=float(m[2]), batch=int(m[3]), loss=float(m[4]))
                      for m in mdr.LINE.findall(t)] for t in texts]
    steps = next((s for s in reversed(steps_by_node) if s), [])
    ckpt = rdir / "checkpoints"
    files = sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file()) if ckpt.exists() else []
    rec = {"target": target, "launch": f"NODE_RANK=k MASTER_ADDR={hosts.addrs[0]} bash {script.name} "
                                      + " ".join(argv[5:]), "hosts": list(hosts.addrs),
           "returncodes": res.returncodes, "timed_out": res.timed_out, "wall_s": round(res.wall_s, 1),
           "load_before": [round(x, 2) for x in load0], "load_after": [round(x, 2) for x in os.getloadavg()],
           "world_size": world[0][0] if world else None, "data_parallel_size": world[0][1] if world else None,
           "loss_lines_per_node": [len(s) for s in steps_by_node], "steps": steps,
           "first_loss": steps[0]["loss"] if steps else None, "last_loss": steps[-1]["loss"] if steps else None,
           "last_step": steps[-1]["step"] if steps else None, "checkpoint_files": files,
           "extra_args": extra}
    rec["ok"] = (res.ok and rec["world_size"] == NODES * RANKS_PER_NODE and rec["last_step"] == STEPS)
    if not rec["ok"]:
        rec["error"] = next((e for e in map(_first_error, texts) if e), None) or f"exit codes {res.returncodes}"
        rec["log_tail"] = [ln[-300:] for ln in texts[0].splitlines()[-15:]]
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mds", type=Path, help="Megatron-DeepSpeed bare git dir (fetch tool) or exported tree")
    ap.add_argument("--mlm", type=Path, help="Megatron-LM bare git dir (fetch tool) or exported tree")
    ap.add_argument("--deps", type=Path, default=Path("/tmp/megatron_deps"),
                    help="pip --target dir with pybind11, six (Megatron-DeepSpeed) and triton (Megatron-LM)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/megatron_two_host"))
    ap.add_argument("--out", type=Path, help="JSONL to append to")
    ap.add_argument("--render", type=Path, help="render the md from this JSONL and exit")
    a = ap.parse_args(argv)
    if a.render:
        print(f"wrote {render(a.render)}")
        return 0
    from dstoolkit.runtime.bench.harness import capture_env
    from dstoolkit.runtime.bench.results_jsonl import append_records
    from dstoolkit.runtime.testhosts.hosts import TestHosts, reap_stale, unavailable_reason

    why = unavailable_reason()
    if why:
        print(f"megatron_two_host: {why}", file=sys.stderr)
        return 2
    if not (a.mds or a.mlm) or not a.out:
        ap.error("give --out and at least one of --mds / --mlm")
    reap_stale()
    a.work.mkdir(parents=True, exist_ok=True)
    rdir = a.work / time.strftime("two_host_%Y%m%d_%H%M%S")  # fresh: --load would resume an earlier run's checkpoint
    rdir.mkdir()
    spec = two_host_spec(rdir)
    gen = subprocess.run([str(REPO / ".venv/bin/dstoolkit"), "generate", str(spec), "--target", "megatron-deepspeed",
                          "--target", "megatron-lm", "--strategy", STRATEGY, "--out", str(rdir / "gen")],
                         capture_output=True, text=True)
    if gen.returncode != 0:
        print(gen.stdout + gen.stderr, file=sys.stderr)
        return 1
    folder = rdir / "gen" / STRATEGY
    hints = [ln for ln in gen.stdout.splitlines() if ln.startswith("run ")]
    env_doc = capture_env(NODES * RANKS_PER_NODE, "gloo", config=spec.read_text(), packages=("megatron-core",))
    common = {"PATH": f"{REPO / '.venv/bin'}{os.pathsep}{os.environ['PATH']}", "DS_ACCELERATOR": "cpu",
              "OMP_NUM_THREADS": "1"}
    plans = []
    if a.mds:
        facts = mdr.prepare_tree(a.mds, a.work, a.deps)
        data = mdr.write_dataset(a.work, facts["tree"], str(a.deps), 128, 2048)
        plans.append(("megatron-deepspeed", facts["commit"], {
            **common, "PYTHONPATH": os.pathsep.join([facts["shim"], str(a.deps), facts["tree"]]),
            "PRETRAIN": str(Path(facts["tree"]) / "pretrain_gpt.py"),
            "DATA_ARGS": f"--data-path {data} --tokenizer-type NullTokenizer --split 100,0,0 --data-impl mmap"},
            ["PATCH_GQA (megatron/model/transformer.py, see megatron_deepspeed_runs.py)",
             "PATCH_ROPE_PP (megatron/utils.py; the pipeline path only, not taken at pp 1)",
             "sitecustomize stand-ins for torchvision and deepspeed.compression.compress",
             "dataset helpers built with pybind11; synthetic indexed dataset (runtime.model.synthetic_batch)"]))
    if a.mlm and not (folder / "launch_megatron_lm.sh").exists():
        # since session 32 generate refuses megatron-lm on CPU ranks (Megatron-LM asserts CUDA in
        # initialize_megatron, which this benchmark's 2026-12 run met as its second stop): its reason is printed
        why = [ln for ln in gen.stdout.splitlines() if "megatron-lm" in ln and "CUDA" in ln]
        print("megatron-lm: not generated for the CPU hosts" + (f": {why[0].strip()}" if why else ""), flush=True)
    elif a.mlm:
        tree, commit = export_tree(a.mlm, a.work / "Megatron-LM")
        shim = a.work / "shim_mlm"
        shim.mkdir(exist_ok=True)
        (shim / "sitecustomize.py").write_text(MLM_SHIM)
        plans.append(("megatron-lm", commit, {
            **common, "PYTHONPATH": os.pathsep.join([str(shim), str(a.deps), str(tree)]),
            "PRETRAIN": str(tree / "pretrain_gpt.py"), "MOCK_DATA": "1"},
            ["sitecustomize: typing.override = typing_extensions.override (the tree needs Python 3.12)",
             "MOCK_DATA=1 (the launch script's switch for Megatron-LM's --mock-data)"]))
    hosts = TestHosts(NODES)
    recs = []
    try:
        hosts.up()
        for target, commit, env, changes in plans:
            attempts = [[]] if target == "megatron-deepspeed" else [[], ["--no-rope-fusion"]]
            for extra in attempts:  # Megatron-LM: as generated, then past its first stop (see the md)
                tag = "".join(f"-{x.strip('-')}" for x in extra)
                rec = run_target(target, hosts, folder, rdir / f"{target}{tag}", env, extra)
                rec.update(bench="megatron_two_host", tree_commit=commit, changes=changes, env=env_doc,
                           spec=yaml.safe_load(spec.read_text()), strategy=STRATEGY, summary_hints=hints)
                recs.append(rec)
                append_records(a.out, [rec])
                print(target, extra, "ok" if rec["ok"] else "FAILED", "world", rec["world_size"], "last loss",
                      rec["last_loss"], rec.get("error", ""), flush=True)
                if rec["ok"]:
                    break
    finally:
        hosts.down()
    print(f"wrote {render(a.out)}")
    return 0 if all(r["ok"] for r in recs if r["target"] == "megatron-deepspeed") else 1


def render(jsonl: Path) -> Path:
    from dstoolkit.runtime.bench.results_jsonl import read_records
    from dstoolkit.runtime.bench.report import render_markdown_table, write_report

    recs = [r for r in read_records(jsonl) if r.get("bench") == "megatron_two_host"]
    md = ["# Megatron targets on two test hosts (2 nodes x 2 CPU ranks, gloo)", "",
          f"Generated by `benchmarks/megatron_two_host.py` from `{jsonl.name}` (JSONL first). Each target's generated "
          f"launch script run unchanged once per host (network namespaces), `NODE_RANK=k MASTER_ADDR=<host 0>`, "
          f"as its summary says; {STEPS} steps, strategy {STRATEGY}.", ""]
    rows = []
    for r in recs:
        e = r["env"]
        loss = f"{r['first_loss']:.4f} -> {r['last_loss']:.4f}" if r.get("steps") else "-"
        ck = [f for f in r.get("checkpoint_files", []) if "optim_states" in f]
        rows.append([r["target"], r["tree_commit"][:10], " ".join(r.get("extra_args") or []) or "(as generated)",
                     "ok" if r["ok"] else "FAILED", r.get("world_size") or "-", r.get("data_parallel_size") or "-",
                     f"{r['last_step'] or '-'}/{STEPS}", loss, "/".join(map(str, r["loss_lines_per_node"])),
                     len(ck), r["returncodes"], r["wall_s"], f"{r['load_before'][0]}/{r['load_after'][0]}",
                     (e.get("git_commit") or "")[:10]])
    md += render_markdown_table(rows, ["target", "tree commit", "extra args", "result", "world size", "dp",
                                       "steps", "loss first -> last", "loss lines node0/node1",
                                       "ZeRO optim shards saved", "exit codes", "wall s", "load 1m before/after",
                                       "dstoolkit commit"])
    md += ["", "World size and dp are rank 0's `using world size` line (host 0's log); the loss lines are printed by "
               "the last rank, global rank 3, which runs on host 1; one ZeRO optimizer shard per data-parallel rank.",
           ""]
    seen = set()
    for r in recs:
        if not r["ok"]:
            how = " ".join(r.get("extra_args") or []) or "(as generated)"
            md.append(f"- {r['target']} {how} stopped: {r.get('error')}")
        if r.get("checkpoint_files"):
            md.append(f"- {r['target']} checkpoint files: " + ", ".join(f"`{f}`" for f in r["checkpoint_files"]))
        if r["target"] not in seen:
            seen.add(r["target"])
            md.append(f"- {r['target']} changes to its tree/environment: " + "; ".join(r["changes"]))
    md += ["", "Notes:", ""] + [f"- {x}" for x in NOTES]
    if recs:
        e = recs[-1]["env"]
        md += ["", f"Environment: torch {e.get('torch')}, deepspeed {e.get('deepspeed')}, python {e.get('python')}, "
                   f"{e.get('cpu_model')} ({e.get('cpu_count')} cores, shared with other jobs: load averages above)."]
    return write_report(jsonl.with_suffix(".md"), md)


if __name__ == "__main__":
    sys.exit(main())

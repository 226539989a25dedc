#!/usr/bin/env python
"""Page faults and step time of a DeepSpeed ZeRO-2 step on 2 CPU ranks, with glibc malloc's defaults and with
the allocator settings dstoolkit gives CPU ranks (`dstoolkit.common.cpu_env.CPU_RANK_ENV`).

Why: with glibc's defaults, tensors above the mmap threshold (dynamic, at most 32 MiB) are mapped fresh and
first-touched in every step, and each 4 KiB page costs a minor fault. The CPU step-time model calibrates its
rates with the ranks' own environment, so this benchmark says what that environment is worth.

    python benchmarks/cpu_malloc.py [--out DIR] [--steps 5]

Each variant runs in a fresh process pair (glibc reads these variables at start-up); the order alternates
(default, tuned, default, tuned) so a change in machine load shows as a spread, not as an effect. Per step:
minor page faults of rank 0 (getrusage), wall and CPU seconds (median).
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
from dstoolkit.runtime.bench.harness import capture_env, free_port  # noqa: E402
from dstoolkit.runtime.bench.report import env_brief, render_markdown_table, write_json, write_report  # noqa: E402

SHAPE = dict(name="malloc", model_type="llama", hidden_size=448, num_hidden_layers=6, num_attention_heads=7,
             num_key_value_heads=7, intermediate_size=1216, vocab_size=12288)
"""A model with large embedding / LM-head tensors (5.5M elements each): ~26M parameters."""
CASES = (("bf16", 1), ("fp32", 1))
"""(precision, micro batch) at seq 128."""


def _worker(rank: int, port: int, prec: str, mb: int, steps: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), LOCAL_SIZE="2")
    import resource

    import deepspeed
    import torch

    from dstoolkit.models.shape import ModelShape
    from dstoolkit.runtime.model import build_model
    from dstoolkit.runtime.synthetic import synthetic_batch
    from dstoolkit.runtime.probe import probe_engine_config
    from dstoolkit.runtime.train.shm import unlink_after_rendezvous

    torch.set_num_threads(1)
    from dstoolkit.runtime.rankexit import install_exit_guard

    install_exit_guard()  # the groups released before the interpreter exits (dstoolkit/runtime/rankexit.py)
    deepspeed.init_distributed(dist_backend="gloo")
    unlink_after_rendezvous()
    shape = ModelShape(**SHAPE)
    cfg = dict(probe_engine_config(prec), train_micro_batch_size_per_gpu=mb)
    model = build_model(shape, seed=0)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=cfg)
    ids, labels = synthetic_batch(shape, mb, 128, step=0, rank=rank)

    def step() -> None:
        loss = engine(ids, labels)
        engine.backward(loss)
        engine.step()

    for _ in range(2):
        step()
    wall, cpu = [], []
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        torch.distributed.barrier()
        t, c = time.perf_counter(), time.process_time()
        step()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / steps
    if rank == 0:
        pathlib.Path(out).write_text(json.dumps(dict(wall_s=statistics.median(wall), cpu_s=statistics.median(cpu),
                                                     minor_faults_per_step=faults)))
    torch.distributed.barrier()


def _run(variant: str, prec: str, mb: int, steps: int) -> dict:
    from dstoolkit.common.cpu_env import CPU_RANK_ENV

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    if variant == "tuned":
        env.update(CPU_RANK_ENV)
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "r.json"
        subprocess.run([sys.executable, __file__, "--worker", prec, str(mb), str(steps), str(out)], env=env,
                       check=True, capture_output=True, text=True, timeout=600)
        return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        import torch.multiprocessing as mp

        prec, mb, steps, out = args.worker
        mp.spawn(_worker, args=(free_port(), prec, int(mb), int(steps), out), nprocs=2, join=True)
        return 0
    from dstoolkit.common.cpu_env import CPU_RANK_ENV

    load_before = os.getloadavg()
    rows = []
    for prec, mb in CASES:
        for variant in ("default", "tuned", "default", "tuned"):
            r = _run(variant, prec, mb, args.steps)
            rows.append(dict(precision=prec, micro_batch=mb, variant=variant, **r))
            print(rows[-1], flush=True)
    env = capture_env(world_size=2, backend="gloo")
    doc = dict(env=env, shape=SHAPE, allocator_env=CPU_RANK_ENV, loadavg_before=load_before,
               loadavg_after=os.getloadavg(), rows=rows)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m")
    out = pathlib.Path(args.out)
    write_json(out / f"cpu_malloc_{stamp}.json", doc)
    table = render_markdown_table(
        [(r["precision"], r["variant"], f"{r['minor_faults_per_step']:,.0f}", f"{r['wall_s']:.3f}", f"{r['cpu_s']:.3f}")
         for r in rows], ["precision", "allocator", "minor faults / step (rank 0)", "wall s / step", "cpu s / step"])

    def med(prec: str, variant: str, key: str) -> float:
        return statistics.median(r[key] for r in rows if r["precision"] == prec and r["variant"] == variant)

    summary = [f"- {p}: faults {med(p, 'default', 'minor_faults_per_step'):,.0f} -> "
               f"{med(p, 'tuned', 'minor_faults_per_step'):,.0f} per step; cpu s {med(p, 'default', 'cpu_s'):.3f} -> "
               f"{med(p, 'tuned', 'cpu_s'):.3f} ({med(p, 'tuned', 'cpu_s') / med(p, 'default', 'cpu_s') - 1:+.0%}); "
               f"wall s {med(p, 'default', 'wall_s'):.3f} -> {med(p, 'tuned', 'wall_s'):.3f}" for p, _ in CASES]
    text = [
        "# glibc malloc defaults vs dstoolkit's CPU rank allocator settings (2 gloo ranks, DeepSpeed ZeRO-2)", "",
        f"{env_brief(env)}; {env.get('cpu_model')}. loadavg before {tuple(round(x, 2) for x in load_before)}, after "
        f"{tuple(round(x, 2) for x in os.getloadavg())}.", "",
        f"Model: hidden {SHAPE['hidden_size']}, {SHAPE['num_hidden_layers']} layers, vocab {SHAPE['vocab_size']} "
        "(~26M parameters), seq 128, torch AdamW, DeepSpeed's default buckets; median of "
        f"{args.steps} steps after 2 warm-up steps. tuned = "
        + ", ".join(f"{k}={v}" for k, v in CPU_RANK_ENV.items() if k.startswith("MALLOC")) + ".", "",
        *summary, "", *table,
    ]
    write_report(out / f"cpu_malloc_{stamp}.md", text)
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())

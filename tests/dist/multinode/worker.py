"""Fallback multi-node training worker: a real DeepSpeed engine on gloo, launched by torchrun or `deepspeed`.

Used by the multi-node tests only where the package's example trainer is not available. It takes the
trainer's flags (--deepspeed_config, --steps, --metrics-out, --checkpoint-dir, --save-every, --resume)
plus --dist-timeout-s, the process-group timeout that bounds how long a cut link can hang a collective.

Data order is a pure function of (seed, step, global sample index), so any world layout that has the same
world size (4 ranks on one host, or 2 hosts x 2 ranks) sees the same samples on the same ranks.
Rank 0 writes one JSON line per step: {"step", "loss", "step_time_s"}; the loss is the mean over ranks.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import time

import torch
from torch import nn

HIDDEN = 256
"""Width of the MLP (about 0.3 M parameters with DEPTH=4: big enough to move data, small for 2 CPUs)."""
DEPTH = 4
"""Hidden layers of the MLP."""
CLASSES = 16
"""Classes of the synthetic task (labels are a fixed function of the inputs, so the loss can fall)."""


def _batch(seed: int, step: int, rank: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    x = torch.randn(micro, HIDDEN, generator=g)
    w = torch.Generator().manual_seed(seed)
    proj = torch.randn(HIDDEN, CLASSES, generator=w)
    return x, (x @ proj).argmax(-1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepspeed_config", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--metrics-out", required=True)
    ap.add_argument("--checkpoint-dir")
    ap.add_argument("--save-every", type=int, default=0)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--dist-timeout-s", type=float, default=60.0)
    ap.add_argument("--step-sleep-s", type=float, default=0.0, help="pause after each step (fault tests)")
    ap.add_argument("--local_rank", type=int, default=0)  # passed by the deepspeed launcher
    args = ap.parse_args()

    import deepspeed

    timeout = datetime.timedelta(seconds=args.dist_timeout_s)
    # DeepSpeed passes `timeout` to the world group only; its ZeRO/expert groups come from dist.new_group(ranks),
    # which takes torch's default (30 min for gloo, torch.distributed.constants.default_pg_timeout). A cut link
    # would hang a ZeRO collective that long, so the default every later group reads is set to ours as well.
    import torch.distributed.distributed_c10d as c10d

    c10d.default_pg_timeout = timeout
    deepspeed.init_distributed(dist_backend="gloo", timeout=timeout)
    rank = torch.distributed.get_rank()
    world = torch.distributed.get_world_size()
    torch.manual_seed(args.seed)
    layers: list[nn.Module] = []
    for _ in range(DEPTH):
        layers += [nn.Linear(HIDDEN, HIDDEN), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(HIDDEN, CLASSES))
    with open(args.deepspeed_config) as f:
        ds_config = json.load(f)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    micro = engine.train_micro_batch_size_per_gpu()
    gas = engine.gradient_accumulation_steps()
    start = 0
    if args.resume and args.checkpoint_dir and os.path.exists(os.path.join(args.checkpoint_dir, "latest")):
        _, client = engine.load_checkpoint(args.checkpoint_dir)
        start = int(client["next_step"])
    out = open(args.metrics_out, "a") if rank == 0 else None
    loss_fn = nn.CrossEntropyLoss()
    for step in range(start, args.steps):
        t0 = time.perf_counter()
        total = torch.zeros(())
        for m in range(gas):
            x, y = _batch(args.seed, step * gas + m, rank, micro)
            loss = loss_fn(engine(x), y)
            engine.backward(loss)
            engine.step()
            total += loss.detach() / gas
        torch.distributed.all_reduce(total)
        dt = time.perf_counter() - t0
        if out is not None:
            out.write(json.dumps({"step": step, "loss": total.item() / world, "step_time_s": dt}) + "\n")
            out.flush()
        if args.checkpoint_dir and args.save_every and (step + 1) % args.save_every == 0:
            engine.save_checkpoint(args.checkpoint_dir, tag=f"step{step + 1}", client_state={"next_step": step + 1})
        if args.step_sleep_s:
            time.sleep(args.step_sleep_s)
    torch.distributed.barrier()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python
"""CPU block rates by shape: forward + backward of one transformer block (dstoolkit.runtime.model.Block, one
thread, wall clock, median of 9) at several widths and head dims, beside the rate this machine's calibration
interpolates for the same micro batch (`Calibration.rate_at(tokens x hidden)`).

Why: the CPU step-time model has one block rate per precision, interpolated in tokens x hidden between two
probe sizes of one shape (hidden 320, head dim 64). Where a shape's GEMMs run at other efficiencies (narrow
heads, wider layers; on CPUs with AMX bf16 this is large), the interpolation is off by as much as this table
says, and so is the estimate's compute time.

    python benchmarks/cpu_block_shapes.py [--calibration FILE] [--out DIR]

Default calibration: this machine's (probed and cached as for `gpu: cpu` estimates).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from dstoolkit.runtime.bench.harness import capture_env  # noqa: E402
from dstoolkit.runtime.bench.report import env_brief, render_markdown_table, write_json, write_report  # noqa: E402

SEQ = 128
SHAPES = [  # (hidden, heads, ffn, micro batch): head dims 32 and 64 at two widths, then wider layers
    (256, 8, 688, 4), (256, 4, 688, 4), (320, 10, 864, 4), (320, 5, 864, 4), (384, 6, 1024, 4),
    (512, 8, 1376, 2), (512, 8, 1376, 4),
]


def block_rate(hidden: int, heads: int, ffn: int, mb: int, dtype, reps: int = 9) -> float:
    """Model FLOP/s of one block's forward + backward (`dstoolkit.runtime.probe.block_flops`)."""
    import torch

    from dstoolkit.runtime.model import Block
    from dstoolkit.runtime.probe import block_flops

    shape = _shape(hidden, heads, ffn)
    flops = block_flops(shape, mb * SEQ, SEQ)
    blk = Block(shape, 0, 1).to(dtype)
    x = torch.randn(mb, SEQ, hidden, dtype=dtype, requires_grad=True)

    def fb() -> None:
        y, _ = blk(x)
        y.float().sum().backward()

    fb(), fb()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fb()
        times.append(time.perf_counter() - t0)
    return flops / statistics.median(times)


def _shape(hidden: int, heads: int, ffn: int):
    from dstoolkit.models.shape import ModelShape

    return ModelShape(name=f"h{hidden}x{heads}", model_type="llama", hidden_size=hidden, num_hidden_layers=1,
                      num_attention_heads=heads, num_key_value_heads=heads, intermediate_size=ffn, vocab_size=2048)


def op_model_rate(c, prec: str, hidden: int, heads: int, ffn: int, mb: int) -> float:
    """The op-level CPU model's rate for the same block (`dstoolkit.estimate.cpu_compute.layer_s` + the fixed
    cost per block), in the same model FLOPs."""
    from dstoolkit.estimate import cpu_compute as cc
    from dstoolkit.estimate.activations import layer_activation_bytes
    from dstoolkit.hardware.table import get_gpu
    from dstoolkit.runplan import RunPlan
    from dstoolkit.runtime.probe import block_flops

    shape = _shape(hidden, heads, ffn)
    plan = RunPlan(shape=shape, ds_config={"train_micro_batch_size_per_gpu": mb, "bf16": {"enabled": prec == "bf16"}},
                   world_size=1, gpus_per_node=1, gpu=get_gpu("cpu"), seq_len=SEQ, precision=prec)
    saved = layer_activation_bytes(plan, 0, mb).full
    t = cc.layer_s(plan, cc.op_rates(c), 0, mb * SEQ, mb, saved, recompute=False) + c.per_layer_overhead_s
    return block_flops(shape, mb * SEQ, SEQ) / t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration", default=None, help="calibration JSON (default: this machine's)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = ap.parse_args()
    import torch

    from dstoolkit.hardware import calibration as cal

    torch.set_num_threads(1)
    path = pathlib.Path(args.calibration) if args.calibration else cal.calibration_path("machine", "cpu")
    load_before = os.getloadavg()
    rows = []
    for prec, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        c = cal.load_calibration(path, prec)
        for hidden, heads, ffn, mb in SHAPES:
            measured = block_rate(hidden, heads, ffn, mb, dtype)
            interp = c.rate_at(mb * SEQ * hidden)
            op = op_model_rate(c, prec, hidden, heads, ffn, mb) if c.has_op_rates else None
            rows.append(dict(precision=prec, hidden=hidden, heads=heads, head_dim=hidden // heads, ffn=ffn,
                             micro_batch=mb, measured_flops_per_s=measured, calibration_flops_per_s=interp,
                             error=interp / measured - 1, op_model_flops_per_s=op,
                             op_model_error=None if op is None else op / measured - 1))
    env = capture_env(world_size=1)
    doc = dict(env=env, calibration=str(path), loadavg_before=load_before, loadavg_after=os.getloadavg(), rows=rows)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m")
    out = pathlib.Path(args.out)
    write_json(out / f"cpu_block_shapes_{stamp}.json", doc)
    table = render_markdown_table(
        [(r["precision"], r["hidden"], r["heads"], r["head_dim"], r["micro_batch"], f"{r['measured_flops_per_s'] / 1e9:.1f}",
          f"{r['calibration_flops_per_s'] / 1e9:.1f}", f"{100 * r['error']:+.0f}%",
          "-" if r["op_model_error"] is None else f"{r['op_model_flops_per_s'] / 1e9:.1f}",
          "-" if r["op_model_error"] is None else f"{100 * r['op_model_error']:+.0f}%") for r in rows],
        ["precision", "hidden", "heads", "head dim", "micro batch", "measured GFLOP/s", "block-rate interpolation GFLOP/s",
         "interpolation vs measured", "op-level model GFLOP/s", "op-level vs measured"])
    worst = max(rows, key=lambda r: abs(r["error"]))
    ops = [r for r in rows if r["op_model_error"] is not None]
    worst_op = max(ops, key=lambda r: abs(r["op_model_error"])) if ops else None
    text = [
        "# CPU block rates by shape vs the calibration's interpolation", "",
        f"{env_brief(env)}; {env.get('cpu_model')}; calibration {path.name}.",
        f"loadavg before {tuple(round(x, 2) for x in load_before)}, after "
        f"{tuple(round(x, 2) for x in os.getloadavg())}.", "",
        "One block, forward + backward, 1 thread, wall clock, seq 128, median of 9 (`benchmarks/cpu_block_shapes.py`). "
        "The calibration column is `Calibration.rate_at(micro batch x seq x hidden)`: what the CPU step-time model "
        "uses for that block.", "",
        f"Worst of the block-rate interpolation: {worst['precision']} hidden {worst['hidden']} head dim "
        f"{worst['head_dim']}: {100 * worst['error']:+.0f}%."
        + ("" if worst_op is None else f" Worst of the op-level model (`dstoolkit.estimate.cpu_compute`, what "
           f"estimates use): {worst_op['precision']} hidden {worst_op['hidden']} head dim {worst_op['head_dim']}: "
           f"{100 * worst_op['op_model_error']:+.0f}%."), "",
        *table,
    ]
    write_report(out / f"cpu_block_shapes_{stamp}.md", text)
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())

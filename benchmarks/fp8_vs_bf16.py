"""FP8 (emulated, DeepSeek block recipe) vs bf16: relative final-loss gap on the tiny transformer.

Trains the "tiny" preset with DeepSpeed ZeRO-2 on 2 CPU ranks (gloo), twice from the same weights and the
same synthetic token stream: once in bf16, once with every eligible linear swapped to the emulated FP8
block recipe (E4M3, 1x128 activation tiles, 128x128 weight blocks; lm_head kept in bf16 as DeepSeek-V3 does).
Both arms see exactly the same tokens (fixed token budget). A third, control arm (bf16 with another weight
seed) measures how far two bf16 runs land apart by chance at this budget: a gap below that noise is not
resolvable here. Reports the relative gap of the final loss
(mean of the last `--tail` training steps, and a held-out evaluation) against DeepSeek-V3's < 0.25%
(arXiv 2412.19437 §3.3), and writes JSON + a loss-curve PNG.

    python benchmarks/fp8_vs_bf16.py            # launches torchrun itself; 3 arms x 200 steps: ~5 CPU-min (10 min wall at load 15)
    python benchmarks/fp8_vs_bf16.py --steps 40 --out /tmp/x   # quicker look

Emulation reproduces FP8 *numerics* (rounding, saturation, scaling granularity), not FP8 speed: step times
here say nothing about GPU throughput (see benchmarks/gpu/fp8_te_bench.py for that).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEEPSEEK_V3_REL_LOSS_GAP = 0.0025
"""DeepSeek-V3 (arXiv 2412.19437 §3.3 / docs/anchors.md): FP8 vs BF16 relative loss error stays below 0.25%."""
EVAL_STEP_OFFSET = 1_000_000
"""Eval batches use data positions far from training ones, so they are held out."""


def _ds_config(micro: int, lr: float, warmup: int, steps: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "train_batch_size": micro * 2,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2},
        "gradient_clipping": 1.0,
        # torch_adam avoids the 47 s fused_adam JIT build; same math.
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.0, "torch_adam": True}},
        "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": steps, "warmup_num_steps": warmup,
                                                           "cos_min_ratio": 0.1}},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def _train_arm(arm: str, args, rank: int) -> dict:
    import deepspeed
    import torch

    from dstoolkit.runtime.fp8 import convert
    from dstoolkit.models.presets import get_preset
    from dstoolkit.runtime.model import build_model
    from dstoolkit.runtime.synthetic import synthetic_batch

    shape = get_preset(args.model)
    # The control arm differs from bf16 only in its weight seed: its gap is the run-to-run noise floor.
    model = build_model(shape, seed=args.seed + (1 if arm == "bf16_control" else 0))
    report = None
    if arm == "fp8":
        report = convert(model, {"recipe": "block", "format": "e4m3"}, backend="emulated")
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=_ds_config(args.micro, args.lr, args.warmup, args.steps))
    losses, times = [], []
    for step in range(args.steps):
        ids, labels = synthetic_batch(shape, args.micro, args.seq, step=step, rank=rank, seed=args.seed)
        t0 = time.perf_counter()
        loss = engine(ids, labels)
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - t0)
        # Mean over both ranks: the loss of the global batch.
        lt = loss.detach().float().reshape(1)
        torch.distributed.all_reduce(lt)
        losses.append(lt.item() / 2)
    engine.eval()
    eval_losses = []
    with torch.no_grad():
        for i in range(args.eval_batches):
            ids, labels = synthetic_batch(shape, args.micro, args.seq, step=EVAL_STEP_OFFSET + i, rank=rank,
                                          seed=args.seed)
            lt = engine(ids, labels).detach().float().reshape(1)
            torch.distributed.all_reduce(lt)
            eval_losses.append(lt.item() / 2)
    out = {"arm": arm, "losses": losses, "eval_loss": sum(eval_losses) / len(eval_losses),
           "step_time_s_median": sorted(times)[len(times) // 2]}
    if report is not None:
        out["swap_report"] = json.loads(report.to_json())
    del engine
    return out


def worker(args) -> None:
    import deepspeed
    import torch

    torch.set_num_threads(1)
    from dstoolkit.runtime.rankexit import install_exit_guard

    install_exit_guard()  # the groups released before the interpreter exits (dstoolkit/runtime/rankexit.py)
    deepspeed.init_distributed(dist_backend="gloo")
    from dstoolkit.runtime.train.shm import unlink_after_rendezvous

    unlink_after_rendezvous()  # DeepSpeed never removes its CPU all-reduce buffers from /dev/shm
    rank = torch.distributed.get_rank()
    arms = ("bf16", "fp8") + (("bf16_control",) if args.control else ())
    results = [_train_arm(arm, args, rank) for arm in arms]
    if rank == 0:
        pathlib.Path(args.raw).write_text(json.dumps(results))


def _tail_mean(xs: list[float], n: int) -> float:
    return sum(xs[-n:]) / len(xs[-n:])


def summarize(results: list[dict], args, wall_s: float) -> dict:
    from dstoolkit.runtime.bench.harness import capture_env
    from dstoolkit.models.presets import get_preset
    from dstoolkit.runtime.synthetic import loss_floor

    bf16, fp8 = results[0], results[1]
    control = results[2] if len(results) > 2 else None
    tail_bf16, tail_fp8 = _tail_mean(bf16["losses"], args.tail), _tail_mean(fp8["losses"], args.tail)
    shape = get_preset(args.model)
    floor = loss_floor(shape)
    config = {k: getattr(args, k) for k in ("model", "steps", "micro", "seq", "lr", "warmup", "seed", "tail",
                                            "eval_batches")}
    tokens = args.steps * args.micro * args.seq * 2
    rel_train = (tail_fp8 - tail_bf16) / tail_bf16
    rel_eval = (fp8["eval_loss"] - bf16["eval_loss"]) / bf16["eval_loss"]
    ctrl = None
    if control is not None:
        ctrl = {"what": "bf16 with weight seed + 1, same data: the gap two bf16 runs show by chance",
                "final_train_loss": _tail_mean(control["losses"], args.tail), "eval_loss": control["eval_loss"],
                "relative_gap_train": (_tail_mean(control["losses"], args.tail) - tail_bf16) / tail_bf16,
                "relative_gap_eval": (control["eval_loss"] - bf16["eval_loss"]) / bf16["eval_loss"]}
    return {
        "bench": "fp8_vs_bf16",
        "config": config,
        "fp8": {"backend": "emulated", "recipe": "block", "format": "e4m3", "tile": "1x128 activations",
                "weight_block": "128x128", "zero_stage": 2, "ranks": 2},
        "token_budget": tokens,
        "final_train_loss": {"bf16": tail_bf16, "fp8": tail_fp8, "averaged_over_last_steps": args.tail},
        "eval_loss": {"bf16": bf16["eval_loss"], "fp8": fp8["eval_loss"], "batches": args.eval_batches},
        "initial_loss": {"bf16": bf16["losses"][0], "fp8": fp8["losses"][0], "ln_vocab": math.log(shape.vocab_size)},
        "loss_floor": floor,
        "relative_gap_train": rel_train,
        "relative_gap_eval": rel_eval,
        "deepseek_v3_threshold": DEEPSEEK_V3_REL_LOSS_GAP,
        "within_deepseek_threshold": abs(rel_eval) < DEEPSEEK_V3_REL_LOSS_GAP,
        "control": ctrl,
        "noise_exceeds_threshold": None if ctrl is None else abs(ctrl["relative_gap_eval"]) >= DEEPSEEK_V3_REL_LOSS_GAP,
        "step_time_s_median": {"bf16": bf16["step_time_s_median"], "fp8_emulated": fp8["step_time_s_median"]},
        "wall_s": wall_s,
        "losses": {"bf16": bf16["losses"], "fp8": fp8["losses"],
                   **({"bf16_control": control["losses"]} if control is not None else {})},
        "swap_report": fp8["swap_report"],
        "env": capture_env(2, "gloo", config),
    }


def plot(summary: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b, f = summary["losses"]["bf16"], summary["losses"]["fp8"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax.plot(b, label="bf16", lw=1.2)
    ax.plot(f, label="FP8 emulated (block 1x128 / 128x128, E4M3)", lw=1.2, alpha=0.85)
    ax.axhline(summary["loss_floor"], color="grey", ls=":", label="loss floor (data entropy)")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (mean of 2 ranks)")
    ax.set_title(f"tiny, ZeRO-2, 2 CPU ranks, {summary['token_budget']:,} tokens")
    ax.legend(fontsize=8)
    c = summary["losses"].get("bf16_control")
    if c:
        ax.plot(c, label="bf16, other weight seed (control)", lw=1, alpha=0.6, color="C2")
        ax.legend(fontsize=8)
        ax2.plot([(y - x) / x * 100 for x, y in zip(b, c)], color="C2", lw=0.8, alpha=0.6,
                 label="control - bf16")
    rel = [(y - x) / x * 100 for x, y in zip(b, f)]
    ax2.plot(rel, color="C3", lw=1, label="fp8 - bf16")
    ax2.legend(fontsize=8)
    for s in (1, -1):
        ax2.axhline(s * summary["deepseek_v3_threshold"] * 100, color="k", ls="--", lw=0.8)
    ax2.set_xlabel("step")
    ax2.set_ylabel("(fp8 - bf16) / bf16 [%]")
    ax2.set_title(f"eval gap {summary['relative_gap_eval'] * 100:+.3f}% (DeepSeek-V3: |gap| < 0.25%, dashed)")
    fig.tight_layout()
    from dstoolkit.runtime.bench.report import save_figure

    save_figure(fig, path, dpi=110)
    plt.close(fig)


def render_md(summary: dict, png_name: str) -> str:
    """Markdown summary rendered from the JSON result."""
    from dstoolkit.runtime.bench.report import render_markdown_table

    c = summary["config"]
    ctl = summary.get("control")
    lines = [
        "# FP8 (emulated, DeepSeek block recipe) vs bf16: tiny transformer, ZeRO-2, 2 CPU ranks", "",
        f"{summary['token_budget']:,} tokens per arm ({c['steps']} steps x {c['micro']} seq x {c['seq']} tokens x 2 ranks), "
        f"lr {c['lr']} (warm-up {c['warmup']}, cosine to 10%), same weights and data in both arms.",
        f"FP8: {summary['fp8']['format']} everywhere, 1x128 activation tiles, 128x128 weight blocks, "
        f"{len(summary['swap_report']['swapped'])} linears swapped, lm_head kept in bf16.", "",
    ]
    lines += render_markdown_table([
        [f"final train loss (mean of last {summary['final_train_loss']['averaged_over_last_steps']} steps)",
         f"{summary['final_train_loss']['bf16']:.4f}", f"{summary['final_train_loss']['fp8']:.4f}",
         f"{summary['relative_gap_train'] * 100:+.3f}%"],
        [f"held-out eval loss ({summary['eval_loss']['batches']} batches)", f"{summary['eval_loss']['bf16']:.4f}",
         f"{summary['eval_loss']['fp8']:.4f}", f"{summary['relative_gap_eval'] * 100:+.3f}%"],
    ], ("", "bf16", "FP8 emulated", "relative gap"))
    if ctl:
        lines += ["", f"Control: bf16 with another weight seed lands {ctl['relative_gap_eval'] * 100:+.3f}% (eval) / "
                  f"{ctl['relative_gap_train'] * 100:+.3f}% (train) from the bf16 run: this is the run-to-run noise "
                  "at this budget. DeepSeek-V3's criterion (|gap| < 0.25%) is "
                  + ("below that noise, so it cannot be resolved here; the FP8 gap is within noise."
                     if summary["noise_exceeds_threshold"] else "above that noise.")]
    lines += ["", f"Loss floor (entropy of the synthetic data): {summary['loss_floor']:.4f}. "
              f"Median step time bf16 {summary['step_time_s_median']['bf16']:.3f} s, FP8 emulated "
              f"{summary['step_time_s_median']['fp8_emulated']:.3f} s (emulation cost, not FP8 speed).",
              f"Environment: torch {summary['env']['torch']}, deepspeed {summary['env']['deepspeed']}, "
              f"commit {summary['env']['git_commit']}, load average {summary['env']['load_avg']} (shared CPU).", "",
              f"![loss curves]({png_name})", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--micro", type=int, default=4, help="sequences per rank per step")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tail", type=int, default=20, help="final loss = mean of the last N steps")
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--no-control", dest="control", action="store_false",
                   help="skip the bf16 control arm (other weight seed) that measures run-to-run noise")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="output folder")
    p.add_argument("--tag", default="fp8_vs_bf16_tiny_cpu2_202611")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--raw", default=None, help=argparse.SUPPRESS)
    p.add_argument("--render-from", metavar="JSON", help="print the markdown of an existing result JSON (its PNG "
                   "named after it) and exit; nothing is run or written")
    args = p.parse_args(argv)
    if args.render_from:
        src = pathlib.Path(args.render_from)
        sys.stdout.write(render_md(json.loads(src.read_text()), src.with_suffix(".png").name))
        return 0
    if args.worker:
        worker(args)
        return 0

    from dstoolkit.runtime.bench.harness import free_port

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    raw = out / f".{args.tag}.raw.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(pathlib.Path(__file__).resolve()), "--worker", "--raw", str(raw)]
    for k in ("model", "steps", "micro", "seq", "lr", "warmup", "seed", "tail"):
        cmd += [f"--{k}", str(getattr(args, k))]
    cmd += ["--eval-batches", str(args.eval_batches)] + ([] if args.control else ["--no-control"])
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    t0 = time.time()
    proc = subprocess.run(cmd, env=env)
    if proc.returncode != 0:
        print(f"fp8_vs_bf16: worker launch failed with exit code {proc.returncode}", file=sys.stderr)
        return 1
    summary = summarize(json.loads(raw.read_text()), args, time.time() - t0)
    raw.unlink()
    json_path, png_path = out / f"{args.tag}.json", out / f"{args.tag}.png"
    from dstoolkit.runtime.bench.report import write_json, write_report

    write_json(json_path, summary)
    plot(summary, png_path)
    write_report(out / f"{args.tag}.md", render_md(summary, png_path.name))
    print(f"final train loss  bf16 {summary['final_train_loss']['bf16']:.4f}  fp8 {summary['final_train_loss']['fp8']:.4f}"
          f"  relative gap {summary['relative_gap_train'] * 100:+.3f}%")
    print(f"held-out eval     bf16 {summary['eval_loss']['bf16']:.4f}  fp8 {summary['eval_loss']['fp8']:.4f}"
          f"  relative gap {summary['relative_gap_eval'] * 100:+.3f}%  (DeepSeek-V3: < 0.25%)")
    if summary["control"]:
        print(f"control (bf16, other seed): eval relative gap {summary['control']['relative_gap_eval'] * 100:+.3f}%"
              " = run-to-run noise at this budget")
    print(f"loss floor {summary['loss_floor']:.4f}; {summary['token_budget']:,} tokens per arm; wrote {json_path}, {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

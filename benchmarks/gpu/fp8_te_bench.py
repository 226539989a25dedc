"""te.Linear FP8 vs nn.Linear bf16 throughput (4096^2, 8192^2) and TE vs emulation numerics, on one GPU.

Ready for when a GPU is lent; sized to finish in well under 5 minutes on an H100/H200 (about 1-2 min):

    python benchmarks/gpu/fp8_te_bench.py                      # writes benchmarks/results/fp8_te_<gpu>_<yyyymm>.jsonl/.md
    python benchmarks/gpu/fp8_te_bench.py --iters 20 --out /tmp  # quicker

Throughput: forward + backward of one linear layer (x: M x K, W: N x K, M = --tokens) per recipe, timed with
CUDA events after warm-up; median and spread over --repeats groups of --iters iterations; TFLOP/s counts
the 3 GEMMs (6*M*N*K). Recipes that the GPU/CUDA cannot run are recorded as skipped with TE's reason.

Numerics: for the same inputs and weights, relative error of TE FP8 and of dstoolkit's emulation against
bf16, and the TE-vs-emulation difference (fprop output, dgrad and wgrad). Emulation runs on the GPU here;
it reproduces FP8 rounding and scaling, not FP8 speed.

The results calibrate `dstoolkit.fp8.plan` (GEMM_LAUNCH_S, FP8_FIXED_OVERHEAD_S, the speed classes).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import pathlib
import statistics
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

SIZES = (4096, 8192)
"""Square weights K = N from the task: 4096^2 and 8192^2."""
RECIPES = ("delayed", "current", "block", "mxfp8")


def _time_fwd_bwd(mod, x, iters: int, repeats: int, ctx_factory) -> list[float]:
    import torch

    grad = torch.randn(x.shape[0], mod.weight.shape[0] if hasattr(mod, "weight") else x.shape[1],
                       device=x.device, dtype=x.dtype)
    for _ in range(5):  # warm-up (delayed scaling also fills its amax history)
        with ctx_factory():
            y = mod(x)
        y.backward(grad)
    torch.cuda.synchronize()
    per_iter = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            with ctx_factory():
                y = mod(x)
            y.backward(grad)
        end.record()
        torch.cuda.synchronize()
        per_iter.append(start.elapsed_time(end) / 1e3 / iters)
    return per_iter


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def run(args) -> list[dict]:
    import contextlib

    import torch

    from dstoolkit.runtime.bench.harness import capture_env
    from dstoolkit.runtime.fp8 import Fp8Converter
    from dstoolkit.fp8.recipes import Fp8BackendUnavailable
    from dstoolkit.dsconfig.fp8 import Fp8Config

    if not torch.cuda.is_available():
        print("fp8_te_bench: no CUDA GPU here; this script needs one (and transformer-engine)", file=sys.stderr)
        sys.exit(2)
    env = capture_env(1, None, vars(args))
    records = []
    m = args.tokens
    for size in SIZES:
        k = n = size
        torch.manual_seed(0)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        base = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
        t_bf16 = _time_fwd_bwd(base, x, args.iters, args.repeats, contextlib.nullcontext)
        flops = 6.0 * m * n * k
        med_bf16 = statistics.median(t_bf16)
        records.append({"bench": "fp8_te", "kind": "throughput", "impl": "nn.Linear bf16", "M": m, "N": n, "K": k,
                        "time_s_median": med_bf16, "time_s_min": min(t_bf16), "time_s_max": max(t_bf16),
                        "tflops": flops / med_bf16 / 1e12, "samples_s": t_bf16, "env": env})
        for recipe in RECIPES:
            cfg = Fp8Config(recipe=recipe, format="hybrid" if recipe in ("delayed", "current") else "e4m3")
            try:
                conv = Fp8Converter(cfg, backend="te")
            except Fp8BackendUnavailable as exc:
                records.append({"bench": "fp8_te", "kind": "throughput", "impl": f"te.Linear {recipe}", "M": m,
                                "N": n, "K": k, "skipped": str(exc), "env": env})
                continue
            te_lin = conv._te.linear(base)
            t = _time_fwd_bwd(te_lin, x, args.iters, args.repeats, conv.autocast)
            med = statistics.median(t)
            records.append({"bench": "fp8_te", "kind": "throughput", "impl": f"te.Linear {recipe}", "M": m, "N": n,
                            "K": k, "time_s_median": med, "time_s_min": min(t), "time_s_max": max(t),
                            "tflops": flops / med / 1e12, "speedup_vs_bf16": med_bf16 / med, "samples_s": t,
                            "env": env})
            if size != SIZES[0]:
                continue
            # Numerics on the smaller size: TE vs emulation vs bf16, fprop and both backward GEMMs.
            emu = torch.nn.Sequential(torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16))
            with torch.no_grad():
                emu[0].weight.copy_(base.weight)
            Fp8Converter(cfg, backend="emulated").convert(emu)
            xs = x.detach()[: args.numerics_tokens].clone()
            g = torch.randn(xs.shape[0], n, device="cuda", dtype=torch.bfloat16)
            outs = {}
            for name, mod, ctx in (("bf16", base, contextlib.nullcontext), ("te", te_lin, conv.autocast),
                                   ("emulated", emu, contextlib.nullcontext)):
                xi = xs.clone().requires_grad_(True)
                w = mod.weight if hasattr(mod, "weight") else mod[0].weight
                w.grad = None
                for _ in range(2):  # delayed: the second pass uses real scales
                    xi.grad = None
                    w.grad = None
                    with ctx():
                        y = mod(xi)
                    y.backward(g)
                outs[name] = (y.detach(), xi.grad.detach(), w.grad.detach())
            rec = {"bench": "fp8_te", "kind": "numerics", "recipe": recipe, "M": xs.shape[0], "N": n, "K": k,
                   "env": env}
            for i, part in enumerate(("fprop", "dgrad", "wgrad")):
                rec[f"{part}_rel_err_te_vs_bf16"] = _rel(outs["te"][i], outs["bf16"][i])
                rec[f"{part}_rel_err_emulated_vs_bf16"] = _rel(outs["emulated"][i], outs["bf16"][i])
                rec[f"{part}_rel_diff_te_vs_emulated"] = _rel(outs["te"][i], outs["emulated"][i])
            records.append(rec)
            del te_lin, emu
            torch.cuda.empty_cache()
    return records


def render_md(records: list[dict]) -> str:
    env = records[0]["env"]
    lines = [f"# te.Linear FP8 vs nn.Linear bf16 on {env.get('gpu_model')}",
             "", f"torch {env.get('torch')}, transformer-engine {env.get('transformer_engine')}, CUDA {env.get('cuda')}, "
             f"commit {env.get('git_commit')}, {env.get('timestamp_utc')}", "",
             "| impl | M | N=K | median ms | TFLOP/s (6MNK) | speedup vs bf16 |", "|---|---|---|---|---|---|"]
    for r in records:
        if r["kind"] != "throughput":
            continue
        if "skipped" in r:
            lines.append(f"| {r['impl']} | {r['M']} | {r['N']} | skipped: {r['skipped']} | | |")
            continue
        sp = f"{r['speedup_vs_bf16']:.2f}x" if "speedup_vs_bf16" in r else "1.00x"
        lines.append(f"| {r['impl']} | {r['M']} | {r['N']} | {r['time_s_median'] * 1e3:.3f} | {r['tflops']:.0f} | {sp} |")
    lines += ["", "| recipe | GEMM | rel err TE vs bf16 | rel err emulated vs bf16 | TE vs emulated |", "|---|---|---|---|---|"]
    for r in records:
        if r["kind"] != "numerics":
            continue
        for part in ("fprop", "dgrad", "wgrad"):
            lines.append(f"| {r['recipe']} | {part} | {r[f'{part}_rel_err_te_vs_bf16']:.4f} | "
                         f"{r[f'{part}_rel_err_emulated_vs_bf16']:.4f} | {r[f'{part}_rel_diff_te_vs_emulated']:.4f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=8192, help="M: rows of x (tokens per micro-batch)")
    p.add_argument("--iters", type=int, default=50, help="iterations per timed group")
    p.add_argument("--repeats", type=int, default=5, help="timed groups (median and spread over these)")
    p.add_argument("--numerics-tokens", type=int, default=2048, help="rows used for the numerics comparison")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = p.parse_args(argv)
    records = run(args)
    gpu = (records[0]["env"].get("gpu_model") or "gpu").replace(" ", "-").replace("/", "-").lower()
    stem = pathlib.Path(args.out) / f"fp8_te_{gpu}_{dt.date.today():%Y%m}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{stem}.jsonl", "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    md = render_md(records)
    pathlib.Path(f"{stem}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Host (CPU-side) seconds a training step spends per transformer block and per micro step, with tensors so small
that the kernels themselves take no time: what the GPU waits for when its own work per block is shorter.

Why (issue 24): on a GPU the host issues every kernel of a block from Python (module calls, autograd, the
dispatcher) and the GPU runs them asynchronously. While a block's GPU work outlasts its host work, the host runs
ahead and costs nothing; for small models at small micro batches it does not, and the step takes the host's
time. The estimator's GPU path (estimate.host_cost.host_layer_s) takes that floor from the figures measured
here:

* per block of a Hugging Face causal LM (LlamaForCausalLM, GPT2LMHeadModel; sdpa attention; fp32; batch 1 x 16
  tokens, hidden 64): the ATen ops forward + backward dispatches (counted with a TorchDispatchMode; views and
  other metadata-only ops counted apart, they launch no kernel), the host seconds per block (least squares over
  models of LAYERS blocks; the intercept is the embedding, LM head and loss), and those seconds per kernel the
  estimator counts for the block (`host_cost.layer_kernels`);
* per block and per micro step of a DeepSpeed engine (ZeRO 0-3, bf16, gradient clipping, torch AdamW, one gloo
  rank): the host seconds of a micro step that is not an accumulation boundary beyond the plain bf16 forward +
  backward, per block and per parameter tensor (ZeRO-2's gradient hooks, ZeRO-3's per-module gather and release),
  and the host seconds the optimizer step adds at a boundary (gradient norm, clipping, update, all-gather).

* with --recompute only: the same blocks plain and under torch.utils.checkpoint (reentrant), and the host time the
  checkpoint machinery adds over the plain block as a fraction of it (`host_cost.HOST_RECOMPUTE_REPLAY`).

One thread, minimum of REPS calls after warm-ups (a busy machine only lengthens a call). The host of a GPU job
also pays the CUDA launch call per kernel, which this CPU run does not (the estimator adds it per ATen op:
`host_cost.HOST_ATEN_OPS_PER_KERNEL`, from this file's op counts).

    python benchmarks/host_overhead.py [--out DIR] [--tag YYYYMM]
    python benchmarks/host_overhead.py --recompute [--tag YYYYMM]   # ~20 s

Outputs benchmarks/results/host_overhead_cpu_<tag>.{json,md}; with --recompute host_recompute_cpu_<tag>.{json,md}.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from dstoolkit.runtime.bench.harness import capture_env  # noqa: E402
from dstoolkit.runtime.bench.report import env_brief, render_markdown_table, write_json, write_report  # noqa: E402

REPS = 60
WARMUP = 5
LAYERS = (2, 6, 10)
TOKENS = 16
FAMILIES = {
    "llama": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64},
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "vocab_size": 128, "n_positions": 64,
             "bos_token_id": 0, "eos_token_id": 0},
}
METADATA_OPS = {"view", "_unsafe_view", "t", "transpose", "expand", "permute", "split", "split_with_sizes", "slice",
                "select", "unsqueeze", "squeeze", "detach", "alias", "as_strided", "unbind", "reshape",
                "_reshape_alias", "lift_fresh", "empty", "empty_like", "empty_strided", "new_empty_strided"}
"""ATen ops that only make a tensor header (or an uninitialised buffer): no kernel runs for them on a GPU."""


def _model(family: str, layers: int):
    import transformers

    cfg = dict(FAMILIES[family])
    model_type = cfg.pop("model_type")
    key = "n_layer" if model_type == "gpt2" else "num_hidden_layers"
    conf = transformers.AutoConfig.for_model(model_type, **cfg, **{key: layers})
    conf._attn_implementation = "sdpa"
    transformers.logging.set_verbosity_error()
    return transformers.AutoModelForCausalLM.from_config(conf)


def _min_s(fn, reps: int = REPS) -> float:
    for _ in range(WARMUP):
        fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _count_ops(fn) -> tuple[int, int]:
    """(kernel ops, metadata ops) that one call of fn dispatches to ATen."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        kernels = 0
        metadata = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__.rstrip("_")
            if name in METADATA_OPS:
                Count.metadata += 1
            else:
                Count.kernels += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.kernels, Count.metadata


def _fit(ys: dict[int, float]) -> tuple[float, float]:
    """(per block, fixed): least squares of seconds against blocks over LAYERS."""
    xs = list(LAYERS)
    mx = sum(xs) / len(xs)
    my = sum(ys[x] for x in xs) / len(xs)
    slope = sum((x - mx) * (ys[x] - my) for x in xs) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def _slope(ys: dict[int, float]) -> float:
    return _fit(ys)[0]


def counted_kernels(family: str) -> int:
    """The estimator's kernels per block for this family (no recompute): `host_cost.layer_kernels`."""
    from dstoolkit.estimate import host_cost as hc
    from dstoolkit.hardware.table import get_gpu
    from dstoolkit.models.hf import shape_from_hf_dict
    from dstoolkit.runplan import RunPlan

    cfg = dict(FAMILIES[family])
    cfg["n_layer" if family == "gpt2" else "num_hidden_layers"] = 2
    shape = shape_from_hf_dict(cfg)
    plan = RunPlan(shape=shape, ds_config={"train_micro_batch_size_per_gpu": 1}, world_size=1, gpus_per_node=1,
                   gpu=get_gpu("H100-SXM"), seq_len=TOKENS, precision="bf16", attention_impl="sdpa")
    return hc.layer_kernels(plan, 0)


def measure_family(family: str) -> dict:
    import torch

    x = torch.randint(0, 128, (1, TOKENS))
    per: dict[int, tuple[float, int, int]] = {}
    params_per_layer = 0
    for n in LAYERS:
        model = _model(family, n)

        def fb() -> None:
            model(input_ids=x, labels=x).loss.backward()

        kernels, metadata = _count_ops(fb)
        per[n] = (_min_s(fb), kernels, metadata)
        params_per_layer = sum(1 for name, _ in model.named_parameters() if ".0." in name or ".h.0." in name)
    host, outside = _fit({n: v[0] for n, v in per.items()})
    kernels = _slope({n: v[1] for n, v in per.items()})
    counted = counted_kernels(family)
    return {"family": family, "host_s_per_layer": host, "host_s_outside_blocks": outside,
            "aten_kernel_ops_per_layer": kernels,
            "aten_metadata_ops_per_layer": _slope({n: v[2] for n, v in per.items()}),
            "host_s_per_aten_kernel_op": host / kernels, "estimator_kernels_per_layer": counted,
            "host_s_per_estimator_kernel": host / counted, "param_tensors_per_layer": params_per_layer}


def measure_recompute(family: str) -> dict:
    """Host seconds per block of the family's forward + backward, plain and with every block under
    torch.utils.checkpoint (reentrant, as Megatron's CheckpointFunction and DeepSpeed's activation checkpointing
    run it): the replay's share over the plain block (`host_cost.HOST_RECOMPUTE_REPLAY`)."""
    import torch

    x = torch.randint(0, 128, (1, TOKENS))
    per: dict[bool, float] = {}
    for ckpt in (False, True):
        ys = {}
        for n in LAYERS:
            model = _model(family, n)
            model.train()
            if ckpt:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})

            def fb() -> None:
                model(input_ids=x, labels=x).loss.backward()

            ys[n] = _min_s(fb)
        per[ckpt] = _slope(ys)
    return {"family": family, "host_s_per_layer": per[False], "host_s_per_layer_recomputed": per[True],
            "recompute_replay": per[True] / per[False] - 1.0}


def recompute_constants(doc: dict) -> dict:
    """HOST_RECOMPUTE_REPLAY from a recompute result: the mean over the families, to 0.01. tests/unit/
    test_cluster_physics.py holds the shipped one to the committed result."""
    return {"HOST_RECOMPUTE_REPLAY": round(_mean(b["recompute_replay"] for b in doc["recompute"]), 2)}


def _engine(family: str, layers: int, stage: int, accum: int):
    import deepspeed

    model = _model(family, layers)
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": accum, "gradient_clipping": 1.0,
           "bf16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
           "zero_optimization": {"stage": stage}, "steps_per_print": 10 ** 9}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=cfg)
    return engine


def measure_engine(family: str) -> list[dict]:
    """DeepSpeed engine (bf16, gradient clipping 1.0, torch AdamW) per ZeRO stage: a micro step that is not a
    gradient-accumulation boundary against the plain bf16 forward + backward, and a boundary micro step (the
    optimizer step: gradient norm, clipping, the update, ZeRO's all-gather) against a non-boundary one."""
    import torch

    x = torch.randint(0, 128, (1, TOKENS))
    rows = []
    plain: dict[int, float] = {}
    for n in LAYERS:
        model = _model(family, n).to(torch.bfloat16)
        plain[n] = _min_s(lambda: model(input_ids=x, labels=x).loss.backward())
    for stage in (0, 1, 2, 3):
        micro: dict[int, float] = {}
        step: dict[int, float] = {}
        for n in LAYERS:
            for accum, into in ((10 ** 6, micro), (1, step)):
                engine = _engine(family, n, stage, accum)

                def one() -> None:
                    loss = engine(input_ids=x, labels=x).loss
                    engine.backward(loss)
                    engine.step()

                into[n] = _min_s(one)
        extra_layer, fixed = _fit({n: micro[n] - plain[n] for n in LAYERS})
        step_layer, step_fixed = _fit({n: step[n] - micro[n] for n in LAYERS})
        rows.append({"family": family, "zero_stage": stage, "extra_host_s_per_layer": extra_layer,
                     "extra_host_s_per_micro_step": fixed, "optimizer_step_host_s_per_layer": step_layer,
                     "optimizer_step_host_s_fixed": step_fixed})
    return rows


def _median_row(rows: list[dict]) -> dict:
    """One row from the same row of several runs: each number the median over the runs (the runs kept apart in
    `per_run`). The engine rows of one run swing by 1-3 ms per call between runs on a shared 2-core VM."""
    import statistics

    out = {k: (statistics.median(r[k] for r in rows) if isinstance(v, float) else v) for k, v in rows[0].items()}
    out["per_run"] = [{k: v for k, v in r.items() if isinstance(v, float)} for r in rows]
    return out


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


def constants(doc: dict) -> dict:
    """The estimator's host constants (estimate.cluster_model) from a result: each the mean over the families,
    negative means (noise around 0) as 0; seconds per kernel to 1 us, per parameter tensor to 10 us, per micro
    step and per optimizer step to 0.1 ms. tests/unit/test_cluster_physics.py holds the shipped ones to the
    committed result."""
    blocks, eng = doc["blocks"], doc["engine"]

    def r(x: float, q: float) -> float:
        return round(max(0.0, x) / q) * q

    stages = sorted({e["zero_stage"] for e in eng})

    def per_stage(key: str, q: float, extra: float = 0.0) -> dict[int, float]:
        return {z: round(r(_mean(e[key] for e in eng if e["zero_stage"] == z) + extra, q), 7) for z in stages}

    outside = _mean(b["host_s_outside_blocks"] for b in blocks)
    return {
        "HOST_S_PER_KERNEL": round(r(_mean(b["host_s_per_estimator_kernel"] for b in blocks), 1e-6), 7),
        "HOST_ATEN_OPS_PER_KERNEL": round(_mean(b["aten_kernel_ops_per_layer"] / b["estimator_kernels_per_layer"]
                                                for b in blocks), 1),
        "HOST_S_PER_PARAM_TENSOR": per_stage("extra_host_s_per_param_tensor", 1e-5),
        "HOST_S_PER_MICRO_STEP": per_stage("extra_host_s_per_micro_step", 1e-4, outside),
        "HOST_S_PER_STEP": per_stage("optimizer_step_host_s_fixed", 1e-4),
        "HOST_S_PER_STEP_PER_PARAM_TENSOR": per_stage("optimizer_step_host_s_per_param_tensor", 1e-5),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--tag", default=_dt.date.today().strftime("%Y%m"))
    ap.add_argument("--runs", type=int, default=3, help="repeat every measurement; the report takes medians")
    ap.add_argument("--recompute", action="store_true",
                    help="only the recompute replay (host_recompute_cpu_<tag>.{json,md}), ~20 s")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    if args.recompute:
        return main_recompute(args)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29631")
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    env = capture_env(1, "gloo")
    load_before = os.getloadavg()
    runs = [([measure_family(f) for f in FAMILIES], [r for f in FAMILIES for r in measure_engine(f)])
            for _ in range(args.runs)]
    blocks = [_median_row([run[0][i] for run in runs]) for i in range(len(runs[0][0]))]
    engines = [_median_row([run[1][i] for run in runs]) for i in range(len(runs[0][1]))]
    for r in engines:
        p = next(b["param_tensors_per_layer"] for b in blocks if b["family"] == r["family"])
        r["extra_host_s_per_param_tensor"] = r["extra_host_s_per_layer"] / p
        r["optimizer_step_host_s_per_param_tensor"] = r["optimizer_step_host_s_per_layer"] / p
    doc = {"env": env, "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "tokens": TOKENS,
           "layers": list(LAYERS), "reps": REPS, "runs": args.runs, "blocks": blocks, "engine": engines,
           "measured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    out = pathlib.Path(args.out)
    write_json(out / f"host_overhead_cpu_{args.tag}.json", doc)
    lines = ["# Host seconds per block and per micro step (tiny tensors: the kernels take no time)", "",
             f"{env_brief(env)}; {doc['measured_at']}.",
             f"loadavg before {tuple(round(v, 2) for v in load_before)}, after "
             f"{tuple(round(v, 2) for v in doc['loadavg_after'])}.", "",
             f"`benchmarks/host_overhead.py`: one thread, batch 1 x {TOKENS} tokens, hidden 64, minimum of "
             f"{REPS} calls, median of {args.runs} runs; per block and fixed = least squares over {', '.join(map(str, LAYERS))}-block models. "
             "The estimator's GPU path uses the per-estimator-kernel figure as the host floor of a block "
             "(`estimate.host_cost.HOST_S_PER_KERNEL`) and the ZeRO rows as the engine's extra host work "
             "(`estimate.host_cost.HOST_S_PER_PARAM_TENSOR`, `HOST_S_PER_MICRO_STEP`, `HOST_S_PER_STEP*`).", "", "## Hugging Face blocks, forward + backward", ""]
    lines += render_markdown_table(
        [[b["family"], f"{b['host_s_per_layer'] * 1e6:.0f}", f"{b['aten_kernel_ops_per_layer']:.0f}",
          f"{b['aten_metadata_ops_per_layer']:.0f}", f"{b['host_s_per_aten_kernel_op'] * 1e6:.1f}",
          b["estimator_kernels_per_layer"], f"{b['host_s_per_estimator_kernel'] * 1e6:.1f}",
          b["param_tensors_per_layer"]] for b in blocks],
        ["family", ("host µs per block", "r"), ("ATen kernel ops", "r"), ("metadata ops", "r"),
         ("µs per ATen kernel op", "r"), ("estimator kernels", "r"), ("µs per estimator kernel", "r"),
         ("param tensors", "r")])
    lines += ["", "## DeepSpeed engine micro step beyond forward + backward", ""]
    lines += render_markdown_table(
        [[r["family"], r["zero_stage"], f"{r['extra_host_s_per_layer'] * 1e6:.0f}",
          f"{r['extra_host_s_per_param_tensor'] * 1e6:.1f}", f"{r['extra_host_s_per_micro_step'] * 1e6:.0f}",
          f"{r['optimizer_step_host_s_per_param_tensor'] * 1e6:.1f}", f"{r['optimizer_step_host_s_fixed'] * 1e6:.0f}"]
         for r in engines],
        ["family", ("ZeRO", "r"), ("micro step: extra µs per block", "r"), ("µs per param tensor", "r"),
         ("µs per micro step", "r"), ("optimizer step: µs per param tensor", "r"), ("µs fixed", "r")])
    lines += ["", "## The estimator's constants from this run (mean over the families; `constants()`)", ""]
    lines += render_markdown_table([[k, v if isinstance(v, float) else ", ".join(f"ZeRO {z}: {x:g}" for z, x in v.items())]
                                    for k, v in constants(doc).items()], ["estimate.cluster_model", "seconds"])
    write_report(out / f"host_overhead_cpu_{args.tag}.md", lines)
    print("\n".join(lines))
    return 0


def main_recompute(args) -> int:
    env = capture_env(1, "cpu")
    load_before = os.getloadavg()
    rows = [_median_row([measure_recompute(f) for _ in range(args.runs)]) for f in FAMILIES]
    doc = {"env": env, "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "tokens": TOKENS,
           "layers": list(LAYERS), "reps": REPS, "runs": args.runs, "recompute": rows,
           "measured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    out = pathlib.Path(args.out)
    write_json(out / f"host_recompute_cpu_{args.tag}.json", doc)
    lines = ["# Host seconds of a recomputed block (torch.utils.checkpoint) against a plain one", "",
             f"{env_brief(env)}; {doc['measured_at']}.", "",
             f"`benchmarks/host_overhead.py --recompute`: one thread, batch 1 x {TOKENS} tokens, hidden 64, train mode "
             f"(dropout on), minimum of {REPS} calls, median of {args.runs} runs; per block = least squares over "
             f"{', '.join(map(str, LAYERS))}-block models. The CPU's speed moves both columns together (this VM "
             "measured a plain GPT-2 block at 666 and at 1158 µs on two days); the estimator takes only their "
             "ratio (`estimate.host_cost.HOST_RECOMPUTE_REPLAY`).", ""]
    lines += render_markdown_table(
        [[b["family"], f"{b['host_s_per_layer'] * 1e6:.0f}", f"{b['host_s_per_layer_recomputed'] * 1e6:.0f}",
          f"{b['recompute_replay']:.2f}"] for b in rows],
        ["family", ("plain µs per block", "r"), ("recomputed µs per block", "r"), ("replay / plain", "r")])
    lines += ["", "## The estimator's constant from this run (`recompute_constants()`)", ""]
    lines += render_markdown_table([[k, f"{v:g}"] for k, v in recompute_constants(doc).items()],
                                   ["estimate.cluster_model", "value"])
    write_report(out / f"host_recompute_cpu_{args.tag}.md", lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

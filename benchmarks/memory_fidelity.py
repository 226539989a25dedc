#!/usr/bin/env python
"""Memory fidelity: dstoolkit.estimate vs what real DeepSpeed engines allocate, on 2 gloo ranks.

For each cell (ZeRO stage x precision x optimizer offload x MoE ep x checkpoint policy) a real DeepSpeed
0.19.8 engine trains a small transformer (`dstoolkit.runtime.model`) for 2 steps. Measured per rank:

* model states *during the inner optimizer step of step 2* (optimizer state exists by then: it is created
  lazily in step 1): the bytes of every distinct tensor storage that holds parameters (module params and
  stage-3 `ds_tensor` partitions), fp32 master weights (the inner optimizer's params), optimizer state
  (`optimizer.state`), gradients (`.grad` of both) and any other tensor the DeepSpeed engine / ZeRO
  optimizer objects hold (gradient partitions, buckets, offload staging buffers). Storages are
  de-duplicated by data pointer, so a flat buffer and its views count once.
* activations: bytes autograd saves in one forward, with `torch.autograd.graph.saved_tensors_hooks`
  (distinct storages, parameters excluded), for none / full / every-k / selective recompute. Recompute uses
  DeepSpeed's own (reentrant) `deepspeed.checkpointing.checkpoint`, which saves each block input through
  `save_for_backward`, so the hook sees what a checkpoint keeps.

The estimate is computed in the same process for the same rank (exact ZeRO partition boundaries).
On this CPU machine device and host are the same RAM, so offloaded states are compared as device + host.

Usage:
    python benchmarks/memory_fidelity.py                      # full grid, writes benchmarks/results/memory_fidelity_cpu_<yyyymm>.{json,md}
    python benchmarks/memory_fidelity.py --grid quick --out DIR   # the few cells the dist test checks
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from dstoolkit.runtime.bench.harness import capture_env, run_rank_cells  # noqa: E402
from dstoolkit.runtime.bench.report import env_brief, render_markdown_table, write_json, write_report  # noqa: E402

MODEL_STATE_GOAL = 0.02
"""Issue #4 goal: model states within 2% per cell."""
ACTIVATION_GOAL = 0.10
"""Issue #4 goal: activations within 10%."""
SEQ_LEN = 64
MICRO_BATCH = 2
REDUCE_BUCKET = 500_000
"""Elements; DeepSpeed's 5e8 default would make the buckets (transient) dwarf this small model."""

DENSE = dict(name="fidelity-dense", model_type="llama", hidden_size=384, num_hidden_layers=4,
             num_attention_heads=6, num_key_value_heads=2, intermediate_size=1024, vocab_size=4096)
"""~9.4M params: matrices 49k-1.6M elements, so buckets and persistence thresholds are not everything."""
MOE = dict(name="fidelity-moe", model_type="mixtral", hidden_size=256, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, intermediate_size=512, vocab_size=4096,
           num_experts=4, num_experts_per_tok=2)


def _cell(name, *, stage, prec, offload=False, moe=False, ep=1, ckpt="none", every_k=1, fused=False,
          grad_accum_fp32=False, act=False):
    return dict(name=name, stage=stage, prec=prec, offload=offload, moe=moe, ep=ep, ckpt=ckpt, every_k=every_k,
                fused=fused, grad_accum_fp32=grad_accum_fp32, act=act)


def grid(kind: str) -> list[dict]:
    cells = []
    if kind == "quick":
        return [
            _cell("z2-bf16", stage=2, prec="bf16", act=True),
            _cell("z3-bf16", stage=3, prec="bf16"),
            _cell("z1-fp32-offload", stage=1, prec="fp32", offload=True),
            _cell("z0-bf16-ckpt-full", stage=0, prec="bf16", ckpt="full", act=True),
            _cell("moe-z2-bf16-ep2", stage=2, prec="bf16", moe=True, ep=2),
        ]
    for stage in (0, 1, 2, 3):
        for prec in ("fp32", "bf16"):
            for off in ((False, True) if stage > 0 else (False,)):
                cells.append(_cell(f"z{stage}-{prec}{'-offload' if off else ''}", stage=stage, prec=prec,
                                   offload=off, act=(not off)))
    cells.append(_cell("z0-bf16-fusedadam", stage=0, prec="bf16", fused=True))
    cells.append(_cell("z1-bf16-gradacc-fp32", stage=1, prec="bf16", grad_accum_fp32=True))
    for stage in (0, 1, 2):
        for prec in ("fp32", "bf16"):
            for ep in (1, 2):
                cells.append(_cell(f"moe-z{stage}-{prec}-ep{ep}", stage=stage, prec=prec, moe=True, ep=ep,
                                   act=(stage == 2)))
    cells.append(_cell("moe-z2-bf16-ep2-offload", stage=2, prec="bf16", moe=True, ep=2, offload=True))
    for prec in ("fp32", "bf16"):
        for ck, k in (("full", 1), ("every-k", 2), ("selective", 1)):
            cells.append(_cell(f"z1-{prec}-ckpt-{ck}{k if ck == 'every-k' else ''}", stage=1, prec=prec,
                               ckpt=ck, every_k=k, act=True))
    return cells


def ds_config(cell: dict) -> dict:
    opt_params = {"lr": 1e-3, "weight_decay": 0.0}
    if not cell["offload"] and not cell["fused"]:
        opt_params["torch_adam"] = True  # avoids JIT-building fused_adam; DeepSpeed wraps torch.optim.AdamW
    cfg = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": opt_params},
        "zero_optimization": {"stage": cell["stage"], "reduce_bucket_size": REDUCE_BUCKET,
                              "allgather_bucket_size": REDUCE_BUCKET},
        "steps_per_print": 10_000,
        "wall_clock_breakdown": False,
    }
    if cell["stage"] == 3:
        cfg["zero_optimization"]["stage3_prefetch_bucket_size"] = REDUCE_BUCKET
    if cell["offload"]:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    if cell["prec"] == "bf16":
        cfg["bf16"] = {"enabled": True}
    if cell["grad_accum_fp32"]:
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    return cfg


# ----------------------------------------------------------------------------------------------- worker


def _storage(t):
    try:
        st = t.untyped_storage()
        return st.data_ptr(), st.nbytes()
    except Exception:
        return None


def _walk_tensors(obj, out: list, seen: set, depth: int = 0):
    """Tensors reachable from DeepSpeed engine/optimizer objects (lists, dicts, dataclasses, attributes)."""
    import torch

    if depth > 6 or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        out.append(obj)
        if obj.grad is not None:
            out.append(obj.grad)
        ds_t = getattr(obj, "ds_tensor", None)
        if isinstance(ds_t, torch.Tensor):
            out.append(ds_t)
        return
    if isinstance(obj, torch.nn.Module):
        return  # the model is accounted through its parameters
    if isinstance(obj, dict):
        for k, v in list(obj.items()):
            if isinstance(k, torch.Tensor):
                _walk_tensors(k, out, seen, depth + 1)
            _walk_tensors(v, out, seen, depth + 1)
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for v in list(obj):
            _walk_tensors(v, out, seen, depth + 1)
        return
    mod = type(obj).__module__ or ""
    if (mod.startswith("deepspeed") or mod.startswith("torch.optim")) and hasattr(obj, "__dict__"):
        for v in list(vars(obj).values()):
            _walk_tensors(v, out, seen, depth + 1)


def measure_model_states(engine, module, masters: list) -> dict:
    """Distinct storages by category; each storage is counted once, in the first category that claims it."""
    import torch

    basic = engine.basic_optimizer
    cats: dict[str, list] = {"params": [], "master": [], "optimizer_state": [], "grads": [], "other_ds": []}
    for p in module.parameters():
        cats["params"].append(p)
        if isinstance(getattr(p, "ds_tensor", None), torch.Tensor):
            cats["params"].append(p.ds_tensor)
    # the master list is captured after initialize: ZeRO-1/2 swaps optimizer.param_groups to one group
    # while that group steps (stage_1_and_2.py _optimizer_step)
    for p in masters:
        cats["master"].append(p)
        if p.grad is not None:
            cats["grads"].append(p.grad)
    for st in basic.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                cats["optimizer_state"].append(v)
    for p in module.parameters():
        if p.grad is not None:
            cats["grads"].append(p.grad)
        ga = getattr(p, "grad_accum", None)
        if isinstance(ga, torch.Tensor):
            cats["grads"].append(ga)
    other: list = []
    seen: set = set()
    _walk_tensors(engine.optimizer, other, seen)
    _walk_tensors({k: v for k, v in vars(engine).items() if k not in ("module", "_modules")}, other, seen)
    cats["other_ds"] = other
    claimed: dict[int, str] = {}
    sizes: dict[int, int] = {}
    for cat in ("params", "master", "optimizer_state", "grads", "other_ds"):
        for t in cats[cat]:
            s = _storage(t)
            if s is None or s[0] == 0 or s[0] in claimed:
                continue
            claimed[s[0]] = cat
            sizes[s[0]] = s[1]
    out = {c: 0 for c in cats}
    for ptr, cat in claimed.items():
        out[cat] += sizes[ptr]
    out["total"] = sum(sizes.values())
    return out


def measure_activations(engine, module, ids, labels) -> int:
    import torch

    param_ptrs = set()
    for p in module.parameters():
        s = _storage(p)
        if s:
            param_ptrs.add(s[0])
    seen: dict[int, int] = {}

    def pack(t):
        if isinstance(t, torch.nn.Parameter):
            return t
        s = _storage(t)
        if s and s[0] and s[0] not in param_ptrs and s[0] not in seen:
            seen[s[0]] = s[1]
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = engine(ids, labels)
    engine.backward(loss)
    return sum(seen.values())


def _reentrant_checkpoint(fn, *args):
    import torch.utils.checkpoint

    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=True)


def run_worker(cells: list[dict], out_path: str) -> None:
    import deepspeed
    import torch

    from dstoolkit.estimate import RunPlan, activation_bytes
    from dstoolkit.estimate.memory import deepspeed_model_states
    from dstoolkit.models.shape import ModelShape
    from dstoolkit.runtime.model import MOE_CAPACITY_FACTOR, build_model, moe_param_groups
    from dstoolkit.runtime.synthetic import synthetic_batch
    from dstoolkit.spec.checkpoint import CheckpointPolicy
    from dstoolkit.hardware.table import get_gpu
    from dstoolkit.runtime.train.checkpointing import apply_checkpoint_policy

    torch.set_num_threads(1)
    from dstoolkit.runtime.rankexit import install_exit_guard

    install_exit_guard()  # the groups released before the interpreter exits (dstoolkit/runtime/rankexit.py)
    deepspeed.init_distributed(dist_backend="gloo")
    from dstoolkit.runtime.train.shm import unlink_after_rendezvous

    unlink_after_rendezvous()  # DeepSpeed never removes its CPU all-reduce buffers from /dev/shm
    rank = torch.distributed.get_rank()
    world = torch.distributed.get_world_size()
    results = []
    for cell in cells:
        t0 = time.time()
        shape = ModelShape(**(MOE if cell["moe"] else DENSE))
        if cell["ckpt"] == "every-k":
            policy = CheckpointPolicy(kind="every-k", every_k=cell["every_k"])
        else:
            policy = CheckpointPolicy(kind=cell["ckpt"])
        cfg = ds_config(cell)
        rec = dict(cell=cell, rank=rank, world=world)
        try:
            model = build_model(shape, ep_size=cell["ep"], seed=0)
            if policy.kind != "none":
                apply_checkpoint_policy(model, policy, backend="torch")
                # Reentrant checkpoint keeps each block input through ctx.save_for_backward, which the hook
                # sees. DeepSpeed's checkpoint keeps the same tensor as a ctx attribute (checkpointing.py
                # ctx.deepspeed_saved_tensors) and torch's non-reentrant one in a closure: same bytes, but
                # invisible to saved_tensors_hooks.
                model.checkpoint_fn = _reentrant_checkpoint
            params = moe_param_groups(model) if shape.is_moe else [p for p in model.parameters()]
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=cfg)
            snaps = []
            basic = engine.basic_optimizer
            masters = [p for g in basic.param_groups for p in g["params"]]
            for attr in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups_flat_partition",
                         "fp32_groups_flat", "fp32_groups"):
                for t in getattr(engine.optimizer, attr, None) or []:
                    masters.extend(t if isinstance(t, (list, tuple)) else [t])
            orig_step = basic.step
            state = {"step": 0}

            def wrapped(*a, **k):
                if state["step"] == 1:
                    snaps.append(measure_model_states(engine, engine.module, masters))
                return orig_step(*a, **k)

            basic.step = wrapped
            losses = []
            for step in range(2):
                ids, labels = synthetic_batch(shape, MICRO_BATCH, SEQ_LEN, step=step, rank=rank)
                loss = engine(ids, labels)
                engine.backward(loss)
                state["step"] = step
                engine.step()
                losses.append(float(loss))
            basic.step = orig_step
            if not snaps:
                raise RuntimeError("inner optimizer step was never called in step 2")
            measured = max(snaps, key=lambda d: d["total"])
            act_measured = None
            if cell["act"]:
                ids, labels = synthetic_batch(shape, MICRO_BATCH, SEQ_LEN, step=5, rank=rank)
                act_measured = measure_activations(engine, engine.module, ids, labels)
            plan = RunPlan(shape=shape, ds_config=cfg, world_size=world, gpus_per_node=world, gpu=get_gpu("cpu"),
                           seq_len=SEQ_LEN, ep=cell["ep"], checkpoint=policy, flash_attention=True,
                           precision=cell["prec"], moe_capacity_factor=MOE_CAPACITY_FACTOR)
            ms = deepspeed_model_states(plan, rank=rank)
            act_est = activation_bytes(plan)
            rec.update(
                ok=True,
                losses=losses,
                measured=measured,
                estimate=dict(
                    params=ms.params + ms.host_params,
                    master=ms.master_params + ms.host_master_params,
                    optimizer_state=ms.optimizer_states + ms.host_optimizer_states,
                    grads_and_buffers=ms.grads_at_step + ms.persistent_buffers + ms.host_grads + ms.host_buffers,
                    total=ms.all_at_step,
                    optimizer_path=ms.optimizer_path,
                ),
                activations_measured=act_measured,
                activations_estimate=act_est.saved if cell["act"] else None,
                optimizer_class=type(engine.optimizer).__name__,
                basic_optimizer_class=type(basic).__name__,
            )
            del engine, model, params, basic
        except Exception as exc:  # record and continue with the next cell
            import traceback

            rec.update(ok=False, error=f"{type(exc).__name__}: {exc}", tb=traceback.format_exc()[-2000:])
        gc.collect()
        rec["seconds"] = round(time.time() - t0, 2)
        results.append(rec)
        with open(out_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        torch.distributed.barrier()


# ----------------------------------------------------------------------------------------------- driver


def launch(cells: list[dict], out_dir: pathlib.Path, timeout_s: int = 1800) -> list[dict]:
    """Run the cells on 2 ranks; return the per-rank records.

    Dense cells share one torchrun launch; MoE cells get one launch per expert-parallel size, because
    DeepSpeed keeps process-global MoE state (expert groups): a second MoE model with another ep_size in the
    same process was measured to save different activations than the same model in a fresh process.
    """
    batches: dict[int, list[dict]] = {}
    for c in cells:
        if c["moe"]:
            batches.setdefault(c["ep"], []).append(c)
    dense = [c for c in cells if not c["moe"]]
    if batches:
        first = next(iter(batches))
        batches[first] = dense + batches[first]  # dense models create no expert groups: they can share
    else:
        batches[0] = dense
    recs: list[dict] = []
    for i, batch in enumerate(batches.values()):
        recs += _launch_one(batch, out_dir / f"launch{i}", timeout_s)
    return recs


def _launch_one(cells: list[dict], out_dir: pathlib.Path, timeout_s: int) -> list[dict]:
    return run_rank_cells(pathlib.Path(__file__), cells, out_dir, timeout_s)


def rel_err(est: float, meas: float) -> float:
    return (est - meas) / meas if meas else float("inf")


def summarize(recs: list[dict]) -> dict:
    rows = []
    for r in recs:
        if not r.get("ok"):
            rows.append(dict(cell=r["cell"]["name"], rank=r["rank"], ok=False, error=r.get("error")))
            continue
        m, e = r["measured"], r["estimate"]
        meas_gb = m["grads"] + m["other_ds"]
        row = dict(
            cell=r["cell"]["name"], rank=r["rank"], ok=True, optimizer_class=r["optimizer_class"],
            optimizer_path=e["optimizer_path"],
            measured_total=m["total"], estimate_total=e["total"], err_total=rel_err(e["total"], m["total"]),
            measured_params=m["params"], estimate_params=e["params"], err_params=rel_err(e["params"], m["params"]),
            measured_master_opt=m["master"] + m["optimizer_state"],
            estimate_master_opt=e["master"] + e["optimizer_state"],
            err_master_opt=rel_err(e["master"] + e["optimizer_state"], m["master"] + m["optimizer_state"]),
            measured_grads_buffers=meas_gb, estimate_grads_buffers=e["grads_and_buffers"],
            err_grads_buffers=rel_err(e["grads_and_buffers"], meas_gb) if meas_gb else None,
            loss_first=r["losses"][0], loss_last=r["losses"][-1],
            measured=m, estimate=e,
        )
        if r.get("activations_measured"):
            row.update(measured_activations=r["activations_measured"], estimate_activations=r["activations_estimate"],
                       err_activations=rel_err(r["activations_estimate"], r["activations_measured"]))
        rows.append(row)
    ok = [x for x in rows if x["ok"]]
    worst_ms = max(ok, key=lambda x: abs(x["err_total"]), default=None)
    acts = [x for x in ok if "err_activations" in x]
    worst_act = max(acts, key=lambda x: abs(x["err_activations"]), default=None)
    return dict(
        rows=rows,
        cells=len({x["cell"] for x in rows}),
        failed=[x for x in rows if not x["ok"]],
        worst_model_state_error=(worst_ms["err_total"], worst_ms["cell"], worst_ms["rank"]) if worst_ms else None,
        worst_activation_error=(worst_act["err_activations"], worst_act["cell"], worst_act["rank"]) if worst_act else None,
        model_state_goal=MODEL_STATE_GOAL, activation_goal=ACTIVATION_GOAL,
        cells_over_model_state_goal=sorted({x["cell"] for x in ok if abs(x["err_total"]) > MODEL_STATE_GOAL}),
        cells_over_activation_goal=sorted({x["cell"] for x in acts if abs(x["err_activations"]) > ACTIVATION_GOAL}),
    )


TABLE_COLUMNS = ("cell", "rank", "DeepSpeed optimizer", "measured MiB", "estimate MiB", "error", "params err",
                 "master+opt err", "grads+buffers err", "act measured MiB", "act estimate MiB", "act err")


def render_md(summary: dict, env: dict) -> str:
    def pct(x):
        return "" if x is None else f"{100 * x:+.4f}%"

    def mib(x):
        return f"{x / 2**20:.2f}"

    lines = [
        "# Memory fidelity: dstoolkit.estimate vs real DeepSpeed (2 gloo ranks, CPU)",
        "",
        f"{env_brief(env)}.",
        f"Model states measured inside the inner optimizer step of step 2; activations with saved_tensors_hooks. "
        f"Goals: model states within {MODEL_STATE_GOAL:.0%} per cell, activations within {ACTIVATION_GOAL:.0%}.",
        "",
        f"**Worst model-state error:** {pct(summary['worst_model_state_error'][0]) if summary['worst_model_state_error'] else 'n/a'}"
        f" ({summary['worst_model_state_error'][1] if summary['worst_model_state_error'] else ''}). "
        f"**Worst activation error:** {pct(summary['worst_activation_error'][0]) if summary['worst_activation_error'] else 'n/a'}"
        f" ({summary['worst_activation_error'][1] if summary['worst_activation_error'] else ''}).",
        "",
    ]
    rows = []
    for x in summary["rows"]:
        if not x["ok"]:
            rows.append([x["cell"], x["rank"], f"FAILED: {x['error'][:80]}"])
            continue
        rows.append([x["cell"], x["rank"], x["optimizer_class"], mib(x["measured_total"]), mib(x["estimate_total"]),
                     pct(x["err_total"]), pct(x["err_params"]), pct(x["err_master_opt"]), pct(x["err_grads_buffers"]),
                     mib(x["measured_activations"]) if "measured_activations" in x else "",
                     mib(x["estimate_activations"]) if "estimate_activations" in x else "",
                     pct(x.get("err_activations"))])
    lines += render_markdown_table(rows, TABLE_COLUMNS)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cells-file", help=argparse.SUPPRESS)
    ap.add_argument("--grid", choices=["full", "quick"], default="full")
    ap.add_argument("--out", help="output directory (default benchmarks/results, files memory_fidelity_cpu_<yyyymm>.*)")
    ap.add_argument("--render-from", metavar="JSON", help="print the markdown of an existing result JSON and exit "
                    "(nothing is run or written)")
    args = ap.parse_args(argv)
    if args.render_from:
        summary = json.loads(pathlib.Path(args.render_from).read_text())
        sys.stdout.write(render_md(summary, summary["env"]))
        return 0
    if args.worker:
        rank = int(os.environ.get("RANK", "0"))
        run_worker(json.loads(pathlib.Path(args.cells_file).read_text()), os.path.join(args.out, f"rank{rank}.jsonl"))
        return 0
    cells = grid(args.grid)
    out = pathlib.Path(args.out) if args.out else REPO / "benchmarks" / "results"
    work = out / "_memory_fidelity_work"
    t0 = time.time()
    recs = launch(cells, work)
    summary = summarize(recs)
    env = capture_env(2, "gloo", {"grid": args.grid, "cells": [c["name"] for c in cells]})
    summary["env"] = env
    summary["wall_s"] = round(time.time() - t0, 1)
    stamp = _dt.datetime.utcnow().strftime("%Y%m")
    json_path = out / f"memory_fidelity_cpu_{stamp}.json"
    md_path = out / f"memory_fidelity_cpu_{stamp}.md"
    write_json(json_path, summary)
    write_report(md_path, render_md(summary, env))
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    print(render_md(summary, env))
    print(f"wrote {json_path} and {md_path} in {summary['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Peak memory per rank: the estimator's phase timeline vs real DeepSpeed engines (2 gloo ranks, CPU).

Each cell (model x ZeRO stage x precision x offload x recompute) trains 3 steps with a real DeepSpeed 0.19.8
engine. Step 1 creates the lazy optimizer state; steps 2-3 are measured.

**Continuous (the measured peak).** `dstoolkit.runtime.alloc_tracker` installs a counting wrapper as torch's CPU
allocator (c10::SetCPUAllocator) in each rank before the first cell: every CPU tensor allocation and free, on
every thread (gloo's worker threads included), moves one running count of live bytes, and the wrapper keeps its
maximum and the phase the rank was in when it was reached. torch 2.13 has no CPU allocator statistics of its own
(c10's ProfiledCPUMemoryReporter counts only while the profiler records memory on the allocating thread, and
records nothing with profile_all_threads). The cell's peak is that maximum over steps 2-3 minus the live bytes
before the cell built its model. Phases (tags set around DeepSpeed's calls): ``forward`` (engine(...)),
``backward`` (inside autograd), ``backward_end`` (the rest of engine.backward: DeepSpeed's reduction epilogue,
engine.allreduce_gradients / ZeRO reduce_gradients / independent_gradient_partition_epilogue), ``step``
(engine.step outside what follows: ZeRO's flatten/cast, the updated-partition all-gather, zero_grad),
``grad_norm`` / ``grad_clip`` (ZeRO-1/2 scaled_global_norm, unscale_and_clip_grads / clip_fp32_gradients) and
``optimizer_step`` (the inner torch/DeepSpeed optimizer's step()).

**Sampled (kept for comparison, what this benchmark measured before).** In step 2 every rank takes a census of
its live memory at phase points:

* ``forward_end``: after the loss is computed (all saved activations alive);
* ``backward@<i>``: when the gradient of block i's output arrives (a tensor hook registered in forward), i.e.
  activations of blocks > i freed, gradients / reduce buckets of blocks > i grown;
* ``backward_end``: after ``engine.backward`` returns;
* ``optimizer_step``: inside the inner optimizer's ``step()`` (the same point memory_fidelity.py measures).

A census is the bytes of distinct tensor storages (de-duplicated by data pointer) reachable as: module
parameters (and stage-3 ``ds_tensor`` partitions) and their ``.grad``, the inner optimizer's parameters and
state, every tensor the DeepSpeed engine / ZeRO optimizer objects hold (benchmarks/memory_fidelity.py's walk),
every tensor object the Python garbage collector tracks, and the tensors autograd saved for backward that are
still alive (``torch.autograd.graph.saved_tensors_hooks``; DeepSpeed's checkpoint is replaced by torch's
reentrant one so the block input it keeps goes through ``save_for_backward``). Storages alive before the cell's
engine existed are excluded. It cannot see what lives between two points (the optimizer's temporaries, the
loss's logits copies, DeepSpeed's flattened all-reduce bucket): the continuous peak is up to 24% above it.

The estimate is ``dstoolkit.estimate.estimate_run(plan, rank=rank).memory.timeline`` (device + host: on this
machine both are the same RAM), computed by the driver from the recorded cells, so ``--render-from`` re-scores a
committed JSONL against the current estimator without rerunning DeepSpeed. MEASURED_PHASE_OF says which
measured phase each estimated phase falls in.

Usage:
    python benchmarks/peak_memory.py                  # full grid -> benchmarks/results/peak_memory_cpu_<yyyymm>.{jsonl,md}
    python benchmarks/peak_memory.py --grid quick --out DIR
    python benchmarks/peak_memory.py --render-from benchmarks/results/peak_memory_cpu_202612.jsonl
"""
from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import pathlib
import subprocess
import sys
import time
import weakref

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from dstoolkit.runtime.bench.harness import capture_env, run_rank_cells, run_tracked_cells  # noqa: E402
from dstoolkit.runtime.bench.report import env_brief, render_markdown_table, write_report  # noqa: E402

PEAK_GOAL = 0.05
"""Issue #15 goal: estimated peak within 5% of the measured peak in every cell."""
SEQ_LEN = 128
MICRO_BATCH = 2
REDUCE_BUCKET = 500_000
"""Elements (DeepSpeed's 5e8 default would make the buckets dwarf these models)."""

MODELS = {
    # the project's own model (dstoolkit/runtime/model.py)
    "proj": dict(kind="proj", shape=dict(name="peak-proj", model_type="llama", hidden_size=384,
                                         num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2,
                                         intermediate_size=1024, vocab_size=4096)),
    # transformers models built from a config (no download)
    "llama": dict(kind="hf", config=dict(model_type="llama", hidden_size=256, num_hidden_layers=4,
                                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=688,
                                         vocab_size=4096, max_position_embeddings=512, tie_word_embeddings=False)),
    "mistral": dict(kind="hf", config=dict(model_type="mistral", hidden_size=256, num_hidden_layers=4,
                                           num_attention_heads=8, num_key_value_heads=2, intermediate_size=640,
                                           vocab_size=4096, max_position_embeddings=512, sliding_window=None,
                                           tie_word_embeddings=False)),
}


def _cell(model, stage, prec, offload="none", ckpt="none", acc=None):
    name = f"{model}-z{stage}-{prec}" + ("" if offload == "none" else f"-off_{offload}") + \
        ("" if ckpt == "none" else f"-ckpt_{ckpt}") + ("" if acc is None else f"-acc_{acc}")
    cell = dict(name=name, model=model, stage=stage, prec=prec, offload=offload, ckpt=ckpt)
    if acc is not None:
        cell["acc"] = acc  # data_types.grad_accum_dtype (BF16_OPTIMIZER_CELLS)
    return cell


BF16_OPTIMIZER_CELLS = (("llama", 1), ("proj", 1), ("llama", 2))
"""bf16 with fp32 gradient accumulation: DeepSpeed's BF16_Optimizer at ZeRO 1 (without offload), the ZeRO optimizer at
ZeRO 2. Stage 0 refuses it (rule DS229); stage 0 + bf16 runs BF16_Optimizer only under the pipeline engine, which
this benchmark does not drive."""


def grid(kind: str) -> list[dict]:
    if kind == "dist":  # tests/dist/test_peak_memory.py: two cheap cells whose peaks are two different transients
        return [_cell("llama", 0, "fp32"), _cell("llama", 2, "bf16")]
    if kind == "bf16_optimizer":
        return [_cell(m, z, "bf16", acc="fp32") for m, z in BF16_OPTIMIZER_CELLS]
    if kind == "quick":
        return [_cell("proj", 1, "bf16"), _cell("proj", 3, "bf16", ckpt="full"),
                _cell("llama", 0, "bf16"), _cell("llama", 2, "fp32", offload="optimizer")]
    cells = []
    for model in MODELS:
        full = model == "proj"
        for stage in (0, 1, 2, 3):
            for prec in ("fp32", "bf16"):
                offs = ["none"] + (["optimizer"] if stage > 0 and (full or prec == "bf16") else []) + \
                    (["param"] if stage == 3 and (full or prec == "bf16") else [])
                for off in offs:
                    for ck in ("none", "full"):
                        if ck == "full" and not (off == "none" and (full or prec == "bf16")):
                            continue
                        cells.append(_cell(model, stage, prec, off, ck))
    return cells + grid("bf16_optimizer")


def ds_config(cell: dict) -> dict:
    opt_params = {"lr": 1e-3, "weight_decay": 0.0}
    if cell["offload"] == "none":
        opt_params["torch_adam"] = True  # torch.optim.AdamW inside DeepSpeed (no fused_adam JIT build)
    zero = {"stage": cell["stage"], "reduce_bucket_size": REDUCE_BUCKET, "allgather_bucket_size": REDUCE_BUCKET}
    if cell["stage"] == 3:
        zero["stage3_prefetch_bucket_size"] = REDUCE_BUCKET
    if cell["offload"] in ("optimizer", "param"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    if cell["offload"] == "param":
        zero["offload_param"] = {"device": "cpu", "pin_memory": False}
    cfg = {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": opt_params}, "zero_optimization": zero,
           "steps_per_print": 10_000, "wall_clock_breakdown": False}
    if cell["prec"] == "bf16":
        cfg["bf16"] = {"enabled": True}
    if cell.get("acc"):
        cfg["data_types"] = {"grad_accum_dtype": cell["acc"]}
    return cfg


# ----------------------------------------------------------------------------------------------- worker

STEPS = 3
"""Iterations per cell: 1 creates the optimizer state, 2-3 are the continuous window (2 also the census)."""
SUB_PHASES = (
    # (method of the DeepSpeed optimizer object, phase name while it runs): the parts of engine.step() and of
    # the end of backward that allocate (DeepSpeed 0.19.8 names; a missing method is skipped)
    ("independent_gradient_partition_epilogue", "backward_end"),
    ("scaled_global_norm", "grad_norm"),
    ("unscale_and_clip_grads", "grad_clip"),
    ("clip_fp32_gradients", "grad_clip"),
    ("_optimizer_step", "optimizer_step"),
)


def _tag_methods(tracker, optimizer) -> list:
    """Wrap the optimizer methods of SUB_PHASES so the tracker charges their allocations to their phase."""
    out = []
    for name, phase in SUB_PHASES:
        fn = getattr(optimizer, name, None)
        if not callable(fn):
            continue

        def tagged(*a, _fn=fn, _phase=phase, **k):
            with tracker.phase(_phase):
                return _fn(*a, **k)
        setattr(optimizer, name, tagged)
        out.append((optimizer, name, fn))
    return out


def _inner_optimizer_name(basic) -> str:
    """The inner optimizer and its torch implementation (for-loop / foreach / fused) where it is torch's."""
    name = type(basic).__name__
    d = getattr(basic, "defaults", {}) or {}
    if type(basic).__module__.startswith("torch.optim"):
        impl = "fused" if d.get("fused") else "foreach" if d.get("foreach") else "for-loop"
        return f"{name} ({impl})"
    return name


def _build(cell: dict, torch):
    spec = MODELS[cell["model"]]
    if spec["kind"] == "proj":
        from dstoolkit.models.shape import ModelShape
        from dstoolkit.runtime.model import build_model

        model = build_model(ModelShape(**spec["shape"]), seed=0)
        blocks = list(model.blocks)
        if cell["ckpt"] == "full":
            from dstoolkit.runtime.train.checkpointing import apply_checkpoint_policy
            from dstoolkit.spec.checkpoint import CheckpointPolicy
            import memory_fidelity

            apply_checkpoint_policy(model, CheckpointPolicy(kind="full"), backend="torch")
            model.checkpoint_fn = memory_fidelity._reentrant_checkpoint
        return model, blocks
    import transformers

    cfg = transformers.AutoConfig.for_model(**spec["config"])
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    if cell["ckpt"] == "full":
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})

    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids, labels):
            return self.m(input_ids=ids, labels=labels, use_cache=False).loss

    hf.train()
    return Wrap(hf), list(hf.model.layers)


def _tensor_storages(torch, tensors, out: dict, cat: str, skip: set):
    for t in tensors:
        try:
            st = t.untyped_storage()
            ptr, n = st.data_ptr(), st.nbytes()
        except Exception:
            continue
        if ptr == 0 or n == 0 or ptr in out or ptr in skip:
            continue
        out[ptr] = (cat, n)


def _gc_tensors(torch):
    return [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]


def census(torch, engine, masters, saved: list, skip: set, extra=()) -> dict:
    """Bytes of distinct live storages by category (first category to claim a storage keeps it)."""
    import memory_fidelity

    module = engine.module
    found: dict[int, tuple[str, int]] = {}
    params = []
    grads = []
    for p in module.parameters():
        params.append(p)
        if isinstance(getattr(p, "ds_tensor", None), torch.Tensor):
            params.append(p.ds_tensor)
        if p.grad is not None:
            grads.append(p.grad)
    _tensor_storages(torch, params, found, "params", skip)
    master_t = list(masters)
    _tensor_storages(torch, master_t, found, "master", skip)
    state = [v for st in engine.basic_optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    _tensor_storages(torch, state, found, "optimizer_state", skip)
    grads += [p.grad for p in masters if p.grad is not None]
    _tensor_storages(torch, grads, found, "grads", skip)
    other: list = []
    seen: set = set()
    memory_fidelity._walk_tensors(engine.optimizer, other, seen)
    memory_fidelity._walk_tensors({k: v for k, v in vars(engine).items() if k not in ("module", "_modules")},
                                  other, seen)
    _tensor_storages(torch, other, found, "deepspeed_buffers", skip)
    _tensor_storages(torch, list(extra), found, "step_transients", skip)
    alive = [r() for r in saved]
    _tensor_storages(torch, [t for t in alive if t is not None], found, "saved_activations", skip)
    _tensor_storages(torch, _gc_tensors(torch), found, "other_live", skip)
    out: dict[str, int] = {}
    for cat, n in found.values():
        out[cat] = out.get(cat, 0) + n
    out["total"] = sum(out.values())
    return out


def run_cell(cell: dict, torch, deepspeed, rank: int, tracker) -> dict:
    skip = set()
    gc.collect()
    base_bytes = tracker.live_bytes()  # what this cell did not allocate (earlier cells' leftovers, imports)
    for t in _gc_tensors(torch):
        try:
            skip.add(t.untyped_storage().data_ptr())
        except Exception:
            pass
    model, blocks = _build(cell, torch)
    cfg = ds_config(cell)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters()],
                                           config=cfg)
    basic = engine.basic_optimizer
    masters = [p for g in basic.param_groups for p in g["params"]]
    for attr in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat", "fp32_groups_flat_partition",
                 "fp32_groups_flat", "fp32_groups"):
        for t in getattr(engine.optimizer, attr, None) or []:
            masters.extend(t if isinstance(t, (list, tuple)) else [t])
    phases: list[tuple[str, dict]] = []
    state = {"on": False}
    saved: list = []

    def take(name, extra=()):
        if state["on"]:
            phases.append((name, census(torch, engine, masters, saved, skip, extra)))

    # ZeRO-1/2 step(): `flatten(averaged_gradients[i]).to(fp32)` keeps the model-dtype flat copy and its fp32
    # cast alive together for one line; a census between the two is taken by handing step() a view of the flat
    # copy whose .to() takes the census once the cast exists (same storage, nothing copied).
    class _CastProbe(torch.Tensor):
        __torch_function__ = torch._C._disabled_torch_function_impl  # results of other ops stay plain tensors

        def to(self, *a, **k):
            out = torch.Tensor.to(self.as_subclass(torch.Tensor), *a, **k)
            take("optimizer_step_cast", (self.as_subclass(torch.Tensor), out))
            return out

    for fname in ("flatten", "flatten_dense_tensors_aligned"):
        fn = getattr(engine.optimizer, fname, None)
        if callable(fn) and type(engine.optimizer).__name__ == "DeepSpeedZeroOptimizer":
            def probe(*a, _fn=fn, **k):
                out = _fn(*a, **k)
                return out.as_subclass(_CastProbe) if state.get("in_step") else out
            setattr(engine.optimizer, fname, probe)
    outer_step = engine.optimizer.step

    def outer(*a, **k):
        state["in_step"] = state["on"]
        try:
            return outer_step(*a, **k)
        finally:
            state["in_step"] = False

    engine.optimizer.step = outer

    orig_step = basic.step

    def wrapped(*a, **k):
        take("optimizer_step")
        with tracker.phase("optimizer_step"):
            return orig_step(*a, **k)

    basic.step = wrapped
    handles = []
    for i, blk in enumerate(blocks):
        def fwd_hook(mod, inp, out, i=i):
            t = out[0] if isinstance(out, (tuple, list)) else out
            if state["on"] and isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(lambda g, i=i: take(f"backward@{i}"))
        handles.append(blk.register_forward_hook(fwd_hook))

    def pack(t):
        if state["on"] and not isinstance(t, torch.nn.Parameter):
            try:
                saved.append(weakref.ref(t))
            except TypeError:
                pass
        return t

    from dstoolkit.runtime.synthetic import synthetic_batch
    from dstoolkit.models.shape import ModelShape

    vocab = (MODELS[cell["model"]].get("shape") or MODELS[cell["model"]]["config"])["vocab_size"]
    tiny = ModelShape(name="b", model_type="llama", hidden_size=64, num_hidden_layers=1, num_attention_heads=1,
                      intermediate_size=64, vocab_size=vocab)
    losses = []
    # The continuous window: iterations 2-3 (index 1-2; step 1 created the lazy optimizer state). The census
    # (the sampled figure, kept for comparison) is taken in iteration 2 only.
    tracer = tracker
    orig_autograd_backward = torch.autograd.backward

    def autograd_backward(*a, **k):  # Tensor.backward calls torch.autograd.backward: DeepSpeed's loss.backward()
        with tracer.phase("backward"):
            return orig_autograd_backward(*a, **k)

    tagged = _tag_methods(tracer, engine.optimizer)
    torch.autograd.backward = autograd_backward
    try:
        for step in range(STEPS):
            ids, labels = synthetic_batch(tiny, MICRO_BATCH, SEQ_LEN, step=step, rank=rank)
            state["on"] = step == 1
            if step == 1:
                gc.collect()
                tracer.reset_peak()
            saved.clear()
            with tracer.phase("forward"):
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    loss = engine(ids, labels)
            take("forward_end")
            with tracer.phase("backward_end"):  # engine.backward outside autograd: DeepSpeed's epilogue
                engine.backward(loss)
            take("backward_end")
            with tracer.phase("step"):
                engine.step()
            losses.append(float(loss))
            del loss
    finally:
        torch.autograd.backward = orig_autograd_backward
        for obj, name, fn in tagged:
            setattr(obj, name, fn)
    cont = tracer.result(base_bytes=base_bytes)
    rec = dict(phases=[dict(name=n, **c) for n, c in phases], losses=losses,
               optimizer_class=type(engine.optimizer).__name__,
               inner_optimizer=_inner_optimizer_name(basic),
               continuous=dict(peak_bytes=cont.peak_bytes, peak_phase=cont.peak_phase,
                               phase_max_bytes=cont.phase_max_bytes, allocations=cont.allocations,
                               frees=cont.frees, base_bytes=base_bytes))
    del engine, model, basic, masters, blocks, saved
    return rec


def run_worker(cells: list[dict], out_path: str) -> None:
    run_tracked_cells(cells, out_path, run_cell)


# ----------------------------------------------------------------------------------------------- driver


def launch(cells: list[dict], out_dir: pathlib.Path, timeout_s: int = 1200) -> list[dict]:
    """Run every cell in one 2-rank torchrun launch; return the per-rank records."""
    return run_rank_cells(pathlib.Path(__file__), cells, out_dir, timeout_s)


def plan_for(cell: dict, rank: int, world: int = 2):
    """The estimator's RunPlan for a cell (no torch needed for the project model; transformers for HF)."""
    from dstoolkit.estimate import RunPlan
    from dstoolkit.hardware.table import get_gpu
    from dstoolkit.models.shape import ModelShape
    from dstoolkit.spec.checkpoint import CheckpointPolicy

    spec = MODELS[cell["model"]]
    if spec["kind"] == "proj":
        shape = ModelShape(**spec["shape"])
    else:
        from dstoolkit.models.hf import shape_from_transformers

        shape = shape_from_transformers(dict(spec["config"]), name=f"tiny-{cell['model']}")
    return RunPlan(shape=shape, ds_config=ds_config(cell), world_size=world, gpus_per_node=world,
                   gpu=get_gpu("cpu"), seq_len=SEQ_LEN, checkpoint=CheckpointPolicy(kind=cell["ckpt"]),
                   flash_attention=True, precision=cell["prec"])


def rel_err(est: float, meas: float) -> float:
    return (est - meas) / meas if meas else float("inf")


MEASURED_PHASE_OF = {
    # the estimator's phase -> the tracker's phase it falls in (run_cell's tags)
    "forward_end": "forward", "backward_start": "backward", "backward_recompute": "backward",
    "backward_end": "backward_end", "optimizer_step": "optimizer_step", "optimizer_step_cast": "step",
    "optimizer_step_temporaries": "optimizer_step", "grad_clip": "grad_norm", "grad_norm": "grad_norm", "offload_step": "optimizer_step",
    "forward_loss": "forward", "backward_loss": "backward",
}
"""Which measured phase each estimated phase names (the estimator's phases are instants, the tracker's spans)."""


PHASE_TIE = 1e-3
"""Phases whose continuous maximum lies within this fraction of the peak reach the peak too: a phase is "the" peak
phase only up to such a tie (llama-z0-fp32 rank 0: the step's maximum 124 bytes above the end of backward's,
of 100 MB, in one run of three)."""


def peak_phases(cont: dict, peak_bytes: int) -> list[str]:
    """The measured phases that reach the peak, within PHASE_TIE (the tracker's peak phase first)."""
    tied = [n for n, b in cont["phase_max_bytes"].items() if b >= peak_bytes * (1 - PHASE_TIE)]
    return [cont["peak_phase"]] + sorted(n for n in tied if n != cont["peak_phase"])


def score(recs: list[dict]) -> list[dict]:
    """One row per (cell, rank): the continuous peak and the sampled census vs the estimator's timeline."""
    from dstoolkit.estimate import estimate_run

    rows = []
    for r in recs:
        cell = r["cell"]
        if not r.get("ok"):
            rows.append(dict(cell=cell["name"], rank=r["rank"], ok=False, error=r.get("error")))
            continue
        ph = r["phases"]
        top = max(ph, key=lambda p: p["total"])
        cont = r.get("continuous")
        est = estimate_run(plan_for(cell, r["rank"], r.get("world", 2)), rank=r["rank"])
        tl = est.memory.timeline
        est_peak = tl.peak_with_host_bytes
        est_phase = max(tl.phases, key=lambda p: p.device_bytes + p.host_bytes).name
        meas = cont["peak_bytes"] if cont else top["total"]
        rows.append(dict(
            cell=cell["name"], rank=r["rank"], ok=True, optimizer_class=r["optimizer_class"],
            inner_optimizer=r.get("inner_optimizer", ""),
            measured_peak=meas, measured_phase=cont["peak_phase"] if cont else top["name"],
            peak_phases=peak_phases(cont, meas) if cont else [top["name"]],
            continuous_phase_max=cont["phase_max_bytes"] if cont else {},
            sampled_peak=top["total"], sampled_phase=top["name"], measured_phases={p["name"]: p["total"] for p in ph},
            sampled_vs_continuous=rel_err(top["total"], meas),
            estimate_peak=est_peak, estimate_phase=est_phase,
            estimate_measured_phase=MEASURED_PHASE_OF.get(est_phase, est_phase),
            err_peak=rel_err(est_peak, meas), err_peak_sampled=rel_err(est_peak, top["total"]),
            sum_of_parts=est.memory.sum_of_parts_bytes + est.host_memory_per_rank_bytes,
            err_sum_of_parts=rel_err(est.memory.sum_of_parts_bytes + est.host_memory_per_rank_bytes, meas),
            estimate_phases={p.name: p.device_bytes + p.host_bytes for p in tl.phases},
            estimate_optimizer_temporaries=est.memory.optimizer_temporaries,
            estimate_optimizer_impl=est.memory.optimizer_impl,
            loss_first=r["losses"][0], loss_last=r["losses"][-1]))
    return rows


COLUMNS = ("cell", "rank", "DeepSpeed optimizer (inner)", "continuous peak MiB", "measured phase",
           "sampled peak MiB", "sampled vs continuous", "estimated peak MiB", "estimated phase", "error",
           "error vs sampled")


def _head_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=str(REPO), timeout=10).stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def render_md(rows: list[dict], env: dict) -> str:
    def pct(x):
        return "" if x is None else f"{100 * x:+.2f}%"

    def mib(x):
        return f"{x / 2**20:.2f}"

    ok = [r for r in rows if r["ok"]]
    worst = max(ok, key=lambda r: abs(r["err_peak"]), default=None)
    over = sorted({r["cell"] for r in ok if abs(r["err_peak"]) > PEAK_GOAL})
    worst_s = min(ok, key=lambda r: r["sampled_vs_continuous"], default=None)
    same_phase = sum(1 for r in ok if r["estimate_measured_phase"] in r["peak_phases"])
    continuous = all(r["continuous_phase_max"] for r in ok)
    how = ("Measured continuously: a counting wrapper installed as torch's CPU allocator "
           "(dstoolkit/runtime/alloc_tracker.py, c10::SetCPUAllocator) counts the live bytes of every CPU "
           "allocation and free on every thread of the rank; the peak is the maximum of that count over iterations "
           "2-3 minus what was live before the cell built its model, and the phase is the one the rank was in when "
           "the maximum was reached (forward; backward = inside autograd; backward_end = the rest of "
           "engine.backward, DeepSpeed's reduction epilogue; step = engine.step outside the inner optimizer "
           "(ZeRO's flatten/cast, all-gather, zero_grad); grad_norm / grad_clip; optimizer_step = the inner "
           "optimizer's step()). Sampled: the census of distinct live tensor storages at phase points of "
           "iteration 2 (forward end, each block's backward, backward end, inner optimizer step, ZeRO-1/2 cast) "
           "that this benchmark used before.") if continuous else (
           "Measured: max over phase points of distinct live tensor storages (sampled census, iteration 2).")
    lines = [
        "# Peak memory per rank: estimated phase timeline vs real DeepSpeed (2 gloo ranks, CPU)",
        "",
        f"{env_brief(env)}. Seq {SEQ_LEN}, micro batch {MICRO_BATCH}, reduce/all-gather buckets {REDUCE_BUCKET:,} "
        f"elements. {how} Estimated: `estimate_run(...).memory.timeline`, device + host (the same RAM here), "
        f"scored with the estimator at commit {_head_commit()}; 'estimated phase' is the estimator's peak phase "
        "(its measured-phase name in the summary).",
        "",
        f"**Cells:** {len({r['cell'] for r in rows})}, failed: {len(rows) - len(ok)}. "
        f"**Worst peak error:** {pct(worst['err_peak']) if worst else 'n/a'} ({worst['cell'] if worst else ''}, "
        f"rank {worst['rank'] if worst else ''}). Goal ±{PEAK_GOAL:.0%}; cells over it: "
        f"{', '.join(over) if over else 'none'}. Estimated peak phase = a measured peak phase in {same_phase} of "
        f"{len(ok)} rows (phases within {PHASE_TIE:.1%} of the peak tie; the table lists them). Largest shortfall of the sampled census against the continuous peak: "
        f"{pct(worst_s['sampled_vs_continuous']) if worst_s else 'n/a'} ({worst_s['cell'] if worst_s else ''}).",
        "",
    ]
    table = []
    for r in rows:
        if not r["ok"]:
            table.append([r["cell"], r["rank"], f"FAILED: {r['error'][:80]}"] + [""] * (len(COLUMNS) - 3))
            continue
        inner = r["optimizer_class"] if r.get("inner_optimizer", "").startswith(r["optimizer_class"]) else \
            f"{r['optimizer_class']} ({r['inner_optimizer']})"
        table.append([r["cell"], r["rank"], inner, mib(r["measured_peak"]), " = ".join(r.get("peak_phases") or [r["measured_phase"]]),
                      mib(r["sampled_peak"]), pct(r["sampled_vs_continuous"]), mib(r["estimate_peak"]),
                      r["estimate_phase"], pct(r["err_peak"]), pct(r["err_peak_sampled"])])
    lines += render_markdown_table(table, COLUMNS)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cells-file", help=argparse.SUPPRESS)
    ap.add_argument("--grid", choices=["full", "quick", "dist", "bf16_optimizer"], default="full")
    ap.add_argument("--only", help="comma-separated cell-name prefixes to run (e.g. llama,proj-z1)")
    ap.add_argument("--out", help="output directory (default benchmarks/results, files peak_memory_cpu_<yyyymm>.*)")
    ap.add_argument("--render-from", metavar="JSONL", help="re-score a recorded JSONL with the current estimator, "
                    "print the markdown and exit (DeepSpeed is not run)")
    ap.add_argument("--write", action="store_true", help="with --render-from: also write the markdown beside the "
                    "JSONL (same stem, .md)")
    args = ap.parse_args(argv)
    if args.worker:
        rank = int(os.environ.get("RANK", "0"))
        run_worker(json.loads(pathlib.Path(args.cells_file).read_text()), os.path.join(args.out, f"rank{rank}.jsonl"))
        return 0
    if args.render_from:
        lines = [json.loads(x) for x in pathlib.Path(args.render_from).read_text().splitlines() if x.strip()]
        env = lines[0]["env"]
        text = render_md(score([x for x in lines[1:]]), env)
        if args.write:
            write_report(pathlib.Path(args.render_from).with_suffix(".md"), text)
        sys.stdout.write(text)
        return 0
    cells = grid(args.grid)
    if args.only:
        cells = [c for c in cells if any(c["name"].startswith(x) for x in args.only.split(","))]
    out = pathlib.Path(args.out) if args.out else REPO / "benchmarks" / "results"
    work = out / "_peak_memory_work"
    t0 = time.time()
    recs = launch(cells, work)
    wall = round(time.time() - t0, 1)
    env = capture_env(2, "gloo", {"grid": args.grid, "cells": len(cells), "wall_s": wall})
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m")
    # "_continuous": the allocator-counted results beside the sampled-census ones of the same month
    jsonl = out / f"peak_memory_cpu_{stamp}_continuous.jsonl"
    md = out / f"peak_memory_cpu_{stamp}_continuous.md"
    with open(jsonl, "w") as f:
        f.write(json.dumps({"env": env}) + "\n")
        for r in sorted(recs, key=lambda r: (r["cell"]["name"], r["rank"])):
            f.write(json.dumps(r) + "\n")
    text = render_md(score(sorted(recs, key=lambda r: (r["cell"]["name"], r["rank"]))), env)
    write_report(md, text)
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    print(text)
    print(f"wrote {jsonl} and {md} in {wall} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fill a spec's "auto" fields with a simple, documented rule so that any spec can be estimated.

`dstoolkit sweep` / `dstoolkit generate` own the real choice (they rank many candidates); this rule only
exists so `dstoolkit estimate SPEC.yaml` answers for specs that still say "auto". Each filled value is
reported as an assumption. No torch import.

Rule (in order):
1. tp "auto" -> 1; pp "auto" -> 1, or, when nothing fits at pp=1, the smallest pp in 2, 4, 8, ... (dividing the
   world size and at most the layer count) that fits, with ZeRO stage <= 1 (DeepSpeed's pipeline engine refuses
   ZeRO-2/3); ep "auto" -> the largest divisor of num_experts that divides dp (dense: 1).
2. Candidates: ZeRO stage 1, 2, 3 (MoE: 1, 2 — DeepSpeed refuses native MoE at stage 3), offload only when the
   spec allows it, checkpointing none then full (when "auto"), micro batch 1, 2, 4, ... dividing the per-rank batch.
3. Keep those that fit and take the one with the shortest estimated step time (then the least memory).
   When nothing fits, the smallest-memory candidate is returned with `fits = False`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from dstoolkit.estimate.core import Estimate, estimate_run
from dstoolkit.estimate.plan import RunPlan, plan_from_spec
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import Spec


@dataclass
class FilledPlan:
    plan: RunPlan
    estimate: Estimate
    ds_config: dict
    assumptions: list[str] = field(default_factory=list)


def ds_config_for(spec: Spec, *, stage: int, micro_batch: int, grad_accum: int, offload: bool) -> dict:
    """A minimal DeepSpeed JSON carrying what the estimator reads."""
    t = spec.training
    cfg: dict = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "optimizer": {"type": "AdamW" if t.optimizer in ("adamw", "adam") else t.optimizer, "params": {"lr": t.lr}},
        "zero_optimization": {"stage": stage},
    }
    if t.precision in ("bf16", "fp8"):
        cfg["bf16"] = {"enabled": True}
    elif t.precision == "fp16":
        cfg["fp16"] = {"enabled": True}
    if offload and stage > 0:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    if t.zeropp and stage == 3:
        cfg["zero_optimization"].update(zero_quantized_weights=True, zero_quantized_gradients=True,
                                        zero_hpz_partition_size=min(spec.cluster.gpus_per_node, spec.cluster.world_size))
    return cfg


def fill_autos(spec: Spec, shape: ModelShape) -> FilledPlan:
    """Resolve the spec's "auto" fields by the module's rule and estimate the result."""
    t = spec.training
    world = spec.cluster.world_size
    if t.pp != "auto":
        return _fill(spec, shape, int(t.pp), [])
    best = _fill(spec, shape, 1, ["pp: auto -> 1"])
    pp = 2
    while not best.estimate.fits and pp <= shape.num_hidden_layers and world % pp == 0:
        cand = _fill(spec, shape, pp, [f"pp: auto -> {pp} (nothing fits with less)"])
        if cand.estimate.fits:
            return cand
        pp *= 2
    return best


def _fill(spec: Spec, shape: ModelShape, pp: int, notes: list[str]) -> FilledPlan:
    t = spec.training
    world = spec.cluster.world_size
    notes = list(notes)
    tp = 1 if t.tp == "auto" else int(t.tp)
    if t.tp == "auto":
        notes.append("tp: auto -> 1")
    if world % (tp * pp):
        raise ValueError(f"world_size={world} is not divisible by tp*pp={tp * pp}")
    dp = world // (tp * pp)
    if t.ep == "auto":
        ep = 1
        if shape.is_moe:
            ep = max(d for d in range(1, shape.num_experts + 1) if shape.num_experts % d == 0 and dp % d == 0)
        notes.append(f"ep: auto -> {ep}")
    else:
        ep = int(t.ep)
    if t.global_batch % dp:
        raise ValueError(f"training.global_batch={t.global_batch} is not divisible by dp={dp}")
    per_rank = t.global_batch // dp
    if t.micro_batch == "auto":
        mbs = [m for m in (1, 2, 4, 8, 16, 32, 64) if per_rank % m == 0]
    else:
        mbs = [int(t.micro_batch)]
    if t.zero_stage == "auto":
        stages = [1, 2] if shape.is_moe else [1, 2, 3]
        if pp > 1:
            stages = [1]  # deepspeed/runtime/pipe/engine.py: ZeRO-2/3 are incompatible with pipeline parallelism
    else:
        stages = [int(t.zero_stage)]
    offloads = [False, True] if t.offload else [False]
    ckpts = ["none", "full"] if t.activation_checkpointing == "auto" else [t.activation_checkpointing]
    candidates: list[FilledPlan] = []
    for ck in ckpts:
        sp = spec.model_copy(update={"training": t.model_copy(update={"activation_checkpointing": ck})})
        for off in offloads:
            for stage in stages:
                if off and stage == 0:
                    continue
                for mb in mbs:
                    cfg = ds_config_for(sp, stage=stage, micro_batch=mb, grad_accum=per_rank // mb, offload=off)
                    spec_deg = sp.model_copy(update={"training": sp.training.model_copy(update={"tp": tp, "pp": pp, "ep": ep})})
                    plan = plan_from_spec(spec_deg, cfg, shape)
                    est = estimate_run(plan)
                    picked = [f"zero_stage -> {stage}" if t.zero_stage == "auto" else None,
                              f"micro_batch -> {mb}" if t.micro_batch == "auto" else None,
                              f"activation_checkpointing -> {ck}" if t.activation_checkpointing == "auto" else None,
                              f"offload -> {'optimizer to cpu' if off else 'none'}" if t.offload else None]
                    candidates.append(FilledPlan(plan, est, cfg, notes + [p for p in picked if p]))
    fitting = [c for c in candidates if c.estimate.fits]
    if fitting:
        best = min(fitting, key=lambda c: (c.estimate.step_time_s, c.estimate.memory.total))
    else:
        best = min(candidates, key=lambda c: c.estimate.memory.total)
        best.assumptions.append(
            f"nothing fits in {best.plan.gpu.memory_bytes / 2**30:.0f} GiB: showing the smallest-memory candidate")
    return best

"""Pipeline stages and their schedule (split from estimate.cluster_model): which blocks each stage holds, the
flush's bubble by schedule, and the one stage/bubble arithmetic every step-time path shares: the heaviest stage
runs every micro batch, the fill and drain pass through the others (flush_s). No torch import."""
from __future__ import annotations

from typing import Callable, Optional

from dstoolkit.estimate.activations import layer_activation_bytes
from dstoolkit.layout import pipeline_split, stage_layer_range
from dstoolkit.runplan import RunPlan


def bubble_fraction(schedule: str, pp: int, micro_batches: int, virtual_stages: int = 1) -> float:
    """Idle time of a pipeline flush relative to the ideal compute time.

    1f1b: (p-1)/m (Narayanan et al. 2021 §2.2.1); interleaved: (p-1)/(v·m) (§2.2.2); zero-bubble (ZB-H1, Qi et
    al. 2023 §3): (p-1)(F+B-2W)/(m(F+B)) = (p-1)/(3m) with F = W = B/2; dualpipe (DeepSeek-V3 Table 2):
    (p/2-1)(F&B+B-3W)/(m(F+B)) = (p-2)/(3m) with F&B = F+B (no intra-pair overlap credited).
    """
    if pp <= 1:
        return 0.0
    m = max(1, micro_batches)
    if schedule == "interleaved":
        return (pp - 1) / (max(1, virtual_stages) * m)
    if schedule == "zero-bubble":
        return (pp - 1) / (3.0 * m)
    if schedule == "dualpipe":
        return max(0.0, (pp - 2) / (3.0 * m))
    return (pp - 1) / m


def stage_layers(plan: RunPlan, stage: int) -> range:
    """Blocks of pipeline stage `stage` as the plan's framework splits them (layout.stage_layers: Megatron's split,
    or DeepSpeed's PipelineModule / torchtitan's uniform one)."""
    return stage_layer_range(plan.shape.num_hidden_layers, plan.pp, stage, pipeline_split(plan.framework))


def moe_layers_per_stage(plan: RunPlan) -> list[int]:
    """MoE blocks on each pipeline stage (DeepSeek-V3 at pp 16: 1 on stage 0, 4 on the others)."""
    return [sum(plan.shape.is_moe_layer(i) for i in stage_layers(plan, s)) for s in range(plan.pp)]


def pipeline_compute_s(plan: RunPlan, layer_s: Callable[[int, float], float], head_s: float,
                       host_s: Optional[Callable[[int], float]] = None, host_micro_s: float = 0.0) -> float:
    """Compute seconds of one optimizer step: the heaviest pipeline stage's blocks, `layer_s(i, saved_bytes)` for
    one micro batch (evaluated once per kind of block: MoE or dense, recomputed or not), over every micro batch,
    `head_s` (the LM head) on the last stage, plus the schedule's fill and drain through the other stages
    (flush_s, bubble_fraction). The one stage/bubble arithmetic of the GPU path (step_time.gpu_compute_s) and the
    CPU one (cpu_compute.cpu_compute_s).

    `host_s(i)`: host seconds block i takes to issue its kernels per micro batch, and `host_micro_s` the host's
    fixed cost per micro batch (GPU path: host_cost.host_layer_s, host_cost.host_micro_step_s). The host runs
    ahead of the GPU, so a stage's micro batch takes the longer of its GPU time and its host time; with
    plan.cuda_launch_blocking each
    launch waits for its kernel (CUDA_LAUNCH_BLOCKING=1, CUDA C++ Programming Guide "Concurrent Execution between
    Host and Device": kernel launches become synchronous), so it takes their sum."""

    shape, ds = plan.shape, plan.ds
    ckpt = plan.checkpoint.checkpointed_layers(shape.num_hidden_layers)
    per_kind: dict[tuple[bool, bool, float], tuple[float, float]] = {}

    def one(i: int) -> tuple[float, float]:
        key = (shape.is_moe_layer(i), ckpt[i], plan.fp8_share(i))  # fp8_share: RunPlan.fp8_selection, per block
        if key not in per_kind:
            per_kind[key] = (layer_s(i, layer_activation_bytes(plan, i, ds.micro_batch).full),
                             host_s(i) if host_s is not None else 0.0)
        return per_kind[key]

    stages = []
    for st in range(plan.pp):
        blocks = [one(i) for i in stage_layers(plan, st)]
        gpu = sum(b[0] for b in blocks) + (head_s if st == plan.pp - 1 else 0.0)
        host = sum(b[1] for b in blocks) + host_micro_s
        stages.append(gpu + host if plan.cuda_launch_blocking else max(gpu, host))
    bubble = bubble_fraction(plan.pipeline_schedule, plan.pp, ds.grad_accum, plan.virtual_stages)
    return flush_s(stages, ds.grad_accum, bubble)


def flush_s(stage_s: list[float], micro_batches: int, bubble: float) -> float:
    """Seconds of one pipeline flush whose stages take `stage_s` each per micro batch (forward + backward): the
    heaviest stage runs every micro batch back to back, and the fill and drain pass once through each of the
    others. For 1F1B that critical path is m·t_max + (Σ t_s − t_max) (the schedule's makespan, replayed step by step
    from DeepSpeed's TrainSchedule in tests/unit/test_deepspeed_pipe_schedule.py); `bubble` (bubble_fraction,
    m·bubble = p − 1 for 1F1B) scales the fill and drain for the other schedules, at the pace of the stages other
    than the heaviest. With equal stages it is (1 + bubble)·m·t (Narayanan et al. 2021 §2.2)."""
    m, heaviest = max(1, micro_batches), max(stage_s)
    if len(stage_s) <= 1:
        return heaviest * m * (1.0 + bubble)
    others = (sum(stage_s) - heaviest) / (len(stage_s) - 1)
    return heaviest * m + bubble * m * others

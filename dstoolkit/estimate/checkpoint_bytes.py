"""Checkpoint size before the run: the tensor bytes `engine.save_checkpoint` writes per rank and in total.

Read from DeepSpeed 0.19.8's save path (runtime/engine.py `_save_checkpoint` / `_common_checkpoint_state`,
`_save_zero_checkpoint`, `_save_moe_checkpoint`; runtime/zero/stage_1_and_2.py and stage3.py `state_dict`):
- model states (`mp_rank_XX_model_states.pt`, written once per model-parallel rank by data-parallel rank 0):
  the module's state dict in the model dtype (bf16/fp16: 2 bytes, fp32: 4). ZeRO-3 writes one
  `zero_pp_rank_N_..._model_states.pt` per rank holding only placeholders (no tensor bytes). Native MoE experts go
  to `layer_L_expert_E_..._model_states.pt`, one per global expert, written by the expert's first data-parallel
  replica: the expert weights in the model dtype, once in total.
- optimizer states (`zero_pp_rank_N_mp_rank_XX_optim_states.pt`, one per rank, ZeRO 1-3): the rank's fp32 master
  partition (4 bytes/element, kept even when training in fp32) plus Adam's exp_avg and exp_avg_sq (4 + 4) and one
  fp32 `step` scalar per param group. ZeRO-1/2 partitions each param group's flat buffer padded to a multiple of
  2 x dp elements (`nccl_start_alignment_factor`); ZeRO-3 pads every parameter to a multiple of dp
  (partition_parameters.py `_aligned_size`). Expert groups partition over the expert-data-parallel group.
  ZeRO-0 keeps the full optimizer state inside the model-states file (torch Adam: exp_avg + exp_avg_sq, fp32).
These are the tensor payload bytes; the files add the pickled metadata (parameter names, shapes, the config) and
the zip container, a few hundred bytes per tensor (`dstoolkit ckpt inspect` shows the bytes on disk).
No torch import.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from dstoolkit.estimate.dtype_bytes import FP32_BYTES, param_bytes
from dstoolkit.estimate.memory import zero_group_sizes
from dstoolkit.estimate.param_groups import NCCL_START_ALIGNMENT_FACTOR, _padded, rank_param_groups
from dstoolkit.runplan import RunPlan

ADAM_MOMENT_BYTES = 8
"""exp_avg + exp_avg_sq, fp32 each (torch.optim.Adam / AdamW, DeepSpeed's FusedAdam and CPUAdam alike)."""
STEP_SCALAR_BYTES = 4
"""torch Adam's per-group `step` tensor (fp32 scalar) in the saved state."""


@dataclass(frozen=True)
class CheckpointBytes:
    """Tensor bytes one `save_checkpoint` writes (per rank: the heaviest rank)."""

    model_states_per_rank_bytes: int
    """The model-states file(s) a rank writes (rank 0 under ZeRO 0-2: every weight in the model dtype; ZeRO-3: 0)."""
    optimizer_states_per_rank_bytes: int
    """A rank's *_optim_states.pt: fp32 master partition + Adam moments (ZeRO 1-3; ZeRO-0: 0, it sits in model states)."""
    expert_states_bytes: int
    """Native-MoE expert files, all of them (written once, not per rank)."""
    total_with_optimizer_bytes: int
    total_without_optimizer_bytes: int
    """Model states and experts only: what a weights-only save (or export) would keep."""
    world_size: int

    @property
    def per_rank_with_optimizer_bytes(self) -> int:
        return self.model_states_per_rank_bytes + self.optimizer_states_per_rank_bytes

    def to_json(self) -> dict:
        d = asdict(self)
        d["per_rank_with_optimizer_bytes"] = self.per_rank_with_optimizer_bytes
        return d


def checkpoint_bytes(plan: RunPlan) -> CheckpointBytes:
    """Checkpoint tensor bytes of `plan` (its ZeRO stage, precision, dp / tp / pp / ep and model shape)."""
    stage = int(plan.ds.zero_stage)
    pb = param_bytes(plan.precision)
    groups = rank_param_groups(plan)
    dense_dp, expert_dp = zero_group_sizes(plan)
    group_dp = [dense_dp] + [expert_dp] * (len(groups) - 1)
    dense_numel = sum(groups[0]) if groups else 0
    expert_numel_local = sum(sum(g) for g in groups[1:])
    mp = plan.tp * plan.pp
    experts_total = expert_numel_local * plan.ep * mp  # every global expert once (ep ranks hold disjoint experts)

    part = 0  # fp32 partition elements of the heaviest rank
    for g, dp in zip(groups, group_dp):
        if stage == 3:
            part += sum(_padded(n, dp) // dp for n in g)
        else:
            part += _padded(sum(g), NCCL_START_ALIGNMENT_FACTOR * dp) // dp
    expert_bytes = experts_total * pb
    steps = len(groups) * STEP_SCALAR_BYTES
    if stage == 0:
        # the whole optimizer in the model-states file (engine.py `_common_checkpoint_state` optimizer=...);
        # bf16/fp16 without ZeRO: FP16_Optimizer's state_dict adds its full fp32 master copy (fp32_groups_flat)
        master = FP32_BYTES if plan.precision != "fp32" else 0
        per_rank_optim = (dense_numel + expert_numel_local) * (ADAM_MOMENT_BYTES + master) + steps
        per_rank_model = dense_numel * pb
        optimizer_total = per_rank_optim * mp * (plan.ep if plan.shape.is_moe else 1)
    else:
        per_rank_model = 0 if stage == 3 else dense_numel * pb
        per_rank_optim = part * (FP32_BYTES + ADAM_MOMENT_BYTES) + steps
        optimizer_total = per_rank_optim * plan.world_size
    model_total = (0 if stage == 3 else dense_numel * pb * mp) + expert_bytes
    return CheckpointBytes(
        model_states_per_rank_bytes=per_rank_model,
        optimizer_states_per_rank_bytes=per_rank_optim,
        expert_states_bytes=expert_bytes,
        total_with_optimizer_bytes=model_total + optimizer_total,
        total_without_optimizer_bytes=model_total,
        world_size=plan.world_size,
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**27 else f"{n / 2**20:.2f} MiB"


def render_checkpoint_bytes(cb: CheckpointBytes) -> str:
    """The estimate's checkpoint line (tensor bytes; files add a few hundred bytes of metadata per tensor)."""
    return (f"checkpoint (tensor bytes): per rank {_gib(cb.per_rank_with_optimizer_bytes)} (model states "
            f"{_gib(cb.model_states_per_rank_bytes)} + optimizer {_gib(cb.optimizer_states_per_rank_bytes)}); "
            f"total {_gib(cb.total_with_optimizer_bytes)} with optimizer states, "
            f"{_gib(cb.total_without_optimizer_bytes)} without"
            + (f" (experts {_gib(cb.expert_states_bytes)})" if cb.expert_states_bytes else ""))

"""Checkpoint size before the run: the tensor bytes `engine.save_checkpoint` writes per rank and in total.

Read from DeepSpeed 0.19.8's save path (runtime/engine.py `_save_checkpoint` / `_common_checkpoint_state`,
`_save_zero_checkpoint`, `_save_moe_checkpoint`; runtime/zero/stage_1_and_2.py and stage3.py `state_dict`):
- model states (`mp_rank_XX_model_states.pt`, written once per model-parallel rank by data-parallel rank 0):
  the module's state dict in the model dtype (bf16/fp16: 2 bytes, fp32: 4), and its persistent buffers in the
  dtype they were loaded in (DeepSeek-V3's fp32 router `e_score_correction_bias`, ParamCount.buffers: engine.py
  `_cast_module_mixed_precision` casts parameters only). Each tensor-parallel rank writes its own shard, the
  replicated tensors (norms, routers) included; each pipeline stage its own blocks (PipelineEngine: one
  `layer_XX-model_YY-model_states.pt` per layer, pipe/module.py `save_state_dict`). ZeRO-3 writes one
  `zero_pp_rank_N_..._model_states.pt` per rank holding placeholders for the parameters (no tensor bytes) and the
  buffers in full. Native MoE experts go to `layer_L_expert_E_mp_rank_XX_model_states.pt`, one per global expert
  and tensor-parallel rank, written by the expert's first data-parallel replica: the expert weights in the model
  dtype, once per tensor-parallel shard.
- optimizer states (`zero_pp_rank_N_mp_rank_XX_optim_states.pt`, one per rank, ZeRO 1-3): the rank's fp32 master
  partition (4 bytes/element, kept even when training in fp32) plus Adam's exp_avg and exp_avg_sq (4 + 4) and one
  fp32 `step` scalar per param group. ZeRO-1/2 partitions each param group's flat buffer padded to a multiple of
  2 x dp elements (`nccl_start_alignment_factor`); ZeRO-3 pads every parameter to a multiple of dp
  (partition_parameters.py `_aligned_size`). Expert groups partition over the expert-data-parallel group.
  ZeRO-0 keeps the full optimizer state inside the model-states file (torch Adam: exp_avg + exp_avg_sq, fp32);
  with native MoE each expert-parallel rank also writes its own to `expp_rank_E_mp_rank_XX_optim_states.pt`
  (measured: tiny-moe at ep 2, two 72,888,511-byte expp files and rank 0's 76,581,337-byte model states).
Pipeline stages hold different blocks (and the embedding / LM head), so the totals sum each stage's ranks; the
per-rank figures are the heaviest rank's. These are the tensor payload bytes; the files add the pickled metadata
(parameter names, shapes, the config) and the zip container, a few hundred bytes per tensor (`dstoolkit ckpt
inspect` shows the bytes on disk).
No torch import.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from dstoolkit.estimate.dtype_bytes import FP32_BYTES, param_bytes
from dstoolkit.estimate.memory import zero_group_sizes
from dstoolkit.estimate.param_groups import NCCL_START_ALIGNMENT_FACTOR, _padded, rank_param_groups
from dstoolkit.estimate.pipeline_stages import moe_layers_per_stage
from dstoolkit.models.params import count_params
from dstoolkit.runplan import RunPlan

ADAM_MOMENT_BYTES = 8
"""exp_avg + exp_avg_sq, fp32 each (torch.optim.Adam / AdamW, DeepSpeed's FusedAdam and CPUAdam alike)."""
STEP_SCALAR_BYTES = 4
"""torch Adam's per-group `step` tensor (fp32 scalar) in the saved state."""


@dataclass(frozen=True)
class CheckpointBytes:
    """Tensor bytes one `save_checkpoint` writes (per rank: the heaviest rank)."""

    model_states_per_rank_bytes: int
    """The model-states file(s) a rank writes (data-parallel rank 0 under ZeRO 0-2: every weight of its stage and
    tensor-parallel shard in the model dtype, and its buffers; ZeRO-3: the buffers only)."""
    optimizer_states_per_rank_bytes: int
    """A rank's *_optim_states.pt: fp32 master partition + Adam moments (ZeRO 1-3); ZeRO-0: the optimizer state the
    model-states file holds, counted here and not in model_states_per_rank_bytes (with native MoE, rank 0 writes it
    twice: there and in its expp_rank_* file)."""
    expert_states_bytes: int
    """Native-MoE expert files, all of them (each expert once per tensor-parallel shard, not per rank)."""
    total_with_optimizer_bytes: int
    """Every file's tensor bytes, summed over the ranks that write them."""
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


@dataclass(frozen=True)
class _StageBytes:
    """What the ranks of one pipeline stage write: one rank's files and the stage's sum over its ranks."""

    model_per_rank: int
    optim_per_rank: int
    model_total: int
    optim_total: int
    expert_total: int


def _stage_bytes(plan: RunPlan, pp_stage: int, buffer_numel: int) -> _StageBytes:
    """Tensor bytes the ranks of pipeline stage `pp_stage` write (its blocks, and the embedding / final norm + LM
    head on the edge stages: rank_param_groups). Every rank of a stage holds partitions of the same size (ZeRO-1/2
    cut each group's padded flat buffer into equal parts, ZeRO-3 pads each parameter), so the stage's optimizer
    bytes are its world_size / pp ranks times one rank's; the model states are written once per tensor-parallel
    rank (data-parallel rank 0), under ZeRO-3 by every rank (placeholders and the buffers)."""
    stage = int(plan.ds.zero_stage)
    pb = param_bytes(plan.precision)
    groups = rank_param_groups(plan, pp_stage=pp_stage)
    dense_dp, expert_dp = zero_group_sizes(plan)
    group_dp = [dense_dp] + [expert_dp] * (len(groups) - 1)
    dense_numel = sum(groups[0]) if groups else 0
    expert_numel_local = sum(sum(g) for g in groups[1:])
    ranks = plan.world_size // plan.pp
    # buffers stay in the dtype they were loaded in (engine.py `_cast_module_mixed_precision` casts parameters only)
    buffer_bytes = buffer_numel * FP32_BYTES
    steps = len(groups) * STEP_SCALAR_BYTES
    if stage == 0:
        # the whole optimizer in the model-states file (engine.py `_common_checkpoint_state` optimizer=...);
        # bf16/fp16 without ZeRO: FP16_Optimizer's state_dict adds its full fp32 master copy (fp32_groups_flat)
        master = FP32_BYTES if plan.precision != "fp32" else 0
        optim = (dense_numel + expert_numel_local) * (ADAM_MOMENT_BYTES + master) + steps
        optim_total = optim * plan.tp
        if plan.shape.is_moe:
            # native MoE (engine.py `_save_moe_checkpoint`): each expert-parallel rank's writer saves its whole
            # optimizer to expp_rank_<e>_mp_rank_XX_optim_states.pt, and data-parallel rank 0 writes its own once
            # more inside the model-states file (`_common_checkpoint_state`): rank 0 writes it twice
            optim_total += optim * plan.tp * plan.ep
            optim *= 2
    else:
        part = 0  # fp32 partition elements of one rank
        for g, dp in zip(groups, group_dp):
            if stage == 3:
                part += sum(_padded(n, dp) // dp for n in g)
            else:
                part += _padded(sum(g), NCCL_START_ALIGNMENT_FACTOR * dp) // dp
        optim = part * (FP32_BYTES + ADAM_MOMENT_BYTES) + steps
        optim_total = optim * ranks
    model = buffer_bytes if stage == 3 else dense_numel * pb + buffer_bytes
    return _StageBytes(model_per_rank=model, optim_per_rank=optim,
                       model_total=model * (ranks if stage == 3 else plan.tp), optim_total=optim_total,
                       expert_total=expert_numel_local * pb * plan.ep * plan.tp)  # each expert once per tp rank


def _stage_buffer_numels(plan: RunPlan) -> list[int]:
    """State-dict buffer elements per pipeline stage (ParamCount.buffers: DeepSeek-V3's router
    e_score_correction_bias, one per routed expert of each MoE block, so each stage holds its MoE blocks' share;
    a model with buffers but no MoE block has them counted on the first stage)."""
    buffers = count_params(plan.shape).buffers
    moe = moe_layers_per_stage(plan)
    if not buffers or not sum(moe):
        return [buffers if s == 0 else 0 for s in range(plan.pp)]
    upto = [buffers * sum(moe[:s]) // sum(moe) for s in range(plan.pp + 1)]  # shares that add up to `buffers`
    return [upto[s + 1] - upto[s] for s in range(plan.pp)]


def checkpoint_bytes(plan: RunPlan) -> CheckpointBytes:
    """Checkpoint tensor bytes of `plan` (its ZeRO stage, precision, dp / tp / pp / ep and model shape): the per-rank
    figures are the heaviest rank's, the totals the sum over every stage's ranks of what each writes."""
    stages = [_stage_bytes(plan, s, b) for s, b in enumerate(_stage_buffer_numels(plan))]
    heaviest = max(stages, key=lambda st: st.model_per_rank + st.optim_per_rank)
    model_total = sum(st.model_total + st.expert_total for st in stages)
    return CheckpointBytes(
        model_states_per_rank_bytes=heaviest.model_per_rank,
        optimizer_states_per_rank_bytes=heaviest.optim_per_rank,
        expert_states_bytes=sum(st.expert_total for st in stages),
        total_with_optimizer_bytes=model_total + sum(st.optim_total for st in stages),
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

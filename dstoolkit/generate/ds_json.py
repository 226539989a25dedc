"""Build the DeepSpeed JSON for one candidate: pure DeepSpeed keys only, every value explicit (no "auto").

No torch import. MoE facts (expert count, ep size) are not DeepSpeed config keys: they go to the model code
(`--ep-size` in launch.sh) and to the Megatron argument files, never into this JSON.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from dstoolkit.dsconfig.ds_zero import ZeroConfig
from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.rules import hpz_partition_size
from dstoolkit.models import count_params
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import Spec

_ZERO = ZeroConfig.model_fields  # DeepSpeed 0.19.8's defaults, declared once in dstoolkit.dsconfig
# DeepSpeed's default buckets (docs/config-json, runtime/zero/config.py): 5e8 elements.
REDUCE_BUCKET_ELEMENTS = _ZERO["reduce_bucket_size"].default
ALLGATHER_BUCKET_ELEMENTS = _ZERO["allgather_bucket_size"].default
# Stage-3 sizes follow the rule Hugging Face's DeepSpeed integration uses for its "auto" values
# (transformers integrations/deepspeed.py): prefetch 0.9*h^2, persistence threshold 10*h, reduce bucket h^2.
STAGE3_PREFETCH_FACTOR = 0.9
STAGE3_PERSISTENCE_FACTOR = 10
STAGE3_MAX_LIVE_PARAMETERS = _ZERO["max_live_parameters"].default  # DeepSpeed default stage3_max_live_parameters (1e9)
STAGE3_MAX_REUSE_DISTANCE = _ZERO["max_reuse_distance"].default  # DeepSpeed default stage3_max_reuse_distance (1e9)
SUB_GROUP_SIZE = _ZERO["sub_group_size"].default  # DeepSpeed default sub_group_size (1e9 elements per sub-group)
GRADIENT_CLIPPING = 1.0  # the usual LLM pre-training clip (Llama 3, DeepSeek-V3, GPT-3 all use 1.0)
ADAM_BETAS = [0.9, 0.95]  # Llama 3 / DeepSeek-V3 / GPT-3 pre-training betas
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.1  # Llama 3 / DeepSeek-V3 pre-training weight decay
STEPS_PER_PRINT = 10
FP16_INITIAL_SCALE_POWER = 16  # DeepSpeed's default dynamic loss scale starts at 2**16
FP16_LOSS_SCALE_WINDOW = 1000
FP16_HYSTERESIS = 2
FP16_MIN_LOSS_SCALE = 1
COSINE_MIN_RATIO = 0.1  # decay to 10% of peak (DeepSeek-V3: 2.2e-4 -> 2.2e-5)

# spec optimizer -> DeepSpeed "type": DeepSpeed's own names, or a torch.optim class name (engine.py looks those
# up with getattr(torch.optim, name)).
_OPTIMIZER_TYPE = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD", "lamb": "Lamb", "adafactor": "Adafactor"}


def is_cpu_cluster(spec: Spec) -> bool:
    gpu = spec.cluster.gpu
    return isinstance(gpu, str) and gpu.lower() == "cpu"


def data_types_section(spec: Spec) -> dict:
    """DeepSpeed's data_types section for training.grad_accum_dtype ({} when it is not set); both DeepSpeed JSON
    files carry it (HF TrainingArguments has no such field)."""
    acc = spec.training.grad_accum_dtype
    return {"data_types": {"grad_accum_dtype": acc}} if acc else {}


def _precision_sections(spec: Spec) -> dict:
    p = spec.training.precision
    if p in ("bf16", "fp8"):  # fp8: FP8 GEMMs run inside Transformer Engine; DeepSpeed keeps bf16 weights
        return {"bf16": {"enabled": True}, **data_types_section(spec)}
    if p == "fp16":
        return {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": FP16_INITIAL_SCALE_POWER,
                         "loss_scale_window": FP16_LOSS_SCALE_WINDOW, "hysteresis": FP16_HYSTERESIS,
                         "min_loss_scale": FP16_MIN_LOSS_SCALE}}
    return {}  # fp32: neither section


def _optimizer_section(spec: Spec, cand: Candidate) -> dict:
    t = spec.training
    kind = _OPTIMIZER_TYPE[t.optimizer]
    params: dict = {"lr": t.lr}
    if kind in ("AdamW", "Adam", "Lamb"):
        params.update(betas=list(ADAM_BETAS), eps=ADAM_EPS, weight_decay=WEIGHT_DECAY)
    elif kind == "SGD":
        params.update(momentum=0.9, weight_decay=0.0)
    if kind == "Adam":
        params["adam_w_mode"] = False  # DeepSpeed's "Adam" means AdamW unless adam_w_mode is false (engine.py)
    if kind in ("AdamW", "Adam") and is_cpu_cluster(spec) and not cand.offload_optimizer:
        # On a CPU cluster DeepSpeed would JIT-compile its FusedAdam op (~47 s, once per machine) for no gain:
        # torch's own AdamW is the same update. Offload keeps DeepSpeedCPUAdam (DeepSpeed requires it).
        params["torch_adam"] = True
    return {"type": kind, "params": params}


WARMUP_TYPE = "linear"  # Megatron-LM's warmup is linear; DeepSpeed's schedulers default to "log" (lr_schedules.py)


def scheduler_section(spec: Spec) -> dict | None:
    """The LR schedule every target runs (one fact: the HF JSON and the Megatron arguments follow it).

    train_steps given: linear warm-up over warmup_steps, then cosine decay to COSINE_MIN_RATIO x lr at
    train_steps (WarmupCosineLR); only warmup_steps: linear warm-up, then constant (WarmupLR); neither: constant
    (no scheduler). DeepSpeed 0.19.8 refuses warmup_num_steps <= 0 and warms up over max(2, n) steps
    (lr_schedules.py), so 0 is written as 1, the value HF Trainer fills for "auto" too.
    """
    t = spec.training
    warm = max(1, t.warmup_steps)
    if t.train_steps:
        return {"type": "WarmupCosineLR", "params": {
            "total_num_steps": t.train_steps, "warmup_num_steps": warm, "warmup_min_ratio": 0.0,
            "cos_min_ratio": COSINE_MIN_RATIO, "warmup_type": WARMUP_TYPE}}
    if t.warmup_steps:
        return {"type": "WarmupLR", "params": {
            "warmup_min_lr": 0.0, "warmup_max_lr": t.lr, "warmup_num_steps": warm,
            "warmup_type": WARMUP_TYPE}}
    return None


_scheduler_section = scheduler_section


@dataclass(frozen=True)
class ParamSplit:
    """Parameters split into the part every data-parallel rank holds and the expert part sharded over EP."""

    total: int
    active: int
    expert: int
    """Routed-expert parameters (sharded over the expert-parallel group)."""

    @property
    def dense(self) -> int:
        return self.total - self.expert


@functools.lru_cache(maxsize=64)
def param_split(shape: ModelShape) -> ParamSplit:
    """Total/active parameters and the routed-expert share, from `dstoolkit.models.count_params` (bucket sizes
    here; the sweep's lower bound and costing import it from this module)."""

    counts = count_params(shape)
    return ParamSplit(total=counts.total, active=counts.active, expert=counts.routed_experts)


BUCKET_ROUND_ELEMENTS = 1_000_000  # bucket sizes clamped to the model are rounded up to a million elements


def _bucket_elements(shape: ModelShape, cand: Candidate, default: int) -> int:
    """DeepSpeed's default bucket, or the parameters one model-parallel rank holds when that is smaller.

    A bucket larger than everything it could hold only reserves memory (stage 1-2 allocate the reduce
    bucket up front): the tiny CPU model would otherwise spend 1 GB per rank on two 5e8-element buckets.
    """
    per_rank = param_split(shape).total / (cand.tp * cand.pp)
    rounded = int(-(-per_rank // BUCKET_ROUND_ELEMENTS) * BUCKET_ROUND_ELEMENTS)
    return min(default, max(BUCKET_ROUND_ELEMENTS, rounded))


def _zero_section(spec: Spec, shape: ModelShape, cand: Candidate) -> dict:
    h = shape.hidden_size
    on_gpu = not is_cpu_cluster(spec)
    z: dict = {"stage": cand.zero_stage}
    if cand.zero_stage == 0:
        return z
    if cand.zero_stage in (1, 2):
        z.update({
            "allgather_partitions": True,
            "allgather_bucket_size": _bucket_elements(shape, cand, ALLGATHER_BUCKET_ELEMENTS),
            "reduce_scatter": True,  # required for MoE at stage 1-2 (stage_1_and_2.py _configure_moe_settings)
            "reduce_bucket_size": _bucket_elements(shape, cand, REDUCE_BUCKET_ELEMENTS),
            # overlap needs CUDA streams; on CPU it only adds copies
            "overlap_comm": on_gpu,
            "contiguous_gradients": True,  # required for MoE at stage 2 (stage_1_and_2.py)
        })
    else:
        z.update({
            "overlap_comm": on_gpu,
            "contiguous_gradients": True,
            "reduce_bucket_size": h * h,
            "stage3_prefetch_bucket_size": int(STAGE3_PREFETCH_FACTOR * h * h),
            "stage3_param_persistence_threshold": STAGE3_PERSISTENCE_FACTOR * h,
            "stage3_max_live_parameters": STAGE3_MAX_LIVE_PARAMETERS,
            "stage3_max_reuse_distance": STAGE3_MAX_REUSE_DISTANCE,
            "sub_group_size": SUB_GROUP_SIZE,
            "stage3_gather_16bit_weights_on_model_save": True,
        })
    if cand.offload_optimizer:
        z["offload_optimizer"] = {"device": "cpu", "pin_memory": on_gpu}
    if cand.offload_param:
        z["offload_param"] = {"device": "cpu", "pin_memory": on_gpu}
    if cand.zeropp:
        z.update({
            "zero_quantized_weights": True,  # qwZ: int8 weight all-gather
            "zero_hpz_partition_size": hpz_partition_size(spec, cand),  # hpZ: secondary copy inside a node
            "zero_quantized_gradients": True,  # qgZ: int4 gradient all-to-all reduce
        })
    return z


def _activation_checkpointing_section(cand: Candidate) -> dict | None:
    if cand.checkpoint.kind == "none":
        return None
    # Read by deepspeed.checkpointing.configure (Megatron-DeepSpeed and our trainer); which layers are
    # recomputed is the model's choice (Megatron recompute flags / CheckpointPolicy).
    return {"partition_activations": cand.tp > 1, "cpu_checkpointing": False,
            "contiguous_memory_optimization": False, "synchronize_checkpoint_boundary": False,
            "profile": False}


def build_ds_config(spec: Spec, shape: ModelShape, cand: Candidate) -> dict:
    """The DeepSpeed config dict for one candidate.

    Args:
        spec: The spec (batch, precision, optimizer, schedule).
        shape: The model shape (bucket sizes scale with hidden size).
        cand: The concrete layout.

    Returns:
        A JSON-serialisable dict with train_batch_size = micro_batch * grad_accum * dp, dp without the ranks
        that share a sequence: sequence_parallel_size (cp or ulysses) is the key DeepSpeed's batch arithmetic
        divides the world by (runtime/config.py; under Megatron-DeepSpeed the mpu's data-parallel size is the same).
    """
    world = spec.cluster.world_size
    cfg: dict = {
        "train_batch_size": spec.training.global_batch,
        "train_micro_batch_size_per_gpu": cand.micro_batch,
        "gradient_accumulation_steps": cand.grad_accum(world, spec.training.global_batch),
        **({"sequence_parallel_size": cand.sequence_shards} if cand.sequence_shards > 1 else {}),
        "gradient_clipping": GRADIENT_CLIPPING,
        "steps_per_print": STEPS_PER_PRINT,
        "wall_clock_breakdown": False,
    }
    cfg.update(_precision_sections(spec))
    cfg["optimizer"] = _optimizer_section(spec, cand)
    sched = _scheduler_section(spec)
    if sched is not None:
        cfg["scheduler"] = sched
    cfg["zero_optimization"] = _zero_section(spec, shape, cand)
    ac = _activation_checkpointing_section(cand)
    if ac is not None:
        cfg["activation_checkpointing"] = ac
    return cfg

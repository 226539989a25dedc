"""`RunPlan`: everything an estimate needs about one run (model shape + DeepSpeed JSON + cluster + parallelism).

Micro batch, gradient accumulation, ZeRO stage, offload and bucket sizes are read from the DeepSpeed JSON
(`ds_config`), so the estimate describes the config the user will actually launch. No torch import.
"""
from __future__ import annotations

import math
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dstoolkit.hardware.calibration import Calibration, calibration_for_spec
from dstoolkit.hardware.table import GpuSpec, get_gpu
from dstoolkit.layout import LayoutFacts, ParallelDims, data_parallel_size, require
from dstoolkit.layout.ulysses_heads import ulysses_impl
from dstoolkit.models.measured import ParamEntry
from dstoolkit.models.shape import ModelShape
from dstoolkit.runplan.autotp import AutoTp, tp_splits
from dstoolkit.fp8.selection import Fp8Selection, fp8_selection
from dstoolkit.runplan.dsview import DsView, read_ds_config
from dstoolkit.spec import Spec
from dstoolkit.spec.cluster_fields import AttentionImpl, LossImpl
from dstoolkit.spec.checkpoint import CheckpointPolicy

Precision = Literal["bf16", "fp16", "fp8", "fp32"]


class RunPlan(BaseModel):
    """One run to estimate."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=False)

    shape: ModelShape
    """The model architecture."""
    ds_config: dict
    """A complete DeepSpeed JSON (no "auto"): micro batch, accumulation, ZeRO stage, offload, buckets."""
    world_size: int = Field(gt=0)
    """Total ranks (GPUs)."""
    gpus_per_node: int = Field(gt=0)
    """Ranks per node as the network sees it (decides which collectives cross nodes): the NVLink domain
    (`ClusterSpec.nvlink_domain`), which is the host except on multi-host NVLink racks."""
    gpu: GpuSpec
    """Accelerator facts."""
    seq_len: int
    """Tokens per sequence (> 0)."""
    tp: int = Field(default=1, ge=1)
    """Tensor-parallel degree (Megatron's, or DeepSpeed AutoTP's where `autotp` is set)."""
    pp: int = Field(default=1, ge=1)
    """Pipeline-parallel degree."""
    ep: int = Field(default=1, ge=1)
    """Expert-parallel degree (MoE only)."""
    num_experts_override: None = None
    """Reserved (always None)."""
    checkpoint: CheckpointPolicy = Field(default_factory=CheckpointPolicy)
    """Activation recompute policy (the same object the runtime applies)."""
    flash_attention: bool = True
    """Fused/flash attention: no s^2 score tensor is stored."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism (needs tp > 1 to matter)."""
    precision: Precision = "bf16"
    """Compute precision; fp8 = FP8 GEMMs with bf16 weights/activations elsewhere."""
    attention_dropout: bool = False
    """Whether the model trains with attention/hidden dropout; unless given, read from the model config's attention
    dropout (ModelShape.attention_dropout > 0, `_dropout_from_shape`, for every way a plan is built): its masks are
    stored (Korthikanti's GPT has them; Llama-style has none) and an eager attention core runs a dropout pass over
    its scores (estimate.attention_core)."""
    moe_capacity_factor: float = Field(default=1.0, gt=0)
    """Expert capacity factor: tokens computed per expert = cf * k * tokens / E (1.0 = exactly top-k)."""
    calibration: Optional[Calibration] = None
    """Measured rates for the step-time model; None uses the GPU table with default efficiencies."""
    # -- the GPU cluster model (spec fields of dstoolkit.spec.cluster_fields; issue 16) --
    framework: Literal["deepspeed", "megatron", "fsdp"] = "deepspeed"
    """Runtime executing the model: decides the overlap defaults (estimate.cluster_model.resolved_overlap)."""
    overlap_grad_reduce: Optional[bool] = None
    """DP gradient reduction overlapped with backward; None = the framework's default."""
    overlap_param_gather: Optional[bool] = None
    """DP parameter all-gather overlapped with compute; None = the framework's default."""
    tp_comm_overlap: bool = False
    """TP collectives overlapped with the GEMMs (Megatron --tp-comm-overlap)."""
    moe_a2a_overlap: bool = False
    """MoE all-to-all overlapped with compute (Megatron --overlap-moe-expert-parallel-comm, DualPipe)."""
    cuda_launch_blocking: bool = False
    """CUDA_LAUNCH_BLOCKING=1: host issue time adds to GPU time (pipeline_stages.pipeline_compute_s)."""
    moe_dispatcher: Literal["alltoall", "deepep"] = "alltoall"
    """MoE token dispatch: one all-to-all (alltoall) or DeepEP's node-deduplicated IB + NVLink forwarding (deepep)."""
    recompute_modules: tuple[str, ...] = ()
    """Megatron --recompute-modules beyond the checkpoint policy (activations._fused_layer_bytes, cluster_model)."""
    pipeline_schedule: Literal["1f1b", "interleaved", "zero-bubble", "dualpipe"] = "1f1b"
    """Pipeline schedule (bubble: estimate.pipeline_stages.bubble_fraction)."""
    virtual_stages: int = Field(default=1, ge=1)
    """Model chunks per pipeline rank (interleaved schedule)."""
    cp: int = Field(default=1, ge=1)
    """Context-parallel degree (sequence split over cp ranks taken out of dp; ring attention)."""
    ulysses: int = Field(default=1, ge=1)
    """DeepSpeed-Ulysses sequence-parallel degree (taken out of dp; all-to-all of q, k, v, out)."""
    attention_impl: Optional[AttentionImpl] = None
    """Attention / fused-kernel implementation; None = sdpa when flash_attention (torch SDPA picks its flash
    kernel; the module repeats GQA k/v as dstoolkit.runtime.model and Hugging Face do), else eager."""
    loss_impl: LossImpl = "torch"
    """Cross-entropy kernel (spec training.loss_impl): torch keeps fp32 copies of the logits, fused does not
    (stage_activations.activation_bytes)."""
    autotp: Optional[AutoTp] = None
    """None: `tp` is Megatron's tensor parallelism (vocab-parallel embedding, LM head and logits). Set: `tp` is
    DeepSpeed AutoTP's (tensor_parallel.autotp_size), which splits the blocks' linears as Megatron's and holds the
    embedding, the LM head and the logits as this says (runplan.autotp.autotp_layout); no sequence parallelism,
    no pipeline."""
    fp8_selection: Optional[Fp8Selection] = None
    """With precision fp8: which linear layers run in FP8, as `dstoolkit fp8 plan` selects them
    (`fp8.selection.fp8_selection`: the config's dstoolkit.fp8 layer rules); None: every block's GEMMs (the LM head
    as `estimate.step_time` decides by framework)."""

    def fp8_share(self, layer: Optional[int]) -> float:
        """Share of block `layer`'s linear weights (None: the LM head) whose GEMMs run in FP8: 0 unless precision
        fp8; 1 without a selection (blocks; the head by framework, step_time)."""
        if self.precision != "fp8":
            return 0.0
        sel = self.fp8_selection
        if sel is None:
            return 1.0
        if layer is None:
            return 1.0 if sel.lm_head else 0.0
        return sel.blocks[layer] if 0 <= layer < len(sel.blocks) else 1.0

    def tp_splits(self, entry: ParamEntry) -> bool:
        """Whether this plan's tensor parallelism splits the parameter entry over its tp ranks
        (`runplan.autotp.tp_splits`: the entry's own flag under Megatron; the embedding and the LM head as
        `autotp` says under AutoTP)."""
        return tp_splits(entry, self.autotp)

    @property
    def logits_vocab_shards(self) -> int:
        """Ranks the [tokens, vocab] logits, and the loss over them, are split across: tp (Megatron's
        vocab-parallel output layer and cross-entropy; AutoTP's vocab-parallel LM head), or 1 where every AutoTP
        rank holds the whole vocabulary's logits (a gathered or a whole LM head)."""
        return self.tp if self.autotp is None or self.autotp.vocab_parallel_loss else 1

    @property
    def lm_head_gemm_shards(self) -> int:
        """Ranks the LM head's GEMM is split across: tp, or 1 where every AutoTP rank holds the whole head and runs
        it on the whole vocabulary (tp times the work of a split head)."""
        return self.tp if self.autotp is None or self.autotp.lm_head_split else 1

    @property
    def attention_kind(self) -> str:
        """The attention implementation in effect (attention_impl, else from flash_attention)."""
        return self.attention_impl or ("sdpa" if self.flash_attention else "eager")

    @model_validator(mode="before")
    @classmethod
    def _dropout_from_shape(cls, data: Any) -> Any:
        # the model's fact, stated once: a plan that does not say otherwise trains with the model config's dropout
        if isinstance(data, dict) and data.get("attention_dropout") is None and data.get("shape") is not None:
            shape = data["shape"]
            drop = shape.get("attention_dropout") if isinstance(shape, dict) else getattr(shape, "attention_dropout", 0)
            data = {**data, "attention_dropout": bool(drop and drop > 0)}
        return data

    @model_validator(mode="after")
    def _check_seq_len_positive(self) -> "RunPlan":
        if self.seq_len <= 0:
            raise ValueError(f"seq_len={self.seq_len}: the sequence length must be > 0 (e.g. seq_len=4096)")
        return self

    # -- layout: every check is a dstoolkit.layout constraint (codes in dstoolkit.layout.constraints) ----------
    def _layout_facts(self) -> LayoutFacts:
        s = self.shape
        return LayoutFacts(world=self.world_size, gpus_per_node=self.gpus_per_node, tp=self.tp, pp=self.pp,
                           ep=self.ep, sp=self.sequence_shards,
                           cp=self.cp, seq_len=self.seq_len, megatron_sp=self.sequence_parallel,
                           num_heads=s.num_attention_heads, kv_heads=s.kv_heads, is_mla=s.is_mla,
                           num_layers=s.num_hidden_layers, num_experts=s.num_experts,
                           virtual_stages=self.virtual_stages, framework=self.framework,
                           ulysses_impl=ulysses_impl(self.framework), pipeline_schedule=self.pipeline_schedule)

    def _require(self, codes: tuple[str, ...]) -> "RunPlan":
        require(self._layout_facts(), codes)  # LayoutError is a ValueError: pydantic reports its message
        return self

    @model_validator(mode="after")
    def _check_world_divisible(self) -> "RunPlan":
        return self._require(("LY001",))

    @model_validator(mode="after")
    def _check_tp_divides_heads(self) -> "RunPlan":
        return self._require(("LY003", "LY004"))

    @model_validator(mode="after")
    def _check_ep_divides_experts(self) -> "RunPlan":
        return self._require(("LY007", "LY008", "LY009"))

    @model_validator(mode="after")
    def _check_pp_layers(self) -> "RunPlan":
        return self._require(("LY005", "LY021", "LY022"))

    @model_validator(mode="after")
    def _check_sequence_shards(self) -> "RunPlan":
        return self._require(("LY023", "LY019", "LY020", "LY024"))

    @model_validator(mode="after")
    def _check_autotp(self) -> "RunPlan":
        if self.autotp is not None and (self.sequence_parallel or self.pp > 1):
            raise ValueError(f"autotp with sequence_parallel={self.sequence_parallel}, pp={self.pp}: DeepSpeed AutoTP "
                             "has no Megatron sequence parallelism and is not combined with a pipeline (DS225): "
                             "set sequence_parallel=False and pp=1, or autotp=None for Megatron tensor parallelism")
        return self

    @model_validator(mode="after")
    def _check_ds_config_readable(self) -> "RunPlan":
        self.ds  # raises ValueError with the offending key
        return self

    @property
    def dims(self) -> ParallelDims:
        """The layout's degrees (`dstoolkit.layout.ParallelDims`)."""
        return ParallelDims(world=self.world_size, tp=self.tp, pp=self.pp, ep=self.ep,
                            sp=self.sequence_shards, gpus_per_node=self.gpus_per_node)

    @property
    def sequence_shards(self) -> int:
        """Ranks one sequence is split over (context parallel x Ulysses), taken out of the data-parallel ones."""
        return self.cp * self.ulysses

    @property
    def dp(self) -> int:
        """Data-parallel degree: world_size / (tp * pp * cp * ulysses)."""
        return self.dims.dp

    @property
    def edp(self) -> int:
        """Expert-data-parallel degree: dp / ep (DeepSpeed's expert_data_parallel_group size)."""
        return self.dims.edp

    @property
    def ds(self) -> DsView:
        """The DeepSpeed JSON as the estimator reads it (`read_ds_config`; parsed once per config and layout)."""
        return read_ds_config(self.ds_config, self.dims)

    @property
    def nodes(self) -> int:
        return math.ceil(self.world_size / self.gpus_per_node)


_POLICY_FROM_SPEC = {"none": "none", "full": "full", "every-k": "every-k", "ratio": "ratio", "selective": "selective",
                     "auto": "none"}


_FROM_SPEC = object()
"""`plan_from_spec(calibration=...)` default: the spec's cluster.calibration."""


def plan_from_spec(spec: Spec, ds_config: dict, shape: ModelShape, *, tp: Optional[int] = None,
                   pp: Optional[int] = None, ep: Optional[int] = None, checkpoint: Optional[CheckpointPolicy] = None,
                   sequence_parallel: Optional[bool] = None, gpu: Optional[GpuSpec] = None,
                   world_size: Optional[int] = None, gpus_per_node: Optional[int] = None,
                   calibration=_FROM_SPEC) -> RunPlan:
    """Build a `RunPlan` from a spec, a resolved DeepSpeed JSON and the resolved model shape: the one
    Spec -> RunPlan adapter (the sweep's candidates come through here too, with their degrees as overrides).

    Args:
        spec: the training spec (cluster and training sections are read).
        ds_config: a complete DeepSpeed JSON for this run (no "auto").
        shape: the spec's model, resolved (`dstoolkit.models.resolve_model`).
        tp, pp, ep, checkpoint, sequence_parallel: the layout when the caller resolved it (a sweep candidate);
            None takes the spec's value ("auto" degrees count as 1, "auto" recompute as none).
        gpu: the device facts (default: the spec's cluster.gpu row).
        world_size, gpus_per_node: ranks when the run is not the spec's cluster (a bench on fewer ranks).
        calibration: measured rates (default: the spec's, `calibration_for_spec`; None: the table's rates).

    Raises:
        ValueError: impossible combinations (a `dstoolkit.layout` constraint: tp not dividing heads, ep not
            dividing experts, ...), a DeepSpeed JSON `read_ds_config` refuses, or an unusable
            cluster.calibration file.
    """
    t = spec.training
    if checkpoint is None:
        kind = _POLICY_FROM_SPEC[t.activation_checkpointing]
        if kind == "every-k":
            checkpoint = CheckpointPolicy(kind="every-k", every_k=t.checkpoint_every_k)
        elif kind == "ratio":
            checkpoint = CheckpointPolicy(kind="ratio", ratio=t.checkpoint_ratio)
        else:
            checkpoint = CheckpointPolicy(kind=kind)

    def deg(given: Optional[int], v) -> int:
        if given is not None:
            return int(given)
        return 1 if v == "auto" else int(v)

    shards = t.cp * t.ulysses
    if shards > 1:
        ds_config = _sequence_sharded_batch(ds_config, spec, shards, deg(tp, t.tp) * deg(pp, t.pp),
                                            world_size or spec.cluster.world_size)
    return RunPlan(
        fp8_selection=_spec_fp8_selection(spec, ds_config, shape, deg(tp, t.tp), deg(pp, t.pp), deg(ep, t.ep)),
        shape=shape,
        ds_config=ds_config,
        world_size=world_size or spec.cluster.world_size,
        gpus_per_node=gpus_per_node or spec.cluster.nvlink_domain,
        gpu=gpu if gpu is not None else get_gpu(spec.cluster.gpu),
        seq_len=t.seq_len,
        tp=deg(tp, t.tp),
        pp=deg(pp, t.pp),
        ep=deg(ep, t.ep),
        checkpoint=checkpoint,
        flash_attention=t.flash_attention,
        sequence_parallel=t.sequence_parallel if sequence_parallel is None else sequence_parallel,
        precision=t.precision,
        calibration=calibration_for_spec(spec) if calibration is _FROM_SPEC else calibration,
        framework=t.framework,
        overlap_grad_reduce=None if t.overlap_grad_reduce == "auto" else t.overlap_grad_reduce,
        overlap_param_gather=None if t.overlap_param_gather == "auto" else t.overlap_param_gather,
        tp_comm_overlap=t.tp_comm_overlap,
        moe_a2a_overlap=t.moe_a2a_overlap,
        cuda_launch_blocking=t.cuda_launch_blocking,
        moe_dispatcher=t.moe_dispatcher,
        recompute_modules=tuple(t.recompute_modules),
        pipeline_schedule=t.pipeline_schedule,
        virtual_stages=t.virtual_stages,
        cp=t.cp,
        ulysses=t.ulysses,
        attention_impl=t.attention_impl,
        loss_impl=t.loss_impl,
    )


_SPEC_FP8_NAMES = {"micro_batch": "training.micro_batch", "seq_len": "training.seq_len", "tp": "training.tp",
                   "pp": "training.pp", "ep": "training.ep",
                   "skip_first_layers": "training.fp8.layers.skip_first_layers",
                   "skip_last_layers": "training.fp8.layers.skip_last_layers"}
"""How the FP8 selection's errors name the spec's fields."""


def _spec_fp8_selection(spec: Spec, ds_config: dict, shape: ModelShape, tp: int, pp: int,
                        ep: int) -> Optional[Fp8Selection]:
    """The FP8 layer selection of a DeepSpeed-framework fp8 spec: dstoolkit's own Transformer Engine swap runs it
    (`runtime.fp8.convert` with the spec's training.fp8, which `generate` writes as the JSON's dstoolkit.fp8), so
    the layers it keeps in bf16 (the LM head by default, fp8.layers skips and patterns) are priced in bf16, as
    `estimate --config` on the generated JSON prices them. None for Megatron and FSDP, which pick their own FP8
    layers (the LM head by framework, `estimate.step_time`), and without fp8.

    Raises:
        ValueError: a selection `fp8 plan` refuses (skips that leave no block, tokens per micro batch Transformer
            Engine refuses), in the spec's field names."""
    t = spec.training
    if t.precision != "fp8" or t.framework != "deepspeed":
        return None
    micro = ds_config.get("train_micro_batch_size_per_gpu")
    return fp8_selection(shape, t.fp8_config(), micro_batch=int(micro) if isinstance(micro, int) else 1,
                         seq_len=t.seq_len, tp=tp, pp=pp, ep=ep, names=_SPEC_FP8_NAMES)


def _sequence_sharded_batch(ds_config: dict, spec: Spec, shards: int, model_ranks: int, world: int) -> dict:
    """The DeepSpeed JSON's batch triad over the data-parallel ranks left when cp x Ulysses ranks share each
    sequence (dp = world / (tp * pp * cp * ulysses)): the generator counts dp = world / (tp * pp). The JSON's
    sequence_parallel_size carries the shard count (DeepSpeed's own key for Ulysses; for Megatron CP the
    nearest DeepSpeed expression)."""
    dp = data_parallel_size(world, model_ranks, 1, shards) or 0  # dstoolkit.layout: None when not whole
    mb = int(ds_config.get("train_micro_batch_size_per_gpu") or 1)
    gb = spec.training.global_batch
    if dp < 1 or gb % (mb * dp):
        raise ValueError(f"global_batch {gb} is not a multiple of micro batch {mb} x dp {dp} "
                         f"(dp = world / (tp * pp * cp * ulysses))")
    out = dict(ds_config)
    out["train_batch_size"] = gb
    out["gradient_accumulation_steps"] = gb // (mb * dp)
    out["sequence_parallel_size"] = shards  # DeepSpeed divides dp by it (runtime/config.py, as for Ulysses)
    return out

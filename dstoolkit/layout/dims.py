"""Parallel dimensions: the arithmetic of world, tp, pp, sp, dp, ep and the batch, written once.

Every caller (the spec loader, `dstoolkit validate`'s cross-field rules, the sweep, the estimator, the tuner
and the trainer) asks this module instead of repeating ``world // (tp * pp)``. Pure Python, imports nothing
else from dstoolkit, so the lowest layers can use it.

Group structure (DeepSpeed 0.19.8 deepspeed/utils/groups.py; Megatron-LM parallel_state.py):
- model-parallel ranks = tp * pp (* sp for DeepSpeed Ulysses sequence parallelism, which splits the sequence
  over ranks taken out of the data-parallel group);
- dp = world / (tp * pp * sp);
- expert parallelism carves ep-sized groups out of the data-parallel group: edp = dp / ep
  (DeepSpeed `_create_expert_and_data_parallel`);
- DeepSpeed's batch rule: train_batch_size = micro_batch * gradient_accumulation_steps * dp
  (deepspeed/runtime/config.py `_set_batch_related_parameters` and `_batch_assertion`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional


class LayoutError(ValueError):
    """An impossible layout. `code` is the constraint code (dstoolkit.layout.constraints), `fix` says what to change."""

    def __init__(self, code: str, message: str, fix: str):
        super().__init__(f"{message} ({fix})" if fix else message)
        self.code = code
        self.message = message
        self.fix = fix


def data_parallel_size(world: int, tp: int = 1, pp: int = 1, sp: int = 1) -> Optional[int]:
    """dp = world / (tp * pp * sp); None when that product does not divide the world size."""
    denom = max(tp, 1) * max(pp, 1) * max(sp, 1)
    if world <= 0 or world % denom:
        return None
    return world // denom


@dataclass(frozen=True)
class ParallelDims:
    """One layout's degrees. Construct only layouts whose model-parallel product divides `world`."""

    world: int
    """Total ranks."""
    tp: int = 1
    """Tensor-parallel degree (inside a node)."""
    pp: int = 1
    """Pipeline stages."""
    ep: int = 1
    """Expert-parallel degree (a divisor of dp)."""
    sp: int = 1
    """Sequence-parallel ranks of DeepSpeed Ulysses (taken out of dp). Megatron's sequence parallelism reuses
    the TP group and is not a degree here."""
    gpus_per_node: Optional[int] = None
    """Ranks per node; None when unknown (single node assumed by `nodes`)."""

    def __post_init__(self) -> None:
        for name in ("world", "tp", "pp", "ep", "sp"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise LayoutError("LY000", f"{name}={v!r} must be a positive integer", f"give {name} >= 1")
        if data_parallel_size(self.world, self.tp, self.pp, self.sp) is None:
            raise LayoutError("LY001", f"tp * pp * sp = {self.tp} * {self.pp} * {self.sp} = {self.model_ranks} does "
                              f"not divide the world size {self.world}", "pick degrees whose product divides the world size")

    @property
    def model_ranks(self) -> int:
        """Ranks one model replica spans: tp * pp * sp."""
        return self.tp * self.pp * self.sp

    @property
    def dp(self) -> int:
        """Data-parallel degree: world / (tp * pp * sp)."""
        return self.world // self.model_ranks

    @property
    def edp(self) -> int:
        """Expert-data-parallel degree: dp / ep (DeepSpeed's expert_data_parallel_group size)."""
        return self.dp // self.ep

    @property
    def nodes(self) -> int:
        """Nodes the job spans (1 when gpus_per_node is unknown)."""
        return math.ceil(self.world / self.gpus_per_node) if self.gpus_per_node else 1

    def hpz_partition_size(self) -> int:
        """ZeRO++ hpZ secondary partition (hpz_partition)."""
        return hpz_partition(self.gpus_per_node, self.world, self.tp, self.dp)


def hpz_partition(gpus_per_node: Optional[int], world: int, tp: int, dp: int) -> int:
    """ZeRO++ hpZ secondary partition size: the data-parallel ranks of one node (gpus_per_node / tp) when the
    data-parallel group spans nodes (ZeRO++ paper §3.2: the secondary copy is partitioned inside a node so that
    backward's all-gather stays on the node's links), else 1 (off). A data-parallel group that fits in one node
    gains nothing from it: DeepSpeed still builds the secondary partition for any zero_hpz_partition_size > 1
    (partition_parameters.py Init.__init__: zero_param_process_group, secondary size tensor_size //
    num_ranks_in_param_group), a second copy of the primary one when the two groups are the same ranks."""
    per_node = max(1, (gpus_per_node or world) // tp)
    return per_node if dp > per_node else 1


@dataclass(frozen=True)
class BatchTriad:
    """DeepSpeed's three batch numbers, consistent: train_batch = micro_batch * grad_accum * dp."""

    micro_batch: int
    grad_accum: int
    train_batch: int


def resolve_batch(train_batch: Optional[int], micro_batch: Optional[int], grad_accum: Optional[int],
                  dp: int) -> BatchTriad:
    """Complete the batch triad the way DeepSpeed does: any two determine the third; one alone takes
    grad_accum = 1 (deepspeed/runtime/config.py `_set_batch_related_parameters`).

    Raises:
        LayoutError: none of the three is given (LY020), or the given ones disagree with dp (LY017).
    """
    tb, mb, ga = train_batch, micro_batch, grad_accum
    if tb is None and mb is None:
        raise LayoutError("LY020", "neither train_batch_size nor train_micro_batch_size_per_gpu is set",
                          "set train_micro_batch_size_per_gpu")
    if mb is not None and ga is not None:
        triad = BatchTriad(mb, ga, mb * ga * dp)
        if tb is not None and tb != triad.train_batch:
            raise LayoutError("LY017", f"train_batch_size {tb} != micro batch {mb} x gradient accumulation {ga} x "
                              f"dp {dp} = {triad.train_batch}", "make the three agree")
        return triad
    if mb is not None and tb is not None:
        ga = tb // (mb * dp)
    elif ga is not None and tb is not None:
        mb = tb // (ga * dp)
    elif tb is not None:
        ga, mb = 1, tb // dp
    else:
        ga = 1
    if mb is None or ga is None or mb < 1 or ga < 1 or (tb is not None and tb != mb * ga * dp):
        raise LayoutError("LY017", f"train_batch_size {tb} is not a multiple of the micro batch x gradient "
                          f"accumulation x dp {dp}", f"use a train_batch_size that is a multiple of {(mb or 1) * dp}")
    return BatchTriad(mb, ga, mb * ga * dp)


PipelineSplit = Literal["megatron", "uniform"]
"""How a framework assigns blocks to pipeline stages (pipeline_split)."""


def pipeline_split(framework: Optional[str]) -> PipelineSplit:
    """The stage split a framework's pipeline uses: Megatron-LM's ("megatron"), or DeepSpeed's PipelineModule and
    torchtitan's ("uniform": the first L mod pp stages take one block more)."""
    return "megatron" if framework == "megatron" else "uniform"


@dataclass(frozen=True)
class MegatronSplit:
    """How Megatron-LM is told a split (megatron_split): nothing (even), the edge-stage flags, or a layout."""

    layers: tuple[int, ...]
    first: Optional[int] = None
    """--decoder-first-pipeline-num-layers."""
    last: Optional[int] = None
    """--decoder-last-pipeline-num-layers."""
    layout: Optional[str] = None
    """--pipeline-model-parallel-layout: stages split by "|", "E" the embedding, "t*n" n decoder layers, "L" the
    output layer and loss (Megatron-Core PipelineParallelLayerLayout)."""

    def args(self) -> list[tuple[str, str]]:
        """(flag, value) pairs that ask Megatron-LM for this split; none for an even one."""
        pairs = (("--decoder-first-pipeline-num-layers", self.first), ("--decoder-last-pipeline-num-layers", self.last),
                 ("--pipeline-model-parallel-layout", self.layout))
        return [(flag, str(v)) for flag, v in pairs if v is not None]


def _check_pp(num_layers: int, pp: int) -> None:
    if pp < 1 or pp > num_layers:
        raise LayoutError("LY005", f"pp={pp} exceeds num_hidden_layers={num_layers}",
                          f"pick pp between 1 and {num_layers}: each pipeline stage needs a layer")


def _uniform(num_layers: int, pp: int) -> tuple[int, ...]:
    base, extra = divmod(num_layers, pp)
    return tuple(base + (1 if s < extra else 0) for s in range(pp))


def megatron_split(num_layers: int, pp: int) -> MegatronSplit:
    """Megatron-LM's split of L blocks over pp stages, and the flags that ask for it. Every uneven form keeps the
    largest stage at ceil(L / pp) and puts the lighter stages at the end, where the output layer and the loss
    (V x h weights, the logits) already sit:

    - pp divides L: L / pp each, no flag;
    - else ceil(L / pp) on every stage before the last and the rest on the last
      (--decoder-last-pipeline-num-layers);
    - where that leaves the last stage nothing: ceil(L / pp) on the middle stages and the rest split between the
      first and the last, the last taking the smaller half (--decoder-first- and --decoder-last-pipeline-num-layers;
      Megatron-Core TransformerConfig's uneven-PP check wants each edge stage > 0 and the middle layers divisible
      by the middle stages);
    - where that leaves an edge empty too: the uniform split (stage_layers "uniform") written as
      --pipeline-model-parallel-layout.

    Raises:
        LayoutError: pp below 1 or above the layer count (LY005).
    """
    _check_pp(num_layers, pp)
    if num_layers % pp == 0:
        return MegatronSplit((num_layers // pp,) * pp)
    per_stage = -(-num_layers // pp)
    last = num_layers - (pp - 1) * per_stage
    if last >= 1:
        return MegatronSplit((per_stage,) * (pp - 1) + (last,), last=last)
    edges = num_layers - (pp - 2) * per_stage
    if edges >= 2:
        a, b = edges - edges // 2, edges // 2
        return MegatronSplit((a,) + (per_stage,) * (pp - 2) + (b,), first=a, last=b)
    layers = _uniform(num_layers, pp)
    stages = [f"t*{n}" for n in layers]
    return MegatronSplit(layers, layout="|".join(["E" + stages[0]] + stages[1:-1] + [stages[-1] + "L"]))


def stage_layers(num_layers: int, pp: int, split: PipelineSplit = "megatron") -> tuple[int, ...]:
    """Blocks per pipeline stage, stage 0 first: the one statement of the split (the LY005 rule, the estimate
    and the generated Megatron-LM arguments all read it). "megatron": megatron_split. "uniform": DeepSpeed's
    PipelineModule (deepspeed/runtime/utils.py partition_uniform: L // pp each, the first L mod pp stages one
    more; Megatron-DeepSpeed's partition_method 'type:transformer' balances the same block counts) and
    torchtitan's split.

    Raises:
        LayoutError: pp below 1 or above the layer count (LY005): some stage would hold no block.
    """
    if split == "uniform":
        _check_pp(num_layers, pp)
        return _uniform(num_layers, pp)
    return megatron_split(num_layers, pp).layers


def stage_layer_range(num_layers: int, pp: int, stage: int, split: PipelineSplit = "megatron") -> range:
    """The blocks (indices) pipeline stage `stage` holds under stage_layers' split."""
    counts = stage_layers(num_layers, pp, split)
    start = sum(counts[:stage])
    return range(start, start + counts[stage])


def ramp_increment(increment: Optional[int], micro_batch: int, dp: int) -> int:
    """A batch ramp's increment: the spec's, or micro_batch * dp (the finest step DeepSpeed can take)."""
    return increment if increment else micro_batch * dp

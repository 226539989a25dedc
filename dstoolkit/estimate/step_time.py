"""Step-time model: compute ÷ (peak × efficiency) + exposed communication + optimizer update (+ offload).

Collectives whose group spans nodes run at the inter-node rate (GpuSpec.inter_node_bw, or
Calibration.inter_node_busbw when calibrated), divided among the groups that cross one link side by side
(estimate.collective_time.link_share). Overlap assumption (explicit): collectives DeepSpeed can overlap (stage 1/2 gradient reduction with
overlap_comm, stage-3 prefetching) hide behind backward compute with efficiency η
(docs/anchors.md: η = 1 − exposed ÷ total), read as contention: the compute runs at η of its speed beside them
(overlapped_exposed_s); everything else is exposed. No torch import.
"""
from __future__ import annotations

from dataclasses import dataclass

from dstoolkit.estimate import cluster_model as cm
from dstoolkit.estimate import collective_time as _ct
from dstoolkit.estimate import host_cost
from dstoolkit.estimate import pipeline_stages as stages
from dstoolkit.estimate.collective_time import nccl_call_latency_s, op_time_s
from dstoolkit.estimate.comm import CommPlan
from dstoolkit.estimate.cpu_compute import cpu_compute_s, op_rates
from dstoolkit.estimate.flops import FlopsPerToken, lm_head_train_flops_per_token
from dstoolkit.estimate.gemm import linear_s
from dstoolkit.hardware.calibration import peak_flops_per_rank
from dstoolkit.runplan import RunPlan

DEFAULT_COMPUTE_EFFICIENCY = 0.55
"""Fraction of dense peak a training step sustains, for callers that want one number (the GPU step time itself
uses the per-GEMM model of estimate.cluster_model): published end-to-end MFU is 38-56% (Llama 3 405B 38-43%,
Megatron 51-56%, MegaScale 55.2%; docs/anchors.md)."""
DEFAULT_OVERLAP_EFFICIENCY = 0.8
"""η for overlappable collectives on GPUs (separate comm streams); Lee et al. 2025 measure sequential
execution only 10.2% slower than overlapped, i.e. most but not all communication hides. Applied as the compute's
speed while collectives run beside it (overlapped_exposed_s), so a communication-bound step pays the collectives'
time, not that plus a slowdown of the compute hidden under them."""
DEFAULT_HBM_BW_BYTES_PER_S = 3.35e12
"""H100 SXM HBM3 datasheet bandwidth; the optimizer update is memory-bound."""
ADAM_BYTES_PER_PARAM_UPDATE = 30
"""Adam step traffic per fp32 partition element: read+write master (8), read grad (4), read+write m and v
(16), write the low-precision copy (2)."""
PCIE_BYTES_PER_S = 25e9
"""Achievable host<->device copy rate on PCIe Gen4 x16 (ZeRO-Offload transfers grads down and params up)."""
PARAM_OFFLOAD_FETCHES_PER_MICRO = 2
"""Host-to-device copies of the offloaded parameter partition per micro step (forward and backward gathers)."""
CPU_ADAM_PARAMS_PER_S = 1.0e9
"""DeepSpeedCPUAdam throughput per rank (AVX-512, several cores): order of magnitude from ZeRO-Offload
(arXiv 2101.06840 §4.2 reports ~6x over torch CPU Adam)."""
GRAD_HANDLING_PASSES = 6
"""Memory passes over each local gradient element per micro step, in units of the model dtype: autograd
writes it, DeepSpeed copies it into the reduce bucket (read + write) and the reduction reads and writes it
(stage_1_and_2.py reduce_independent_p_g_buckets_and_remove_grads / engine buffered all-reduce)."""
MEGATRON_GRAD_BUFFER_PASSES = 4
"""Per step and local parameter with Megatron (GPU path), in units of the model dtype: the fp32 main_grad buffer
(2 units per element) read and written once when it is reduced and handed to the optimizer. Megatron fuses the
micro steps' accumulation into the weight-gradient GEMM (Megatron-LM --gradient-accumulation-fusion, on unless
--no-gradient-accumulation-fusion; Megatron-Core ModelParallelConfig.gradient_accumulation_fusion: "fuses weight
gradient accumulation to GEMMs"), so GRAD_HANDLING_PASSES per micro step does not apply."""
PARAM_WRITEBACK_PASSES = 2
"""Per step and local parameter: the updated fp32 master is copied into the low-precision flat buffer, and the
all-gather writes the other partitions (in units of the model dtype)."""
LOSS_FP32_PASSES = 6
"""fp32 passes over the (tokens x vocab) logits per micro step outside the matmuls: the .float() copy, log-softmax
forward output, its backward read/write and the gradient cast back (torch_model / HF cross-entropy)."""
BACKWARD_SHARE = 2.0 / 3.0
"""Backward is ~2/3 of training compute (4N of 6N), the window gradient reduction can hide in."""


@dataclass(frozen=True)
class StepTime:
    """Seconds per optimizer step on one rank."""

    compute_s: float
    comm_total_s: float
    comm_exposed_s: float
    optimizer_s: float
    memory_s: float
    """Memory-bound work besides the optimizer: gradient handling, parameter write-back, fp32 loss."""
    offload_s: float
    overhead_s: float
    overlap_efficiency: float

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_exposed_s + self.optimizer_s + self.memory_s + self.offload_s + self.overhead_s


def peak_flops(plan: RunPlan) -> float:
    """Per-rank MFU peak for the plan's precision: `hardware.calibration.peak_flops_per_rank` (a calibration's
    measured GEMM peak, else the table's fp8 / bf16 peak; fp32 is taken as the bf16 tensor peak)."""
    return peak_flops_per_rank(plan.gpu, plan.precision, plan.calibration)[0]


def step_time(plan: RunPlan, fpt: FlopsPerToken, comm: CommPlan, partition_numel: int,
              tokens_per_rank_step: float, local_numel: int = 0) -> StepTime:
    """Predict one optimizer step.

    Args:
        plan: the run.
        fpt: FLOPs per token.
        comm: collectives of the step.
        partition_numel: parameters this rank's optimizer updates (its fp32 partition).
        tokens_per_rank_step: tokens one data-parallel replica processes per step (micro·accum·seq).
        local_numel: parameters this rank holds (after TP/PP/EP), for the memory-bound gradient handling.
    """
    cal = plan.calibration
    ds = plan.ds
    model_ranks = plan.tp * plan.pp
    if cal is not None:
        intra = cal.comm_busbw_bytes_per_s
        inter = cal.inter_node_busbw_bytes_per_s or intra
        latency = cal.comm_latency_s
        inter_latency = cal.inter_node_latency_s if cal.inter_node_latency_s is not None else latency
        links = cal.inter_node_links_per_node
        mem_bw = cal.mem_bw_bytes_per_s
        nics = None  # the calibration's inter-node busbw is what one group measured (links_per_node shares it)
        group_nics = None
        eta = 0.0  # CPU ranks run gloo on the same cores: nothing overlaps
        if cal.has_op_rates:  # the probe's op-level rates: each GEMM at its shape, attention, elementwise

            compute = cpu_compute_s(plan, op_rates(cal))
            layers = max(len(stages.stage_layers(plan, st)) for st in range(plan.pp))
        else:  # one block rate, interpolated in size between the probe's two blocks
            flops = fpt.hardware * tokens_per_rank_step / model_ranks
            if plan.lm_head_gemm_shards != plan.tp:
                # a whole LM head on every AutoTP rank: its GEMMs run lm_head_gemm_shards-split, not tp-split
                flops += lm_head_train_flops_per_token(plan.shape) * tokens_per_rank_step * (
                    1 / plan.lm_head_gemm_shards - 1 / plan.tp)
            if plan.pp > 1:
                # 1F1B bubble: (pp - 1) / micro batches of idle time (Narayanan et al. 2021, §2.2)
                flops *= 1.0 + stages.bubble_fraction(plan.pipeline_schedule, plan.pp, ds.grad_accum, plan.virtual_stages)
            compute = flops / cal.rate_at(ds.micro_batch * plan.seq_len * plan.shape.hidden_size / plan.tp)
            layers = plan.shape.num_hidden_layers
        overhead = cal.step_overhead_s + cal.per_layer_overhead_s * layers * ds.grad_accum
    else:
        intra, inter = plan.gpu.intra_node_bw_bytes_per_s, plan.gpu.inter_node_bw_bytes_per_s
        latency = inter_latency = 0.0
        # GpuSpec.inter_node_bw is one NIC's; a group gets a NIC per rank it has on the node, shared with the
        # groups crossing beside it (collective_time.group_inter_node_busbw); nodes without a stated NIC count have one per GPU
        links = None
        nics = plan.gpu.nics_per_node or plan.gpus_per_node
        group_nics = plan.gpu.nics_per_group
        mem_bw = cm.hbm_bw(plan.gpu, DEFAULT_HBM_BW_BYTES_PER_S)
        eta = DEFAULT_OVERLAP_EFFICIENCY
        overhead = host_cost.host_step_s(plan)  # the optimizer step's host work (DeepSpeed engine, measured)
        compute = gpu_compute_s(plan, mem_bw)

    exposed = 0.0
    total = 0.0
    hide_bwd = 0.0
    hide_any = 0.0
    gpu_latency = cal is None and _ct.NCCL_CALL_LATENCY
    for op in comm.ops:
        t = op_time_s(op, intra, inter, latency, inter_latency, links, nics, group_nics)
        if gpu_latency:
            # GPU ranks: each call's fixed cost in NCCL's own tuning model (collective_time.nccl_call_latency_s)
            t += op.calls * nccl_call_latency_s(op)
        total += t
        if not op.overlappable:
            exposed += t
            continue
        # the part of the op that cannot run ahead of its consumer (comm.CommOp.hidden_fraction) is exposed
        exposed += t * (1.0 - op.hidden_fraction)
        if _backward_only(op.name):
            hide_bwd += t * op.hidden_fraction
        else:
            hide_any += t * op.hidden_fraction
    # gradient reduction hides only behind backward compute; parameter gathers, TP, all-to-all and CP traffic
    # behind any compute left over; each hides with efficiency eta
    window_bwd = min(hide_bwd, compute * BACKWARD_SHARE)
    window_any = min(hide_any, max(0.0, compute - window_bwd))
    exposed += overlapped_exposed_s(hide_bwd + hide_any, window_bwd + window_any, eta)
    offload = 0.0
    if ds.offload_optimizer:
        optimizer = partition_numel / CPU_ADAM_PARAMS_PER_S if cal is None else \
            partition_numel * ADAM_BYTES_PER_PARAM_UPDATE / mem_bw
        offload = 0.0 if cal is not None else partition_numel * (4 + 2) / PCIE_BYTES_PER_S
    else:
        optimizer = partition_numel * ADAM_BYTES_PER_PARAM_UPDATE / mem_bw
    # memory-bound work outside the GEMMs and the optimizer: gradient handling, parameter write-back, and the
    # fp32 loss over the vocabulary (on the last pipeline stage)
    pb = 4 if plan.precision == "fp32" else 2
    if ds.offload_param and cal is None:
        # ZeRO-Infinity (Rajbhandari et al. 2021, §5): the 16-bit parameter partition lives in host memory and is
        # copied to the GPU before each all-gather, in forward and again in backward, every micro step
        offload += partition_numel * pb * PARAM_OFFLOAD_FETCHES_PER_MICRO * ds.grad_accum / PCIE_BYTES_PER_S
    grad_passes = GRAD_HANDLING_PASSES * ds.grad_accum
    if cal is None and plan.framework == "megatron":
        # Megatron's gradient-accumulation fusion: the weight-gradient GEMM accumulates into the fp32 main_grad
        # buffer itself, so a micro step adds no gradient pass; the buffer is read and written once per step
        grad_passes = MEGATRON_GRAD_BUFFER_PASSES
    grad_traffic = local_numel * pb * (grad_passes + PARAM_WRITEBACK_PASSES)
    grad_bw = (cal.grad_bw_bytes_per_s if cal is not None else None) or mem_bw
    loss_traffic = (LOSS_FP32_PASSES * 4 * tokens_per_rank_step * plan.shape.vocab_size / plan.logits_vocab_shards
                    / plan.sequence_shards)
    return StepTime(compute_s=compute, comm_total_s=total, comm_exposed_s=exposed, optimizer_s=optimizer,
                    memory_s=grad_traffic / grad_bw + loss_traffic / mem_bw, offload_s=offload, overhead_s=overhead, overlap_efficiency=eta)


def overlapped_exposed_s(comm_s: float, window_s: float, eta: float) -> float:
    """Seconds that `comm_s` of overlappable communication adds to a step whose compute offers `window_s` to hide
    it in (window_s <= comm_s), at overlap efficiency `eta` (docs/anchors.md: eta = 1 - exposed / total).

    A contention model: while the collectives run, the compute proceeds at `eta` of its speed (it shares the GPU's
    SMs and memory bandwidth with the collectives' kernels) and the collectives at theirs. Where the compute is
    the longer, the collectives finish inside it and slow it by (1 - eta) x comm_s; where they are the longer, the
    slowed compute finishes under them and the step pays only what overflows the window. So the step pays the
    longer of the two, max(comm_s - window_s, (1 - eta) x comm_s): eta = 1 gives max(compute, comm), eta = 0 (no
    overlap, e.g. gloo on the cores that compute) their sum."""
    return max(comm_s - window_s, (1.0 - eta) * comm_s)


def _backward_only(name: str) -> bool:
    """Gradient collectives (they can only start once backward produced their bucket)."""
    return "grad" in name or name.startswith("dp_all_reduce") or name == "zeropp_qgz_all_to_all"


def gpu_compute_s(plan: RunPlan, mem_bw: float) -> float:
    """Compute seconds of one optimizer step on a GPU rank: the heaviest pipeline stage's blocks (each GEMM at
    its shape's rate, the attention core at its kernel's rate, the memory-bound rest at HBM bandwidth) over
    every micro batch, the LM head on the last stage, divided by the framework efficiency, never below the host's
    time to issue them (host_cost.host_layer_s), with the schedule's fill and drain (pipeline_stages.flush_s)."""
    shape = plan.shape
    tok = cm.tokens_per_micro(plan)
    h, v = shape.hidden_size, shape.vocab_size
    # Megatron-Core keeps the output layer out of FP8: it is Megatron's own ColumnParallelLinear, not a Transformer
    # Engine module, and the FP8 context wraps the transformer layers only (transformer_block.py); torchtitan's
    # Float8 converter takes every nn.Linear not in filter_fqns (default: none), the LM head included
    # A plan with an FP8 selection (RunPlan.fp8_selection) runs the head as `fp8 plan` selects it (its default
    # excludes '*lm_head*')
    head_bf16 = plan.framework == "megatron" or (plan.fp8_selection is not None and not plan.fp8_selection.lm_head)
    head_prec = "bf16" if plan.precision == "fp8" and head_bf16 else plan.precision
    # split over tp, or whole on every rank where DeepSpeed AutoTP keeps the head whole (RunPlan.lm_head_gemm_shards)
    shards = plan.lm_head_gemm_shards
    one = linear_s(plan.gpu, head_prec, v * h * tok / shards, tok, v / shards, h)
    head = one.forward_s + one.backward_s
    eff = cm.FRAMEWORK_EFFICIENCY
    # the host issues each block's kernels ahead of the GPU: a micro batch takes the longer of the two
    # (host_cost.host_layer_s; binds for small models at small micro batches)
    return stages.pipeline_compute_s(plan, lambda i, saved: cm.layer_compute_s(plan, i, tok, saved, mem_bw) / eff,
                                     head / eff, lambda i: host_cost.host_layer_s(plan, i),
                                     host_cost.host_micro_step_s(plan))

"""Activation memory of one rank: its pipeline stage's blocks (per block: `dstoolkit.estimate.activations`) times
the micro batches the schedule keeps in flight, the embedding's ids, the final norm, LM head and loss tensors on
the stage that holds them, and what a pipeline engine's buffers keep (split from estimate.activations, which
counts one block). The memory timeline (estimate.timeline) decides which of these coexist. No torch import.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from dstoolkit.estimate.activations import _act_bytes, layer_activation_bytes, op_sac_layer_bytes, uses_op_sac
from dstoolkit.estimate.dtype_bytes import FP32_BYTES, INDEX_BYTES
from dstoolkit.layout import pipeline_split, stage_layer_range
from dstoolkit.runplan import RunPlan


@dataclass(frozen=True)
class ActivationEstimate:
    """Activation bytes on one rank."""

    saved: float
    """Saved for backward at the end of the forward pass (all layers of the stage, in-flight micro batches)."""
    recompute_transient: float
    """Extra bytes while one recomputed block re-runs its forward in backward."""
    embedding_and_loss: float
    """Embedding ids, final norm, LM-head input and fp32 log-probabilities (included in `saved`)."""
    in_flight_micro_batches: float
    """Micro batches whose activations coexist (1F1B pipeline: min(pp, grad_accum) on the first stage)."""
    loss_forward_transient: float = 0.0
    """Bytes beyond `saved` while the loss is computed: the logits (activation dtype) and, when that is not fp32,
    their `.float()` copy, alive with the fp32 log-softmax output (`F.cross_entropy(logits.float() ...)`, the
    project model and HF's ForCausalLMLoss both upcast); 0 when the head is not on this rank's stage."""
    loss_backward_transient: float = 0.0
    """Bytes beyond `saved` when backward starts at the loss: log_softmax's backward holds the incoming gradient of
    the log-probabilities (nll_loss backward) and its own output, both fp32 [tokens, vocab/tp], while every
    saved activation is still alive."""
    pipe_buffers: float = 0.0
    """Bytes a pipeline engine's buffers hold through every phase of the step, outside `saved`: DeepSpeed's last
    stage keeps the logits of its last DEEPSPEED_LAST_STAGE_PIPE_BUFFERS micro batches (deepspeed_pipe_logits)."""

    @property
    def peak(self) -> float:
        return self.saved + self.recompute_transient + self.pipe_buffers


LOSS_BACKWARD_FP32_COPIES = 2
"""aten log_softmax_backward_data: grad_output (from nll_loss_backward) and grad_input, fp32 [tokens, vocab]."""
DEEPSPEED_LAST_STAGE_PIPE_BUFFERS = 2
"""Pipe buffers of DeepSpeed's last pipeline stage: runtime/pipe/schedule.py TrainSchedule.num_pipe_buffers,
max(2, min(stages - stage_id, micro_batches)), which is 2 on the last stage."""
FUSED_LOSS_BACKWARD_COPIES = 1
"""A fused cross-entropy's backward (flash-attn `losses/cross_entropy.py`, `cross_entropy_loss` backward with
inplace_backward off, the CrossEntropyLoss default): one gradient of the logits' shape and dtype, computed from the
kept logits and the fp32 log-sum-exp; no fp32 [tokens, vocab] tensor at any point."""


def activation_bytes(plan: RunPlan, micro_batch: int | None = None, stage: str = "first") -> ActivationEstimate:
    """Activation memory of one rank for the plan's checkpoint policy.

    The checkpoint policy is read from the shared `CheckpointPolicy.checkpointed_layers`, so the estimate
    and the runtime choose the same blocks. Selective recompute drops each block's attention core.

    stage: with a pipeline, "first" (the stage that holds the most micro batches in flight) or "last" (one micro
    batch in flight under 1F1B, last_stage_in_flight, but the final norm, LM head and loss with their
    [tokens, vocab] transients, which the first stage never holds). Without a pipeline both are the one stage.
    """
    if stage not in ("first", "last"):
        raise ValueError(f"stage={stage!r}: use 'first' or 'last'")
    last = stage == "last" and plan.pp > 1
    shape = plan.shape
    mb = micro_batch if micro_batch is not None else plan.ds.micro_batch
    flags = plan.checkpoint.checkpointed_layers(shape.num_hidden_layers)
    per_stage = math.ceil(shape.num_hidden_layers / plan.pp)
    layers = range(0, min(per_stage, shape.num_hidden_layers))  # first stage (holds the most micro batches)
    if last:
        layers = stage_layer_range(shape.num_hidden_layers, plan.pp, plan.pp - 1, pipeline_split(plan.framework))
    saved = 0.0
    transient = 0.0
    for li in layers:
        la = layer_activation_bytes(plan, li, mb)
        sac = op_sac_layer_bytes(plan, li, mb) if uses_op_sac(plan) and not flags[li] else None
        if flags[li]:
            saved += la.checkpointed
            transient = max(transient, la.full)
        elif sac is not None:
            # torchtitan op-level SAC: the kept tensors; one block's recomputed ones are alive while it re-runs
            saved += sac
            transient = max(transient, la.full - sac)
        elif plan.checkpoint.recomputes_attention_core:
            saved += la.full - la.attention_core
        else:
            saved += la.full
    p, pl = _act_bytes(plan, None)  # pl: the LM head's input
    tok = plan.seq_len * mb / (plan.cp * plan.ulysses)
    h, v = shape.hidden_size, shape.vocab_size
    emb_loss = 0.0 if last else INDEX_BYTES * tok  # embedding backward keeps the ids (the first stage's)
    fused_loss = plan.loss_impl == "fused"
    holds_head = plan.pp == 1 or last
    pipe_logits = deepspeed_pipe_logits(plan, mb) if last else 0.0
    if holds_head:
        # final RMSNorm, LM-head input, the labels, and what the loss keeps for its backward: torch's log_softmax
        # its fp32 output; a fused cross-entropy the low-precision logits and an fp32 log-sum-exp per token
        emb_loss += (FP32_BYTES + p) * tok * h + FP32_BYTES * tok + pl * tok * h + INDEX_BYTES * tok
        if fused_loss:
            # the kept logits; on DeepSpeed's last stage they are the pipe buffer's (pipe_logits below)
            emb_loss += (0.0 if pipe_logits else p * tok * v / plan.logits_vocab_shards) + FP32_BYTES * tok
        else:
            emb_loss += FP32_BYTES * tok * v / plan.logits_vocab_shards
    in_flight = min(plan.pp, plan.ds.grad_accum) if plan.pp > 1 else 1
    if plan.pp > 1 and plan.pipeline_schedule == "interleaved" and plan.virtual_stages > 1 and in_flight == plan.pp:
        # interleaved 1F1B keeps (1 + (p-1)/(p·v)) x the 1F1B activations on the first stage (Korthikanti et al.
        # 2022 §4.2.3; Narayanan et al. 2021 §2.2.2)
        in_flight = plan.pp * (1 + (plan.pp - 1) / (plan.pp * plan.virtual_stages))
    elif plan.pp > 1 and plan.pipeline_schedule == "dualpipe":
        in_flight = min(plan.pp + 1, plan.ds.grad_accum)  # DeepSeek-V3 Table 2: PP + 1 micro batches
    if last:
        in_flight = last_stage_in_flight(plan)
    loss_fwd = loss_bwd = 0.0
    if holds_head:
        # [tokens, vocab/tp] under Megatron's vocab-parallel loss; [tokens, vocab] on every rank where AutoTP gathers
        # the logits or runs a whole head (RunPlan.logits_vocab_shards)
        logits = tok * v / plan.logits_vocab_shards
        if fused_loss:
            # the kept logits are the saved tensor above; backward writes one gradient in their dtype
            loss_bwd = FUSED_LOSS_BACKWARD_COPIES * p * logits
        else:
            # the logits (unless a pipe buffer holds them, pipe_logits) and their fp32 copy
            loss_fwd = (0.0 if pipe_logits else p * logits) + (FP32_BYTES * logits if p != FP32_BYTES else 0.0)
            loss_bwd = LOSS_BACKWARD_FP32_COPIES * FP32_BYTES * logits
    # the last stage's head tensors belong to the one micro batch whose loss is being computed
    kept = (saved + emb_loss) * in_flight if not last else saved * in_flight + emb_loss
    return ActivationEstimate(saved=kept, recompute_transient=transient,
                              embedding_and_loss=emb_loss, in_flight_micro_batches=in_flight,
                              loss_forward_transient=loss_fwd, loss_backward_transient=loss_bwd,
                              pipe_buffers=pipe_logits)


def deepspeed_pipe_logits(plan: RunPlan, micro_batch: int | None = None) -> float:
    """Bytes of logits DeepSpeed's PipelineEngine keeps on the last stage through the whole step, for micro batches
    of `micro_batch` sequences (default: the plan's).

    _exec_forward_pass stores each micro batch's output, the logits, in pipe_buffers['outputs'][buffer_id], and
    _exec_backward_pass returns on the last stage before the lines that release it (runtime/pipe/engine.py: "The
    last stage just runs backward on the loss"), so each buffer keeps the logits of the last micro batch that used
    it until a later forward overwrites them: min(DEEPSPEED_LAST_STAGE_PIPE_BUFFERS, grad_accum) micro batches'
    logits, also through the optimizer step (measured: benchmarks/results/pipeline_memory_cpu_*.md). 0 for other
    frameworks and without a pipeline."""
    if plan.pp == 1 or plan.framework != "deepspeed" or plan.pipeline_schedule == "dualpipe":
        return 0.0
    p, _ = _act_bytes(plan)
    mb = plan.ds.micro_batch if micro_batch is None else micro_batch
    tok = plan.seq_len * mb / (plan.cp * plan.ulysses)
    return (min(DEEPSPEED_LAST_STAGE_PIPE_BUFFERS, plan.ds.grad_accum) * p * tok * plan.shape.vocab_size
            / plan.logits_vocab_shards)


def last_stage_in_flight(plan: RunPlan) -> float:
    """Micro batches whose block activations the last pipeline stage holds at once, in units of its whole stage.
    1F1B: one (it runs each micro batch's backward right after its forward; Narayanan et al. 2021 §2.2.1).
    Interleaved 1F1B with v chunks per device: Megatron-LM's schedule runs (v - 1) x pp warm-up forward chunks on
    the last rank before its first backward (schedules.py forward_backward_pipelining_with_interleaving,
    num_warmup_microbatches = (pp - rank - 1) x 2 + (v - 1) x pp, rank = pp - 1), then one more in the steady
    state: ((v - 1) x pp + 1) chunks of 1/v of the stage each, capped at the first stage's count."""
    if plan.pipeline_schedule == "interleaved" and plan.virtual_stages > 1:
        v = plan.virtual_stages
        chunks = min((v - 1) * plan.pp + 1, plan.ds.grad_accum * v)
        return chunks / v
    return 1.0

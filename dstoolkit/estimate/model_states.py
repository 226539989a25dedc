"""ModelStates: the model-state bytes on one rank, split the way DeepSpeed allocates them (the result type of
memory.deepspeed_model_states; zero_states.py fills the ZeRO paths). No torch import.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelStates:
    """Model-state bytes on one rank (device unless named host_*), split the way DeepSpeed allocates them."""

    optimizer_path: str
    """Which DeepSpeed class holds the states: basic, fp16_fused, fp16_unfused, bf16_optimizer, zero12, zero3."""
    params: int = 0
    """Working (model-dtype) parameters on the device (flat buffer incl. padding; stage 3: partition + persistent)."""
    master_params: int = 0
    """fp32 master weights (full or partition)."""
    optimizer_states: int = 0
    """Optimizer moments (created lazily at the first step)."""
    grads_at_step: int = 0
    """Gradient bytes alive while the inner optimizer steps (partition buffer + fp32 flat copy)."""
    grads_backward_peak: int = 0
    """Gradient bytes at the end of backward, before reduction / partitioning (full grads at stage 0/1)."""
    grads_backward_start: int = 0
    """Gradient bytes alive when backward reaches the last block (the LM head's gradients exist): its .grad at
    stage 0/1; at stage 2 the partition buffer grads_in_partition on the rank whose partition holds the
    last-registered parameters (stage_1_and_2.py copy_grads_in_partition allocates it on the first copy); 0 at
    stage 3 (its gradient buffers persist)."""
    grads_step_transient_peak: int = 0
    """Gradient bytes at their short peak inside step() (partition buffer + flat copy + fp32 copy)."""
    grads_between_micro_steps: int = 0
    """Gradient bytes the earlier micro steps of an accumulation leave alive while a later one runs its forward
    and backward (beyond grads_persistent): the full .grad tensors at stage 0/1 and under the fp16 optimizers,
    which reduce only at the accumulation boundary (engine.py allreduce_gradients: "Communicate only at gradient
    accumulation boundaries"); stage 2's partition buffer grads_in_partition, filled every micro step; the bf16
    .grad tensors BF16_Optimizer keeps (bf16.immediate_grad_update false); 0 at stage 3 and with offloaded stage 2
    (host buffers). Counted only when the plan accumulates (memory_timeline accumulating)."""
    grads_persistent: int = 0
    """Part of the gradient bytes allocated once and kept across steps (stage 3's grad_partitions_flat_buffer);
    included in grads_at_step and grads_backward_peak."""
    persistent_buffers: int = 0
    """Buffers that stay allocated across steps (stage-3 reduce bucket, offload staging buffers)."""
    transient_buffers: int = 0
    """Peak buffers that exist only inside backward/step (ZeRO-1/2 reduce buckets, DDP all-reduce flatten; stage 3:
    the parameters gathered around the running module, plus the persistent small ones)."""
    gathered_forward_end: int = 0
    """Stage 3: parameters still gathered at the end of forward (kept for reuse in backward)."""
    hpz_secondary_params: int = 0
    """ZeRO++ hpZ: the secondary partition of every parameter (model dtype, 1/hpz of each padded parameter) on the
    device, alive at the optimizer step (zero_states._hpz_secondary); 0 without hpZ or under offload_param."""
    hpz_secondary_backward: int = 0
    """The part of hpz_secondary_params alive at the end of backward: the parameters that are not ds_persist."""
    hpz_secondary_forward_end: int = 0
    """The part alive at the end of forward: hpz_secondary_backward less the parameters still gathered for reuse
    (their secondary is made when backward releases them); all of it when accumulating (earlier micro steps')."""
    host_hpz_secondary_params: int = 0
    """The hpZ secondary partition in host RAM (offload_param: partition_parameters.py remote_device)."""
    host_params: int = 0
    host_master_params: int = 0
    host_optimizer_states: int = 0
    host_grads: int = 0
    host_buffers: int = 0
    optimizer_impl: str = ""
    """The Adam implementation the inner optimizer steps with (step_temporaries.IMPLEMENTATIONS)."""
    optimizer_temporaries: int = 0
    """Peak temporaries inside the inner optimizer's step() on the device (step_temporaries.py)."""
    host_optimizer_temporaries: int = 0
    """The same on the host, when the optimizer steps offloaded tensors."""
    grad_norm_temporaries: int = 0
    """ZeRO-1/2: the fp64 copy of the largest partition gradient while the global norm is computed."""
    grads_at_norm: int = 0
    """Gradient bytes alive while ZeRO-1/2 computes the norm (the partition buffer grads_in_partition)."""
    notes: list[str] = field(default_factory=list)

    @property
    def device_at_step(self) -> int:
        """Device model-state bytes alive during the optimizer step (what the fidelity benchmark measures)."""
        return (self.params + self.master_params + self.optimizer_states + self.grads_at_step + self.persistent_buffers
                + self.hpz_secondary_params)

    @property
    def host_total(self) -> int:
        return (self.host_params + self.host_master_params + self.host_optimizer_states + self.host_grads
                + self.host_buffers + self.host_hpz_secondary_params)

    @property
    def all_at_step(self) -> int:
        """Device + host model-state bytes at the step (on a CPU-only machine both are the same RAM)."""
        return self.device_at_step + self.host_total

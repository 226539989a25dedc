"""Transformer Engine's TP comm-overlap userbuffers: device bytes a tensor-parallel rank holds from start-up to the
end of the run when the TP collectives are overlapped with the GEMMs (Megatron --tp-comm-overlap, RunPlan
tp_comm_overlap). `timeline.memory_timeline` counts them once, in every phase, so `estimate`, `sweep` and
`generate` report one figure. No torch import.
"""
from __future__ import annotations

from dstoolkit.runplan import RunPlan

TE_TP_OVERLAP_USERBUFFERS = 10
"""Userbuffers Transformer Engine allocates for TP comm overlap, one per overlapped GEMM (4 ring-exchange
all-gathers qkv/fc1 fprop and proj/fc2 dgrad, 2 pipelined reduce-scatters proj/fc2 fprop, 4 bulk
qkv/fc1 dgrad and wgrad: transformer_engine/pytorch/module/base.py initialize_ub), each of the shape
Megatron-LM passes, [seq_length x micro_batch / cp, hidden] (megatron/training/initialize.py
_initialize_tp_communicators), in the activation dtype except the all-gather ones under FP8."""
TE_TP_OVERLAP_FP8_BUFFERS = 4
"""Of those, the all-gather buffers (layers_all_gather_overlap: qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad) are
uint8 under FP8 (initialize_ub: `fp8_buf = name in layers_all_gather_overlap`, `buffer_dtype = torch.uint8 if
(use_fp8 and fp8_buf) else dtype`): 1 byte per element."""
TE_CUBLAS_WORKSPACE_BYTES = 3 * 32 * 2**20
"""TE repeats its 32 MiB Hopper cuBLAS workspace for its 3 overlap streams (initialize_ub, _NUM_MAX_UB_STREAMS)."""


def tp_overlap_buffer_bytes(plan: RunPlan) -> int:
    """Device bytes of the TP comm-overlap userbuffers (0 unless plan.tp_comm_overlap and tp > 1): allocated once at
    start-up (initialize_ub) and held, so alive in every phase of a step."""
    if not plan.tp_comm_overlap or plan.tp <= 1:
        return 0
    elem = 4 if plan.precision == "fp32" else 2
    fp8 = TE_TP_OVERLAP_FP8_BUFFERS if plan.precision == "fp8" else 0
    rows = plan.seq_len * plan.ds.micro_batch // max(1, plan.cp)
    per_elem_bytes = (TE_TP_OVERLAP_USERBUFFERS - fp8) * elem + fp8 * 1
    return rows * plan.shape.hidden_size * per_elem_bytes + TE_CUBLAS_WORKSPACE_BYTES


__all__ = ["TE_TP_OVERLAP_USERBUFFERS", "TE_TP_OVERLAP_FP8_BUFFERS", "TE_CUBLAS_WORKSPACE_BYTES", "tp_overlap_buffer_bytes"]

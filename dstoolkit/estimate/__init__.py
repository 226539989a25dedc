"""dstoolkit.estimate: memory, FLOPs, communication and step-time estimates (pure functions, no torch import).

    from dstoolkit.runplan import RunPlan, plan_from_spec
    from dstoolkit.estimate import Estimate, estimate_run

`RunPlan` and `plan_from_spec` live in `dstoolkit.runplan` (the layer below); they are re-exported here for
callers that only estimate.
"""
from dstoolkit.estimate.activations import korthikanti_layer_bytes, layer_activation_bytes
from dstoolkit.estimate.stage_activations import activation_bytes
from dstoolkit.estimate.collective_time import busbw_factor
from dstoolkit.estimate.comm import comm_plan, zeropp_cross_node_bytes
from dstoolkit.estimate.core import Estimate, MemoryBreakdown, estimate_run
from dstoolkit.estimate.flops import flops_per_token, mfu
from dstoolkit.estimate.memory import deepspeed_model_states, paper_model_states
from dstoolkit.estimate.timeline import device_allowance_bytes, memory_timeline
from dstoolkit.hardware.calibration import Calibration
from dstoolkit.runplan import RunPlan, plan_from_spec

__all__ = [
    "RunPlan", "Estimate", "MemoryBreakdown", "Calibration", "estimate_run", "plan_from_spec",
    "activation_bytes", "korthikanti_layer_bytes", "layer_activation_bytes", "busbw_factor", "comm_plan",
    "zeropp_cross_node_bytes", "flops_per_token", "mfu", "deepspeed_model_states", "paper_model_states",
    "memory_timeline", "device_allowance_bytes",
]

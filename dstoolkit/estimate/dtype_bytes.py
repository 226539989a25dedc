"""Bytes per element: fp32 and int64 index tensors, and what DeepSpeed allocates per parameter (optimizer state and
working weights).

Moved out of memory.py (re-exported there). No torch import.
"""
from __future__ import annotations

FP32_BYTES = 4
"""fp32 element size (RMSNorm's upcast, softmax log-sum-exp, the fp32 loss logits, fp32 router outputs)."""
INDEX_BYTES = 8
"""int64 token ids / labels kept by the embedding and the loss backward; int64 expert-slot indices."""

OPTIMIZER_STATE_BYTES_PER_PARAM = {
    # fp32 exp_avg + exp_avg_sq (torch.optim.Adam(W), DeepSpeed FusedAdam / DeepSpeedCPUAdam)
    "adam": 8, "adamw": 8, "fusedadam": 8, "cpuadam": 8, "onebitadam": 8, "zerooneadam": 8,
    # LAMB keeps the same two fp32 moments
    "lamb": 8, "onebitlamb": 8, "fusedlamb": 8,
    # one fp32 buffer: momentum (SGD with momentum; Lion's exp_avg; Adagrad's sum)
    "sgd": 4, "lion": 4, "adagrad": 4,
    # Adafactor's factored second moment is O(rows + cols): ~0 per param
    "adafactor": 0,
}
"""Optimizer-state bytes per parameter of the fp32 partition the optimizer steps."""


def optimizer_state_bytes_per_param(optimizer_type: str) -> int:
    key = optimizer_type.lower().replace("_", "").replace("-", "")
    if key not in OPTIMIZER_STATE_BYTES_PER_PARAM:
        raise ValueError(
            f"optimizer.type={optimizer_type!r} is not modelled; known: {', '.join(sorted(OPTIMIZER_STATE_BYTES_PER_PARAM))}"
        )
    return OPTIMIZER_STATE_BYTES_PER_PARAM[key]


def param_bytes(precision: str) -> int:
    """Bytes per working (low-precision) parameter: fp8 trains with bf16 weights (the fp8 copy is a cache)."""
    return 4 if precision == "fp32" else 2

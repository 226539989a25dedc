"""ZeRO paper view of per-device model states (Rajbhandari et al., arXiv 1910.02054, §3.1, §5.1, Figure 1).

A separate accounting from what DeepSpeed allocates (`dstoolkit.estimate.memory`). No torch import.
"""
from __future__ import annotations

from dataclasses import dataclass

ZERO_PAPER_K = 12
"""ZeRO §3.1: K = 12 bytes/param of optimizer state for mixed-precision Adam (fp32 master + momentum + variance)."""
ZERO_PAPER_WEIGHT_BYTES = 2
"""ZeRO §3.1: fp16 weights, 2 bytes/param."""
ZERO_PAPER_GRAD_BYTES = 2
"""ZeRO §3.1: fp16 gradients, 2 bytes/param."""


@dataclass(frozen=True)
class PaperView:
    """ZeRO §3.1 model-state accounting (mixed-precision Adam, K = 12), bytes per device."""

    psi: int
    """Ψ: parameters."""
    dp: int
    """N: data-parallel degree."""
    baseline_bytes: int
    """Plain DP: (2 + 2 + K)Ψ = 16Ψ."""
    zero1_bytes: int
    """P_os: 4Ψ + KΨ/N."""
    zero2_bytes: int
    """P_os+g: 2Ψ + (2 + K)Ψ/N."""
    zero3_bytes: int
    """P_os+g+p: (2 + 2 + K)Ψ/N."""
    stage: int
    stage_bytes: int
    """The row for the plan's ZeRO stage."""


def paper_model_states(psi: int, dp: int, stage: int = 0) -> PaperView:
    """ZeRO §3.1 / Figure 1 per-device model-state memory for Ψ parameters on N data-parallel ranks."""
    k = ZERO_PAPER_K
    w, g = ZERO_PAPER_WEIGHT_BYTES, ZERO_PAPER_GRAD_BYTES
    base = (w + g + k) * psi  # ZeRO §3.1: 16Ψ
    z1 = (w + g) * psi + k * psi / dp  # ZeRO §5.1 P_os: 4Ψ + KΨ/N
    z2 = w * psi + (g + k) * psi / dp  # P_os+g: 2Ψ + 14Ψ/N
    z3 = (w + g + k) * psi / dp  # P_os+g+p: 16Ψ/N
    rows = [base, z1, z2, z3]
    return PaperView(psi=psi, dp=dp, baseline_bytes=int(base), zero1_bytes=int(z1), zero2_bytes=int(z2),
                     zero3_bytes=int(z3), stage=stage, stage_bytes=int(rows[stage]))

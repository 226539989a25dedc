"""FP8 quantisation numerics for the emulation backend (CPU or GPU, no Transformer Engine).

Every function quantises to a real torch FP8 dtype (`torch.float8_e4m3fn` / `torch.float8_e5m2`) and
dequantises back to float32, so the rounding is the hardware format's. We never call `torch._scaled_mm`
(about 20 s for a 1024^3 product on CPU): the GEMM itself runs on the dequantised values in fp32.

Scale convention (TE and DeepSeek-V3): ``q = cast_fp8(clamp(x * scale, -fp8_max, fp8_max))`` and
``x_hat = q / scale``, with ``scale = fp8_max / amax / 2**margin`` (TE DelayedScaling docs: margin).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional

import torch
from torch import Tensor

from dstoolkit.dsconfig.fp8 import E4M3_MAX, E5M2_MAX

Fp8Name = Literal["e4m3", "e5m2"]

FP8_DTYPE = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
"""torch dtypes of the two OCP FP8 formats (e4m3fn: no infinities, max 448)."""
FP8_MAX = {"e4m3": E4M3_MAX, "e5m2": E5M2_MAX}
"""Largest finite magnitude per format (OCP FP8 spec v1.0)."""
FP8_EMAX = {"e4m3": 8, "e5m2": 15}
"""Exponent of the largest power of two representable (448 = 1.75 * 2^8, 57344 = 1.75 * 2^15); OCP MX spec §6.3."""


def scale_from_amax(amax: Tensor, fp8_max: float, margin: int = 0) -> Tensor:
    """scale = fp8_max / amax / 2**margin, elementwise; 1.0 where amax is 0 or not finite.

    TE keeps the previous scale for a zero amax; for a stateless (current/block) scale the neutral value 1.0
    is used, and an all-zero tile quantises to zeros under any scale.
    """
    amax = amax.float()
    scale = fp8_max / amax / (2.0 ** margin)
    bad = (amax <= 0) | ~torch.isfinite(amax) | ~torch.isfinite(scale)
    return torch.where(bad, torch.ones_like(scale), scale)


def cast_fp8(x: Tensor, scale: Tensor, fmt: Fp8Name) -> Tensor:
    """Scale, saturate to ±fp8_max, and cast to the FP8 dtype (broadcasting `scale`)."""
    fmax = FP8_MAX[fmt]
    return (x.float() * scale).clamp(-fmax, fmax).to(FP8_DTYPE[fmt])


def fake_quant(x: Tensor, scale: Tensor, fmt: Fp8Name) -> Tensor:
    """Quantise with `scale` (per tensor, or broadcastable) and dequantise to float32."""
    return cast_fp8(x, scale, fmt).float() / scale


def amax(x: Tensor) -> Tensor:
    """Largest |x| as a float32 scalar tensor (0 for an empty tensor)."""
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    return x.detach().abs().max().float()


# ---------------------------------------------------------------------------------------------------------
# Per-block scaling (DeepSeek-V3 §3.3.1 fine-grained quantisation; OCP MX for power-of-two block scales)
# ---------------------------------------------------------------------------------------------------------
@dataclass
class BlockQuantized:
    """A 2-D tensor quantised per (block_rows x block_cols) block."""

    data: Tensor
    """FP8 values, same shape as the input."""
    scale: Tensor
    """float32 scales, shape (ceil(rows/block_rows), ceil(cols/block_cols)); x_hat = data / scale (per block)."""
    block: tuple[int, int]
    """(block_rows, block_cols)."""

    def dequantize(self) -> Tensor:
        """Back to float32 with each block divided by its scale."""
        r, c = self.data.shape
        br, bc = self.block
        s = self.scale.repeat_interleave(br, 0)[:r].repeat_interleave(bc, 1)[:, :c]
        return self.data.float() / s


def _blocked_view(x: Tensor, br: int, bc: int) -> tuple[Tensor, int, int]:
    """Pad a 2-D tensor with zeros to whole blocks and view it as (R/br, br, C/bc, bc)."""
    r, c = x.shape
    pr, pc = (-r) % br, (-c) % bc
    if pr or pc:
        x = torch.nn.functional.pad(x, (0, pc, 0, pr))
    return x.reshape((r + pr) // br, br, (c + pc) // bc, bc), r, c


def quantize_blocks(x: Tensor, block: tuple[int, int], fmt: Fp8Name, *, power_of_two: bool = False) -> BlockQuantized:
    """Quantise a 2-D tensor with one scale per block.

    Args:
        x: 2-D tensor (rows, cols).
        block: (block_rows, block_cols): (1, 128) activation tiles and (128, 128) weight blocks in DeepSeek-V3;
            (1, 32) for MXFP8. Edge blocks may be partial (padded with zeros, which do not change the amax).
        fmt: "e4m3" or "e5m2".
        power_of_two: use an E8M0 (power-of-two) scale as the OCP MX spec: scale = 2^(emax_elem -
            floor(log2 amax)); otherwise scale = fp8_max / amax in float32 (DeepSeek-V3).

    Returns:
        The FP8 data, the per-block scales and the block shape.
    """
    if x.dim() != 2:
        raise ValueError(f"quantize_blocks expects a 2-D tensor, got shape {tuple(x.shape)}")
    br, bc = block
    xb, r, c = _blocked_view(x.float(), br, bc)
    block_amax = xb.abs().amax(dim=(1, 3))
    if power_of_two:
        # OCP MX v1.0 §6.3: shared_exp = floor(log2(amax)) - emax_elem; X = 2^shared_exp; scale = 1/X.
        safe = torch.where(block_amax > 0, block_amax, torch.ones_like(block_amax))
        scale = torch.exp2(FP8_EMAX[fmt] - torch.floor(torch.log2(safe)))
    else:
        scale = scale_from_amax(block_amax, FP8_MAX[fmt])
    fmax = FP8_MAX[fmt]
    q = (xb * scale[:, None, :, None]).clamp(-fmax, fmax).to(FP8_DTYPE[fmt])
    q = q.reshape(xb.shape[0] * br, xb.shape[2] * bc)[:r, :c]
    return BlockQuantized(data=q, scale=scale, block=(br, bc))


def fake_quant_blocks(x: Tensor, block: tuple[int, int], fmt: Fp8Name, *, power_of_two: bool = False) -> Tensor:
    """quantize_blocks then dequantize: float32 values on the FP8 grid of their block."""
    return quantize_blocks(x, block, fmt, power_of_two=power_of_two).dequantize()


# ---------------------------------------------------------------------------------------------------------
# Delayed scaling state (TE DelayedScaling semantics)
# ---------------------------------------------------------------------------------------------------------
class AmaxHistory:
    """Rolling amax history of one tensor role (input, weight or grad) for delayed scaling.

    `history[0]` is the most recent amax. The scale used for a quantisation comes from the history *before*
    this step's amax is recorded (TE: scale from the previous iteration), starting at 1.0 like TE's initial
    scale. A step whose reduced amax is 0 or not finite keeps the previous scale (TE behaviour).
    """

    def __init__(self, length: int, algo: Literal["max", "most_recent"], fp8_max: float, margin: int = 0,
                 device: Optional[torch.device] = None) -> None:
        if length < 1:
            raise ValueError(f"amax_history_len={length} must be >= 1")
        self.algo = algo
        self.fp8_max = fp8_max
        self.margin = margin
        self.history = torch.zeros(length, dtype=torch.float32, device=device)
        self.scale = torch.ones((), dtype=torch.float32, device=device)

    def record(self, new_amax: Tensor) -> None:
        """Roll the history by one, put `new_amax` at index 0, and recompute the scale for the next use."""
        self.history = torch.roll(self.history, 1)
        self.history[0] = new_amax.detach().float().to(self.history.device)
        eff = self.history.max() if self.algo == "max" else self.history[0]
        if float(eff) > 0 and math.isfinite(float(eff)):
            self.scale = (self.fp8_max / eff / (2.0 ** self.margin)).float()

    def to(self, device: torch.device) -> "AmaxHistory":
        """Move the state (kept in float32 whatever the module dtype)."""
        self.history = self.history.to(device=device, dtype=torch.float32)
        self.scale = self.scale.to(device=device, dtype=torch.float32)
        return self

    def state(self) -> dict:
        """Plain-tensor snapshot (for checkpoints or inspection)."""
        return {"history": self.history.clone(), "scale": self.scale.clone()}

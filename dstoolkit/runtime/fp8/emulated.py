"""Emulated FP8 linear layer: TE-equivalent quantisation on any device, GEMM on dequantised values.

`EmulatedFp8Linear` has exactly the parameters of the `nn.Linear` it replaces (the same Parameter
objects, named `weight` and `bias`), so state dicts load both ways and an optimizer built before the swap
keeps working. Scaling state (delayed recipe amax histories) is kept outside the state dict, in float32.

Which operand is quantised how (DeepSeek-V3 §3.3.1 and TE's rowwise/columnwise quantisers):

| GEMM  | product            | block recipe scaling                    | mxfp8 (1x32 E8M0)        |
|-------|--------------------|-----------------------------------------|--------------------------|
| fprop | y  = x  · Wᵀ       | x 1x128 tiles, W 128x128 blocks         | x rowwise, W rowwise     |
| dgrad | dx = g  · W        | g 1x128 tiles, W 128x128 blocks         | g rowwise, W columnwise  |
| wgrad | dW = gᵀ · x        | g 128x1 tiles, x 128x1 tiles            | g, x columnwise          |

Per-tensor recipes (delayed, current) quantise x and W once and reuse them in backward, as TE does.
Forward tensors use E4M3; gradients use E5M2 under the hybrid format. Products run in float32
(DeepSeek-V3 promotes accumulation to FP32), and outputs return in the input dtype.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
from torch import Tensor, nn

from dstoolkit.runtime.fp8 import quant
from dstoolkit.dsconfig.fp8 import MX_BLOCK, Fp8Config

_STATE = {"enabled": False}
"""Whether emulated FP8 modules quantise (inside `fp8_autocast`) or run plain high-precision linears."""


@contextlib.contextmanager
def fp8_autocast(enabled: bool = True) -> Iterator[None]:
    """Emulation counterpart of `te.fp8_autocast`: FP8 modules quantise only inside this context."""
    prev = _STATE["enabled"]
    _STATE["enabled"] = enabled
    try:
        yield
    finally:
        _STATE["enabled"] = prev


def is_fp8_enabled() -> bool:
    """True inside `fp8_autocast(enabled=True)`."""
    return _STATE["enabled"]


def _inside_backward() -> bool:
    """True while autograd runs a backward pass (activation-checkpoint recomputation happens there)."""
    try:
        return torch._C._current_graph_task_id() != -1
    except AttributeError:  # pragma: no cover - older torch without the query
        return False


class _RoleQuantizer:
    """Quantises one tensor role (input, weight or grad) of one layer according to the recipe."""

    def __init__(self, cfg: Fp8Config, role: str) -> None:
        self.recipe = cfg.recipe
        self.fmt: quant.Fp8Name = "e5m2" if (role == "grad" and cfg.format == "hybrid") else "e4m3"
        self.margin = cfg.margin
        self.block = cfg.block_size
        self.history: Optional[quant.AmaxHistory] = None
        self._last_scale: Optional[Tensor] = None
        """Scale the last recorded forward used (reused by checkpoint recomputation)."""
        if cfg.recipe == "delayed":
            self.history = quant.AmaxHistory(cfg.amax_history_len, cfg.amax_compute_algo,
                                             quant.FP8_MAX[self.fmt], cfg.margin)

    def per_tensor(self, x: Tensor, record: bool = True) -> Tensor:
        """delayed / current: one scale for the whole tensor; returns float32 dequantised values.

        `record=False` (activation-checkpoint recomputation) reuses the scale of the original forward and
        leaves the amax history alone, so the recomputed values equal the saved ones.
        """
        if self.history is not None:
            if self.history.scale.device != x.device:
                self.history.to(x.device)
            if record or self._last_scale is None:
                self._last_scale = self.history.scale
            out = quant.fake_quant(x, self._last_scale, self.fmt)
            if record:
                self.history.record(quant.amax(x))  # delayed: this amax only affects the next step's scale
            return out
        scale = quant.scale_from_amax(quant.amax(x), quant.FP8_MAX[self.fmt], self.margin)
        return quant.fake_quant(x, scale, self.fmt)

    def rowwise(self, x2d: Tensor, weight: bool = False) -> Tensor:
        """Blocks along the last (reduction) dim: activation/grad tiles 1xB; weight blocks BxB (block) or 1x32 (mx)."""
        if self.recipe == "block":
            blk = (self.block, self.block) if weight else (1, self.block)
            return quant.fake_quant_blocks(x2d, blk, self.fmt)
        return quant.fake_quant_blocks(x2d, (1, MX_BLOCK), self.fmt, power_of_two=True)

    def columnwise(self, x2d: Tensor, weight: bool = False) -> Tensor:
        """Blocks along the first dim (the reduction dim of wgrad, or of W in dgrad for mxfp8)."""
        if self.recipe == "block":
            blk = (self.block, self.block) if weight else (self.block, 1)
            return quant.fake_quant_blocks(x2d, blk, self.fmt)
        return quant.fake_quant_blocks(x2d, (MX_BLOCK, 1), self.fmt, power_of_two=True)


class _Fp8LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor], mod: "EmulatedFp8Linear",
                recompute: bool) -> Tensor:
        k = x.shape[-1]
        x2 = x.reshape(-1, k)
        per_tensor = mod.cfg.recipe in ("delayed", "current")
        if per_tensor:
            xq = mod.q_input.per_tensor(x2, record=not recompute)
            wq = mod.q_weight.per_tensor(weight, record=not recompute)
        else:
            xq = mod.q_input.rowwise(x2)
            wq = mod.q_weight.rowwise(weight, weight=True)
        y = xq @ wq.t()
        if bias is not None:
            y = y + bias.float()
        ctx.mod = mod
        ctx.per_tensor = per_tensor
        ctx.x_shape = x.shape
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.has_bias = bias is not None
        if per_tensor:
            ctx.save_for_backward(xq, wq, weight)
        else:
            ctx.save_for_backward(x2, wq, weight)
        return y.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        mod: EmulatedFp8Linear = ctx.mod
        saved_x, wq, weight = ctx.saved_tensors
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        g2 = grad_out.reshape(-1, grad_out.shape[-1])
        dx = dw = db = None
        if ctx.per_tensor:
            gq = mod.q_grad.per_tensor(g2)
            if ctx.needs_input_grad[0]:
                dx = (gq @ wq).to(x_dtype).reshape(ctx.x_shape)
            if ctx.needs_input_grad[1]:
                dw = (gq.t() @ saved_x).to(w_dtype)
        else:
            if ctx.needs_input_grad[0]:
                g_row = mod.q_grad.rowwise(g2)
                w_for_dgrad = wq if mod.cfg.recipe == "block" else mod.q_weight.columnwise(weight, weight=True)
                dx = (g_row @ w_for_dgrad).to(x_dtype).reshape(ctx.x_shape)
            if ctx.needs_input_grad[1]:
                g_col = mod.q_grad.columnwise(g2)
                x_col = mod.q_input.columnwise(saved_x)
                dw = (g_col.t() @ x_col).to(w_dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = g2.float().sum(0).to(b_dtype)
        return dx, dw, db, None, None


class EmulatedFp8Linear(nn.Module):
    """Drop-in for `nn.Linear` whose GEMMs see FP8-quantised operands (inside `fp8_autocast`).

    Outside `fp8_autocast` it is an ordinary linear layer, like TE modules outside `te.fp8_autocast`.
    Activation checkpointing works: a forward recomputed during backward (outside the context) repeats
    what the original forward did, with the same delayed-scaling scale and no extra amax record.
    """

    def __init__(self, in_features: int, out_features: int, cfg: Fp8Config, bias: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.cfg = cfg
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype)) if bias else None
        self._fp8_last = False
        self._make_quantizers()

    def _make_quantizers(self) -> None:
        self.q_input = _RoleQuantizer(self.cfg, "input")
        self.q_weight = _RoleQuantizer(self.cfg, "weight")
        self.q_grad = _RoleQuantizer(self.cfg, "grad")

    @classmethod
    def from_linear(cls, linear: nn.Linear, cfg: Fp8Config) -> "EmulatedFp8Linear":
        """Wrap an existing nn.Linear, sharing its Parameter objects (so tied weights and optimizers survive)."""
        mod = cls.__new__(cls)
        nn.Module.__init__(mod)
        mod.in_features, mod.out_features, mod.cfg = linear.in_features, linear.out_features, cfg
        mod.weight = linear.weight
        mod.bias = linear.bias
        mod.train(linear.training)
        mod._fp8_last = False
        mod._make_quantizers()
        return mod

    def to_linear(self) -> nn.Linear:
        """An nn.Linear sharing this module's parameters (used by `revert`)."""
        lin = nn.Linear.__new__(nn.Linear)
        nn.Module.__init__(lin)
        lin.in_features, lin.out_features = self.in_features, self.out_features
        lin.weight = self.weight
        lin.bias = self.bias
        lin.train(self.training)
        return lin

    def amax_state(self) -> dict:
        """Delayed-recipe histories and scales per role ({} for stateless recipes)."""
        return {role: q.history.state() for role, q in
                (("input", self.q_input), ("weight", self.q_weight), ("grad", self.q_grad)) if q.history is not None}

    def forward(self, x: Tensor) -> Tensor:
        recompute = _inside_backward()
        enabled = self._fp8_last if recompute else is_fp8_enabled()
        if not recompute:
            self._fp8_last = enabled
        if not enabled:
            return nn.functional.linear(x, self.weight, self.bias)
        return _Fp8LinearFn.apply(x, self.weight, self.bias, self, recompute)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"recipe={self.cfg.recipe}, format={self.cfg.format}")

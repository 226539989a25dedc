"""Transformer Engine backend: swap nn.Linear -> te.Linear and norm+SwiGLU MLP -> te.LayerNormMLP.

Everything here needs TE and a CUDA GPU; the module itself imports neither at import time.
Not exercised on CPU CI: tests/gpu/test_fp8_te.py checks it where a GPU is present.
"""
from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, Optional

import torch
from torch import nn

from dstoolkit.fp8.recipes import Fp8BackendUnavailable, build_te_recipe, import_te
from dstoolkit.dsconfig.fp8 import DEEPSEEK_TILE, Fp8Config, check_fp8_hardware
from dstoolkit.hardware.table import GpuSpec

# Attribute names of a pre-norm block's FFN half (HF Llama/Mistral/Qwen decoder layers and
# dstoolkit.runtime.model.Block): y = mlp(post_attention_layernorm(x)).
FUSABLE_NORM_MLP = ("post_attention_layernorm", "mlp")
# Attributes DeepSpeed MoE sets on expert parameters (deepspeed/moe/experts.py, deepspeed/moe/utils.py).
DEEPSPEED_PARAM_ATTRS = ("allreduce", "group_name")


class TeBackend:
    """Loaded once by the converter: TE module, recipe object and the hardware check."""

    def __init__(self, cfg: Fp8Config) -> None:
        self.te = import_te()
        if not torch.cuda.is_available():
            raise Fp8BackendUnavailable(
                "backend='te' needs a CUDA GPU but torch.cuda.is_available() is False; "
                "use backend='emulated' to run the FP8 numerics on CPU")
        if cfg.recipe == "block" and cfg.block_size != DEEPSEEK_TILE:
            raise Fp8BackendUnavailable(
                f"fp8.block_size={cfg.block_size}: Transformer Engine's Float8BlockScaling uses 128 only; "
                "set block_size 128 or use backend='emulated'")
        major, minor = torch.cuda.get_device_capability()
        gpu = GpuSpec(name=torch.cuda.get_device_name(), memory_bytes=1, peak_bf16_flops=1.0,
                      intra_node_bw_bytes_per_s=1.0, inter_node_bw_bytes_per_s=1.0,
                      compute_capability=f"{major}.{minor}")
        problems = check_fp8_hardware(cfg, gpu, torch.version.cuda)
        if problems:
            raise Fp8BackendUnavailable("; ".join(problems))
        self.cfg = cfg
        self.recipe = build_te_recipe(cfg)

    # ---- autocast ---------------------------------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager:
        """te.autocast(recipe=...) on TE 2.x, te.fp8_autocast(fp8_recipe=...) on older releases."""
        te = self.te
        new = getattr(te, "autocast", None)
        if new is not None and "recipe" in inspect.signature(new).parameters:
            return new(enabled=True, recipe=self.recipe)
        return te.fp8_autocast(enabled=True, fp8_recipe=self.recipe)

    # ---- swaps ------------------------------------------------------------------------------------------
    def linear(self, lin: nn.Linear) -> nn.Module:
        """A te.Linear with a copy of `lin`'s weights (new Parameter objects: swap before building the optimizer)."""
        w = lin.weight
        mod = self.te.Linear(lin.in_features, lin.out_features, bias=lin.bias is not None,
                             params_dtype=w.dtype, device="cuda")
        with torch.no_grad():
            mod.weight.copy_(w)
            if lin.bias is not None:
                mod.bias.copy_(lin.bias)
        # DeepSpeed MoE marks expert parameters (allreduce=False, group_name=...) for its expert-parallel
        # gradient handling; the new TE parameters must carry the same marks.
        for old_p, new_p in ((lin.weight, mod.weight), (lin.bias, getattr(mod, "bias", None))):
            if old_p is None or new_p is None:
                continue
            for attr in DEEPSPEED_PARAM_ATTRS:
                if hasattr(old_p, attr):
                    setattr(new_p, attr, getattr(old_p, attr))
        return mod

    def fusable(self, parent: nn.Module) -> Optional[tuple[nn.Module, nn.Module, str]]:
        """(norm, mlp, normalization) when `parent` is a pre-norm block with a bias-free SwiGLU MLP, else None."""
        norm = getattr(parent, FUSABLE_NORM_MLP[0], None)
        mlp = getattr(parent, FUSABLE_NORM_MLP[1], None)
        if norm is None or mlp is None:
            return None
        lins = [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if not all(type(m) is nn.Linear and m.bias is None for m in lins):
            return None
        if getattr(mlp, "gated", True) is False:
            return None
        if getattr(norm, "weight", None) is None:
            return None  # no affine weight to carry over
        if isinstance(norm, nn.LayerNorm):
            kind = "LayerNorm"
        elif type(norm).__name__ in ("RMSNorm", "LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm"):
            kind = "RMSNorm"
        else:
            return None
        return norm, mlp, kind

    def norm_mlp(self, norm: nn.Module, mlp: nn.Module, kind: str) -> nn.Module:
        """te.LayerNormMLP(swiglu) holding norm weight, fc1 = [gate; up] and fc2 = down.

        TE's swiglu applies SiLU to the first half of fc1's output (Megatron's GLU layout), so fc1 is the
        concatenation [gate_proj; up_proj]. tests/gpu/test_fp8_te.py checks fused == unfused outputs.
        """
        gate, up, down = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        eps = float(getattr(norm, "eps", getattr(norm, "variance_epsilon", 1e-5)))
        mod = self.te.LayerNormMLP(gate.in_features, gate.out_features, eps=eps, bias=False,
                                   normalization=kind, activation="swiglu", params_dtype=gate.weight.dtype,
                                   device="cuda")
        with torch.no_grad():
            mod.layer_norm_weight.copy_(norm.weight)
            if kind == "LayerNorm" and getattr(norm, "bias", None) is not None:
                mod.layer_norm_bias.copy_(norm.bias)
            mod.fc1_weight.copy_(torch.cat([gate.weight, up.weight], dim=0))
            mod.fc2_weight.copy_(down.weight)
        # Keep the original modules as skeletons (parameters released) so revert can rebuild them exactly.
        mod._dstoolkit_orig = (norm, mlp)  # type: ignore[attr-defined]
        for p in list(norm.parameters()) + list(mlp.parameters()):
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        return mod

    def is_te_module(self, mod: nn.Module) -> bool:
        """True for the TE classes this backend creates."""
        return isinstance(mod, (self.te.Linear, self.te.LayerNormMLP))


def te_module_to_torch(mod: nn.Module) -> Optional[tuple[nn.Module, Optional[nn.Module]]]:
    """Undo a TE swap: (replacement, norm_or_None) with weights copied back; None for non-TE modules."""
    cls = type(mod).__name__
    if not type(mod).__module__.startswith("transformer_engine"):
        return None
    with torch.no_grad():
        if cls == "Linear":
            w = mod.weight
            lin = nn.Linear(w.shape[1], w.shape[0], bias=getattr(mod, "bias", None) is not None
                            and mod.bias.numel() > 0, device=w.device, dtype=w.dtype)
            lin.weight.copy_(w)
            if lin.bias is not None:
                lin.bias.copy_(mod.bias)
            return lin, None
        if cls == "LayerNormMLP" and hasattr(mod, "_dstoolkit_orig"):
            norm, mlp = mod._dstoolkit_orig
            ffn = mod.fc1_weight.shape[0] // 2
            norm.weight.data = mod.layer_norm_weight.detach().clone()
            if getattr(norm, "bias", None) is not None and hasattr(mod, "layer_norm_bias"):
                norm.bias.data = mod.layer_norm_bias.detach().clone()
            mlp.gate_proj.weight.data = mod.fc1_weight[:ffn].detach().clone()
            mlp.up_proj.weight.data = mod.fc1_weight[ffn:].detach().clone()
            mlp.down_proj.weight.data = mod.fc2_weight.detach().clone()
            return mlp, norm
    return None


def wrap_factory(backend: TeBackend) -> Callable[[], Any]:
    """Context factory the converter installs around the root forward."""
    return backend.autocast

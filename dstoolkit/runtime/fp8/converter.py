"""`convert(model, cfg, backend)` -> SwapReport, and `revert(model)`.

The converter checks the backend once when built (TE import, GPU, recipe support), then walks the whole
model and never stops early: each module with parameters is either swapped or listed with the reason it
was kept. Layer skips that keep every transformer block in bf16 are refused first, with the message of
`dstoolkit fp8 plan` (`dstoolkit.fp8.report.layer_skip_problem`): FP8 would do nothing. The root module's
forward is wrapped in the backend's FP8 autocast context, so a DeepSpeed engine built on the converted model
(ZeRO 0-2) runs each forward in FP8 with no change to the training loop.

Emulated swaps reuse the original Parameter objects: converting before or after `deepspeed.initialize`
both work. TE swaps create new TE parameters: convert before building the optimizer / engine.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Literal, Mapping, Optional, Union

from torch import nn

from dstoolkit.runtime.fp8.emulated import EmulatedFp8Linear, fp8_autocast
from dstoolkit.fp8.recipes import Fp8BackendUnavailable
from dstoolkit.fp8.report import SkipEntry, SwapEntry, SwapReport, block_index, decide_linear, layer_skip_problem
from dstoolkit.dsconfig.fp8 import Fp8Config

Backend = Literal["te", "emulated"]
_ORIG_FORWARD = "_dstoolkit_fp8_orig_forward"


def _coerce_cfg(cfg: Union[Fp8Config, Mapping, None]) -> Fp8Config:
    if cfg is None:
        return Fp8Config()
    if isinstance(cfg, Fp8Config):
        return cfg
    return Fp8Config.model_validate(dict(cfg))


def count_blocks(model: nn.Module) -> Optional[int]:
    """Length of the largest ModuleList that is not an expert list: the transformer blocks."""
    best = None
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and "expert" not in name.rsplit(".", 1)[-1]:
            if best is None or len(mod) > best:
                best = len(mod)
    return best


def _set_child(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, attr, new)


def _own_params(mod: nn.Module) -> bool:
    return any(p is not None for p in mod._parameters.values())


class Fp8Converter:
    """Builds the backend once, then converts any number of models with the same settings.

    Args:
        cfg: FP8 settings (Fp8Config, a dict of its fields, or None for TE's defaults).
        backend: "te" (Transformer Engine, CUDA only) or "emulated" (any device).
        fuse: TE only: swap a pre-norm SwiGLU MLP (post_attention_layernorm + mlp) for te.LayerNormMLP.

    Raises:
        Fp8BackendUnavailable: TE missing, no GPU, or the GPU/CUDA cannot run the recipe; the message says
            what to install or to use backend="emulated".
        ValueError: unknown backend.
    """

    def __init__(self, cfg: Union[Fp8Config, Mapping, None] = None, backend: Backend = "te", *,
                 fuse: bool = True) -> None:
        self.cfg = _coerce_cfg(cfg)
        if backend not in ("te", "emulated"):
            raise ValueError(f"backend={backend!r} is not one of 'te', 'emulated'")
        self.backend = backend
        self.fuse = fuse
        self._te = None
        if backend == "te":
            from dstoolkit.runtime.fp8.te_backend import TeBackend

            self._te = TeBackend(self.cfg)

    def autocast(self) -> Any:
        """The FP8 context for this backend (te.autocast / emulated fp8_autocast)."""
        if self._te is not None:
            return self._te.autocast()
        return fp8_autocast(True)

    def _is_fp8(self, mod: nn.Module) -> bool:
        if isinstance(mod, EmulatedFp8Linear):
            return True
        return type(mod).__module__.startswith("transformer_engine")

    def convert(self, model: nn.Module, *, wrap_forward: bool = True) -> SwapReport:
        """Swap every eligible layer of `model` in place and return the report (never stops early).

        Raises:
            ValueError: fp8.layers.skip_first_layers + skip_last_layers reach the model's block count, so no block
                could run in FP8 (`layer_skip_problem`, the check `dstoolkit fp8 plan` refuses with); the model is
                left untouched.
        """
        cfg = self.cfg
        num_blocks = count_blocks(model)
        # a setting error, not a per-layer skip: FP8 would do nothing, so refuse before touching the model
        problem = layer_skip_problem(cfg, num_blocks, model=type(model).__name__)
        if problem:
            raise ValueError(problem)
        report = SwapReport(backend=self.backend, recipe=cfg.recipe, format=cfg.format)
        done: set[str] = set()  # names handled by a fused swap

        if self._te is not None and self.fuse and cfg.enabled:
            self._fuse_pass(model, num_blocks, report, done)

        replacements: list[tuple[str, nn.Module]] = []
        for name, mod in model.named_modules():
            if name in done or any(name.startswith(d + ".") for d in done):
                continue
            tname = type(mod).__name__
            if self._is_fp8(mod):
                report.skipped.append(SkipEntry(name=name, type=tname, reason="already an FP8 module"))
                done.add(name)
                continue
            if type(mod) is nn.Linear:
                if name == "":
                    report.skipped.append(SkipEntry(name="<root>", type=tname, reason=(
                        "the root module itself cannot be replaced in place; wrap it in a container")))
                    continue
                reason = decide_linear(cfg, name, mod.in_features, mod.out_features, num_blocks)
                if reason:
                    report.skipped.append(SkipEntry(name=name, type=tname, reason=reason))
                    continue
                new = (EmulatedFp8Linear.from_linear(mod, cfg) if self._te is None else self._te.linear(mod))
                replacements.append((name, new))
                report.swapped.append(SwapEntry(name=name, old_type=tname, new_type=_type_label(new),
                                                in_features=mod.in_features, out_features=mod.out_features,
                                                params=sum(p.numel() for p in mod.parameters(recurse=False))))
            elif isinstance(mod, nn.Linear):
                report.skipped.append(SkipEntry(name=name, type=tname, reason=(
                    f"subclass of nn.Linear ({tname}) with its own forward; not swapped")))
            elif _own_params(mod):
                report.skipped.append(SkipEntry(name=name or "<root>", type=tname, reason=(
                    "not a linear layer: no FP8 GEMM, stays in high precision")))
        for name, new in replacements:
            _set_child(model, name, new)
        if wrap_forward and (report.swapped or self._has_fp8(model)):
            report.forward_wrapped = _wrap_forward(model, self.autocast)
        return report

    def _has_fp8(self, model: nn.Module) -> bool:
        return any(self._is_fp8(m) for m in model.modules())

    def _fuse_pass(self, model: nn.Module, num_blocks: Optional[int], report: SwapReport, done: set[str]) -> None:
        te = self._te
        fused: list[tuple[str, nn.Module, str, nn.Module]] = []
        for name, parent in model.named_modules():
            found = te.fusable(parent)
            if not found:
                continue
            norm, mlp, kind = found
            prefix = f"{name}." if name else ""
            mlp_name = prefix + "mlp"
            reasons = [decide_linear(self.cfg, f"{mlp_name}.{n}", getattr(mlp, n).in_features,
                                     getattr(mlp, n).out_features, num_blocks)
                       for n in ("gate_proj", "up_proj", "down_proj")]
            if any(reasons):
                continue  # the per-linear pass reports each one with its reason
            fused.append((name, parent, kind, te.norm_mlp(norm, mlp, kind)))
            report.swapped.append(SwapEntry(
                name=mlp_name, old_type=f"{type(norm).__name__}+{type(mlp).__name__}", new_type="te.LayerNormMLP",
                in_features=mlp.gate_proj.in_features, out_features=mlp.gate_proj.out_features,
                params=3 * mlp.gate_proj.in_features * mlp.gate_proj.out_features))
            done.update({prefix + "post_attention_layernorm", mlp_name})
        for _name, parent, _kind, new in fused:
            parent.post_attention_layernorm = nn.Identity()
            parent.mlp = new


def _type_label(mod: nn.Module) -> str:
    if type(mod).__module__.startswith("transformer_engine"):
        return f"te.{type(mod).__name__}"
    return type(mod).__name__


def _wrap_forward(model: nn.Module, ctx_factory: Callable[[], Any]) -> bool:
    """Run `model.forward` inside the FP8 context (instance attribute; `revert` removes it)."""
    if _ORIG_FORWARD in model.__dict__:
        return True
    orig = model.forward

    @functools.wraps(orig)
    def forward(*args, **kwargs):
        with ctx_factory():
            return orig(*args, **kwargs)

    model.__dict__[_ORIG_FORWARD] = orig
    model.forward = forward  # type: ignore[method-assign]
    return True


def convert(model: nn.Module, cfg: Union[Fp8Config, Mapping, None] = None, backend: Backend = "te", *,
            fuse: bool = True, wrap_forward: bool = True) -> SwapReport:
    """Swap the model's eligible linear layers for FP8 ones, in place.

    Args:
        model: any nn.Module (a DeepSpeed engine's `.module` works too).
        cfg: FP8 settings; None uses TE's defaults (hybrid, delayed, history 1024, max).
        backend: "te" (needs transformer-engine and a CUDA GPU) or "emulated" (CPU or GPU).
        fuse: TE only: fuse pre-norm SwiGLU MLPs into te.LayerNormMLP.
        wrap_forward: run the root forward inside the FP8 autocast context.

    Returns:
        SwapReport listing every swapped module and every kept one with its reason.

    Raises:
        Fp8BackendUnavailable: with "te" when TE or a suitable GPU is missing (says what to do instead).
        ValueError: the layer skips keep every transformer block in bf16 (`Fp8Converter.convert`).
    """
    return Fp8Converter(cfg, backend, fuse=fuse).convert(model, wrap_forward=wrap_forward)


def revert(model: nn.Module) -> int:
    """Undo `convert` in place: FP8 modules back to nn.Linear (and norm + MLP), forward unwrapped.

    Returns:
        The number of modules restored.
    """
    restored = 0
    targets = [(n, m) for n, m in model.named_modules() if n and (
        isinstance(m, EmulatedFp8Linear) or type(m).__module__.startswith("transformer_engine"))]
    for name, mod in targets:
        if isinstance(mod, EmulatedFp8Linear):
            _set_child(model, name, mod.to_linear())
            restored += 1
            continue
        from dstoolkit.runtime.fp8.te_backend import te_module_to_torch

        back = te_module_to_torch(mod)
        if back is None:
            continue
        new, norm = back
        _set_child(model, name, new)
        if norm is not None:
            parent_name = name.rpartition(".")[0]
            parent = model.get_submodule(parent_name) if parent_name else model
            parent.post_attention_layernorm = norm
        restored += 1
    orig = model.__dict__.pop(_ORIG_FORWARD, None)
    if orig is not None:
        model.__dict__.pop("forward", None)
    return restored


def load_state_dict(model: nn.Module, state_dict: Mapping[str, Any], strict: bool = True) -> None:
    """Load a state dict saved from the converted or the unconverted model, in either direction.

    TE modules add `*._extra_state` entries (FP8 metadata) that plain modules lack; they are dropped when the
    target has no such key and tolerated when missing, as are empty placeholder tensors (TE's bias=False).
    Every other key is checked strictly. Fused TE modules (te.LayerNormMLP) rename their parameters: call
    `revert` before exchanging state dicts with a plain model, or convert with fuse=False.
    """
    own_sd = model.state_dict()
    sd = {k: v for k, v in state_dict.items() if not (k.endswith("._extra_state") and k not in own_sd)}
    result = model.load_state_dict(sd, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("._extra_state")
               and not (hasattr(own_sd.get(k), "numel") and own_sd[k].numel() == 0)]
    if strict and (missing or result.unexpected_keys):
        raise KeyError(f"state dict does not match the model: missing {missing}, unexpected "
                       f"{list(result.unexpected_keys)}")


__all__ = ["Fp8Converter", "Fp8BackendUnavailable", "convert", "revert", "load_state_dict", "count_blocks",
           "block_index"]

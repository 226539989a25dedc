"""FP8 training settings (`Fp8Config`), their mapping to Transformer Engine and Megatron, and hardware gates.

No torch / transformer_engine import here (schemas must stay import-light). `Fp8Config.te_recipe_kwargs()`
returns the plain kwargs for a TE recipe class; `dstoolkit.fp8.recipes.build_te_recipe` turns them into a
real recipe object with a lazy TE import.

The section lives in the DeepSpeed JSON under our own optional key::

    {"dstoolkit": {"fp8": {"recipe": "block", "format": "e4m3"}}}

Facts used below (checked against the sources named):
- TE `DelayedScaling` defaults: fp8_format=HYBRID, amax_history_len=1024, amax_compute_algo="max", margin=0
  (TE docs, common API, releases 1.12 - 2.15). `Float8CurrentScaling` defaults to HYBRID,
  `Float8BlockScaling` and `MXFP8BlockScaling` to E4M3.
- Megatron-LM `_add_transformer_engine_args`: `--fp8-format {e4m3,hybrid}` (default None = off),
  `--fp8-recipe {tensorwise,delayed,mxfp8,blockwise}` (default delayed), `--fp8-margin` 0,
  `--fp8-amax-history-len` 1, `--fp8-amax-compute-algo` most_recent, `--first-last-layers-bf16`,
  `--num-layers-at-start-in-bf16` 1, `--num-layers-at-end-in-bf16` 1.
- TE hardware checks (transformer_engine/pytorch fp8 support functions): FP8 needs compute capability 8.9+;
  block scaling needs 9.0+ and CUDA >= 12.9; MXFP8 needs 10.0+ and is refused on 12.0+ (consumer Blackwell)
  "yet". TE 2.x needs CUDA 12.1+, 12.8+ on Blackwell (its installation prerequisites; `min_cuda`).
- TE's quantisation alignment (`get_align_size_for_quantization`): 16 elements, 32 for MXFP8.
"""
from __future__ import annotations

import fnmatch
import math
import warnings
from typing import Any, Literal, Mapping, Optional

from pydantic import BaseModel, Field, model_validator

from dstoolkit.common.model import StrictModel
from dstoolkit.hardware.table import GpuSpec

# Largest finite magnitudes of the two OCP FP8 formats (OCP 8-bit FP spec v1.0; TE Format.E4M3/E5M2 max_fwd).
E4M3_MAX = 448.0
E5M2_MAX = 57344.0

# DeepSeek-V3 §3.3.1: activations are scaled per 1x128 tile, weights per 128x128 block.
DEEPSEEK_TILE = 128
# OCP Microscaling (MX) spec v1.0: one shared E8M0 scale per 32 consecutive elements.
MX_BLOCK = 32

# TE get_align_size_for_quantization: FP8 GEMM operands need dims divisible by 16 (32 for MXFP8 blocks).
FP8_ALIGN_ELEMENTS = 16
MXFP8_ALIGN_ELEMENTS = 32

# Transformer Engine's DelayedScaling defaults (TE docs, common.recipe.DelayedScaling).
TE_DEFAULTS = {"format": "hybrid", "amax_history_len": 1024, "amax_compute_algo": "max", "margin": 0}
# Megatron-LM arguments.py `_add_transformer_engine_args` defaults.
MEGATRON_DEFAULTS = {"format": None, "recipe": "delayed", "amax_history_len": 1, "amax_compute_algo": "most_recent",
                     "margin": 0}

# Our recipe name -> Megatron's --fp8-recipe choice.
_MEGATRON_RECIPE = {"delayed": "delayed", "current": "tensorwise", "block": "blockwise", "mxfp8": "mxfp8"}
# Our recipe name -> TE class name in transformer_engine.common.recipe.
TE_RECIPE_CLASS = {"delayed": "DelayedScaling", "current": "Float8CurrentScaling",
                   "block": "Float8BlockScaling", "mxfp8": "MXFP8BlockScaling"}

# Minimum compute capability (major, minor) per recipe, from TE's support checks.
_MIN_CC = {"delayed": (8, 9), "current": (8, 9), "block": (9, 0), "mxfp8": (10, 0)}
# TE refuses MXFP8 on 12.0+ architectures ("not supported on 12.0+ architectures yet").
_MXFP8_REFUSED_FROM_CC = (12, 0)
# Lowest CUDA per recipe and architecture (`min_cuda`):
# - every recipe: 12.1. Transformer Engine 2.x, where the current / block / mxfp8 recipes are (what `dstoolkit[te]`
#   installs), lists "CUDA 12.1+ (12.8+ for Blackwell support)" as its prerequisite (TE user guide, Installation,
#   releases 2.0 - 2.11: https://docs.nvidia.com/deeplearning/transformer-engine/user-guide/installation.html);
#   on Ada (sm_89) TE's own runtime check asks 12.1 too (transformer_engine/pytorch check_fp8_support: "Cuda
#   version 12.1 or higher required for FP8 execution on Ada"). FP8 types and GEMMs first came with CUDA 11.8.
# - Blackwell (sm_100+): 12.8, the same prerequisite's "12.8+ for Blackwell support" (CUDA 12.8 is the first
#   toolkit that builds sm_100 / sm_120 code).
# - block: 12.9 (TE check_fp8_block_scaling_support: "FP8 block scaled GEMM requires Hopper and CUDA >= 12.9").
_FP8_MIN_CUDA = (12, 1)
_BLACKWELL_CC = (10, 0)
_BLACKWELL_MIN_CUDA = (12, 8)
_BLOCK_MIN_CUDA = (12, 9)


class Fp8LayerSelection(StrictModel):
    """Which linear layers run in FP8. A layer must pass every rule; skipped layers keep bf16."""

    skip_first_layers: int = Field(default=0, ge=0)
    """Transformer blocks at the start kept in bf16 (Megatron --num-layers-at-start-in-bf16); 0 = none."""
    skip_last_layers: int = Field(default=0, ge=0)
    """Transformer blocks at the end kept in bf16 (Megatron --num-layers-at-end-in-bf16); 0 = none."""
    include: list[str] = Field(default_factory=list)
    """fnmatch patterns on qualified module names (e.g. "layers.*.mlp.*"); empty means every linear layer."""
    exclude: list[str] = Field(default_factory=lambda: ["*lm_head*", "*output_layer*", "*.gate", "*.gate.wg",
                                                        "*router*"])
    """fnmatch patterns on module names kept in bf16; default keeps the LM head and MoE routers in bf16 (DeepSeek-V3 §3.3)."""
    min_in_features: int = Field(default=FP8_ALIGN_ELEMENTS, ge=1)
    """Smallest in_features swapped; tiny GEMMs are slower in FP8 (quantisation overhead dominates)."""
    min_out_features: int = Field(default=FP8_ALIGN_ELEMENTS, ge=1)
    """Smallest out_features swapped."""

    @model_validator(mode="after")
    def _check_include_exclude_overlap(self) -> "Fp8LayerSelection":
        same = sorted(set(self.include) & set(self.exclude))
        if same:
            raise ValueError(
                f"fp8.layers.include and fp8.layers.exclude both list {same}: a pattern cannot be both; "
                "remove it from one of them")
        return self

    def name_reason(self, name: str) -> Optional[str]:
        """Return why a module name is excluded by the patterns, or None when it passes."""
        for pat in self.exclude:
            if fnmatch.fnmatchcase(name, pat):
                return f"excluded by pattern {pat!r}"
        if self.include and not any(fnmatch.fnmatchcase(name, p) for p in self.include):
            return f"not matched by include patterns {self.include}"
        return None


class MegatronFp8Args(BaseModel):
    """Megatron-LM command-line flags for an `Fp8Config`, plus warnings about default mismatches."""

    args: list[str]
    """Flags in order, e.g. ["--fp8-format", "hybrid", "--fp8-recipe", "delayed", ...]."""
    warnings: list[str]
    """One line per place where Megatron's default differs from TE's and the value was not set explicitly."""


class Fp8Config(StrictModel):
    """FP8 GEMM settings: format, scaling recipe and which layers. Defaults are Transformer Engine's."""

    enabled: bool = True
    """Whether FP8 is used at all; False keeps bf16 everywhere (the section may stay in the file)."""
    format: Literal["e4m3", "hybrid"] = "hybrid"
    """e4m3: E4M3 everywhere (DeepSeek-V3); hybrid: E4M3 forward, E5M2 gradients. Unset, it follows TE's
    default for the recipe: hybrid for delayed/current, e4m3 for block/mxfp8."""
    recipe: Literal["delayed", "current", "block", "mxfp8"] = "delayed"
    """Scaling: delayed (amax history, per tensor), current (per tensor, this step), block (DeepSeek 1x128
    activation tiles / 128x128 weight blocks; sm_90 + CUDA 12.9), mxfp8 (32-element E8M0 blocks; sm_100)."""
    amax_history_len: int = Field(default=1024, ge=1)
    """delayed only: steps of amax kept per tensor (TE default 1024; Megatron default 1)."""
    amax_compute_algo: Literal["max", "most_recent"] = "max"
    """delayed only: amax taken from the history: its max (TE default) or the latest (Megatron default)."""
    margin: int = Field(default=0, ge=0)
    """delayed/current: scale = fp8_max / amax / 2**margin; each +1 halves the scale (headroom for growth)."""
    block_size: int = Field(default=DEEPSEEK_TILE, ge=16)
    """block only: tile length for activations (1 x block_size) and weight block side (block_size^2). DeepSeek: 128."""
    layers: Fp8LayerSelection = Field(default_factory=Fp8LayerSelection)
    """Which linear layers are swapped to FP8."""

    @model_validator(mode="before")
    @classmethod
    def _default_format_per_recipe(cls, data: Any) -> Any:
        # TE: Float8BlockScaling and MXFP8BlockScaling default to Format.E4M3; DelayedScaling and
        # Float8CurrentScaling to Format.HYBRID.
        if isinstance(data, dict) and "format" not in data and data.get("recipe") in ("block", "mxfp8"):
            data = {**data, "format": "e4m3"}
        return data

    @model_validator(mode="after")
    def _check_history_only_for_delayed(self) -> "Fp8Config":
        # Only values that differ from the default count, so a full model_dump() round-trips.
        set_fields = {f for f in ("amax_history_len", "amax_compute_algo")
                      if getattr(self, f) != type(self).model_fields[f].default}
        if self.recipe != "delayed" and set_fields:
            fields = ", ".join(f"fp8.{f}={getattr(self, f)!r}" for f in sorted(set_fields))
            raise ValueError(
                f"{fields} only apply to fp8.recipe='delayed' but fp8.recipe={self.recipe!r}: "
                "remove them or use recipe 'delayed'")
        return self

    @model_validator(mode="after")
    def _check_margin_recipe(self) -> "Fp8Config":
        if self.margin and self.recipe in ("block", "mxfp8"):
            raise ValueError(
                f"fp8.margin={self.margin} has no effect with fp8.recipe={self.recipe!r} "
                "(TE's block recipes take no margin): remove fp8.margin")
        return self

    @model_validator(mode="after")
    def _check_block_size(self) -> "Fp8Config":
        if self.block_size != DEEPSEEK_TILE and self.recipe != "block":
            raise ValueError(f"fp8.block_size={self.block_size} only applies to fp8.recipe='block' "
                             f"(fp8.recipe={self.recipe!r}): remove it")
        if self.block_size % FP8_ALIGN_ELEMENTS:
            raise ValueError(f"fp8.block_size={self.block_size} must be a multiple of {FP8_ALIGN_ELEMENTS}")
        return self

    # ---- derived facts -------------------------------------------------------------------------------
    @property
    def forward_max(self) -> float:
        """Largest finite value of the forward (activation/weight) format: E4M3 in both formats."""
        return E4M3_MAX

    @property
    def backward_max(self) -> float:
        """Largest finite value of the gradient format: E5M2 for hybrid, E4M3 for e4m3."""
        return E5M2_MAX if self.format == "hybrid" else E4M3_MAX

    @property
    def align_elements(self) -> int:
        """GEMM dims must be divisible by this for the recipe (TE get_align_size_for_quantization)."""
        return MXFP8_ALIGN_ELEMENTS if self.recipe == "mxfp8" else FP8_ALIGN_ELEMENTS

    # ---- mappings ------------------------------------------------------------------------------------
    def te_recipe_kwargs(self) -> dict:
        """Kwargs for the TE recipe class named by `TE_RECIPE_CLASS[self.recipe]`.

        ``fp8_format`` is given as the `Format` member name ("E4M3" / "HYBRID"); the builder in
        `dstoolkit.fp8.recipes` replaces it by the enum. Testable without TE.
        """
        kw: dict = {"fp8_format": self.format.upper()}
        if self.recipe == "delayed":
            kw.update(margin=self.margin, amax_history_len=self.amax_history_len,
                      amax_compute_algo=self.amax_compute_algo)
        elif self.recipe == "block":
            # TE Float8BlockScaling: 1-D (1x128) scaling for activations and grads, 2-D (128x128) for weights.
            kw.update(x_block_scaling_dim=1, w_block_scaling_dim=2, grad_block_scaling_dim=1)
        return kw

    def to_megatron_args(self) -> MegatronFp8Args:
        """Megatron-LM flags. Every value is emitted explicitly, so Megatron's defaults never apply silently.

        Returns:
            The flags and one warning for each knob whose Megatron default differs from TE's default
            and that the user did not set (so a hand-written Megatron command would differ from TE use).
        """
        out: list[str] = []
        notes: list[str] = []
        if not self.enabled:
            return MegatronFp8Args(args=[], warnings=[])
        out += ["--fp8-format", self.format, "--fp8-recipe", _MEGATRON_RECIPE[self.recipe]]
        if self.recipe == "delayed":
            out += ["--fp8-margin", str(self.margin), "--fp8-amax-history-len", str(self.amax_history_len),
                    "--fp8-amax-compute-algo", self.amax_compute_algo]
            for key in ("amax_history_len", "amax_compute_algo"):
                if TE_DEFAULTS[key] != MEGATRON_DEFAULTS[key] and key not in self.model_fields_set:
                    notes.append(
                        f"fp8.{key}: Megatron's default is {MEGATRON_DEFAULTS[key]!r} but Transformer Engine's is "
                        f"{TE_DEFAULTS[key]!r}; emitting --fp8-{key.replace('_', '-')} {getattr(self, key)} "
                        "explicitly (set fp8.{0} to choose)".format(key))
        elif self.recipe == "current" and self.margin:
            out += ["--fp8-margin", str(self.margin)]
        if "format" not in self.model_fields_set:
            notes.append("fp8.format: Megatron has no default format (FP8 is off without --fp8-format); "
                         f"emitting TE's default {self.format!r}")
        sel = self.layers
        if sel.skip_first_layers or sel.skip_last_layers:
            # Megatron keeps first/last layers in bf16 via one switch and two counts (default 1 each).
            out += ["--first-last-layers-bf16", "--num-layers-at-start-in-bf16", str(sel.skip_first_layers),
                    "--num-layers-at-end-in-bf16", str(sel.skip_last_layers)]
        if sel.include or set(sel.exclude) != set(Fp8LayerSelection().exclude):
            notes.append("fp8.layers.include/exclude have no Megatron flag; Megatron decides per module type")
        return MegatronFp8Args(args=out, warnings=notes)


def parse_version(text: str) -> tuple[int, int]:
    """Parse "12.9" / "12.9.1" / "9.0" into (major, minor). Raises ValueError naming the text."""
    parts = str(text).strip().split(".")
    try:
        major = int(parts[0])
        minor = int(parts[1]) if len(parts) > 1 and parts[1] else 0
    except (ValueError, IndexError):
        raise ValueError(f"cannot read version {text!r}: expected MAJOR.MINOR such as '12.9'") from None
    return major, minor


def check_fp8_hardware(cfg: Fp8Config, gpu: GpuSpec, cuda_version: Optional[str] = None) -> list[str]:
    """List why `gpu` (and the CUDA toolkit, when known) cannot run `cfg` with Transformer Engine.

    Args:
        cfg: the FP8 settings.
        gpu: the target accelerator (a hardware-table row or explicit facts).
        cuda_version: CUDA version such as "12.8"; None skips the CUDA checks.

    Returns:
        One message per problem (empty when fine or when FP8 is disabled). Each names the recipe, the GPU,
        its compute capability and a fix.
    """
    if not cfg.enabled:
        return []
    problems: list[str] = []
    need = _MIN_CC[cfg.recipe]
    need_s = f"sm_{need[0]}{need[1]}"
    if gpu.compute_capability is None:
        return [f"fp8.recipe={cfg.recipe!r} needs an NVIDIA GPU with {need_s}+ but {gpu.name!r} has no CUDA "
                "compute capability; use training.precision bf16 there, or dstoolkit.runtime.fp8.convert(..., "
                "backend='emulated') for CPU correctness runs"]
    cc = parse_version(gpu.compute_capability)
    cc_s = f"sm_{cc[0]}{cc[1]}"
    if cc < need:
        fix = {"block": "use recipe 'delayed' or 'current' (sm_89+), or a Hopper/Blackwell GPU",
               "mxfp8": "use recipe 'block' (sm_90) or 'delayed', or a Blackwell (sm_100) GPU"}.get(
            cfg.recipe, "use bf16 (FP8 tensor cores start with Ada/Hopper)")
        problems.append(f"fp8.recipe={cfg.recipe!r} needs compute capability {need_s}+ but {gpu.name!r} is "
                        f"{cc_s}: {fix}")
    if cfg.recipe == "mxfp8" and cc >= _MXFP8_REFUSED_FROM_CC:
        problems.append(f"fp8.recipe='mxfp8' is refused by Transformer Engine on {cc_s} ({gpu.name!r}, 12.0+ "
                        "architectures): use recipe 'current'")
    if cuda_version is not None:
        need_cuda, why = min_cuda(cfg.recipe, cc)
        if parse_version(cuda_version) < need_cuda:
            alt = (" or use recipe 'delayed'/'current'" if cfg.recipe == "block" and parse_version(cuda_version)
                   >= min_cuda("current", cc)[0] else "")
            problems.append(f"fp8.recipe={cfg.recipe!r} needs CUDA >= {need_cuda[0]}.{need_cuda[1]} but CUDA is "
                            f"{cuda_version} ({gpu.name!r}, {cc_s}: {why}): upgrade CUDA{alt}")
    return problems


def min_cuda(recipe: str, cc: tuple[int, int]) -> tuple[tuple[int, int], str]:
    """The lowest CUDA (major, minor) Transformer Engine runs `recipe` with on compute capability `cc`, and why (the
    strictest of the floors above `_FP8_MIN_CUDA`: every recipe, Blackwell, block scaling)."""
    floors = [(_FP8_MIN_CUDA, "Transformer Engine 2.x (what the [te] extra installs) needs CUDA 12.1+; TE 1.x, which "
                              "ran FP8 on Hopper from CUDA 11.8, is not supported here")]
    if cc >= _BLACKWELL_CC:
        floors.append((_BLACKWELL_MIN_CUDA, "Transformer Engine 2.x needs CUDA 12.8+ for Blackwell"))
    if recipe == "block":
        floors.append((_BLOCK_MIN_CUDA, "Transformer Engine's FP8 block-scaled GEMM needs CUDA 12.9+"))
    return max(floors, key=lambda f: f[0])


def warn_megatron_defaults(cfg: Fp8Config) -> None:
    """Emit `to_megatron_args` warnings through the warnings module (for callers that print nothing)."""
    for line in cfg.to_megatron_args().warnings:
        warnings.warn(line, stacklevel=2)


TE_FP8_TOKEN_MULTIPLE = 8
"""Transformer Engine asserts, before every FP8 GEMM of te.Linear / te.LayerNormLinear, that the input's leading dims
(the tokens of the micro batch) multiply to a multiple of 8 and the last dim to a multiple of 16
(transformer_engine/pytorch/utils.py `assert_dim_for_fp8_exec`, called from `_Linear.forward` and
`_LayerNormLinear.forward`)."""


def token_multiple(cfg: Fp8Config) -> int:
    """Tokens per micro batch must be a multiple of this for the recipe: TE_FP8_TOKEN_MULTIPLE, and for MXFP8 the MX
    block (`MX_BLOCK`, 32: the columnwise copy the wgrad GEMM reads is scaled per 32 tokens, OCP MX spec v1.0;
    TE's MXFP8Quantizer.is_quantizable asks the leading dims for a multiple of 32)."""
    return MX_BLOCK if cfg.recipe == "mxfp8" else TE_FP8_TOKEN_MULTIPLE


def token_problem(cfg: Fp8Config, micro_batch: int, seq_len: int,
                  names: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Why micro_batch x seq_len tokens cannot run Transformer Engine's FP8 GEMMs (`token_multiple`), naming the
    numbers and the nearest seq_len that can; None when they can or FP8 is off. `names` spells micro_batch and
    seq_len as the caller's input does."""
    q = token_multiple(cfg)
    tokens = micro_batch * seq_len
    if not cfg.enabled or tokens % q == 0:
        return None
    n = {"micro_batch": "micro_batch", "seq_len": "seq_len", **(names or {})}
    step = q // math.gcd(q, micro_batch)  # seq_len multiples of this make micro_batch x seq_len a multiple of q
    down, up = seq_len // step * step, (seq_len // step + 1) * step
    near = up if down == 0 or up - seq_len < seq_len - down else down
    other = down if near == up else up
    alt = f" (or {other})" if other > 0 else ""
    why = ("Transformer Engine's FP8 GEMMs need (transformer_engine/pytorch/utils.py assert_dim_for_fp8_exec)"
           if q == TE_FP8_TOKEN_MULTIPLE else
           f"fp8.recipe {cfg.recipe!r} needs (its scales cover blocks of {q} tokens, OCP MX spec v1.0)")
    return (f"{n['micro_batch']}={micro_batch} x {n['seq_len']}={seq_len} = {tokens} tokens per micro-batch is not a "
            f"multiple of {q}, which {why}: use {n['seq_len']} {near}{alt}")

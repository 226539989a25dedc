"""What differs between the DeepSpeed releases we model (0.16.x and 0.19.x).

Facts come from deepspeed 0.19.8's source (``runtime/config.py`` ``_REMOVED_TOP_LEVEL_CONFIG_KEYS`` /
``_REMOVED_ZERO_CONFIG_KEYS``, ``runtime/precision_config.py``) and from the per-file verdicts of 0.16.5 and
0.19.8 recorded in the corpus SOURCES.tsv:
- 0.19 refuses the removed sections below with DeepSpeedConfigError; 0.16 accepted them.
- 0.19's bf16 section is a strict pydantic model (fp16 loss-scaling keys in it are rejected); 0.16 read bf16 with
  get_scalar_param and ignored extra keys.
- 0.16 read fp16/bf16 ``enabled`` raw, so ``"auto"`` in both counted as both enabled; 0.19 drops "auto".
- 0.16's ``compile`` section had ``disable``/``backend``/``kwargs`` (runtime/compiler.py); 0.19's is DeepCompile.
- The 1-bit optimizers (OneBitAdam, ZeroOneAdam, OneBitLamb) exist in 0.16, not in 0.19; Muon is new in 0.19.
"""
from __future__ import annotations

from typing import Literal

SUPPORTED = ("0.16", "0.19")
DEFAULT_VERSION = "0.19"
Version = Literal["0.16", "0.19"]

_ISSUE = "https://github.com/deepspeedai/DeepSpeed/issues/8489"

# Section -> (what replaces it / why). Refused by 0.19 (runtime/config.py _reject_removed_config_keys).
REMOVED_TOP_LEVEL_019: dict[str, str] = {
    "nebula": "Nebula checkpointing was removed; checkpoints would silently fall back to torch.save",
    "compression_training": "the compression library was removed; the model would train unquantized",
    "amp": "Apex AMP was removed; use fp16, bf16 or torch_autocast",
    "quantize_training": "Mixture-of-Quantization (MoQ, quantize_training) was removed",
    "sparse_gradients": "sparse embedding-gradient compression was removed",
    "eigenvalue": "eigenvalue-based MoQ was removed",
    "sparse_attention": "DeepSpeed Sparse Attention was removed",
    "elasticity": "elastic training was removed; set the batch triad directly",
    "graph_harvesting": "graph harvesting was removed",
    "curriculum_learning": "legacy top-level curriculum_learning was removed; use "
                           "data_efficiency.data_sampling.curriculum_learning",
    "progressive_layer_drop": "Progressive Layer Dropping was removed",
}
REMOVED_ZERO_019: dict[str, str] = {
    "mics_shard_size": "MiCS sharding was removed",
    "mics_hierarchical_params_gather": "MiCS sharding was removed",
    "zeropp_loco_param": "LoCo-ZeRO++ was removed; plain ZeRO++ quantized gradients remain",
}
# 0.16's compile section (runtime/compiler.py CompileConfig).
COMPILE_KEYS_016 = frozenset({"disable", "backend", "kwargs"})


def normalize_version(text: str) -> str:
    """'0.19.8' -> '0.19'. Raises ValueError for releases we do not model."""
    parts = str(text).strip().lstrip("v").split(".")
    if len(parts) >= 2 and f"{parts[0]}.{parts[1]}" in SUPPORTED:
        return f"{parts[0]}.{parts[1]}"
    raise ValueError(f"DeepSpeed version {text!r} is not modelled; choose one of {', '.join(SUPPORTED)}")


def removed_top_level(version: str) -> dict[str, str]:
    """Top-level sections the given release refuses."""
    return REMOVED_TOP_LEVEL_019 if version == "0.19" else {}


def removed_zero_keys(version: str) -> dict[str, str]:
    """zero_optimization keys the given release refuses."""
    return REMOVED_ZERO_019 if version == "0.19" else {}


def bf16_foreign_keys_are_errors(version: str) -> bool:
    """0.19 rejects fp16-only keys inside bf16; 0.16 ignored them."""
    return version == "0.19"

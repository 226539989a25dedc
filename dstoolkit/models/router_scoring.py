"""The score function of a MoE router that holds a per-expert score-correction bias (`e_score_correction_bias`),
when the config does not name it: the family's default, one rule for the hand-written readers (hf_families) and the
transformers build (shape_fields). `ModelShape.router_score_correction_bias` (sigmoid scores + expert bias, Megatron-LM
--moe-router-score-function sigmoid --moe-router-enable-expert-bias) follows from it. No torch import.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

SCORING_KEY = "scoring_func"
"""The config key DeepSeek's own configs (V2: softmax, V3: sigmoid) and transformers' DeepseekV4Config /
Inkling2Config name the router's score function by."""

_SIGMOID = ("deepseek_v3", "deepseek_v32", "glm4_moe", "glm4_moe_lite", "glm4v_moe", "glm4v_moe_text", "glm5_next",
            "glm_moe_dsa", "dots1", "dots3_note", "exaone_moe", "kimi_linear", "minimax_m2", "minimax_m3_vl",
            "minimax_m3_vl_text", "mimo_v2_flash", "minicpm5_moe", "nemotron_h", "solar_open", "step3p7", "laguna",
            "hy_v3", "hy_v4", "hy_v4_vl", "hy_v4_vl_text", "axk1", "axk2", "bailing_hybrid", "beam", "ergo", "inkling_text",
            "kolibri1", "kolibri1_1", "muse_spark",
            # the text configs of multimodal families (the model_type the text shape is built from)
            "glm5_next_text", "dots3_note_text", "muse_spark_text", "step3p5")
_SOFTMAX = ("deepseek_v2", "ernie4_5_moe", "ernie4_5_vl_moe", "ernie4_5_vl_moe_text", "longcat_flash")

SCORING_BY_MODEL_TYPE: dict[str, str] = {**{t: "sigmoid" for t in _SIGMOID}, **{t: "softmax" for t in _SOFTMAX}}
"""The router score function of each model_type whose config class has no scoring_func attribute, as its
transformers 5.25 modelling code computes it (models/<type>/modeling_<type>.py: `router_logits.sigmoid()` in
DeepseekV3TopkRouter, Glm4MoeTopkRouter, ...; `softmax` in Ernie4_5_MoeTopKRouter and LongcatFlashTopkRouter).
deepseek_v2: DeepSeek's own DeepseekV2 config defaults scoring_func to softmax, as transformers' DeepseekV2Moe
scores. A config class that declares scoring_func (DeepseekV4Config: sqrtsoftplus, Inkling2Config: sigmoid) gives
its default through the built config object, before this table is read."""


class RouterScoring(NamedTuple):
    """The score function a router uses and where it came from."""

    function: str
    """sigmoid, softmax, sqrtsoftplus, ... (the config's spelling)."""
    note: Optional[str] = None
    """Set when the function was assumed (no scoring_func and a model_type outside `SCORING_BY_MODEL_TYPE`)."""


def router_scoring(model_type: Any, scoring_func: Any) -> RouterScoring:
    """The score function of a router that holds a score-correction bias.

    Args:
        model_type: The (text) config's model_type; None for a user's module.
        scoring_func: The config's scoring_func (the config class default on a built config object), or None.

    Returns:
        The config's own value; else the model_type's default (`SCORING_BY_MODEL_TYPE`); else sigmoid, with a note
        that says it was assumed and names the field to set.
    """
    if scoring_func is not None:
        return RouterScoring(str(scoring_func))
    known = SCORING_BY_MODEL_TYPE.get(str(model_type)) if model_type is not None else None
    if known is not None:
        return RouterScoring(known)
    return RouterScoring("sigmoid", f"the router holds a score-correction bias (e_score_correction_bias) and the "
                                    f"config names no {SCORING_KEY}; model_type {model_type!r} has no known default, "
                                    f"so sigmoid scoring was assumed (set {SCORING_KEY} in the config: sigmoid or "
                                    "softmax)")


def sigmoid_with_expert_bias(model_type: Any, scoring_func: Any, has_bias: bool) -> tuple[bool, Optional[str]]:
    """`ModelShape.router_score_correction_bias` for a router that holds (has_bias) or lacks a score-correction bias,
    and the note `router_scoring` gives (None when nothing was assumed or there is no bias)."""
    if not has_bias:
        return False, None
    scoring = router_scoring(model_type, scoring_func)
    return scoring.function == "sigmoid", scoring.note

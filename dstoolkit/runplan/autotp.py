"""DeepSpeed AutoTP on the estimate side: what its tensor parallelism does with the vocabulary-sized parts of a model
(the input embedding, the LM head and the logits), read once from the DeepSpeed JSON's `tensor_parallel` section and
the model, and the one rule every estimator asks whether a parameter entry is split over the TP ranks
(`tp_splits`). No torch import.

The blocks' linears are split as Megatron's column / row pairs in every AutoTP path (module_inject/auto_tp.py
AutoTP._replace: LinearLayer / LinearAllreduce), so only the embedding, the LM head and the logits differ from
Megatron's vocab-parallel layers. DeepSpeed 0.19.8 shards a model in runtime/engine.py
`DeepSpeedEngine._apply_autotp_partitioning`, by the first of three paths that applies ("custom config > HF tp_plan
> AutoTP"):

- partition_config: `tensor_parallel.partition_config` or `preset_model` (TPTrainingConfig.get_partition_config_object).
  Only layers whose name a layer spec matches are split (AutoTP._replace_with_config, `_replace_module`); the
  built-in presets name no embedding and no LM head (module_inject/autotp_config.py AutoTPPresets), so both stay
  whole unless a spec of the config matches them.
- hf_tp_plan: the model's Hugging Face tp_plan (runtime/tensor_parallel/config.py `_get_hf_tp_plan`: the config's
  base_model_tp_plan, the class's `_tp_plan`, the instance's). transformers gives its causal LMs
  `_tp_plan = {"lm_head": "colwise_gather_output"}` and its base models `"embed_tokens": "embedding_rowwise"`
  (transformers 5.25 distributed/mixin.py init_parallel_plans). tp_plan_converter.py TPPlanConverter.convert makes
  the head a gathered column spec (AutoTP._create_column_parallel_layer -> layers.py LinearLayer(gather_output=True):
  weight rows vocab/tp, output all-gathered to [tokens, vocab] on every rank, GatherFromTensorParallelRegion) and
  the embedding a SKIP spec (whole). A tied head and embedding are vocab-parallel by default
  (`auto_vocab_parallel_lm_head`: vocab_parallel_lm_head unset, the plan asks embedding_rowwise, and the head's
  weight is an embedding's; not under DeepCompile's autotp pass); with vocab_parallel_lm_head false both stay whole
  (AutoTP._configure_gathered_column_tie_fallbacks keeps a gathered head tied to an embedding replicated).
- heuristic: no tp_plan (the user's own module, or a transformers class that declares none: OPT, BLOOM, Falcon,
  ...; GPT-2 is refused there, `HEURISTIC_UNSUPPORTED`). Only the decoder layers AutoTP.tp_parser finds are
  replaced (module_inject/replace_module.py replace_transformer_layer); `set_lm_head` returns at once in training
  mode, so the embedding and the LM head stay whole and every rank runs the whole head on the whole vocabulary.

In every path `tensor_parallel.vocab_parallel_lm_head: true` makes the head a layers.py VocabParallelLinear (weight
rows vocab/tp, logits left [tokens, vocab/tp]), a tied embedding a VocabParallelEmbedding sharing that shard
(AutoTP._create_vocab_parallel_layer), and installs the distributed loss (sequence/cross_entropy.py
VocabParallelCausalLMLoss, engine `finalize_autotp`); an untied embedding stays whole. Measured on 2 gloo ranks
(tiny transformers Llama, deepspeed 0.19.8): untied + tp_plan: embedding [1024, 64] whole, head [512, 64], logits
[1, 16, 1024]; with vocab_parallel_lm_head true logits [1, 16, 512]; tied: embedding [512, 64], logits [1, 16,
512]; tied with vocab_parallel_lm_head false, and untied without a tp_plan: everything whole, logits [1, 16, 1024].
"""
from __future__ import annotations

import re
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict

from dstoolkit.dsconfig.rule_facts import HF_ZERO3_AUTOTP_NOTE
from dstoolkit.models.measured import ParamEntry

AutoTpPath = Literal["partition_config", "hf_tp_plan", "heuristic"]

HF_LM_HEAD_NAME = "lm_head.weight"
"""The LM head's parameter name in a transformers causal LM, which a partition_config pattern is matched against."""
HF_EMBEDDING_NAME = "model.embed_tokens.weight"
"""The input embedding's parameter name in a transformers causal LM (AutoTP._replace_module: full module name +
".weight")."""


class AutoTp(BaseModel):
    """How DeepSpeed AutoTP training holds the embedding, the LM head and the logits of one run (`autotp_layout`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    path: AutoTpPath
    """Which of engine._apply_autotp_partitioning's paths shards the model (module docstring)."""
    embedding_split: bool
    """The input embedding's table is split over the TP ranks (a tied one shares the vocab-parallel head's shard);
    False: every TP rank holds it whole, with its gradient and optimizer states."""
    lm_head_split: bool
    """The LM head's weight (the embedding's when tied) is split over the TP ranks, and so is its GEMM; False: every
    TP rank holds the whole head and runs it on the whole vocabulary."""
    vocab_parallel_loss: bool
    """The logits stay [tokens, vocab/tp] on each rank and DeepSpeed's VocabParallelCausalLMLoss reduces the loss
    over the TP group; False: every TP rank holds [tokens, vocab] logits and runs the loss on them."""
    why: str
    """One line: the DeepSpeed code and config keys that decided it."""

    @property
    def logits_gathered(self) -> bool:
        """A split head whose output is all-gathered into [tokens, vocab] on every rank (LinearLayer with
        gather_output: the HF tp_plan's colwise_gather_output, or a gathered column spec)."""
        return self.lm_head_split and not self.vocab_parallel_loss


def tp_splits(entry: ParamEntry, autotp: Optional[AutoTp]) -> bool:
    """Whether the run's tensor parallelism splits `entry` over its tp ranks: the one rule the estimators ask.

    Megatron (`autotp` None): the entry's own flag (attention, MLP, experts, and the vocab of the embedding and the
    LM head, Megatron's VocabParallelEmbedding / ColumnParallelLinear output layer). AutoTP: the blocks' linears
    the same (module_inject/auto_tp.py AutoTP._replace: LinearLayer / LinearAllreduce), the token embedding and
    the LM head as `AutoTp` says (a learned position table is whole in both).
    """
    if autotp is None or entry.layer >= 0:
        return entry.tp_split
    if entry.kind == "embedding":
        return entry.tp_split and autotp.embedding_split
    if entry.kind == "lm_head":
        return autotp.lm_head_split
    return entry.tp_split


def _first_spec(specs: list, name: str, model_type: str) -> Optional[dict]:
    """The first layer spec of a partition_config whose patterns match `name` (module_inject/autotp_config.py
    AutoTPConfig.find_matching_spec / TPLayerSpec.matches: re.match, model_types compared lower-case)."""
    for spec in specs:
        if not isinstance(spec, dict):
            continue
        types = spec.get("model_types")
        if types and str(model_type).lower() not in [str(t).lower() for t in types]:
            continue
        if any(re.match(p, name) for p in spec.get("patterns") or ()):
            return spec
    return None


def _kind(spec: Optional[dict]) -> str:
    """A layer spec's partition type (TPLayerSpec.partition_type, default column), or skip when none matched."""
    return "skip" if spec is None else str(spec.get("partition_type", "column")).lower()


def autotp_layout(tensor_parallel: Any, *, tied: bool, model_type: str, hf_tp_plan: bool,
                  deepcompile_autotp: bool = False) -> AutoTp:
    """What DeepSpeed 0.19.8 AutoTP training does with the embedding, the LM head and the logits (module docstring).

    Args:
        tensor_parallel: the config's validated `tensor_parallel` section (dsconfig.ds_misc.TensorParallelConfig):
            vocab_parallel_lm_head, partition_config, preset_model.
        tied: the model ties its LM head to its input embedding (tie_word_embeddings).
        model_type: the model's model_type (a layer spec's model_types filter).
        hf_tp_plan: the model carries a Hugging Face tp_plan (`models.tp_plan.tp_plan_of` is not empty).
        deepcompile_autotp: compile.deepcompile with "autotp" in compile.passes (keeps a tied pair whole).
    """
    vp = tensor_parallel.vocab_parallel_lm_head
    if tensor_parallel.partition_config is not None or tensor_parallel.preset_model is not None:
        specs = list((tensor_parallel.partition_config or {}).get("layer_specs") or [])
        head = _first_spec(specs, HF_LM_HEAD_NAME, model_type)
        embed = _first_spec(specs, HF_EMBEDDING_NAME, model_type)
        named = f"{HF_LM_HEAD_NAME}: {_kind(head)}, {HF_EMBEDDING_NAME}: {_kind(embed)}"
        # an untied embedding a layer spec names is sliced on its hidden dimension (AutoTP._slice_embedding)
        embed_own = _kind(embed) in ("column", "row")
        if vp is True:
            return AutoTp(path="partition_config", embedding_split=tied or embed_own, lm_head_split=True,
                          vocab_parallel_loss=True,
                          why="partition_config with vocab_parallel_lm_head: AutoTP._replace_with_config -> "
                              "_create_vocab_parallel_layer (VocabParallelLinear"
                              + (", the tied embedding a VocabParallelEmbedding)" if tied else f"; {named})"))
        head_split = _kind(head) in ("column", "row")
        if tied and _kind(head) == "column" and bool(head.get("gather_output")):
            head_split = False  # AutoTP._configure_gathered_column_tie_fallbacks: the tied pair stays whole
        return AutoTp(path="partition_config", embedding_split=head_split if tied else embed_own,
                      lm_head_split=head_split, vocab_parallel_loss=False,
                      why="partition_config / preset_model: only layers a layer spec matches are split "
                          f"(AutoTP._replace_with_config; {named})")
    if hf_tp_plan:
        if tied:
            auto = vp is None and not deepcompile_autotp
            split = vp is True or auto
            if auto:
                why = ("a tied head and embedding vocab-parallel by default (engine._apply_autotp_partitioning "
                       "auto_vocab_parallel_lm_head, from the plan's embed_tokens embedding_rowwise: "
                       "VocabParallelLinear / VocabParallelEmbedding; kept whole where the embedding has its own "
                       "forward, layers.py "
                       "VocabParallelEmbedding.validate_embedding)")
            elif split:
                why = ("vocab_parallel_lm_head: the tied head and embedding a VocabParallelLinear / "
                       "VocabParallelEmbedding")
            else:
                why = (("vocab_parallel_lm_head false" if vp is False else "DeepCompile's autotp pass")
                       + ": the tied head and embedding whole (AutoTP._configure_gathered_column_tie_fallbacks)")
            return AutoTp(path="hf_tp_plan", embedding_split=split, lm_head_split=split, vocab_parallel_loss=split,
                          why="Hugging Face tp_plan: " + why)
        return AutoTp(path="hf_tp_plan", embedding_split=False, lm_head_split=True, vocab_parallel_loss=vp is True,
                      why="Hugging Face tp_plan: embed_tokens embedding_rowwise (a SKIP spec), lm_head "
                          + ("a VocabParallelLinear (vocab_parallel_lm_head)" if vp is True else
                             "colwise_gather_output (LinearLayer(gather_output=True))"))
    if vp is True:
        return AutoTp(path="heuristic", embedding_split=tied, lm_head_split=True, vocab_parallel_loss=True,
                      why="no tp_plan, vocab_parallel_lm_head: the decoder layers by AutoTP.tp_parser, the head a "
                          "VocabParallelLinear (_replace_vocab_parallel_lm_head)"
                          + (" sharing its shard with the tied embedding" if tied else "; the embedding whole"))
    return AutoTp(path="heuristic", embedding_split=False, lm_head_split=False, vocab_parallel_loss=False,
                  why="no tp_plan: only the decoder layers AutoTP.tp_parser finds are replaced "
                      "(replace_transformer_layer; set_lm_head returns in training mode)")


HF_TP_PLAN_STYLES = frozenset({"colwise", "colwise_rep", "colwise_gather_output", "rowwise",
                               "replicated_with_grad_allreduce", "embedding_rowwise"})
"""Partition styles of a Hugging Face tp_plan DeepSpeed 0.19.8 AutoTP converts (module_inject/tp_plan_converter.py
SUPPORTED_STYLES). Any other style makes TPPlanConverter.convert raise ValueError for the whole plan, so
deepspeed.initialize fails before the first step, unless tensor_parallel.partition_config (or preset_model) is set:
engine._apply_autotp_partitioning tries that first. Measured on 2 gloo ranks with autotp_size 2 (tiny transformers
models): Phi-3 and OLMo-2 (rowwise_split_input) raise at initialize, Llama initializes. transformers 5 declares such
styles for Phi-3, OLMo-2/3, OLMoE, GLM / GLM-4, MiniMax-M2 (rowwise_split_input), DeepSeek-V2/V3, MiniCPM3 and
other MLA models (mla_kv_a_proj), Llama-4 (moe_tp_experts, packed_rowwise), among others."""


HEURISTIC_UNSUPPORTED = frozenset({"deberta", "flaubert", "fsmt", "gpt2", "led", "longformer", "xlm", "xlnet"})
"""Models DeepSpeed 0.19.8's heuristic AutoTP path (no tp_plan) refuses: module_inject/auto_tp.py AutoTP.supported
names them by the class-name stem of the model (`AutoTP not supported for model` assertion in tp_parser). Measured:
a tiny transformers GPT-2 at autotp_size 2 on 2 gloo ranks raises it at deepspeed.initialize (OPT, also without a
tp_plan, initializes with its attention and MLP split)."""


ALIBI_NOTE = ("its ALiBi bias is built for every attention head (transformers' build_alibi_tensor from the config's "
              "head count) while AutoTP leaves each rank heads / tp, so the first forward fails on a shape mismatch")
"""Measured on 2 gloo ranks at autotp_size 2 (tiny transformers models, deepspeed 0.19.8): BLOOM and MPT initialize
and then raise RuntimeError (a size mismatch against the ALiBi tensor) at the first forward; Llama, OPT, Falcon,
StableLM and GPT-Neo give the loss of the unsharded model (difference <= 5e-7)."""


def tp_plan_refusal(tp_plan: tuple[tuple[str, str], ...], autotp_size: int, where: str,
                    model_type: str = "", alibi: bool = False) -> Optional[str]:
    """Why DeepSpeed 0.19.8 AutoTP cannot shard a model by its Hugging Face tp_plan (`models.tp_plan.tp_plan_of`),
    or, without one, by its heuristic path (`HEURISTIC_UNSUPPORTED`, by `model_type`), or cannot run it once sharded
    (`alibi`: ALiBi positions, ALIBI_NOTE), or None. `where`: the setting that asks for AutoTP, named in the message
    (e.g. "tensor_parallel.autotp_size")."""
    if autotp_size <= 1:
        return None
    if alibi:
        return (f"{where}={autotp_size}: DeepSpeed 0.19.8 AutoTP cannot train this model: {ALIBI_NOTE}. Train it "
                "without AutoTP (tensor parallel size 1, ZeRO only)")
    if not tp_plan and model_type.replace("-", "_") in HEURISTIC_UNSUPPORTED:
        return (f"{where}={autotp_size}: DeepSpeed 0.19.8 AutoTP does not shard model_type {model_type}: it has no "
                "Hugging Face tp_plan, and AutoTP's own layer parser refuses it (module_inject/auto_tp.py "
                "AutoTP.supported), so deepspeed.initialize raises 'AutoTP not supported for model'. Give the config "
                "a tensor_parallel.partition_config for this model, or train without AutoTP (tensor parallel size 1, "
                "ZeRO only)")
    rejected = [(pattern, style) for pattern, style in tp_plan if style.lower() not in HF_TP_PLAN_STYLES]
    if not rejected:
        return None
    styles = sorted({style for _, style in rejected})
    shown = ", ".join(f"{pattern}: {style}" for pattern, style in rejected[:4])
    more = f" and {len(rejected) - 4} more" if len(rejected) > 4 else ""
    return (f"{where}={autotp_size}: DeepSpeed 0.19.8 AutoTP rejects this model's Hugging Face tp_plan, whose "
            f"partition style{'s' if len(styles) > 1 else ''} {', '.join(styles)} it does not convert ({shown}{more}; "
            "module_inject/tp_plan_converter.py takes only " + ", ".join(sorted(HF_TP_PLAN_STYLES)) + "), so "
            "deepspeed.initialize raises ValueError before the first step. Give the config a "
            "tensor_parallel.partition_config for this model (DeepSpeed applies it instead of the tp_plan), or train "
            "without AutoTP (tensor parallel size 1, ZeRO only)")


def shape_tp_refusal(shape: Any, tp_plan: tuple[tuple[str, str], ...], autotp_size: int,
                     where: str) -> Optional[str]:
    """`tp_plan_refusal` of a model shape (its model_type and ALiBi positions) and its tp_plan
    (`models.tp_plan.tp_plan_of`): the one call of estimate and the hf / accelerate targets."""
    return tp_plan_refusal(tp_plan, autotp_size, where, shape.model_type, alibi=shape.position_encoding == "alibi")


def hf_zero3_autotp_refusal(zero_stage: int, autotp_size: int, where: str) -> Optional[str]:
    """Why a Hugging Face Trainer / Accelerate run cannot use AutoTP at this ZeRO stage (`HF_ZERO3_AUTOTP_NOTE`), with
    the fix, or None. `where`: the setting that asks for AutoTP, named in the message."""
    if autotp_size <= 1 or zero_stage != 3:
        return None
    return (f"{where}={autotp_size} at ZeRO stage 3: {HF_ZERO3_AUTOTP_NOTE}. Fix: tensor parallel size 1 at ZeRO-3 for HF "
            "Trainer / Accelerate (training.tp: 1 or auto; ZeRO-3 already shards the weights), or AutoTP at ZeRO stage "
            "0-2")

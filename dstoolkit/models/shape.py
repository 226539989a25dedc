"""The model shape every estimator, generator and real run works from (no torch import).

Field names follow Hugging Face `config.json` names so that a shape reads like the config it came from.
Readers (`dstoolkit.models.hf`) and presets (`dstoolkit.models.presets`) produce a `ModelShape`;
`dstoolkit.models.params.count_params(shape)` counts its parameters exactly.
"""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dstoolkit.models.measured import MeasuredParams, TracedFlops


class ModelShape(BaseModel):
    """Architecture facts of a decoder-only transformer (dense, MoE, MLA)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str = "model"
    """Display name (preset name or the config file's stem)."""
    model_type: str
    """HF `model_type`: llama, mistral, mixtral, qwen2, qwen2_moe, deepseek_v2, deepseek_v3, gpt2, ... ."""
    hidden_size: int = Field(gt=0)
    """h: width of the residual stream."""
    num_hidden_layers: int = Field(gt=0)
    """L: number of transformer blocks."""
    num_attention_heads: int = Field(gt=0)
    """a: query heads."""
    num_key_value_heads: Optional[int] = Field(default=None, gt=0)
    """KV heads for GQA/MQA; None means equal to num_attention_heads."""
    head_dim: Optional[int] = Field(default=None, gt=0)
    """Per-head width; None means hidden_size // num_attention_heads."""
    intermediate_size: int = Field(gt=0)
    """Dense FFN width (also the dense layers of DeepSeek-style models)."""
    vocab_size: int = Field(gt=0)
    """Vocabulary size V."""
    tie_word_embeddings: bool = False
    """Whether the LM head shares the input embedding matrix."""
    attention_bias: bool = False
    """q/k/v projection biases (Qwen2 has them; o_proj has none)."""
    mlp_gated: bool = True
    """SwiGLU-style gate+up+down (3 matrices) when True; plain up+down (2 matrices) when False."""
    max_position_embeddings: Optional[int] = None
    """Learned absolute position table size (GPT-2 style), counted only when learned_positions is True."""
    learned_positions: bool = False
    """True for models with a learned position-embedding table (GPT-2); RoPE models have none."""
    o_proj_bias: bool = False
    """Bias on the attention output projection (GPT-2 c_proj; Llama/Qwen3 with attention_bias=True)."""
    mlp_bias: bool = False
    """Biases on the dense FFN projections (GPT-2 c_fc/c_proj; Llama mlp_bias=True). Experts never have them."""
    norm_type: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    """rmsnorm: weight only (Llama, Mistral, Qwen, DeepSeek); layernorm: weight and bias (GPT-2)."""
    hidden_act: str = "silu"
    """FFN activation as HF names it (silu for SwiGLU models, gelu_new for GPT-2)."""
    qk_norm: bool = False
    """Qwen3: per-head RMSNorm (width head_dim) on q and k inside attention."""
    qk_norm_scope: Literal["head", "projection"] = "head"
    """What each q / k norm spans when qk_norm: one head (Qwen3; Megatron's --qk-layernorm) or the whole projection
    (OLMo-2, OLMoE: q_norm over heads x head_dim)."""
    attention_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout probability on the attention probabilities in training (GPT-2 `attn_pdrop`, HF default 0.1, as
    Megatron-LM's GPT `--attention-dropout` default; Llama-style configs `attention_dropout`, default 0.0). An eager
    core with it runs and keeps a dropout pass over its score matrices (estimate.attention_core,
    estimate.activations)."""
    position_encoding: Literal["rope", "alibi", "none"] = "rope"
    """What encodes positions when learned_positions is False: rope (rotary), alibi (BLOOM, Falcon alibi=True:
    attention biases, no table, no rotation) or none (NoPE). Read from the built modules (models.block_facts) for
    shapes transformers builds; the hand-written families are all RoPE (GPT-2: learned)."""
    rotary_fraction: float = Field(default=1.0, gt=0.0, le=1.0)
    """Share of each head's channels the rotary embedding turns (GPT-NeoX rotary_pct, Phi partial_rotary_factor;
    Megatron --rotary-percent); 1.0: all of them."""
    rope_scaling: Optional["RopeScaling"] = None
    """The config's rope_scaling (rope_parameters in transformers 5) when it changes the frequencies (not
    "default"); None: plain RoPE at rope_theta."""
    parallel_residual: bool = False
    """Attention and MLP read the same block input and add into one residual stream (GPT-NeoX
    use_parallel_residual, Falcon parallel_attn, Phi); False: the sequential pre-norm block."""
    embedding_norm: bool = False
    """A norm right after the token embedding (BLOOM word_embeddings_layernorm)."""
    output_norm: bool = False
    """A norm on the attention or MLP output before its residual add (post- or sandwich-norm blocks: OLMo-2,
    Gemma-2/3, GLM-4); False: the pre-norm block (a norm on the sublayer input only)."""
    norm_variant: Optional[str] = None
    """A norm norm_type does not describe: "LayerNorm without bias", "LayerNorm without weight or bias
    (non-parametric)" (OLMo-1), "scales by (1 + weight)" (Gemma), or the norm module's class name; None: a plain
    RMSNorm / LayerNorm (block_facts.NORM_VARIANTS)."""
    lm_head_bias: bool = False
    """The untied output head has a bias (Phi-2)."""
    qkv_fused: bool = False
    """q, k and v projected by one weight tensor (GPT-2's `c_attn` Conv1D, transformers GPT2Attention); False: the
    separate q_proj / k_proj / v_proj of Llama-style modules. Counts the block's GEMM launches and parameter tensors
    (estimate.host_cost.layer_kernels / layer_param_tensors), not its parameters."""

    sliding_window: Optional[int] = Field(default=None, gt=0)
    """Keys one query attends to at most (itself and the window - 1 before it: transformers'
    sliding_window_causal_mask) on every softmax-attention layer but full_attention_layers, where the config applies
    one window without a per-layer `layer_types` (Mistral-7B-v0.1 4096, Mixtral, StarCoder2, Phi-3; Qwen2/Qwen3
    use_sliding_window); None: full attention (per-layer windows of a transformers build sit in `measured`)."""
    full_attention_layers: tuple[int, ...] = ()
    """Layers sliding_window leaves at full attention (Qwen2/Qwen3 use_sliding_window: those below
    max_window_layers; Qwen2-MoE: the odd ones and those from max_window_layers on)."""

    # --- Mixture of experts (0 experts = dense) ---
    num_experts: int = Field(default=0, ge=0)
    """Routed experts per MoE layer (Mixtral num_local_experts, Qwen-MoE num_experts, DeepSeek n_routed_experts)."""
    num_experts_per_tok: int = Field(default=0, ge=0)
    """Top-k routed experts each token activates."""
    moe_intermediate_size: Optional[int] = Field(default=None, gt=0)
    """FFN width of one routed expert; None means intermediate_size (Mixtral)."""
    num_shared_experts: int = Field(default=0, ge=0)
    """Always-active shared experts (DeepSeek n_shared_experts); each has moe_intermediate_size width."""
    shared_expert_intermediate_size: Optional[int] = Field(default=None, gt=0)
    """Qwen-MoE: width of the single shared expert (which also has a 1-output sigmoid gate: shared_expert_gate)."""
    shared_expert_gate: bool = False
    """The shared expert's output is scaled by sigmoid(a 1-output linear of the token) (Qwen2-MoE
    shared_expert_gate; Megatron-LM --moe-shared-expert-gate)."""
    norm_topk_prob: bool = True
    """The top-k routing weights are renormalised to sum to 1 (Mixtral, DeepSeek-V3, Qwen3-MoE configs with
    norm_topk_prob true; Megatron-LM's default softmax over the top-k logits); False: softmax over all experts and the
    top-k weights used as they are (Qwen2-MoE, DeepSeek-V2 norm_topk_prob false; Megatron-LM
    --moe-router-pre-softmax)."""
    first_k_dense_replace: int = Field(default=0, ge=0)
    """DeepSeek: the first k layers use a dense FFN instead of MoE."""
    moe_layer_freq: int = Field(default=1, ge=1)
    """DeepSeek: every moe_layer_freq-th layer (after first_k_dense_replace) is MoE."""
    mlp_only_layers: tuple[int, ...] = ()
    """Qwen-MoE: layer indices that use a dense FFN (intermediate_size) instead of MoE; the reader also
    lists here the layers that `decoder_sparse_step` > 1 leaves dense."""
    router_score_correction_bias: bool = False
    """DeepSeek-V3 routing (topk_method noaux_tc): sigmoid expert scores, and the router also holds
    `e_score_correction_bias`, one per routed expert, added to the scores before the top-k (Megatron-LM
    --moe-router-score-function sigmoid --moe-router-enable-expert-bias). A transformers build sets it when a router
    holds that tensor and the config's scoring_func is sigmoid or absent (shape_fields)."""
    num_nextn_predict_layers: int = Field(default=0, ge=0)
    """DeepSeek-V3 multi-token-prediction modules in the checkpoint; recorded, EXCLUDED from parameter counts."""

    # --- Multi-head latent attention (DeepSeek-V2/V3); all None for standard attention ---
    q_lora_rank: Optional[int] = Field(default=None, gt=0)
    """Rank of the query down-projection; None means a full q_proj (DeepSeek-V2-Lite)."""
    kv_lora_rank: Optional[int] = Field(default=None, gt=0)
    """Rank of the joint KV compression (its presence turns MLA on)."""
    qk_rope_head_dim: Optional[int] = Field(default=None, gt=0)
    """Per-head rotary part of q/k."""
    qk_nope_head_dim: Optional[int] = Field(default=None, gt=0)
    """Per-head non-rotary part of q/k."""
    v_head_dim: Optional[int] = Field(default=None, gt=0)
    """Per-head value width."""

    # --- Where the shape came from ---
    source: Literal["analytic", "transformers", "user"] = "analytic"
    """analytic: a hand-written family reader or preset (counts from `count_params`'s formulas);
    transformers: built by transformers on the meta device (exact counts in `measured`; the fields above are
    filled from the config for the estimator's formulas); user: the user's own nn.Module
    (`dstoolkit.models.user_module`: exact counts in `measured`, FLOPs in `traced_flops`)."""
    model_class: Optional[str] = None
    """The transformers class the counts come from (source transformers), or the module reference
    `package.module:attribute` (source user)."""
    traced_flops: Optional[TracedFlops] = None
    """Training FLOPs per token traced on the module itself (source user: there is no formula for it)."""
    measured: Optional[MeasuredParams] = None
    """Exact per-layer, per-role counts of the transformers build; `count_params` returns these when set."""
    notes: tuple[str, ...] = ()
    """What reading the config did that the user should know (text_config used, quantization ignored, ...)."""

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def expert_ffn_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    def is_moe_layer(self, layer_index: int) -> bool:
        """DeepSeek/Qwen-MoE convention: layer i is MoE when i >= first_k_dense_replace and i % freq == 0."""
        if not self.is_moe or layer_index in self.mlp_only_layers:
            return False
        return layer_index >= self.first_k_dense_replace and layer_index % self.moe_layer_freq == 0

    def attention_window(self, layer_index: int) -> Optional[int]:
        """Keys one query of layer `layer_index` may attend to at most: the layer's own window from the config's
        layer_types (`measured`, first), else sliding_window unless the layer is in full_attention_layers; None:
        every key."""
        m = self.measured
        if m is not None and layer_index < len(m.layers) and m.layers[layer_index].attention_window is not None:
            return m.layers[layer_index].attention_window
        if self.sliding_window is None or layer_index in self.full_attention_layers:
            return None
        return self.sliding_window

    def attention_keys(self, layer_index: int, seq_len: int) -> int:
        """Keys per query the quadratic attention term of layer `layer_index` counts at `seq_len`: min(seq_len,
        its window) (the window bounds them), seq_len for full attention."""
        w = self.attention_window(layer_index)
        return seq_len if w is None else min(seq_len, w)

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_hidden_layers))

    @property
    def num_dense_layers(self) -> int:
        """Layers with a dense FFN (all layers of a dense model)."""
        return self.num_hidden_layers - self.num_moe_layers

    @property
    def q_head_dim(self) -> int:
        """Per-head query/key width: qk_nope_head_dim + qk_rope_head_dim under MLA, else head_size."""
        if self.is_mla:
            return (self.qk_nope_head_dim or 0) + (self.qk_rope_head_dim or 0)
        return self.head_size

    @model_validator(mode="after")
    def _check_heads_consistent(self) -> "ModelShape":
        if self.is_mla:
            return self
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.kv_heads} (GQA shares each KV head among a whole number of query heads)"
            )
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads={self.num_attention_heads}; "
                "set head_dim explicitly"
            )
        return self

    @model_validator(mode="after")
    def _check_mla_fields_complete(self) -> "ModelShape":
        mla = {"kv_lora_rank": self.kv_lora_rank, "qk_rope_head_dim": self.qk_rope_head_dim,
               "qk_nope_head_dim": self.qk_nope_head_dim, "v_head_dim": self.v_head_dim}
        given = [k for k, v in mla.items() if v is not None]
        if given and len(given) != len(mla):
            missing = [k for k in mla if k not in given]
            raise ValueError(f"MLA needs all of {', '.join(mla)}; missing {', '.join(missing)}")
        if self.q_lora_rank is not None and not given:
            raise ValueError(f"q_lora_rank={self.q_lora_rank} is only meaningful with MLA (set kv_lora_rank, ...)")
        return self

    @model_validator(mode="after")
    def _check_full_attention_layers(self) -> "ModelShape":
        bad = [i for i in self.full_attention_layers if not 0 <= i < self.num_hidden_layers]
        if bad:
            raise ValueError(f"full_attention_layers={bad} outside 0..num_hidden_layers-1={self.num_hidden_layers - 1}")
        if self.full_attention_layers and self.sliding_window is None:
            raise ValueError(f"full_attention_layers={list(self.full_attention_layers)} needs a sliding_window (the "
                             "layers it leaves at full attention)")
        return self

    @model_validator(mode="after")
    def _check_moe_fields(self) -> "ModelShape":
        if self.is_moe:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ValueError(
                    f"num_experts_per_tok={self.num_experts_per_tok} must be in 1..num_experts={self.num_experts}"
                )
        elif self.num_experts_per_tok or self.num_shared_experts or self.shared_expert_intermediate_size:
            raise ValueError(
                "num_experts_per_tok / num_shared_experts / shared_expert_intermediate_size need num_experts > 0"
            )
        bad = [i for i in self.mlp_only_layers if not 0 <= i < self.num_hidden_layers]
        if bad:
            raise ValueError(f"mlp_only_layers={bad} outside 0..num_hidden_layers-1={self.num_hidden_layers - 1}")
        return self


class RopeScaling(BaseModel):
    """A config's rope_scaling: the rope type and its numbers (HF names)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    rope_type: str
    """linear | dynamic | yarn | longrope | llama3 (transformers modeling_rope_utils.ROPE_INIT_FUNCTIONS)."""
    factor: Optional[float] = None
    """The scaling factor (context extension ratio)."""
    params: tuple[tuple[str, Any], ...] = ()
    """The other keys (low_freq_factor, original_max_position_embeddings, beta_fast, mscale, ...), sorted."""

    def param(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)


ROPE_TYPES = ("linear", "dynamic", "yarn", "longrope", "llama3", "proportional")
"""The rope types transformers builds (modeling_rope_utils.ROPE_INIT_FUNCTIONS, transformers 5.x; "default" means
none); any other raises KeyError when the model is built."""


def rope_scaling_of(value: Any, key: str = "rope_scaling") -> Optional[RopeScaling]:
    """A config's rope_scaling / rope_parameters mapping as a RopeScaling, None when absent or "default".

    Raises:
        ValueError: not a mapping, or a rope type transformers does not build (naming the key and the value)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"{key}={value!r} is not a mapping (give e.g. {{\"rope_type\": \"llama3\", \"factor\": 8.0, ...}})")
    which = "rope_type" if "rope_type" in value else "type"
    kind = value.get(which, "default")
    if kind in (None, "default"):
        return None
    if kind not in ROPE_TYPES:
        raise ValueError(f"{key}.{which}={kind!r} is not a rope type transformers builds (one of "
                         f"{', '.join(ROPE_TYPES)}, or default)")
    factor = value.get("factor")
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0):
        raise ValueError(f"{key}.factor={factor!r} is not a positive number")
    rest = tuple(sorted((k, v) for k, v in value.items()
                        if k not in ("rope_type", "type", "factor", "rope_theta")
                        and isinstance(v, (int, float, str, bool, type(None)))))
    return RopeScaling(rope_type=str(kind), factor=None if factor is None else float(factor), params=rest)


def position_table_problem(shape: ModelShape, seq_len: int, field: str) -> Optional[str]:
    """Why `seq_len` tokens do not fit the model's learned position table (GPT-2 n_positions, OPT
    max_position_embeddings), naming `field`; None when they fit or the model has no table.

    A learned table has one row per position: transformers indexes it with the token's position, so a longer
    sequence fails at the first forward (IndexError in nn.Embedding), and a Megatron --max-position-embeddings
    above it trains a different (bigger) table. RoPE, ALiBi and NoPE models have no table: a seq_len past their
    max_position_embeddings runs (the positions were not trained that far, which is what long-context
    fine-tuning does), so it is not refused."""
    limit = shape.max_position_embeddings
    if not shape.learned_positions or limit is None or seq_len <= limit:
        return None
    return (f"{field}={seq_len} is longer than the learned position table of {shape.name!r} "
            f"({limit} positions: max_position_embeddings / n_positions); the model cannot run past it "
            f"(transformers fails at the first forward): set {field} to {limit} or less")


ATTENTION_DROPOUT_KEYS = ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob")
"""The config keys transformers' families name the attention dropout by (Llama-style, GPT-2, BERT-style)."""
DROPOUT_FIX = "give a probability in [0, 1), e.g. 0.0 (no dropout) or 0.1"
"""What to give instead of a dropout value dropout_probability refuses."""


def dropout_probability(value: Any) -> float:
    """A config's dropout value as a probability; ValueError naming the problem unless it is a number in [0, 1)
    (torch.nn.Dropout refuses anything else when the model is built for training). The one check of both model
    readers: a config mapping (models.hf_families) and a transformers config object (models.from_transformers);
    ModelShape.attention_dropout holds the same range."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{value!r} is not a number")
    try:
        f = float(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a number") from None
    if not 0.0 <= f < 1.0:
        raise ValueError(f"{f} is not a probability in [0, 1)")
    return f


ModelShape.model_rebuild()

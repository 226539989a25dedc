"""Parameter counts measured on a transformers module tree, by layer and role (no torch import).

`dstoolkit.models.from_transformers` builds a model on the meta device and fills a `MeasuredParams`;
this module only holds the result, so that the core (estimate, generate, sweep, tune, fp8 plan) can use it
without importing torch. Roles are the ones memory is sharded by:

- embedding: token (and learned position) tables; sharded over TP (vocab) and held by the first PP stage.
- lm_head: the untied output projection (0 when tied: a tied matrix is counted once, as the embedding).
- attention: the token mixer of a layer — softmax attention, linear attention (gated delta net), or a
  Mamba/SSM mixer — with its internal norms (q/k norms, MLA latent norms) and biases. `LayerParams.mixer`
  says which one.
- dense_mlp: a dense FFN (all layers of a dense model; dense layers and dense side-FFNs of MoE models).
- routed_experts: every routed expert of the layer; sharded over EP (num_experts / ep per rank).
- shared_experts: always-active experts (and their gates).
- router: expert-choice gates (and their biases / scales). Not TP-sharded.
- norms: per-layer and final norms outside the mixer. Not TP-sharded.
- other: anything else a layer holds (learned scalars, per-layer embeddings projections); replicated.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from pydantic import BaseModel, ConfigDict

ROLES = ("embedding", "lm_head", "attention", "dense_mlp", "routed_experts", "shared_experts", "router", "norms",
         "other")
"""Every role a parameter is assigned to (each parameter has exactly one)."""

TP_SPLIT_ROLES = frozenset({"embedding", "lm_head", "attention", "dense_mlp", "routed_experts", "shared_experts"})
"""Roles whose matrices Megatron-style tensor parallelism shards (norms, routers and scalars are replicated)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class ScanFacts(_Frozen):
    """Widths of a layer's chunked token-mixing scan (or the DSA indexer), as the built module holds them
    (FLOPs: `dstoolkit.models.flop_count`)."""

    kind: str
    """gated_delta (Qwen3-Next / Qwen3.5 linear attention) | mamba2_ssd (Mamba-2 mixers) | dsa_indexer
    (DeepSeek-V3.2 lightning indexer of an indexed_attention layer)."""
    heads: int
    """Heads the scan runs over: value heads (gated delta), Mamba heads, indexer heads."""
    key_dim: int
    """Per-head key width (gated delta), SSM state size N (Mamba-2), indexer head width D_I."""
    value_dim: int = 0
    """Per-head value width (gated delta), head_dim P (Mamba-2); 0 for the indexer."""
    chunk: int = 0
    """Chunk length of the chunked scan (0: none, the indexer)."""


class LayerParams(_Frozen):
    """Parameters of one decoder layer, by role."""

    index: int
    """Layer number (0-based)."""
    mixer: str = "attention"
    """Token mixer: attention | linear_attention | mamba | none (an MLP-only layer of a hybrid model)."""
    attention: int = 0
    dense_mlp: int = 0
    routed_experts: int = 0
    shared_experts: int = 0
    router: int = 0
    norms: int = 0
    other: int = 0
    num_experts: int = 0
    """Routed experts in this layer (0: dense layer)."""
    experts_per_tok: int = 0
    """Top-k routed experts a token activates in this layer."""
    attention_width: Optional[int] = None
    """Query heads x per-head q.k width of this layer's softmax attention (what the quadratic FLOPs term
    scales with); None: the shape's num_attention_heads x head size (or no softmax attention: see mixer)."""
    attention_window: Optional[int] = None
    """Keys one query may attend to at most: the sliding window (sliding_attention layers), the chunk
    (chunked_attention) or the selected top-k keys (indexed_attention); None: every key (full attention)."""
    attention_kind: str = "full_attention"
    """The layer type as the config names it (layer_types): full_attention, sliding_attention, ..."""
    scan: Optional[ScanFacts] = None
    """The layer's chunked scan or indexer (token-mixing FLOPs outside 6N and 12·H·Q·T); None: none."""

    @property
    def total(self) -> int:
        return (self.attention + self.dense_mlp + self.routed_experts + self.shared_experts + self.router
                + self.norms + self.other)

    @property
    def expert_params_each(self) -> int:
        return self.routed_experts // self.num_experts if self.num_experts else 0

    @property
    def active(self) -> int:
        """What one token touches: everything but the routed experts it is not sent to."""
        return self.total - self.routed_experts + self.experts_per_tok * self.expert_params_each

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


ROW_PARALLEL_NAMES = frozenset({"o_proj", "out_proj", "down_proj", "dense", "c_proj", "fc2", "w2", "wo",
                                "dense_4h_to_h", "proj_out", "output_proj"})
"""Projections that read the attention/FFN inner width and write the residual stream: Megatron's row-parallel
layers (TP splits their K); every other linear inside a layer is column-parallel (TP splits N)."""


class LinearGroup(_Frozen):
    """Linear layers of one name pattern and shape in a built model (nn.Linear, or a fused expert tensor)."""

    pattern: str
    """Module path with the layer index written `{i}`, e.g. `model.layers.{i}.self_attn.q_proj`."""
    in_features: int
    """K of the GEMM (per expert for fused experts)."""
    out_features: int
    """N of the GEMM (per expert for fused experts)."""
    layers: tuple[int, ...] = ()
    """Decoder-layer indices holding one; empty for a module outside the layers (lm_head)."""
    fused_experts: int = 0
    """Experts stacked in one 3-D parameter (0: a plain nn.Linear); the GEMM runs per expert."""
    role: str = "other"
    """attention | dense_mlp | routed_experts | shared_experts | router | lm_head | other (as `ROLES`)."""

    @property
    def count(self) -> int:
        """Modules in the group (1 for a module outside the layers)."""
        return max(1, len(self.layers))

    @property
    def tp_split(self) -> str:
        """How Megatron-style TP shards it: row (K split: projections back to the residual stream), column
        (N split: every other linear of a layer, and the vocab of the LM head) or none (routers)."""
        if self.role == "router":
            return "none"
        if self.role != "lm_head" and self.pattern.rsplit(".", 1)[-1] in ROW_PARALLEL_NAMES:
            return "row"
        return "column"


class TracedFlops(_Frozen):
    """Training FLOPs per token measured on the model itself (no formula exists for it: a user's module).

    Traced forward + backward under `torch.utils.flop_counter` (on the meta device where the module allows)
    at two sequence lengths; FLOPs per token are affine in T (matmuls per token are constant, softmax
    attention adds a term proportional to T), so two points give both coefficients.
    """

    per_token: float
    """Training FLOPs per token that do not depend on the sequence length (the matmuls: ~6N)."""
    per_token_per_seq: float
    """Training FLOPs per token per token of context (quadratic attention: ~12·L·H·Q)."""
    forward_fraction: float = 1 / 3
    """Forward share of the training FLOPs (what one recompute adds)."""
    seq_lens: tuple[int, int]
    """The two sequence lengths traced."""
    device: str = "meta"
    """meta (shapes only, no memory) or cpu (real tensors: the module did not run on meta)."""

    def at(self, seq_len: int) -> float:
        """Training FLOPs per token at `seq_len`."""
        return self.per_token + self.per_token_per_seq * seq_len


class ArchFacts(_Frozen):
    """What a built model's blocks are made of, beyond its widths: read from the modules themselves
    (`dstoolkit.models.block_facts.block_facts`), so a launcher for another framework (Megatron) can say the same
    model or refuse it, naming the property."""

    norm: str = "rmsnorm"
    """rmsnorm (weight only) | layernorm (weight and bias) | layernorm_no_bias (LayerNorm(bias=False)) |
    layernorm_no_params (neither weight nor bias: OLMo-1's OlmoLayerNorm) | the norm module's class name otherwise."""
    norm_one_plus_weight: bool = False
    """The norm scales by (1 + weight) (Gemma's RMSNorm), not by weight."""
    qkv_bias: bool = False
    """Biases on the q/k/v projections (or the fused query_key_value)."""
    o_bias: bool = False
    """Bias on the attention output projection (o_proj, dense, c_proj, out_proj)."""
    mlp_bias: bool = False
    """Biases on the dense FFN projections."""
    lm_head_bias: bool = False
    """The output head has a bias (Phi-2)."""
    mlp_gated: Optional[bool] = None
    """The dense FFN's first projection is gated (gate and up: 3 matrices, or one fused gate_up twice the width of
    the down projection's input); None: no dense FFN to look at (every layer routed)."""
    mlp_width: Optional[int] = None
    """Input width of the dense FFN's down projection (the FFN width); None as for mlp_gated."""
    activation: Optional[str] = None
    """The FFN activation as transformers names it (ACT2CLS key), or the activation module's class name."""
    positions: str = "rope"
    """rope | learned (a position-embedding table) | alibi | none."""
    rotary_dim: Optional[int] = None
    """Channels of each head the rotary embedding turns (2 x its inv_freq length); None: no rotary module."""
    parallel_residual: bool = False
    """Attention and MLP read the same block input and add into one residual (GPT-NeoX use_parallel_residual,
    Falcon parallel_attn, Phi): a block with one norm before both, or the config's flag."""
    embedding_norm: bool = False
    """A norm right after the token embedding (BLOOM word_embeddings_layernorm)."""
    qk_norm: Optional[str] = None
    """Norms on the queries and keys inside attention (children of the attention module named q*/k* norm):
    "head" when each spans one head's width (Qwen3), "projection" when they span the whole q / k projection
    (OLMo-2, OLMoE); None: none."""
    output_norm: bool = False
    """A norm on the attention or MLP output before its residual add (OLMo-2's post-norm, Gemma-2/3's and GLM-4's
    sandwich), read from the decoder layer's forward (`block_facts.sublayer_output_norm`)."""
    shared_expert_gate: bool = False
    """The shared expert's output is scaled by a learned sigmoid gate (Qwen2-MoE shared_expert_gate, a
    1-output linear among the shared-expert parameters)."""
    router_score_bias: bool = False
    """A layer's router holds a per-expert score-correction bias (e_score_correction_bias, a buffer in transformers
    5: DeepSeek-V3's auxiliary-loss-free balancing), added to the scores before the top-k."""


class MeasuredParams(_Frozen):
    """Exact parameter counts of a model that transformers built on the meta device."""

    model_class: str
    """The transformers class that was built (GptOssForCausalLM, Gemma4ForCausalLM, ...), or the user's
    module reference (mypkg.models:build)."""
    transformers_version: Optional[str] = None
    """None for a user module (built by its own code, not by transformers)."""
    embedding: int
    lm_head: int
    final_norms: int
    """Norms outside the layers (final norm)."""
    other: int = 0
    """Parameters outside the layers that are neither embedding, head nor norm."""
    layers: tuple[LayerParams, ...]
    buffers_not_counted: int = 0
    """Non-rotary buffers transformers registers (e.g. DeepSeek-V3's e_score_correction_bias): not parameters."""
    vision_params: int = 0
    """Vision/audio towers and projectors of a multimodal checkpoint: in `total` and the layout (they hold
    weights, gradients and optimizer states: transformers builds them trainable and HF Trainer optimizes every
    parameter that requires grad), not in `active` (a text token does not pass through them), outside the layers."""
    vision_blocks: tuple[int, ...] = ()
    """`vision_params` per tower block in registration order (`from_transformers.tower_blocks`); () when not
    read (the layout then holds the towers as one entry)."""
    notes: tuple[str, ...] = ()
    """What the count did with the config (text_config used, quantization_config ignored, ...)."""
    linears: tuple["LinearGroup", ...] = ()
    """The matmul weights of the built model, grouped by name pattern (`linear_layers()`): what FP8 and TP
    planners swap or shard. Empty when the build was not walked for them."""
    arch: Optional[ArchFacts] = None
    """What the blocks are made of (norm, biases, positions, residual wiring); None when not read (a user's
    module)."""
    tp_plan: tuple[tuple[str, str], ...] = ()
    """The built model's Hugging Face tensor-parallel plan, (pattern, style) pairs merged as a trainer reads them
    (`models.tp_plan.merged_tp_plan`); () for a user's module."""

    def linear_layers(self) -> tuple["LinearGroup", ...]:
        """The model's own linear layers (language model only), one group per (name pattern, shape)."""
        return self.linears

    def _sum(self, role: str) -> int:
        return sum(getattr(layer, role) for layer in self.layers)

    @property
    def attention(self) -> int:
        return self._sum("attention")

    @property
    def dense_mlp(self) -> int:
        return self._sum("dense_mlp")

    @property
    def routed_experts(self) -> int:
        return self._sum("routed_experts")

    @property
    def shared_experts(self) -> int:
        return self._sum("shared_experts")

    @property
    def router(self) -> int:
        return self._sum("router")

    @property
    def norms(self) -> int:
        return self._sum("norms") + self.final_norms

    @property
    def layer_other(self) -> int:
        return self._sum("other") + self.other

    @property
    def total(self) -> int:
        return (self.embedding + self.lm_head + self.final_norms + self.other + self.vision_params
                + sum(l.total for l in self.layers))

    @property
    def active(self) -> int:
        return self.embedding + self.lm_head + self.final_norms + self.other + sum(l.active for l in self.layers)

    @property
    def num_moe_layers(self) -> int:
        return sum(l.is_moe for l in self.layers)

    def by_role(self) -> dict[str, int]:
        """Whole-model count of every role in `ROLES`."""
        return {"embedding": self.embedding, "lm_head": self.lm_head, "attention": self.attention,
                "dense_mlp": self.dense_mlp, "routed_experts": self.routed_experts,
                "shared_experts": self.shared_experts, "router": self.router, "norms": self.norms,
                "other": self.layer_other}


TOKEN_EMBEDDING_NAME = "embed_tokens.weight"
"""The token embedding's name in both layouts (the one tensor a tied LM head shares)."""


@dataclass(frozen=True)
class ParamEntry:
    """One parameter tensor (or, from a measured model, one block of them) in module registration order.

    The estimator's parameter layout (`dstoolkit.estimate.layout.param_layout`, from a shape) and the measured one
    (`measured_layout`) are lists of these. Names follow the estimator's convention
    (`blocks.<i>.mlp.experts.<e>.weight` for routed expert e) so that expert-parallel sharding picks the local
    experts by index.
    """

    name: str
    """Module path, HF style (blocks.3.self_attn.q_proj.weight)."""
    numel: int
    """Elements."""
    kind: str
    """embedding | lm_head | attention | dense_mlp | expert | shared_expert | router | norm | other | tower
    (a multimodal model's vision/audio towers and projectors)."""
    layer: int
    """Block index, -1 for embedding / final norm / lm_head."""
    tp_split: bool
    """True for matrices Megatron shards over TP (attention, MLP, vocab); False for norms and the router."""

    @property
    def is_expert(self) -> bool:
        return self.kind == "expert"


_KIND = {"attention": "attention", "dense_mlp": "dense_mlp", "shared_experts": "shared_expert",
         "router": "router", "norms": "norm", "other": "other"}


@lru_cache(maxsize=64)
def measured_layout(measured: MeasuredParams) -> tuple[ParamEntry, ...]:
    """The measured counts as an ordered parameter layout (vision/audio towers, embedding, layers, final norm,
    lm_head).

    One entry per (layer, role), and one per routed expert, in module registration order as far as DeepSpeed's
    partitioning cares (a layer's parameters stay together). A multimodal model's towers and projectors are entries
    of kind "tower" (layer -1, not TP-split), one per tower block (`vision_blocks`), first as transformers
    registers them (Qwen3-VL `visual`, LLaVA `vision_tower`). The sum of numel equals `measured.total`.
    """
    out: list[ParamEntry] = [ParamEntry(f"vision_tower.{i}.weight", n, "tower", -1, False)
                             for i, n in enumerate(measured.vision_blocks or
                                                   ((measured.vision_params,) if measured.vision_params else ()))]
    out.append(ParamEntry(TOKEN_EMBEDDING_NAME, measured.embedding, "embedding", -1, True))
    if measured.other:
        out.append(ParamEntry("other.weight", measured.other, "other", -1, False))
    for layer in measured.layers:
        i = layer.index
        for role in ("norms", "attention", "router", "dense_mlp", "shared_experts", "other"):
            n = getattr(layer, role)
            if n:
                out.append(ParamEntry(f"blocks.{i}.{role}.weight", n, _KIND[role], i, role in TP_SPLIT_ROLES))
        each = layer.expert_params_each
        for e in range(layer.num_experts):
            out.append(ParamEntry(f"blocks.{i}.mlp.experts.{e}.weight", each, "expert", i, True))
    out.append(ParamEntry("norm.weight", measured.final_norms, "norm", -1, False))
    if measured.lm_head:
        out.append(ParamEntry("lm_head.weight", measured.lm_head, "lm_head", -1, True))
    return tuple(out)


def layer_summary(measured: Optional[MeasuredParams]) -> str:
    """One line: how many layers of each mixer kind and how many MoE layers (for CLI output)."""
    if measured is None:
        return ""
    kinds: dict[str, int] = {}
    for layer in measured.layers:
        kinds[layer.mixer] = kinds.get(layer.mixer, 0) + 1
    mixers = ", ".join(f"{n} {k}" for k, n in kinds.items())
    moe = measured.num_moe_layers
    return f"{len(measured.layers)} layers ({mixers}); {moe} MoE layers" if moe else f"{len(measured.layers)} layers ({mixers})"

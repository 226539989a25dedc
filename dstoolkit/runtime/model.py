"""A tiny decoder-only transformer for real DeepSpeed runs (the one torch module under `dstoolkit.models`).

It is built from a `ModelShape`, so the parameter count of a llama-style dense or Mixtral-style MoE shape
equals `dstoolkit.models.count_params(shape).total` (Hugging Face module layout: embed_tokens, per block
input_layernorm / q,k,v,o_proj / post_attention_layernorm / gate,up,down_proj, final norm, lm_head).

MoE blocks use DeepSpeed's native `deepspeed.moe.layer.MoE`; with `ep_size > 1` each rank holds
`num_experts // ep_size` experts, and DeepSpeed needs `deepspeed.init_distributed` before the engine
creates the expert groups. Pass `moe_param_groups(model)` to `deepspeed.initialize` as model_parameters.

Initialisation is deterministic per parameter *name* (CRC32 of the name mixed with the seed), and expert
weights are keyed by their *global* expert index, so the model a rank builds does not depend on
construction order, and the experts of an ep=2 run are exactly those of the ep=1 model.

Its training data: `dstoolkit.runtime.synthetic`; a transformers model of a config's own architecture:
`dstoolkit.runtime.hf_model`.
"""
from __future__ import annotations

import zlib
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dstoolkit.models.shape import ModelShape
from dstoolkit.spec.checkpoint import CheckpointPolicy

INIT_STD = 0.02
"""Std of the normal init of linear and embedding weights (GPT-2 / Llama `initializer_range`)."""
ROPE_THETA = 10000.0
"""RoPE base frequency (Su et al. 2021; Llama-2 default)."""
RMS_NORM_EPS = 1e-5
"""RMSNorm epsilon (Llama default)."""
MOE_AUX_LOSS_COEF = 0.01
"""Weight of the load-balancing loss added to the LM loss (Switch Transformer §2.2 uses 1e-2)."""
MOE_CAPACITY_FACTOR = 2.0
"""DeepSpeed TopKGate capacity factor; 2.0 keeps token drops rare on tiny batches."""


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned scale (Zhang & Sennrich 2019)."""

    def __init__(self, hidden_size: int, eps: float = RMS_NORM_EPS) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


def make_norm(width: int, shape: ModelShape) -> nn.Module:
    """RMSNorm (weight) or LayerNorm (weight + bias), as the shape's norm_type says."""
    if shape.norm_type == "layernorm":
        return nn.LayerNorm(width, eps=RMS_NORM_EPS)
    return RMSNorm(width)


def _rope(x: Tensor) -> Tensor:
    """Rotary position embedding on (batch, heads, seq, head_dim), half-split convention (GPT-NeoX / HF Llama)."""
    seq, dim = x.shape[-2], x.shape[-1]
    half = dim // 2
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, half, dtype=torch.float32, device=x.device) / half))
    angles = torch.arange(seq, dtype=torch.float32, device=x.device)[:, None] * inv_freq[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos + rotated * sin


def _attention_core(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal scaled-dot-product attention; GQA by repeating KV heads (works on every SDPA backend)."""
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Attention(nn.Module):
    """Causal self-attention with GQA and RoPE (q/k/v biases when the shape says so, o_proj without)."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        h, d = shape.hidden_size, shape.head_size
        self.n_heads, self.n_kv, self.head_dim = shape.num_attention_heads, shape.kv_heads, d
        if self.n_heads % self.n_kv != 0:
            raise ValueError(
                f"num_attention_heads={self.n_heads} must be a multiple of num_key_value_heads={self.n_kv}"
            )
        self.q_proj = nn.Linear(h, self.n_heads * d, bias=shape.attention_bias)
        self.k_proj = nn.Linear(h, self.n_kv * d, bias=shape.attention_bias)
        self.v_proj = nn.Linear(h, self.n_kv * d, bias=shape.attention_bias)
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=shape.o_proj_bias)
        self.q_norm: Optional[nn.Module] = None
        self.k_norm: Optional[nn.Module] = None
        if shape.qk_norm:  # Qwen3: per-head norm over head_dim on q and k, before RoPE
            self.q_norm = make_norm(d, shape)
            self.k_norm = make_norm(d, shape)
        self.recompute_core = False
        """Selective recompute (Korthikanti §4.2): recompute the attention core in backward."""

    def forward(self, x: Tensor) -> Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = _rope(q), _rope(k)
        if self.recompute_core and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint

            out = checkpoint(_attention_core, q, k, v, use_reentrant=False)
        else:
            out = _attention_core(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.n_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU FFN (gate, up, down; Shazeer 2020) or a plain GELU up/down FFN when `gated` is False."""

    def __init__(self, hidden_size: int, intermediate_size: int, gated: bool = True, bias: bool = False) -> None:
        super().__init__()
        self.gated = gated
        if gated:
            self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        if self.gated:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(F.gelu(self.up_proj(x)))


class MoEFFN(nn.Module):
    """DeepSpeed native MoE over SwiGLU experts, plus optional shared experts (DeepSeek / Qwen-MoE)."""

    def __init__(self, shape: ModelShape, ep_size: int) -> None:
        super().__init__()
        from deepspeed.moe.layer import MoE  # heavy import only when a MoE shape is built

        if shape.num_experts % ep_size != 0:
            raise ValueError(
                f"ep_size={ep_size} must divide num_experts={shape.num_experts}; pick a divisor of the expert count"
            )
        if shape.num_experts_per_tok not in (1, 2):
            raise NotImplementedError(
                f"num_experts_per_tok={shape.num_experts_per_tok}: deepspeed.moe.layer.MoE supports top-1/top-2 only"
            )
        expert = MLP(shape.hidden_size, shape.expert_ffn_size, shape.mlp_gated)
        self.moe = MoE(
            shape.hidden_size,
            expert=expert,
            num_experts=shape.num_experts,
            ep_size=ep_size,
            k=shape.num_experts_per_tok,
            capacity_factor=MOE_CAPACITY_FACTOR,
            eval_capacity_factor=MOE_CAPACITY_FACTOR,
            # No random token selection / 2nd-expert sampling: keeps the routing a pure function of the input.
            use_rts=False,
            top2_2nd_expert_sampling=False,
        )
        self.shared_expert: Optional[MLP] = None
        self.shared_expert_gate: Optional[nn.Linear] = None
        if shape.num_shared_experts > 0:  # DeepSeek: n_shared experts of moe_intermediate_size, one fused MLP
            self.shared_expert = MLP(
                shape.hidden_size, shape.num_shared_experts * shape.expert_ffn_size, shape.mlp_gated
            )
        elif shape.shared_expert_intermediate_size:  # Qwen2-MoE: one shared expert with a sigmoid gate
            self.shared_expert = MLP(shape.hidden_size, shape.shared_expert_intermediate_size, shape.mlp_gated)
            self.shared_expert_gate = nn.Linear(shape.hidden_size, 1, bias=False)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        out, aux, _counts = self.moe(x)
        if self.shared_expert is not None:
            shared = self.shared_expert(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out, aux


class Block(nn.Module):
    """Pre-norm transformer block; returns (hidden, moe_aux_loss)."""

    def __init__(self, shape: ModelShape, layer_index: int, ep_size: int) -> None:
        super().__init__()
        self.input_layernorm = make_norm(shape.hidden_size, shape)
        self.self_attn = Attention(shape)
        self.post_attention_layernorm = make_norm(shape.hidden_size, shape)
        self.is_moe = shape.is_moe_layer(layer_index)
        if self.is_moe:
            self.mlp: nn.Module = MoEFFN(shape, ep_size)
        else:
            self.mlp = MLP(shape.hidden_size, shape.intermediate_size, shape.mlp_gated, shape.mlp_bias)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        x = x + self.self_attn(self.input_layernorm(x))
        y = self.post_attention_layernorm(x)
        if self.is_moe:
            y, aux = self.mlp(y)
            aux = aux.float()
        else:
            y, aux = self.mlp(y), x.new_zeros((), dtype=torch.float32)
        return x + y, aux


class TinyTransformer(nn.Module):
    """Decoder-only LM built from a ModelShape; `forward(input_ids, labels)` returns the scalar training loss."""

    def __init__(self, shape: ModelShape, *, ep_size: int = 1) -> None:
        super().__init__()
        if shape.is_mla:
            raise NotImplementedError(
                f"model {shape.name!r} uses multi-head latent attention (kv_lora_rank={shape.kv_lora_rank}); "
                "the torch model implements standard GQA attention only. Use a llama/mixtral-style shape for real runs."
            )
        if shape.learned_positions:
            raise NotImplementedError(
                f"model {shape.name!r} has learned position embeddings (GPT-2 style); the torch model uses RoPE only."
            )
        if shape.is_moe and shape.router_score_correction_bias:
            raise NotImplementedError(
                f"model {shape.name!r} uses DeepSeek-V3 noaux_tc routing (e_score_correction_bias); "
                "deepspeed.moe's TopKGate has no such bias"
            )
        self.shape = shape
        self.ep_size = ep_size
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.blocks = nn.ModuleList([Block(shape, i, ep_size) for i in range(shape.num_hidden_layers)])
        self.norm = make_norm(shape.hidden_size, shape)
        self.lm_head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        if shape.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.checkpointed = [False] * shape.num_hidden_layers
        """Per block: recompute the whole block in backward (set by `apply_checkpoint_policy`)."""
        self.checkpoint_fn = None
        """Callable(fn, *args) used for checkpointed blocks; None means torch.utils.checkpoint (non-reentrant)."""

    def _run_block(self, i: int, block: nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
        if self.checkpointed[i]:
            from dstoolkit.runtime.train.checkpointing import recompute_call

            return recompute_call(self.checkpoint_fn, block, x)
        return block(x)

    def forward(self, input_ids: Tensor, labels: Tensor) -> Tensor:
        x = self.embed_tokens(input_ids)
        aux_total = x.new_zeros((), dtype=torch.float32)
        for i, block in enumerate(self.blocks):
            x, aux = self._run_block(i, block, x)
            aux_total = aux_total + aux.float()
        logits = self.lm_head(self.norm(x))
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))
        if self.shape.is_moe:
            loss = loss + MOE_AUX_LOSS_COEF * aux_total
        return loss


def _name_seed(seed: int, name: str) -> int:
    return (zlib.crc32(name.encode()) ^ (seed * 0x9E3779B1)) & 0x7FFFFFFF


def _expert_rank() -> int:
    """This rank's index inside its expert-parallel group (DeepSpeed groups consecutive ranks: rank % ep)."""
    try:
        import torch.distributed as tdist

        if tdist.is_available() and tdist.is_initialized():
            return tdist.get_rank()
    except Exception:  # pragma: no cover - torch built without distributed
        pass
    return 0


def _global_name(name: str, ep_rank: int, num_local: int) -> str:
    """Rewrite a local expert index in a parameter name to its global index (experts.deepspeed_experts.<j>)."""
    marker = "deepspeed_experts."
    if marker not in name or num_local <= 0:
        return name
    head, tail = name.split(marker, 1)
    local, rest = tail.split(".", 1)
    return f"{head}{marker}{ep_rank * num_local + int(local)}.{rest}"


def _init_weights(model: TinyTransformer, seed: int, ep_size: int) -> None:
    ep_rank = _expert_rank() % ep_size if ep_size > 1 else 0
    num_local = model.shape.num_experts // ep_size if model.shape.is_moe else 0
    seen: set[int] = set()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            if name.endswith(("layernorm.weight", "q_norm.weight", "k_norm.weight")) or name == "norm.weight":
                p.fill_(1.0)
                continue
            if name.endswith(".bias"):
                p.zero_()
                continue
            gen = torch.Generator().manual_seed(_name_seed(seed, _global_name(name, ep_rank, num_local)))
            p.copy_(torch.randn(p.shape, generator=gen) * INIT_STD)


def build_model(
    shape: ModelShape,
    *,
    ep_size: int = 1,
    checkpoint: Optional[CheckpointPolicy] = None,
    seed: int = 0,
) -> TinyTransformer:
    """Build a TinyTransformer for `shape` with deterministic weights.

    Args:
        shape: the architecture (dense llama-style or Mixtral/DeepSeek/Qwen-style MoE; MLA is not supported).
        ep_size: expert-parallel degree; each rank builds num_experts // ep_size experts per MoE layer.
        checkpoint: activation-checkpoint policy applied to `model.blocks` (None = keep all activations).
        seed: weight seed; identical seeds give identical weights on every rank.

    Returns:
        The model in fp32 on CPU (DeepSpeed casts and moves it).

    Raises:
        NotImplementedError: for MLA or learned-position shapes, or top-k > 2 MoE.
        ValueError: when ep_size does not divide num_experts.
    """
    if shape.is_moe and shape.num_experts % ep_size != 0:
        raise ValueError(
            f"ep_size={ep_size} must divide num_experts={shape.num_experts}; pick a divisor of the expert count"
        )
    model = TinyTransformer(shape, ep_size=ep_size)
    _init_weights(model, seed, ep_size)
    if checkpoint is not None:
        from dstoolkit.runtime.train.checkpointing import apply_checkpoint_policy

        apply_checkpoint_policy(model, checkpoint)
    return model


def moe_param_groups(model: nn.Module, weight_decay: float = 0.0) -> list[dict]:
    """Parameter groups with experts split per expert-data-parallel group, as DeepSpeed MoE requires.

    Dense models get a single group. Pass the result as `model_parameters` to `deepspeed.initialize`.
    """
    groups = [{"params": [p for p in model.parameters() if p.requires_grad], "name": "params",
               "weight_decay": weight_decay}]
    if not any(getattr(p, "allreduce", True) is False for p in model.parameters()):
        return groups
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    return split_params_into_different_moe_groups_for_optimizer(groups)

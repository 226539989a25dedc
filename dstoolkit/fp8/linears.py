"""The linear layers one rank holds, with the GEMM each runs per micro batch: which FP8 can swap and what their
inputs cost to save (fp8/plan.py reads them). No torch import.

Where the model was built (a transformers config or the user's module: `shape.measured`), the layers are the
model's own (`MeasuredParams.linear_layers()`: its module names and shapes). Otherwise module names follow
`dstoolkit.runtime.model` (the converter's view of the same model), so for a shape the toolkit can build, the
names equal `convert(...)`'s report exactly.
"""
from __future__ import annotations

from dstoolkit.models.shape import ModelShape


class RankLinear:
    """One linear module on this rank: name, dims, rows per micro-batch and which input tensor it reads."""

    __slots__ = ("name", "kind", "k", "n", "m", "input_key", "other_saver")

    def __init__(self, name, kind, k, n, m, input_key, other_saver=False):
        self.name, self.kind, self.k, self.n, self.m = name, kind, k, n, m
        self.input_key, self.other_saver = input_key, other_saver


def _from_shape(shape: ModelShape, m: int, tp: int, ep: int) -> list[RankLinear]:
    """Linear layers in torch_model order (dims per rank under Megatron-style TP: column split N, row split K)."""
    h, heads, kvh, d = shape.hidden_size, shape.num_attention_heads, shape.kv_heads, shape.head_size
    lins: list[RankLinear] = []
    for i in range(shape.num_hidden_layers):
        p = f"blocks.{i}."
        a = p + "self_attn."
        if shape.is_mla:
            qk = (shape.qk_nope_head_dim or 0) + (shape.qk_rope_head_dim or 0)
            v = shape.v_head_dim or d
            if shape.q_lora_rank:
                lins.append(RankLinear(a + "q_a_proj", "self_attn.q_a_proj", h, shape.q_lora_rank, m, (i, "attn_in")))
                lins.append(RankLinear(a + "q_b_proj", "self_attn.q_b_proj", shape.q_lora_rank, heads * qk // tp, m, (i, "q_lat")))
            else:
                lins.append(RankLinear(a + "q_proj", "self_attn.q_proj", h, heads * qk // tp, m, (i, "attn_in")))
            lins.append(RankLinear(a + "kv_a_proj_with_mqa", "self_attn.kv_a_proj_with_mqa", h,
                             shape.kv_lora_rank + (shape.qk_rope_head_dim or 0), m, (i, "attn_in")))
            lins.append(RankLinear(a + "kv_b_proj", "self_attn.kv_b_proj", shape.kv_lora_rank,
                             heads * ((shape.qk_nope_head_dim or 0) + v) // tp, m, (i, "kv_lat")))
            lins.append(RankLinear(a + "o_proj", "self_attn.o_proj", heads * v // tp, h, m, (i, "attn_out"), True))
        else:
            for nm, out in (("q_proj", heads * d), ("k_proj", kvh * d), ("v_proj", kvh * d)):
                lins.append(RankLinear(a + nm, f"self_attn.{nm}", h, out // tp, m, (i, "attn_in")))
            # The attention kernel saves its own output for backward: o_proj's bf16 input stays alive anyway.
            lins.append(RankLinear(a + "o_proj", "self_attn.o_proj", heads * d // tp, h, m, (i, "attn_out"), True))
        mp = p + "mlp."
        gated = shape.mlp_gated
        if shape.is_moe_layer(i):
            local = shape.num_experts // ep
            ffn = shape.expert_ffn_size
            # Average rows per expert: the ep ranks of an expert-parallel group each route M tokens to top_k of
            # num_experts experts, and the all-to-all brings an expert all of its rows: M * ep * top_k / E.
            me = max(1, m * ep * shape.num_experts_per_tok // shape.num_experts)
            lins.append(RankLinear(mp + "moe.deepspeed_moe.gate.wg", "mlp.moe.deepspeed_moe.gate.wg", h, shape.num_experts,
                             m, (i, "mlp_in")))
            for e in range(local):
                ex = f"{mp}moe.deepspeed_moe.experts.deepspeed_experts.{e}."
                kind = "mlp.moe.deepspeed_moe.experts.deepspeed_experts.{e}."
                if gated:
                    lins.append(RankLinear(ex + "gate_proj", kind + "gate_proj", h, ffn, me, (i, f"x{e}_in")))
                lins.append(RankLinear(ex + "up_proj", kind + "up_proj", h, ffn, me, (i, f"x{e}_in")))
                lins.append(RankLinear(ex + "down_proj", kind + "down_proj", ffn, h, me, (i, f"x{e}_act")))
            sffn = shape.num_shared_experts * ffn if shape.num_shared_experts else shape.shared_expert_intermediate_size
            if sffn:
                sp = mp + "shared_expert."
                if gated:
                    lins.append(RankLinear(sp + "gate_proj", "mlp.shared_expert.gate_proj", h, sffn // tp, m, (i, "mlp_in")))
                lins.append(RankLinear(sp + "up_proj", "mlp.shared_expert.up_proj", h, sffn // tp, m, (i, "mlp_in")))
                lins.append(RankLinear(sp + "down_proj", "mlp.shared_expert.down_proj", sffn // tp, h, m, (i, "sh_act")))
                if shape.shared_expert_intermediate_size and not shape.num_shared_experts:
                    lins.append(RankLinear(mp + "shared_expert_gate", "mlp.shared_expert_gate", h, 1, m, (i, "mlp_in")))
        else:
            ffn = shape.intermediate_size
            if gated:
                lins.append(RankLinear(mp + "gate_proj", "mlp.gate_proj", h, ffn // tp, m, (i, "mlp_in")))
            lins.append(RankLinear(mp + "up_proj", "mlp.up_proj", h, ffn // tp, m, (i, "mlp_in")))
            lins.append(RankLinear(mp + "down_proj", "mlp.down_proj", ffn // tp, h, m, (i, "mlp_act")))
    lins.append(RankLinear("lm_head", "lm_head", h, shape.vocab_size // tp, m, ("head", "final")))
    return lins


def _from_model(shape: ModelShape, m: int, tp: int, ep: int) -> list[RankLinear]:
    """Linear layers of the model as built (`shape.measured.linear_layers()`: transformers or the user's
    module), in layer order, with their own module names. Dims per rank under Megatron-style TP (column
    layers split N, row layers split K, routers and routed experts whole); a fused expert tensor becomes one
    GEMM per local expert (`<name>.{e}`), fed M * ep * top_k / E rows on average."""
    measured = shape.measured
    by_layer = {l.index: l for l in measured.layers}
    lins: list[RankLinear] = []
    per_layer: dict[int, list] = {}
    outside: list = []
    for g in measured.linear_layers():
        for i in g.layers or ():
            per_layer.setdefault(i, []).append(g)
        if not g.layers:
            outside.append(g)

    def one(name: str, kind: str, g, i, rows: int) -> RankLinear:
        k, n = g.in_features, g.out_features
        if g.role == "routed_experts":
            pass  # experts are sharded over EP, whole per rank (as `_from_shape`: DeepSpeed MoE)
        elif g.tp_split == "row":
            k //= tp
        elif g.tp_split == "column":
            n //= tp
        parent = name.rsplit(".", 1)[0]
        row = g.tp_split == "row"
        # Column layers reading one tensor (q/k/v, gate/up) share one saved input; a row layer reads its own.
        key = (i, name if row else f"{parent}:{g.in_features}")
        return RankLinear(name, kind, k, n, rows, key, other_saver=row and g.role == "attention")

    for i in sorted(per_layer):
        layer = by_layer.get(i)
        for g in per_layer[i]:
            name = g.pattern.replace("{i}", str(i))
            kind = g.pattern
            if g.fused_experts:
                e_all = g.fused_experts
                topk = layer.experts_per_tok if layer is not None and layer.experts_per_tok else 1
                me = max(1, m * ep * topk // e_all)
                for e in range(e_all // ep):
                    lins.append(one(f"{name}.{e}", kind + ".{e}", g, i, me))
            else:
                lins.append(one(name, kind, g, i, m))
    for g in outside:
        lins.append(one(g.pattern, g.pattern, g, "head", m))
    return lins


def from_built_model(shape: ModelShape) -> bool:
    """Whether the linear layers come from the model as built (`shape.measured`) rather than from the shape."""
    return shape.measured is not None and bool(shape.measured.linear_layers())


def rank_linears(shape: ModelShape, m: int, tp: int, ep: int) -> list[RankLinear]:
    """Every linear layer on one rank, fed `m` rows (tokens) per micro batch, under TP `tp` and EP `ep`: the model's
    own where it was built (from_built_model), else the toolkit's module tree for the shape."""
    return _from_model(shape, m, tp, ep) if from_built_model(shape) else _from_shape(shape, m, tp, ep)

"""Training FLOPs per token and per step, and MFU (docs/anchors.md, "FLOPs and MFU"). No torch import."""
from __future__ import annotations

from dataclasses import dataclass

from dstoolkit.estimate.layout import param_totals
from dstoolkit.models.flop_count import dsa_indexer_score_flops, gated_delta_chunk_flops, mamba2_ssd_chunk_flops
from dstoolkit.runplan import RunPlan
from dstoolkit.models.shape import ModelShape

TRAIN_FLOPS_PER_PARAM = 6
"""Kaplan et al. 2020: forward 2N + backward 4N FLOPs per token per matmul parameter."""
FORWARD_FLOPS_PER_PARAM = 2
"""One multiply-accumulate per parameter per token in the forward pass."""
ATTENTION_TRAIN_COEFF = 12
"""PaLM App. B: attention adds 12·L·H·Q·T training FLOPs per token (fwd 4·L·H·Q·T: QK^T and AV, 2 each)."""
ATTENTION_FORWARD_COEFF = 4
"""Forward-only share of the attention term (1/3 of 12)."""
SCAN_TRAIN_PER_FORWARD = 3
"""A chunked scan's matmuls (and triangular solves) cost their forward FLOPs again twice in backward (one
product per input gradient), as for every matmul here (Kaplan et al. 2020's 2N + 4N). torch's eager backward
of linalg.solve_triangular forms the full C x C gradient product (4x its forward); counted at 3x like a matmul."""


@dataclass(frozen=True)
class FlopsPerToken:
    """Training FLOPs per token (model FLOPs, the MFU numerator) and what the hardware executes."""

    dense: float
    """6 · N_matmul (N = active parameters that take part in a matmul; MoE: top-k experts only)."""
    attention: float
    """Token-mixing FLOPs outside 6N: 12 · L · H · Q · T (PaLM App. B) over the layers that have softmax
    attention (see `path`), plus `scan`."""
    recompute: float
    """Extra forward FLOPs from activation recompute (counted by HFU, not by MFU)."""
    path: str = "analytic"
    """Which accounting gave the numbers: analytic (6N + 12·L·H·Q·T over every layer), per-layer (6N from
    the exact counts + the quadratic term on each softmax-attention layer, bounded by its window), or traced
    (measured on the user's module with torch.utils.flop_counter)."""
    detail: str = ""
    """One line saying how `path` was applied (which layers carry the quadratic term, where the trace ran)."""
    scan: float = 0.0
    """The part of `attention` from chunked scans and indexers (per-layer path, layers whose measured facts
    carry `scan`): gated DeltaNet, Mamba-2 SSD, the DeepSeek-V3.2 indexer scores."""
    recompute_attention: float = 0.0
    """The part of `recompute` that re-runs the attention term (recomputed blocks' own attention, or every
    block's attention core under selective recompute)."""

    @property
    def model(self) -> float:
        """Model FLOPs per token: 6N + 12LHQT."""
        return self.dense + self.attention

    @property
    def hardware(self) -> float:
        """FLOPs per token including recompute, the attention term counted whole (PaLM App. B)."""
        return self.model + self.recompute

    def executed(self, attention_fraction: float) -> float:
        """FLOPs per token the kernels run, recompute included, where they run `attention_fraction` of the
        quadratic attention term (a causal fused kernel skips the masked half: cluster_model.attention_work_fraction);
        the HFU numerator. Chunked scans run whole."""
        quadratic = self.attention - self.scan + self.recompute_attention
        return self.hardware - (1.0 - attention_fraction) * quadratic


def attention_head_dims(shape: ModelShape) -> tuple[int, int]:
    """(H, Q) for the attention term: heads and the per-head q·k width (MLA: nope + rope dims)."""
    if shape.is_mla:
        return shape.num_attention_heads, (shape.qk_nope_head_dim or 0) + (shape.qk_rope_head_dim or 0)
    return shape.num_attention_heads, shape.head_size


def layer_attention_flops(shape: ModelShape, seq_len: int) -> tuple[tuple[float, ...], str]:
    """Training FLOPs per token of the quadratic attention term, per layer, and how they were counted.

    A shape with exact per-layer counts (`shape.measured`: built by transformers) is counted per layer from
    its config: 12·H·Q·T (PaLM App. B) on a softmax-attention layer only, none on linear-attention
    (Qwen3-Next / Qwen3.5 gated DeltaNet), Mamba (Nemotron-H, Jamba) or MLP-only layers, whose token mixing
    grows linearly with T and whose projections are already in 6N; H·Q is the layer's own width (Gemma 4's
    global layers are twice as wide). A layer that attends to at most W keys (sliding_attention: the window,
    Mistral/Gemma/GPT-OSS; chunked_attention: the chunk, Llama 4; indexed_attention: the top-k keys the
    DeepSeek-V3.2 indexer selects, its report §2.1) is counted at min(T, W) keys per query, as the quadratic
    term counts T for full attention (every key, causal mask ignored). A layer whose measured facts carry a
    chunked scan or indexer (`LayerParams.scan`: gated DeltaNet, Mamba-2 SSD, the DSA indexer) adds
    `layer_scan_flops`. Every other shape: all L layers, each at min(T, W) keys where the config bounds it by
    one sliding window (ModelShape.sliding_window: Mistral-7B-v0.1, Mixtral; T <= W counts T, as full attention).
    """
    L = shape.num_hidden_layers
    H, Q = attention_head_dims(shape)
    m = shape.measured
    if m is None or len(m.layers) != L:
        keys = [shape.attention_keys(i, seq_len) for i in range(L)]
        out_all = tuple(float(ATTENTION_TRAIN_COEFF * H * Q * k) for k in keys)
        windowed = sum(k < seq_len for k in keys)
        return out_all, f"12·L·H·Q·T over all {L} layers (PaLM App. B)" + (
            f"; {windowed} sliding-window layers at min(T, {shape.sliding_window}) keys" if windowed else "")
    out: list[float] = []
    kinds: dict[str, int] = {}
    bounded: dict[tuple[str, int], int] = {}
    scans: dict[str, int] = {}
    for i, layer in enumerate(m.layers):
        facts = getattr(layer, "scan", None)  # LayerParams.scan: filled by models.from_transformers
        extra = layer_scan_flops(facts, seq_len) if facts is not None else 0.0
        if facts is not None:
            scans[facts.kind] = scans.get(facts.kind, 0) + 1
        if layer.mixer != "attention":
            out.append(extra)
            kinds[layer.mixer] = kinds.get(layer.mixer, 0) + 1
            continue
        keys = shape.attention_keys(i, seq_len)
        if layer.attention_window is not None:
            bounded[(layer.attention_kind, layer.attention_window)] = bounded.get(
                (layer.attention_kind, layer.attention_window), 0) + 1
        out.append(float(ATTENTION_TRAIN_COEFF * (layer.attention_width or H * Q) * keys) + extra)
    n_attn = L - sum(kinds.values())
    parts = [f"12·H·Q·T on the {n_attn} softmax-attention layers of {L}"]
    if kinds:
        unscanned = {k: n - sum(scans.get(s, 0) for s in _SCANS_OF.get(k, ())) for k, n in kinds.items()}
        listed = ", ".join(f"{n} {_MIXER_NAMES.get(k, k)}" for k, n in kinds.items())
        parts.append(("no 12·H·Q·T on " if scans else "none on ") + listed + " layers"
                     + (" (their chunked scans, linear in T, not counted: ~2% of such a layer traced)"
                        if any(unscanned[k] for k in unscanned if k != "none") else ""))
    for (kind, w), n in bounded.items():
        parts.append(f"{n} {kind} layers at min(T, {w}) keys"
                     + (" (the indexer's own scores not counted)"
                        if kind == "indexed_attention" and not scans.get("dsa_indexer") else ""))
    for kind, n in scans.items():
        parts.append(f"+ {_SCAN_NAMES[kind]} on {n} layers")
    source = "sliding_window" if shape.sliding_window is not None else "layer types"
    return tuple(out), "; ".join(parts) + f" (per layer from the config's {source})"


_MIXER_NAMES = {"none": "MLP-only", "mamba": "Mamba", "linear_attention": "linear-attention"}
_SCANS_OF = {"linear_attention": ("gated_delta",), "mamba": ("mamba2_ssd",)}
_SCAN_NAMES = {
    "gated_delta": "3x the chunked gated delta rule (transformers torch_chunk_gated_delta_rule)",
    "mamba2_ssd": "3x the Mamba-2 SSD chunk scan (transformers mamba2_chunk_scan)",
    "dsa_indexer": "1x the DSA indexer scores (DeepSeek-V3.2 §2.1; no_grad in transformers)",
}


def _layer_scans(shape: ModelShape) -> tuple:
    """`LayerParams.scan` of each layer (None where the layer has none, or the shape has no per-layer facts)."""
    m = shape.measured
    if m is None or len(m.layers) != shape.num_hidden_layers:
        return ()
    return tuple(getattr(layer, "scan", None) for layer in m.layers)


def layer_scan_flops(facts, seq_len: int) -> float:
    """Training FLOPs per token of a layer's chunked scan or indexer (`LayerParams.scan`) at `seq_len`.

    gated_delta (Qwen3-Next / Qwen3.5 linear attention) and mamba2_ssd (Nemotron-H Mamba-2 layers): the
    forward FLOPs of `dstoolkit.models.flop_count` (transformers' torch paths), x3 for forward + backward
    (`SCAN_TRAIN_PER_FORWARD`), over T tokens. dsa_indexer (DeepSeek-V3.2): the scores once, 2·H_I·(D_I+1)·T
    per token: transformers runs the indexer under torch.no_grad (the report's §2.1 trains it on its own
    KL loss with its input detached, which a plain LM loss does not do).
    """
    if facts.kind == "gated_delta":
        fwd = gated_delta_chunk_flops(seq_len, facts.heads, facts.key_dim, facts.value_dim, facts.chunk).total
        return SCAN_TRAIN_PER_FORWARD * fwd / seq_len
    if facts.kind == "mamba2_ssd":
        fwd = mamba2_ssd_chunk_flops(seq_len, facts.heads, facts.value_dim, facts.key_dim, facts.chunk).total
        return SCAN_TRAIN_PER_FORWARD * fwd / seq_len
    if facts.kind == "dsa_indexer":
        return dsa_indexer_score_flops(seq_len, facts.heads, facts.key_dim) / seq_len
    raise ValueError(f"unknown scan kind {facts.kind!r} (expected gated_delta, mamba2_ssd or dsa_indexer)")


def flops_per_token(shape: ModelShape, seq_len: int, *, checkpointed_layers: list[bool] | None = None,
                    selective: bool = False) -> FlopsPerToken:
    """Training FLOPs per token: 6N + 12·L·H·Q·T, plus recompute.

    Args:
        shape: model.
        seq_len: T.
        checkpointed_layers: per block, True where the block re-runs its forward in backward.
        selective: selective recompute (re-runs only the attention core forward in every block).

    Returns:
        The FLOPs with `path` naming the accounting: traced (a user's module: `shape.traced_flops`),
        per-layer (exact counts with per-layer attention types) or analytic.
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len={seq_len}: must be > 0")
    L = shape.num_hidden_layers
    traced = shape.traced_flops
    if traced is not None:
        # Measured on the module: the T-independent part (~6N) and the part growing with T (attention).
        dense = traced.per_token
        attn_layers = tuple(traced.per_token_per_seq * seq_len / L for _ in range(L))
        fwd_frac = traced.forward_fraction
        path, detail = "traced", (f"traced on the {traced.device} device with torch.utils.flop_counter at seq "
                                  f"{traced.seq_lens[0]} and {traced.seq_lens[1]}: {traced.per_token:.4g} + "
                                  f"{traced.per_token_per_seq:.4g}·T per token")
    else:
        n = param_totals(shape).matmul_active
        dense = float(TRAIN_FLOPS_PER_PARAM * n)  # Kaplan et al. 2020
        attn_layers, detail = layer_attention_flops(shape, seq_len)
        fwd_frac = FORWARD_FLOPS_PER_PARAM / TRAIN_FLOPS_PER_PARAM
        path = "analytic" if shape.measured is None else "per-layer"
        detail = f"6N (Kaplan et al. 2020) + {detail}"
    attention = sum(attn_layers)
    scan = 0.0 if traced is not None else sum(layer_scan_flops(f, seq_len) for f in _layer_scans(shape) if f)
    recompute = recompute_attention = 0.0
    if checkpointed_layers:
        # One more forward of each recomputed block: its share of the layer matmuls and its own attention.
        layer_dense_fwd = fwd_frac * (dense - TRAIN_FLOPS_PER_PARAM * _non_layer_matmul(shape)) / L
        recompute += sum(layer_dense_fwd + fwd_frac * a for a, c in zip(attn_layers, checkpointed_layers) if c)
        recompute_attention += sum(fwd_frac * a for a, c in zip(attn_layers, checkpointed_layers) if c)
    if selective:
        recompute += fwd_frac * attention  # the attention core forward of every block, again
        recompute_attention += fwd_frac * attention
    return FlopsPerToken(dense=float(dense), attention=float(attention), recompute=float(recompute), path=path,
                         detail=detail, scan=float(scan), recompute_attention=float(recompute_attention))


def _non_layer_matmul(shape: ModelShape) -> int:
    """Matmul parameters outside the blocks (the LM head)."""
    return shape.vocab_size * shape.hidden_size


def lm_head_train_flops_per_token(shape: ModelShape) -> float:
    """Training FLOPs per token of the LM head's GEMMs, the whole vocabulary on one rank: 6 · vocab · hidden
    (Kaplan et al. 2020: 2 forward + 4 backward per matmul parameter). Part of `FlopsPerToken.dense`; a rank that
    runs the whole head (DeepSpeed AutoTP without a split head, RunPlan.lm_head_gemm_shards = 1) does all of it."""
    return float(TRAIN_FLOPS_PER_PARAM * _non_layer_matmul(shape))


def plan_flops_per_token(plan: RunPlan) -> FlopsPerToken:
    return flops_per_token(plan.shape, plan.seq_len,
                           checkpointed_layers=plan.checkpoint.checkpointed_layers(plan.shape.num_hidden_layers),
                           selective=plan.checkpoint.recomputes_attention_core)


def tokens_per_step(plan: RunPlan) -> int:
    """Global tokens per optimizer step: micro_batch · grad_accum · dp · seq_len."""
    ds = plan.ds
    return ds.micro_batch * ds.grad_accum * plan.dp * plan.seq_len


def mfu(tokens_per_s: float, model_flops_per_token: float, peak_flops_per_gpu: float, num_gpus: int) -> float:
    """MFU = achieved tokens/s × FLOPs per token ÷ (peak × GPUs) (docs/anchors.md; PaLM App. B)."""
    if tokens_per_s < 0 or peak_flops_per_gpu <= 0 or num_gpus <= 0:
        raise ValueError("tokens_per_s must be >= 0, peak and GPU count > 0")
    return tokens_per_s * model_flops_per_token / (peak_flops_per_gpu * num_gpus)

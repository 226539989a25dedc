"""FP8 plan from a model shape alone (no torch): which GEMMs swap, memory change per rank, speedup class.

The linear layers one rank holds, and their names, come from `dstoolkit.fp8.linears` (the model's own where it
was built, else the toolkit's module tree), so for a shape the toolkit can build, the plan's swapped names equal
`convert(...)`'s report exactly.

Memory: only tensors actually *stored* in FP8 shrink (docs/anchors.md, "Claims that are wrong": torchtitan
measured -0.3% with float8 linears). Master weights, gradients, optimizer state and the bf16 weights
are unchanged. What changes per rank:

- FP8 weight caches (+): TE keeps an FP8 copy of each swapped weight and of its transpose for the
  backward GEMMs (`FP8_WEIGHT_COPIES`), plus block scales.
- Saved GEMM inputs (+/-): a swapped linear saves its input in FP8 (1 byte + scales) instead of sharing
  the bf16 tensor autograd saves once. A bf16 tensor read by k swapped linears (q, k, v) becomes k FP8
  copies; the bf16 copy is freed only when no other op keeps it (attention keeps its output for its
  own backward, so o_proj's FP8 input copy is pure overhead). Separate te.Linear modules on one input
  therefore *add* memory; fused TE modules (LayerNormLinear, LayerNormMLP) save one copy.

Speed: a roofline per GEMM (compute at peak vs. HBM traffic, plus the cast/amax kernels FP8 adds),
classified into slower / same / moderate / large. Small GEMMs lose: quantisation traffic and fixed
kernel overheads outweigh the 2x tensor-core rate. The constants are datasheet figures and one stated
assumption (`FP8_FIXED_OVERHEAD_S`), to be replaced by `benchmarks/gpu/fp8_te_bench.py` measurements.
"""
from __future__ import annotations

from typing import Mapping, Optional

from pydantic import BaseModel, Field

from dstoolkit.fp8.linears import RankLinear, from_built_model, rank_linears
from dstoolkit.fp8.report import SkipEntry, SwapEntry, SwapReport, decide_linear, layer_skip_problem
from dstoolkit.layout import LayoutFacts, first_violation
from dstoolkit.models.shape import ModelShape
# the token rule lives with Fp8Config so a spec checks it at load (spec sits below fp8); re-exported here
from dstoolkit.dsconfig.fp8 import (MX_BLOCK, TE_FP8_TOKEN_MULTIPLE, Fp8Config, check_fp8_hardware,  # noqa: F401
                                    token_multiple, token_problem)
from dstoolkit.hardware.table import GpuSpec

BF16_BYTES = 2
FP8_BYTES = 1
SCALE_BYTES = 4
"""float32 scale per block (DeepSeek-V3 / TE Float8BlockScaling)."""
E8M0_SCALE_BYTES = 1
"""MXFP8 shared exponent per 32 elements (OCP MX spec v1.0)."""
FP8_WEIGHT_COPIES = 2
"""TE caches the quantised weight rowwise and columnwise (transpose) for fprop/dgrad and wgrad layouts."""

HBM_BW_BYTES_PER_S = {
    # Vendor datasheets: H100 SXM5 3.35 TB/s, H200 4.8 TB/s, H800 SXM 3.35 TB/s, A100 80GB 2.039 TB/s,
    # A100 40GB 1.555 TB/s, L40S 0.864 TB/s (GDDR6), MI300X 5.3 TB/s.
    "H100-SXM": 3.35e12, "H200": 4.8e12, "H800": 3.35e12, "A100-80G": 2.039e12, "A100-40G": 1.555e12,
    "L40S": 0.864e12, "MI300X": 5.3e12,
}
DEFAULT_HBM_BW_BYTES_PER_S = 3.35e12
"""Used for GPUs not in HBM_BW_BYTES_PER_S (H100 SXM's figure)."""
GEMM_LAUNCH_S = 5e-6
"""Assumption: fixed cost of one GEMM kernel launch + tail (a few us), paid by bf16 and FP8 alike."""
FP8_FIXED_OVERHEAD_S = 10e-6
"""Assumption: extra per-GEMM launches for amax/scale/cast kernels (~3 kernels x a few us). Calibrate on GPU."""
QUANT_BYTES_PER_ELEMENT = BF16_BYTES + FP8_BYTES
"""Casting one bf16 activation to FP8 reads 2 bytes and writes 1 (amax fused into the cast, as TE does)."""

SPEED_CLASSES = ((0.9, "slower"), (1.2, "same"), (1.6, "moderate"), (float("inf"), "large"))
"""Upper bounds of modelled FP8/bf16 speedup per class: <0.9 slower, 0.9-1.2 same, 1.2-1.6 moderate, >=1.6 large."""


class GemmGroup(BaseModel):
    """Linear layers of one kind (e.g. every q_proj), with their shared decision and GEMM shape."""

    kind: str
    """Module name pattern, e.g. 'blocks.{0..3}.self_attn.q_proj'."""
    count: int
    """Modules in the group on this rank."""
    in_features: int
    """K per rank (after TP split for row-parallel layers)."""
    out_features: int
    """N per rank (after TP split for column-parallel layers)."""
    tokens: int
    """M: rows through one module per micro-batch (MoE experts: average routed tokens)."""
    swapped: bool
    """Whether the group runs in FP8."""
    reason: Optional[str] = None
    """Why it stays in bf16."""
    speedup: Optional[float] = None
    """Modelled FP8/bf16 time ratio for one fprop GEMM (None without FP8 tensor cores)."""
    speed_class: str = "n/a"
    """slower | same | moderate | large | n/a."""


class MemoryDelta(BaseModel):
    """Change in bytes per rank when the plan is applied (positive = more memory)."""

    weight_cache_bytes: int
    """FP8 weight copies (rowwise + columnwise) and their scales."""
    activation_bytes_per_micro_batch: int
    """Saved GEMM inputs for one micro-batch in flight (negative = saving)."""
    micro_batches_in_flight: int
    """Micro-batches whose activations coexist (pp for 1F1B's first stage, else 1)."""
    net_bytes: int
    """weight_cache_bytes + activation delta x micro-batches in flight."""
    unchanged: str = ("master weights, gradients, optimizer states and bf16 weights are unchanged "
                      "(only tensors stored in FP8 shrink)")
    """What FP8 GEMMs do not touch."""


class Fp8Plan(BaseModel):
    """Result of `plan_from_shape`."""

    model: str
    gpu: str
    recipe: str
    format: str
    tokens_per_micro_batch: int
    tp: int
    pp: int
    ep: int
    groups: list[GemmGroup]
    report: SwapReport
    memory: MemoryDelta
    hardware_problems: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)

    def to_table(self) -> str:
        """Human-readable plan."""
        gib = 2 ** 30
        out = [f"FP8 plan: {self.model} on {self.gpu}, recipe={self.recipe}, format={self.format}, "
               f"M={self.tokens_per_micro_batch} tokens/micro-batch, tp={self.tp} pp={self.pp} ep={self.ep}",
               f"{len(self.report.swapped)} linear layers swapped ({self.report.swapped_params:,} params; all pipeline "
               f"stages, dims per TP rank, this EP rank's experts), {len(self.report.skipped)} kept", ""]
        w = max(len(g.kind) for g in self.groups) if self.groups else 10
        out.append(f"  {'layers':<{w}}  {'n':>5}  {'K x N':>13}  {'M':>8}  {'fp8':>4}  speedup")
        for g in self.groups:
            sp = "n/a" if g.speedup is None else f"{g.speed_class} (~{g.speedup:.2f}x)"
            fp8 = "yes" if g.swapped else "no"
            line = f"  {g.kind:<{w}}  {g.count:>5}  {g.in_features:>6}x{g.out_features:<6}  {g.tokens:>8}  {fp8:>4}  "
            out.append(line + (sp if g.swapped else f"kept: {g.reason}"))
        m = self.memory
        out += ["", "Memory change per rank (estimate):",
                f"  FP8 weight caches        {m.weight_cache_bytes / gib:+.3f} GiB",
                f"  saved GEMM inputs        {m.activation_bytes_per_micro_batch / gib:+.3f} GiB per micro-batch"
                f" x {m.micro_batches_in_flight} in flight",
                f"  net                      {m.net_bytes / gib:+.3f} GiB",
                f"  ({m.unchanged})"]
        for p in self.hardware_problems:
            out.append(f"error: {p}")
        for n in self.notes:
            out.append(f"note: {n}")
        return "\n".join(out)


def gemm_speedup(m: int, n: int, k: int, gpu: GpuSpec) -> Optional[float]:
    """Modelled bf16 time / FP8 time for y[m,n] = x[m,k] @ w[k,n] (None when the GPU has no FP8 peak).

    Roofline (Williams et al. 2009): time = max(flops / peak, bytes / bandwidth). FP8 adds the cast of x
    (QUANT_BYTES_PER_ELEMENT per element; weights are cached) and FP8_FIXED_OVERHEAD_S.
    """
    if gpu.peak_fp8_flops is None or gpu.compute_capability is None:
        return None
    bw = HBM_BW_BYTES_PER_S.get(gpu.name, DEFAULT_HBM_BW_BYTES_PER_S)
    flops = 2.0 * m * n * k
    t_bf16 = max(flops / gpu.peak_bf16_flops, BF16_BYTES * (m * k + k * n + m * n) / bw) + GEMM_LAUNCH_S
    t_fp8 = (max(flops / gpu.peak_fp8_flops, (FP8_BYTES * (m * k + k * n) + BF16_BYTES * m * n) / bw)
             + QUANT_BYTES_PER_ELEMENT * m * k / bw + GEMM_LAUNCH_S + FP8_FIXED_OVERHEAD_S)
    return t_bf16 / t_fp8


def speed_class(ratio: Optional[float]) -> str:
    """Map a modelled speedup to its class name."""
    if ratio is None:
        return "n/a"
    for bound, name in SPEED_CLASSES:
        if ratio < bound:
            return name
    return SPEED_CLASSES[-1][1]  # pragma: no cover


def _scale_bytes_per_element(cfg: Fp8Config, weight: bool) -> float:
    if cfg.recipe == "block":
        return SCALE_BYTES / (cfg.block_size ** 2 if weight else cfg.block_size)
    if cfg.recipe == "mxfp8":
        return E8M0_SCALE_BYTES / MX_BLOCK
    return 0.0  # one scale per tensor


def _range(idx: list[int]) -> str:
    idx = sorted(set(idx))
    if len(idx) == 1:
        return str(idx[0])
    if idx == list(range(idx[0], idx[-1] + 1)):
        return f"{idx[0]}..{idx[-1]}"
    return ",".join(map(str, idx))


PLAN_LAYOUT_CODES = ("LY003", "LY004", "LY005", "LY007", "LY008")
"""The layout constraints a plan's tp / pp / ep must meet against the model (dstoolkit.layout: tp divides the
attention and key/value heads, every pipeline stage has a layer, ep divides the experts of an MoE model)."""


def check_plan_inputs(shape: ModelShape, cfg: Fp8Config, tp: int, pp: int, ep: int,
                      names: Optional[Mapping[str, str]] = None) -> None:
    """Raise ValueError, naming the setting, its value and the fix, when the plan's tp / pp / ep break a layout
    constraint of the model (`PLAN_LAYOUT_CODES`) or the layer skips leave no block in FP8 (`layer_skip_problem`).
    `names` spells the settings (tp, pp, ep, skip_first_layers, skip_last_layers) as the caller's input does."""
    facts = LayoutFacts(tp=tp, pp=pp, ep=ep, num_heads=shape.num_attention_heads, kv_heads=shape.kv_heads,
                        is_mla=shape.is_mla, num_layers=shape.num_hidden_layers,
                        num_experts=shape.num_experts if shape.is_moe else 0)
    v = first_violation(facts, PLAN_LAYOUT_CODES, names)
    if v is not None:
        raise ValueError(f"{v.message} ({v.fix}; layout rule {v.code}, `dstoolkit validate --explain {v.code}`)")
    problem = layer_skip_problem(cfg, shape.num_hidden_layers, names, shape.name)
    if problem:
        raise ValueError(problem)


def plan_from_shape(shape: ModelShape, cfg: Optional[Fp8Config] = None, *, gpu: GpuSpec, micro_batch: int = 1,
                    seq_len: int = 4096, tp: int = 1, pp: int = 1, ep: int = 1, zero_stage: int = 1,
                    activation_checkpointing: str = "none", cuda_version: Optional[str] = None,
                    names: Optional[Mapping[str, str]] = None) -> Fp8Plan:
    """Plan FP8 for a model shape on a GPU, per rank.

    Args:
        shape: the model.
        cfg: FP8 settings (None: TE defaults).
        gpu: target accelerator (hardware-table row or explicit facts).
        micro_batch: sequences per micro-batch per rank.
        seq_len: tokens per sequence.
        tp, pp, ep: tensor, pipeline and expert parallel degrees.
        zero_stage: at 3 the FP8 weight caches are transient (one layer gathered at a time).
        activation_checkpointing: "full" keeps only block inputs, so saved GEMM inputs do not change.
        cuda_version: for the hardware gates (None skips the CUDA checks).
        names: how the caller's input spells tp, pp, ep and the layer skips, for the errors (`check_plan_inputs`).

    Returns:
        The plan: groups of GEMMs with decisions and speed classes, the swap report it implies, the memory
        change per rank and any hardware problems.

    Raises:
        ValueError: a setting below 1, tp / pp / ep the model cannot be split by, layer skips that keep every
            block in bf16 (`check_plan_inputs`), or micro_batch x seq_len tokens Transformer Engine's FP8 GEMMs
            refuse (`token_problem`).
    """
    cfg = cfg or Fp8Config()
    if min(micro_batch, seq_len, tp, pp, ep) < 1:
        raise ValueError(f"micro_batch={micro_batch}, seq_len={seq_len}, tp={tp}, pp={pp}, ep={ep} must all be >= 1")
    check_plan_inputs(shape, cfg, tp, pp, ep, names)
    problem = token_problem(cfg, micro_batch, seq_len, names)
    if problem:
        raise ValueError(problem)
    m = micro_batch * seq_len
    lins = rank_linears(shape, m, tp, ep)
    n_blocks = shape.num_hidden_layers
    report = SwapReport(backend="plan", recipe=cfg.recipe, format=cfg.format)
    decisions: dict[str, Optional[str]] = {}
    for lin in lins:
        reason = decide_linear(cfg, lin.name, lin.k, lin.n, n_blocks)
        decisions[lin.name] = reason
        if reason is None:
            report.swapped.append(SwapEntry(name=lin.name, old_type="Linear", new_type="fp8 linear",
                                            in_features=lin.k, out_features=lin.n, params=lin.k * lin.n))
        else:
            report.skipped.append(SkipEntry(name=lin.name, type="Linear", reason=reason))

    # Group by (kind, decision), keeping first-seen order.
    groups: dict[tuple, dict] = {}
    for lin in lins:
        reason = decisions[lin.name]
        kind = lin.kind
        key = (kind, reason is None, reason if reason and "block" not in reason else "", lin.k, lin.n, lin.m)
        g = groups.setdefault(key, {"lin": lin, "blocks": [], "count": 0, "reason": reason, "experts": set()})
        g["count"] += 1
        if isinstance(lin.input_key[0], int):
            g["blocks"].append(lin.input_key[0])
        if kind.endswith(".{e}"):  # a fused expert tensor of a built model: <name>.<expert>
            g["experts"].add(int(lin.name.rsplit(".", 1)[-1]))
    out_groups = []
    for (kind, swapped, _r, k, n, rows), g in groups.items():
        if "{i}" in kind:  # a model-built name pattern: the layer range goes where the index was
            label = kind.replace("{i}", f"{{{_range(g['blocks'])}}}")
        else:
            label = kind if not g["blocks"] else f"blocks.{{{_range(g['blocks'])}}}.{kind}"
        if "{e}" in label:
            label = label.replace("{e}", f"{{{_range(sorted(g['experts']))}}}" if g["experts"]
                                  else f"{{0..{shape.num_experts // ep - 1}}}")
        ratio = gemm_speedup(rows, n, k, gpu) if swapped else None
        out_groups.append(GemmGroup(kind=label, count=g["count"], in_features=k, out_features=n, tokens=rows,
                                    swapped=swapped, reason=g["reason"], speedup=ratio, speed_class=speed_class(ratio)))

    # ---- memory ------------------------------------------------------------------------------------------
    # The most loaded pipeline stage holds ceil(L / pp) blocks; scale whole-model sums by that share.
    frac = -(-n_blocks // pp) / n_blocks
    weight_bytes = 0.0
    per_layer_weight: dict[str, float] = {}
    for lin in lins:
        if decisions[lin.name] is None:
            b = lin.k * lin.n * FP8_WEIGHT_COPIES * (FP8_BYTES + _scale_bytes_per_element(cfg, True))
            weight_bytes += b
            layer = lin.input_key[0] if isinstance(lin.input_key[0], int) else "head"
            per_layer_weight[layer] = per_layer_weight.get(layer, 0.0) + b
    notes: list[str] = []
    if from_built_model(shape):
        notes.append(f"linear layers from the model as built ({shape.measured.model_class}: its own module names and "
                     f"shapes, {len(lins)} GEMMs on this rank)")
    if zero_stage == 3:
        weight_bytes = max(per_layer_weight.values(), default=0)
        notes.append("ZeRO-3: FP8 weight copies exist only for the gathered layer; counted for one layer")
    else:
        weight_bytes *= frac

    act = 0.0
    by_input: dict[tuple, list[RankLinear]] = {}
    for lin in lins:
        by_input.setdefault(lin.input_key, []).append(lin)
    for key, consumers in by_input.items():
        elems = consumers[0].m * consumers[0].k
        swapped = [c for c in consumers if decisions[c.name] is None]
        if not swapped:
            continue
        fp8_copy = elems * (FP8_BYTES + _scale_bytes_per_element(cfg, False))
        bf16_kept = len(swapped) < len(consumers) or consumers[0].other_saver
        act += len(swapped) * fp8_copy - (0 if bf16_kept else BF16_BYTES * elems)
    if activation_checkpointing == "full":
        act = act / n_blocks  # only the layer being recomputed holds its GEMM inputs
        notes.append("full activation checkpointing: saved GEMM inputs exist for one layer at a time")
    else:
        act *= frac
    in_flight = pp if pp > 1 else 1
    if pp > 1:
        notes.append(f"pp={pp}: 1F1B keeps up to {pp} micro-batches of activations on the first stage")
    memory = MemoryDelta(weight_cache_bytes=int(weight_bytes), activation_bytes_per_micro_batch=int(act),
                         micro_batches_in_flight=in_flight, net_bytes=int(weight_bytes + act * in_flight))
    notes.append("separate te.Linear modules on one input each save an FP8 copy; backend='te' fuses pre-norm "
                 "SwiGLU MLPs into te.LayerNormMLP, which saves one")
    if tp > 1:
        notes.append("K x N are per rank: column-parallel layers split N, row-parallel layers split K by tp")
    return Fp8Plan(model=shape.name, gpu=gpu.name, recipe=cfg.recipe, format=cfg.format, tokens_per_micro_batch=m,
                   tp=tp, pp=pp, ep=ep, groups=out_groups, report=report, memory=memory,
                   hardware_problems=check_fp8_hardware(cfg, gpu, cuda_version), notes=notes)

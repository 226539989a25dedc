"""Which DeepSpeed-Ulysses degrees a model's attention heads allow, under the implementation that runs it: the
arithmetic of layout rule LY020 (`step_rules`), which `generate.targets` asks for each launcher's reason and advice.
Pure Python.

Three implementations split the heads of a Ulysses group, each with its own rule (read at the pinned trees):

- ``megatron-core``: Megatron-LM runs the degree as all-to-all context parallelism (--context-parallel-size N
  --cp-comm-type a2a): Transformer Engine's AttnFuncWithCPAndQKVOA2A asserts "The number of attention heads needs to
  be divisible by CP size!" for the query and the key/value heads of each TP rank.
- ``megatron-deepspeed``: Megatron-DeepSpeed (f4157bea, megatron/model/transformer.py ParallelAttention) wraps its core
  attention in DeepSpeed's DistributedAttention and first asserts ``args.num_attention_heads %
  sequence_parallel_world_size == 0`` (all query heads, before TP). DistributedAttention (deepspeed/sequence/layer.py)
  asserts "Number of key-value heads ... must be at least the sequence parallel size" for the key/value heads of each
  TP rank (the key tensor it receives) and splits a count the degree does not divide unevenly
  (uneven_heads_all2all).
- ``alst``: DeepSpeed's UlyssesSPAttentionHF (deepspeed/runtime/sequence_parallel/ulysses_sp.py; ALST, for HF models)
  raises "Attention head count ... is not divisible by SP size" and "KV attention head count ... is not divisible by
  SP size ... or vice versa": it replicates the key/value heads when the degree is a multiple of them (4 kv heads
  at sp 8: each twice), reading the model config's head counts. No dstoolkit launcher writes it (the HF / Accelerate
  scripts shard no sequence); a DeepSpeed JSON's sequence_parallel_size is for it or for Megatron-DeepSpeed.
"""
from __future__ import annotations

from typing import Optional

ULYSSES_IMPLS: dict[str, str] = {
    "megatron-core": "Megatron-Core's all-to-all context parallelism (Megatron-LM --cp-comm-type a2a)",
    "megatron-deepspeed": "Megatron-DeepSpeed's DeepSpeed-Ulysses (DistributedAttention)",
    "alst": "DeepSpeed's UlyssesSPAttentionHF (ALST, HF models)",
}
"""How messages name each implementation of a Ulysses split."""

FRAMEWORK_ULYSSES: dict[str, str] = {"megatron": "megatron-core", "deepspeed": "megatron-deepspeed"}
"""The implementation a framework's Ulysses degree runs when the caller names none: Megatron-Core's own, or under
DeepSpeed's engine Megatron-DeepSpeed's (the one DeepSpeed-engine launcher dstoolkit splits sequences for)."""

IMPL_LAUNCHER = {"megatron-core": "megatron-lm", "megatron-deepspeed": "megatron-deepspeed"}
"""The dstoolkit target that runs each implementation (ALST has none)."""


def ulysses_impl(framework: Optional[str]) -> Optional[str]:
    """The implementation an engine runs a Ulysses degree with (`FRAMEWORK_ULYSSES`), the `LayoutFacts.ulysses_impl`
    the sweep and a `RunPlan` give; None: unknown (LY020 then asks DistributedAttention's own rule)."""
    return FRAMEWORK_ULYSSES.get(framework or "")


def per_tp_rank(heads: int, tp: int) -> int:
    """Heads one TP rank holds (one when there are fewer heads than TP ranks: a replicated KV head)."""
    return heads // tp if heads >= tp else 1


def ulysses_heads_problem(impl: Optional[str], ulysses: int, num_heads: Optional[int], kv_heads: int, tp: int, *,
                          name: str = "ulysses", tp_name: str = "tp") -> Optional[str]:
    """Why `impl` cannot split these heads over `ulysses` ranks (the message, starting with ``name=ulysses``), or
    None. `num_heads` None: unknown (only the key/value rule is asked)."""
    if ulysses <= 1:
        return None
    kv = per_tp_rank(kv_heads, tp)
    head = f"{name}={ulysses}"
    if impl == "megatron-core":
        q = None if num_heads is None else per_tp_rank(num_heads, tp)
        for what, total, n in (("attention heads", num_heads, q), ("key/value heads", kv_heads, kv)):
            if n is not None and n % ulysses:
                return (f"{head}: Megatron-LM's all-to-all context parallelism needs the {what} of each TP rank "
                        f"({total} / {tp_name} {tp} = {n}) divisible by it (Transformer Engine's "
                        "AttnFuncWithCPAndQKVOA2A: 'The number of attention heads needs to be divisible by CP size!')")
        return None
    if impl == "alst":
        if num_heads is not None and num_heads % ulysses:
            return (f"{head} does not divide the {num_heads} attention heads: DeepSpeed's UlyssesSPAttentionHF "
                    f"raises 'Attention head count {num_heads} is not divisible by SP size {ulysses}'")
        if kv_heads % ulysses and ulysses % kv_heads:
            return (f"{head} and the {kv_heads} key/value heads: DeepSpeed's UlyssesSPAttentionHF raises 'KV "
                    f"attention head count {kv_heads} is not divisible by SP size {ulysses} or vice versa' (it "
                    "replicates key/value heads only when the degree is a multiple of them)")
        return None
    if impl == "megatron-deepspeed" and num_heads is not None and num_heads % ulysses:
        return (f"{head} does not divide the {num_heads} attention heads: Megatron-DeepSpeed asserts "
                "num_attention_heads % ds_sequence_parallel_size == 0 (megatron/model/transformer.py "
                "ParallelAttention), whatever DeepSpeed's DistributedAttention could split")
    if kv < ulysses:
        return (f"{head} exceeds the {kv} key/value heads on each TP rank ({kv_heads} / {tp_name} {tp}): "
                "DeepSpeed-Ulysses would leave a rank without a head (DistributedAttention asserts 'Number of "
                "key-value heads ... must be at least the sequence parallel size', deepspeed/sequence/layer.py)")
    return None


def ulysses_degrees(impl: Optional[str], num_heads: Optional[int], kv_heads: int, tp: int,
                    room: Optional[int] = None) -> list[int]:
    """The degrees above 1 `impl` takes for these heads (at most the attention heads: each rank needs one); `room`:
    the ranks a replica's TP x PP leaves (world / (tp x pp)), which the degree must divide too."""
    most = max(num_heads or 0, kv_heads)
    return [u for u in range(2, most + 1) if ulysses_heads_problem(impl, u, num_heads, kv_heads, tp) is None
            and (room is None or room % u == 0)]


def one_of(values: list[int]) -> str:
    """'2', '2 or 4', '2, 4 or 8' ('' for none)."""
    words = [str(v) for v in values]
    if not words:
        return ""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def ulysses_heads_fix(impl: Optional[str], num_heads: Optional[int], kv_heads: int, tp: int, *,
                      name: str = "ulysses", ulysses: Optional[int] = None, room: Optional[int] = None) -> str:
    """The way out of `ulysses_heads_problem`: the degrees `impl` takes (dividing `room` too, `ulysses_degrees`), the
    other launcher whose implementation takes `ulysses` (only one that does), and ring context parallelism
    (Megatron-LM's cp splits no heads)."""
    ok = ulysses_degrees(impl, num_heads, kv_heads, tp, room)
    parts = [f"use {name} {one_of(ok)}" if ok else f"no {name} above 1 splits these heads here: use {name} 1"]
    if ulysses is not None:
        for other, launcher in IMPL_LAUNCHER.items():
            if other != impl and ulysses_heads_problem(other, ulysses, num_heads, kv_heads, tp) is None:
                parts.append(f"run it on {launcher} ({ULYSSES_IMPLS[other]} takes {ulysses})")
    parts.append("context parallelism (cp, Megatron-LM's ring attention: no head split) for longer sequences")
    return ", or ".join(parts)

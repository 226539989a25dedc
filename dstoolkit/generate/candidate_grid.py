"""The sweep's grid: every ZeRO stage x offload x ZeRO++ x TP x PP x EP x micro-batch x checkpoint policy the spec
leaves open ("auto" fields tried over their choices, fixed fields kept). No torch import.
"""
from __future__ import annotations

import itertools
from typing import Iterable, Iterator, Optional

from dstoolkit.generate.candidates import Candidate, StrategyDef
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import Spec
from dstoolkit.spec.checkpoint import CheckpointPolicy


MICRO_BATCH_CHOICES = (1, 2, 4, 8, 16, 32)  # micro-batches tried when training.micro_batch is "auto"


AUTO_CHECKPOINT_POLICIES = (CheckpointPolicy(kind="none"), CheckpointPolicy(kind="selective"),
                            CheckpointPolicy(kind="full"))  # tried when activation_checkpointing is "auto"


def pow2_upto(n: int) -> list[int]:
    """1, 2, 4, ... up to n: the parallel degrees and micro-batches the sweep (and the tuner) try."""
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def pp_choices(world_size: int, num_layers: int) -> list[int]:
    """Pipeline degrees the sweep (and the tuner) try: every degree up to the layer count that divides the world
    size, so that some data-parallel degree exists. On a power-of-two world these are the powers of two; on 48
    nodes x 8 GPUs they include 3, 6, 12, 24 and 48 (BLOOM's fastest measured layouts were PP 6 and 12 on 384 GPUs,
    benchmarks/data/layout_sweeps.yaml). Stages need not split the layers evenly (the estimator and DeepSpeed's
    pipeline partitioner take uneven stages)."""
    return [p for p in range(1, min(world_size, num_layers) + 1) if world_size % p == 0]


def zero_modes(spec: Spec, strategy: Optional[StrategyDef]) -> list[tuple[int, bool, bool, bool]]:
    """(stage, offload_optimizer, offload_param, zeropp) combinations the spec (or the strategy) allows."""
    if strategy is not None:
        return [(strategy.zero_stage, strategy.offload_optimizer, strategy.offload_param, strategy.zeropp)]
    t = spec.training
    stages = [0, 1, 2, 3] if t.zero_stage == "auto" else [int(t.zero_stage)]
    modes = []
    for s in stages:
        modes.append((s, False, False, False))
        if t.offload and s in (1, 2):
            modes.append((s, True, False, False))
        if t.offload and s == 3:
            modes += [(s, True, False, False), (s, True, True, False)]
        if t.zeropp and s == 3:
            modes.append((s, False, False, True))
    return modes


def _degrees(value, choices: Iterable[int]) -> list[int]:
    return list(choices) if value == "auto" else [int(value)]


def checkpoint_choices(spec: Spec) -> list[CheckpointPolicy]:
    """The recompute policies to try: the spec's, or none/selective/full for "auto"."""
    t = spec.training
    if t.activation_checkpointing == "auto":
        return list(AUTO_CHECKPOINT_POLICIES)
    return [t.checkpoint_policy()]


def enumerate_candidates(spec: Spec, shape: ModelShape, strategy: Optional[StrategyDef] = None) -> Iterator[Candidate]:
    """Every combination the spec leaves open ("auto" fields), restricted to `strategy` when given."""
    t, c = spec.training, spec.cluster
    tps = _degrees(t.tp, pow2_upto(c.nvlink_domain))
    pps = _degrees(t.pp, pp_choices(c.world_size, shape.num_hidden_layers))
    if shape.is_moe:
        eps = _degrees(t.ep, [e for e in pow2_upto(min(shape.num_experts, c.world_size))
                              if shape.num_experts % e == 0])
    else:
        eps = _degrees(t.ep, [1])
    if strategy is not None:
        eps = [e for e in eps if (e > 1) == strategy.expert_parallel]
    mbs = _degrees(t.micro_batch, MICRO_BATCH_CHOICES)
    policies = checkpoint_choices(spec)
    for (stage, off_opt, off_par, zpp), tp, pp, ep, mb, ck in itertools.product(
            zero_modes(spec, strategy), tps, pps, eps, mbs, policies):
        yield Candidate(zero_stage=stage, offload_optimizer=off_opt, offload_param=off_par, zeropp=zpp, tp=tp,
                        pp=pp, ep=ep, micro_batch=mb, checkpoint=ck,
                        sequence_parallel=bool(t.sequence_parallel and tp > 1), cp=t.cp, ulysses=t.ulysses)

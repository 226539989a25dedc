"""Checkpoint totals sum what each pipeline stage's ranks write (s36): before, the heaviest rank's bytes were
multiplied by every rank (Llama-3.1-405B: 822.69 GiB without optimizer against 755.96 GiB of bf16 weights).

Hand derivation of the 5-block model below (llama, hidden 32, 4 heads / 2 KV heads of 8, FFN 64, vocab 64, untied):
one block = norms 32 + 32 + q 1024 + k 512 + v 512 + o 1024 + gate/up/down 3 x 2048 = 9280; embedding 2048;
final norm 32 + LM head 2048 = 2080; all 5 x 9280 + 2048 + 2080 = 50528 parameters. DeepSpeed's PipelineModule
splits 5 blocks as (3, 2) at pp 2 and (2, 2, 1) at pp 3 (runtime/utils.py partition_uniform), so the stages hold
pp 2: 2048 + 3 x 9280 = 29888 | 2 x 9280 + 2080 = 20640; pp 3: 20608 | 18560 | 9280 + 2080 = 11360.
ZeRO-1 at dp 3 pads each stage's flat group to a multiple of 2 x 3 = 6 and gives each rank a third of it:
one rank writes (padded / 3) x (4 master + 8 Adam) + 4 (step) bytes; bf16 weights are 2 bytes each.
"""
from __future__ import annotations

import pytest

from dstoolkit.estimate.checkpoint_bytes import checkpoint_bytes
from dstoolkit.hardware.table import get_gpu
from dstoolkit.layout import stage_layers
from dstoolkit.models.params import count_params
from dstoolkit.models.presets import PRESETS
from dstoolkit.models.shape import ModelShape
from dstoolkit.runplan import RunPlan

FIVE = dict(name="ck5", model_type="llama", hidden_size=32, num_hidden_layers=5, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=64, vocab_size=64)
FIVE_PARAMS = 5 * 9280 + 2048 + 2080  # 50528
# 3 blocks, the first dense, two MoE blocks of 4 experts; the DeepSeek-V3 router buffer: 2 x 4 fp32 elements
MOE_BIAS = dict(FIVE, name="ck3m", model_type="deepseek_v3", num_hidden_layers=3, num_experts=4,
                num_experts_per_tok=2, moe_intermediate_size=16, first_k_dense_replace=1,
                router_score_correction_bias=True)


def _plan(shape, stage: int, world: int, pp: int = 1, tp: int = 1, ep: int = 1, precision: str = "bf16") -> RunPlan:
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": stage}}
    if precision == "bf16":
        ds["bf16"] = {"enabled": True}
    shape = shape if isinstance(shape, ModelShape) else ModelShape(**shape)
    return RunPlan(shape=shape, ds_config=ds, world_size=world, gpus_per_node=world, gpu=get_gpu("cpu"),
                   seq_len=16, precision=precision, pp=pp, tp=tp, ep=ep)


def _optim_rank(stage_numel: int, dp: int = 3) -> int:
    padded = -(-stage_numel // (2 * dp)) * (2 * dp)
    return padded // dp * 12 + 4


# pp: (stage parameter counts, per rank model / optimizer of the heaviest stage (stage 0), total with optimizer)
HAND = {
    1: ((50528,), 50528 * 2, 16844 * 12 + 4, 50528 * 2 + 3 * (16844 * 12 + 4)),  # 50528 -> 50532 padded
    2: ((29888, 20640), 29888 * 2, 9964 * 12 + 4,  # 29888 -> 29892; 20640 -> 20640 (6880 a rank)
        50528 * 2 + 3 * (9964 * 12 + 4) + 3 * (6880 * 12 + 4)),
    3: ((20608, 18560, 11360), 20608 * 2, 6870 * 12 + 4,  # 20610 / 18564 / 11364 padded
        50528 * 2 + 3 * (6870 * 12 + 4) + 3 * (6188 * 12 + 4) + 3 * (3788 * 12 + 4)),
}


@pytest.mark.parametrize("pp", [1, 2, 3])
def test_totals_sum_each_stage_hand_derived(pp):
    counts, model_rank, optim_rank, total = HAND[pp]
    assert stage_layers(5, pp, "uniform") == {1: (5,), 2: (3, 2), 3: (2, 2, 1)}[pp]
    assert sum(counts) == FIVE_PARAMS and [_optim_rank(n) for n in counts][0] == optim_rank
    cb = checkpoint_bytes(_plan(FIVE, 1, world=3 * pp, pp=pp))  # dp 3 at every pp
    assert cb.model_states_per_rank_bytes == model_rank
    assert cb.optimizer_states_per_rank_bytes == optim_rank
    assert cb.total_without_optimizer_bytes == FIVE_PARAMS * 2
    assert cb.total_with_optimizer_bytes == total
    assert total == FIVE_PARAMS * 2 + 3 * sum(_optim_rank(n) for n in counts)
    assert {1: 707452, 2: 707464, 3: 707548}[pp] == total


# ZeRO-2 with pp > 1 is refused (DeepSpeed's pipeline engine: 'ZeRO-2 and ZeRO-3 are incompatible with pipeline
# parallelism'), so ZeRO-2 runs at pp 1 only
STAGE_PP = [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3), (2, 1)]


@pytest.mark.parametrize("stage,pp", STAGE_PP)
def test_without_optimizer_is_every_weight_once_at_tp1(stage, pp):
    assert checkpoint_bytes(_plan(FIVE, stage, world=2 * pp, pp=pp)).total_without_optimizer_bytes == FIVE_PARAMS * 2


@pytest.mark.parametrize("pp", [1, 2])
def test_tensor_parallel_ranks_each_write_the_replicated_norms(pp):
    # each mp_rank file holds its rank's full state dict: the split matrices once in all, the norms
    # (5 x (32 + 32) + 32 = 352 elements, not split) once per tensor-parallel rank
    cb = checkpoint_bytes(_plan(FIVE, 1, world=4 * pp, pp=pp, tp=2))
    assert cb.total_without_optimizer_bytes == (FIVE_PARAMS + 352) * 2


@pytest.mark.parametrize("pp", [1, 2, 3, 4, 6])
def test_llama3_8b_without_optimizer_does_not_grow_with_pp(pp):
    # the tester's case: 3 x 4 ranks, ZeRO-1, bf16; before: 14.96 / 14.96 / 16.34 / 16.91 / 20.50 GiB
    shape = PRESETS["llama-3-8b"]
    cb = checkpoint_bytes(_plan(shape, 1, world=12, pp=pp))
    assert cb.total_without_optimizer_bytes == count_params(shape).total * 2


@pytest.mark.parametrize("stage,pp", [c for c in STAGE_PP if c[1] != 2])
@pytest.mark.parametrize("ep", [1, 2])
def test_router_buffer_is_in_the_model_states(stage, pp, ep):
    with_bias = checkpoint_bytes(_plan(MOE_BIAS, stage, world=2 * pp, pp=pp, ep=ep))
    without = checkpoint_bytes(_plan(dict(MOE_BIAS, router_score_correction_bias=False), stage, world=2 * pp,
                                     pp=pp, ep=ep))
    count = count_params(ModelShape(**MOE_BIAS))
    assert count.buffers == 8
    assert with_bias.total_without_optimizer_bytes == count.total * 2 + 8 * 4
    assert with_bias.total_without_optimizer_bytes - without.total_without_optimizer_bytes == 32
    assert with_bias.total_with_optimizer_bytes - without.total_with_optimizer_bytes == 32  # no optimizer state
    # the heaviest rank writes its stage's share: all 8 at pp 1; at pp 3 (blocks 0 | 1 | 2) the heaviest stage is
    # the first (embedding + the dense block), which holds no MoE block and so no buffer
    assert with_bias.model_states_per_rank_bytes - without.model_states_per_rank_bytes == (32 if pp == 1 else 0)


def test_zero3_every_rank_writes_the_buffers():
    cb = checkpoint_bytes(_plan(MOE_BIAS, 3, world=2))
    assert cb.model_states_per_rank_bytes == 8 * 4  # parameter placeholders hold no bytes, buffers in full
    assert cb.total_without_optimizer_bytes == 2 * 8 * 4 + cb.expert_states_bytes


TIED = dict(FIVE, name="ck5t", tie_word_embeddings=True)  # no LM head: 5 x 9280 + 2048 + 32 = 48480 parameters


@pytest.mark.parametrize("pp", [1, 2, 3])
def test_tied_embedding_is_written_by_the_first_and_the_last_stage(pp):
    # at pp > 1 the last stage holds its own trained copy of the tied embedding (Megatron-LM's output layer
    # `shared_embedding_or_output_weight`, DeepSpeed's TiedLayerSpec), 2048 elements, and saves it: its stage is
    # 2 x 9280 + 32 + 2048 = 20640 at pp 2 (as the untied LM head's), 9280 + 32 + 2048 = 11360 at pp 3
    assert count_params(ModelShape(**TIED)).total == 48480
    cb = checkpoint_bytes(_plan(TIED, 1, world=3 * pp, pp=pp))
    assert cb.total_without_optimizer_bytes == (48480 + (2048 if pp > 1 else 0)) * 2
    counts = {1: (48480,), 2: (29888, 20640), 3: (20608, 18560, 11360)}[pp]
    assert cb.total_with_optimizer_bytes == sum(counts) * 2 + 3 * sum(_optim_rank(n) for n in counts)

"""`dstoolkit.estimate.checkpoint_bytes` against the tensor bytes of real DeepSpeed 0.19.8 checkpoints.

The pinned figures were read (dstoolkit.ckpt.torchzip.payload_bytes) from checkpoints that
`dstoolkit.runtime.ckpt.runs` wrote on 2 CPU gloo ranks (the same models and layouts as tests/dist/test_ckpt_resume.py,
which also compares the estimate with its own checkpoints live): a 22,688-parameter llama-style model and its
4-expert Mixtral-style MoE variant, fp32, Adam.
"""
from __future__ import annotations

import pytest

from dstoolkit.estimate.checkpoint_bytes import checkpoint_bytes, render_checkpoint_bytes
from dstoolkit.hardware.table import get_gpu
from dstoolkit.models.shape import ModelShape
from dstoolkit.runplan import RunPlan

DENSE = dict(name="ck", model_type="llama", hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=64, vocab_size=64)
MOE = dict(DENSE, name="ckm", model_type="mixtral", num_experts=4, num_experts_per_tok=2)


def _plan(shape: dict, stage: int, world: int = 2, ep: int = 1, precision: str = "fp32") -> RunPlan:
    ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": stage}}
    if precision == "bf16":
        ds["bf16"] = {"enabled": True}
    return RunPlan(shape=ModelShape(**shape), ds_config=ds, world_size=world, gpus_per_node=world,
                   gpu=get_gpu("cpu"), seq_len=16, precision=precision, ep=ep)


# measured: (model states file, each rank's optim file, each expert file) tensor bytes
@pytest.mark.parametrize("shape,stage,ep,model,optim,expert_files", [
    (DENSE, 2, 1, 90752, 136132, 0),      # mp_rank_00_model_states.pt, zero_pp_rank_{0,1}_..._optim_states.pt
    (DENSE, 3, 1, 0, 136132, 0),          # ZeRO-3 model-states files hold placeholders only
    (MOE, 2, 2, 42624, 358856, 8),        # + 8 layer_L_expert_E files of 24,576 bytes each
])
def test_matches_real_checkpoint_bytes(shape, stage, ep, model, optim, expert_files):
    cb = checkpoint_bytes(_plan(shape, stage, ep=ep))
    assert cb.model_states_per_rank_bytes == model
    assert cb.optimizer_states_per_rank_bytes == optim
    assert cb.expert_states_bytes == expert_files * 24576
    assert cb.total_with_optimizer_bytes == model + 2 * optim + expert_files * 24576
    assert cb.total_without_optimizer_bytes == model + expert_files * 24576


def test_bf16_halves_model_states_not_optimizer():
    fp32, bf16 = checkpoint_bytes(_plan(DENSE, 2)), checkpoint_bytes(_plan(DENSE, 2, precision="bf16"))
    assert bf16.model_states_per_rank_bytes * 2 == fp32.model_states_per_rank_bytes
    assert bf16.optimizer_states_per_rank_bytes == fp32.optimizer_states_per_rank_bytes


def test_more_ranks_split_the_optimizer():
    one, two = checkpoint_bytes(_plan(DENSE, 1, world=1)), checkpoint_bytes(_plan(DENSE, 1, world=2))
    assert one.optimizer_states_per_rank_bytes - 4 == 2 * (two.optimizer_states_per_rank_bytes - 4)
    assert one.total_with_optimizer_bytes == two.total_with_optimizer_bytes - 4  # one more step scalar
    assert "per rank" in render_checkpoint_bytes(two) and "without" in render_checkpoint_bytes(two)


def test_zero0_native_moe_writes_the_optimizer_twice():
    # measured (s37, payload_bytes of a real save: `dstoolkit train --spec ds_configs/tiny_moe_cpu.yaml --config
    # ds_configs/generated/tiny_moe_cpu/zero0-ep/ds_config.json --steps 2`, bf16, ep 2 on 2 gloo ranks):
    # expp_rank_{0,1}_mp_rank_00_optim_states.pt 72,821,980 each; mp_rank_00_model_states.pt 76,504,796 =
    # 3,682,816 of weights + 72,821,980 (rank 0's optimizer again); 16 expert files 16,908,288; all 239,057,044.
    # Before, the model-states copy was not counted: total 166,234,640 (-30%).
    from dstoolkit.models.presets import PRESETS

    ds = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 0},
          "bf16": {"enabled": True}}
    cb = checkpoint_bytes(RunPlan(shape=PRESETS["tiny-moe"], ds_config=ds, world_size=2, gpus_per_node=2,
                                  gpu=get_gpu("cpu"), seq_len=128, precision="bf16", ep=2))
    one_copy = cb.optimizer_states_per_rank_bytes // 2
    assert cb.optimizer_states_per_rank_bytes == 2 * one_copy
    assert abs(one_copy - 72_821_980) <= 256  # the files add a few scalars (loss scaler, step) beside the tensors
    assert cb.model_states_per_rank_bytes == 3_682_816
    assert cb.expert_states_bytes == 16_908_288
    assert abs(cb.total_with_optimizer_bytes - 239_057_044) <= 3 * 256
    assert cb.total_without_optimizer_bytes == 3_682_816 + 16_908_288

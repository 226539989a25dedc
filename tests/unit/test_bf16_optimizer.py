"""DeepSpeed's BF16_Optimizer as the estimator prices it (DeepSpeed 0.19.8 engine.py: stage 0 + bf16 with pipeline
parallelism, bf16 accumulation; stage 1 + bf16 with fp32 accumulation): its gradient buffer is of
data_types.grad_accum_dtype, and it all-gathers the updated parameters over data parallelism after the step
(runtime/bf16_optimizer.py). Stage 0 with fp32 accumulation is refused (rule DS229), so RunPlan refuses it too."""
import pytest

from dstoolkit.estimate.comm import comm_plan
from dstoolkit.estimate.memory import deepspeed_model_states, optimizer_path
from dstoolkit.hardware.table import get_gpu
from dstoolkit.models import get_preset
from dstoolkit.runplan import RunPlan


def _plan(stage=0, pp=2, precision="bf16", grad_accum_dtype=None):
    ds = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8, "zero_optimization": {"stage": stage},
          "optimizer": {"type": "AdamW"}}
    if precision == "bf16":
        ds["bf16"] = {"enabled": True}
    if grad_accum_dtype:
        ds["data_types"] = {"grad_accum_dtype": grad_accum_dtype}
    return RunPlan(shape=get_preset("llama-3-8b"), ds_config=ds, world_size=16, gpus_per_node=8,
                   gpu=get_gpu("A100-80G"), seq_len=2048, tp=2, pp=pp, precision=precision)


def test_gradient_buffer_has_the_accumulation_dtype():
    bf16 = deepspeed_model_states(_plan())
    fp32 = deepspeed_model_states(_plan(stage=1, grad_accum_dtype="fp32"))
    assert optimizer_path(_plan()) == optimizer_path(_plan(stage=1, grad_accum_dtype="fp32")) == "bf16_optimizer"
    # the persistent buffer is the padded flat group: 2 bytes per element by default, 4 with fp32 accumulation
    # (engine.get_data_types: grad_accum_dtype defaults to the model dtype)
    assert fp32.grads_persistent == 2 * bf16.grads_persistent
    assert bf16.grads_persistent == bf16.params  # bf16 params and a bf16 buffer of the same padded groups


def test_updated_parameters_are_all_gathered_after_the_step():
    plan = _plan()
    ops = {op.name: op for op in comm_plan(plan).ops}
    gather = ops["bf16_optimizer_all_gather"]
    # Ψ of the rank's dense parameters in bf16, the same bytes the gradient all-reduce moves, and not overlapped
    assert gather.bytes == ops["dp_all_reduce"].bytes
    assert gather.group_size == plan.dp and not gather.overlappable
    # stage 0 without BF16_Optimizer (fp32: the basic path) gathers nothing
    assert optimizer_path(_plan(precision="fp32")) == "basic"
    assert "bf16_optimizer_all_gather" not in {op.name for op in comm_plan(_plan(precision="fp32")).ops}


def test_megatron_keeps_its_fp32_main_grad_buffer():
    # Megatron-LM forces accumulate_allreduce_grads_in_fp32 under bf16 (arguments.py), whatever the DeepSpeed
    # JSON's data_types says: the fp32 buffer stays, and its optimizer does not all-gather as BF16_Optimizer does
    meg = _plan().model_copy(update={"framework": "megatron"})
    fp32 = deepspeed_model_states(_plan(stage=1, grad_accum_dtype="fp32"))
    assert deepspeed_model_states(meg).grads_persistent == fp32.grads_persistent
    assert "bf16_optimizer_all_gather" not in {op.name for op in comm_plan(meg).ops}


def test_stage0_with_fp32_accumulation_is_refused_as_deepspeed_refuses_it():
    with pytest.raises(ValueError, match="DS229|grad_accum_dtype"):
        _plan(grad_accum_dtype="fp32")

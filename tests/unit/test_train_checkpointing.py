"""Checkpoint policy applied to the model's blocks; saved-tensor bytes measured vs dstoolkit.estimate.

Measured with torch.autograd.graph.saved_tensors_hooks on CPU (bf16 weights, the tiny preset at s=64, b=2);
the estimate comes from the SAME CheckpointPolicy object through RunPlan.checkpoint.
"""
import pytest

from dstoolkit.estimate import RunPlan, activation_bytes
from dstoolkit.models import get_preset
from dstoolkit.spec.checkpoint import CheckpointPolicy
from dstoolkit.hardware.table import get_gpu

# torch and dstoolkit.runtime.* are imported inside the tests: collecting this module must not import torch.

ACTIVATION_TOLERANCE = 0.10  # issue #4: activations within 10% of measurement
SEQ, MICRO = 64, 2
POLICIES = {
    "none": CheckpointPolicy(kind="none"),
    "full": CheckpointPolicy(kind="full"),
    "every-2": CheckpointPolicy(kind="every-k", every_k=2),
    "ratio-0.75": CheckpointPolicy(kind="ratio", ratio=0.75),
    "selective": CheckpointPolicy(kind="selective"),
}


@pytest.fixture(scope="module")
def measured():
    import torch

    from dstoolkit.runtime.model import build_model
    from dstoolkit.runtime.synthetic import synthetic_batch
    from dstoolkit.runtime.train.checkpointing import apply_checkpoint_policy, measure_saved_activation_bytes

    shape = get_preset("tiny")
    model = build_model(shape).to(torch.bfloat16)
    x, y = synthetic_batch(shape, MICRO, SEQ, step=0, rank=0)
    out = {}
    for name, policy in POLICIES.items():
        apply_checkpoint_policy(model, policy)
        out[name] = measure_saved_activation_bytes(lambda: model(x, y), exclude=list(model.parameters())).saved_bytes
    return shape, out


def _estimate(shape, policy):
    plan = RunPlan(shape=shape, ds_config={"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1,
                                           "bf16": {"enabled": True}}, world_size=1, gpus_per_node=1,
                   gpu=get_gpu("cpu"), seq_len=SEQ, checkpoint=policy, precision="bf16", flash_attention=True)
    return activation_bytes(plan).saved


def test_policy_flags_reach_the_blocks():
    from dstoolkit.runtime.model import build_model
    from dstoolkit.runtime.train.checkpointing import apply_checkpoint_policy

    model = build_model(get_preset("tiny"))
    flags = apply_checkpoint_policy(model, CheckpointPolicy(kind="every-k", every_k=3))
    assert flags == model.checkpointed == [True, False, False, True]
    apply_checkpoint_policy(model, CheckpointPolicy(kind="selective"))
    assert model.checkpointed == [False] * 4 and all(b.self_attn.recompute_core for b in model.blocks)
    with pytest.raises(ValueError, match="backend='jax'"):
        apply_checkpoint_policy(model, CheckpointPolicy(), backend="jax")


def test_recompute_gives_identical_gradients():
    import torch

    from dstoolkit.runtime.model import build_model
    from dstoolkit.runtime.synthetic import synthetic_batch

    shape = get_preset("tiny").model_copy(update={"num_hidden_layers": 2})
    x, y = synthetic_batch(shape, 1, 16, step=0, rank=0)
    grads = []
    for policy in (CheckpointPolicy(kind="none"), CheckpointPolicy(kind="full"), CheckpointPolicy(kind="selective")):
        model = build_model(shape, checkpoint=policy)
        model(x, y).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.equal(grads[0], grads[1]) and torch.equal(grads[0], grads[2])


def test_measured_bytes_order_and_savings(measured):
    _, m = measured
    assert m["full"] < m["every-2"] < m["none"]
    assert m["ratio-0.75"] < m["every-2"]  # 3 of 4 blocks recomputed vs 2 of 4
    assert m["selective"] < m["none"]


@pytest.mark.parametrize("name", list(POLICIES))
def test_measured_matches_estimate_within_10_percent(measured, name):
    shape, m = measured
    est = _estimate(shape, POLICIES[name])
    assert abs(est - m[name]) / m[name] <= ACTIVATION_TOLERANCE, (name, m[name], est)


@pytest.mark.parametrize("name", ["full", "every-2", "ratio-0.75", "selective"])
def test_recompute_saving_matches_estimate(measured, name):
    shape, m = measured
    saved_measured = m["none"] - m[name]
    saved_est = _estimate(shape, POLICIES["none"]) - _estimate(shape, POLICIES[name])
    assert abs(saved_est - saved_measured) / saved_measured <= ACTIVATION_TOLERANCE


_DS_BACKEND_SCRIPT = """
import os, sys, torch, deepspeed
deepspeed.init_distributed(dist_backend="gloo")
from dstoolkit.models import get_preset
from dstoolkit.runtime.model import build_model
from dstoolkit.runtime.synthetic import synthetic_batch
from dstoolkit.spec.checkpoint import CheckpointPolicy
from dstoolkit.runtime.train.checkpointing import apply_checkpoint_policy
shape = get_preset("tiny").model_copy(update={"num_hidden_layers": 2})
x, y = synthetic_batch(shape, 1, 16, step=0, rank=0)
grads = []
for backend in ("torch", "deepspeed"):
    m = build_model(shape)
    apply_checkpoint_policy(m, CheckpointPolicy(kind="full"), backend=backend)
    m(x, y).backward()
    grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
print("EQUAL" if torch.equal(grads[0], grads[1]) else "DIFFERENT")
"""


def test_deepspeed_checkpointing_backend_gives_identical_gradients(tmp_path):
    import os
    import subprocess
    import sys

    from dstoolkit.runtime.train.launch import free_port

    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", _DS_BACKEND_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "EQUAL"

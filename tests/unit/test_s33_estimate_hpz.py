"""s33 estimator finding 3: ZeRO++ hpZ keeps a secondary copy of the parameters, partitioned over the hpZ group
(ZeRO++ arXiv 2306.10209 §3.2; DeepSpeed 0.19.8 partition_parameters.py `_partition_param_sec`:
`_aligned_size(param) // num_ranks_in_param_group` elements in the parameter's dtype per parameter, made as
parameters are partitioned, dropped after each step by stage3.py `invalidate_secondary_tensor`). Before, the memory
model never read zero_hpz_partition_size: zero++ on 4 x 8 showed the same peak as zero3 (45.9 GiB both).
"""
from __future__ import annotations

import copy

import pytest

from dstoolkit.estimate import estimate_run
from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.costing import estimate_candidate, run_plan_for
from dstoolkit.generate.ds_json import build_ds_config
from dstoolkit.hardware.table import get_gpu
from dstoolkit.spec.checkpoint import CheckpointPolicy

SPEC = """\
name: zpp
model: {preset: llama-3-70b}
cluster: {nodes: 4, gpus_per_node: 8, gpu: H100-SXM}
training: {seq_len: 4096, global_batch: 64, micro_batch: 1, precision: bf16, optimizer: adamw,
           activation_checkpointing: full, tp: 1, pp: 1, zero_stage: 3, offload: false, zeropp: true}
"""

# Llama-3-70B from its config (hidden 8192, 80 layers, 64 heads / 8 KV heads of 128, MLP 28672, vocab 128256):
# per layer q,o 2*8192^2 + k,v 2*8192*1024 + gate,up,down 3*8192*28672 + 2 norms of 8192; untied embedding and head;
# the final norm. Every dimension is a multiple of 32, so no parameter is padded at dp 32.
LAYER = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192
PSI = 80 * LAYER + 2 * 128256 * 8192 + 8192
PERSISTENT = (2 * 80 + 1) * 8192  # the norms: <= stage3_param_persistence_threshold, kept whole, partitioned at step
BF16 = 2


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from dstoolkit.generate.io import load_spec_and_shape

    p = tmp_path_factory.mktemp("zpp") / "zpp.yaml"
    p.write_text(SPEC)
    spec, shape = load_spec_and_shape(p)
    cand = Candidate(zero_stage=3, micro_batch=1, checkpoint=CheckpointPolicy(kind="full"))
    cfg = build_ds_config(spec, shape, Candidate(zero_stage=3, zeropp=True, micro_batch=1, checkpoint=cand.checkpoint))
    assert cfg["zero_optimization"]["zero_hpz_partition_size"] == 8  # one node
    return spec, shape, cand, cfg


def _estimate(setup, hpz, **zero):
    spec, shape, cand, cfg = setup
    c = copy.deepcopy(cfg)
    c["zero_optimization"].update(zero)
    if hpz is None:
        for k in ("zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_gradients"):
            c["zero_optimization"].pop(k)
    else:
        c["zero_optimization"]["zero_hpz_partition_size"] = hpz
    return estimate_run(run_plan_for(spec, shape, cand, c))


def _phase(est, name):
    return next(p for p in est.memory.timeline.phases if p.name == name)


def test_psi_is_llama_3_70b(setup):
    from dstoolkit.estimate.layout import param_totals

    assert param_totals(setup[1]).total == PSI == 70_553_706_496


def test_hpz_secondary_partition_is_counted_exactly(setup):
    zero3, zpp = _estimate(setup, None), _estimate(setup, 8)
    secondary = PSI // 8 * BF16  # 17,638,426,624 B = 2 Psi / 8
    assert zpp.memory.hpz_secondary_params == secondary == 17_638_426_624
    # at the optimizer step every parameter has its secondary partition (stage3.py step -> _partition_all_parameters)
    step = _phase(zpp, "optimizer_step")
    assert step.device_bytes - _phase(zero3, "optimizer_step").device_bytes == secondary
    assert {t.name: t.bytes for t in step.terms}["hpz_secondary_params"] == secondary
    # the peak (backward_loss: the persistent norms are not partitioned yet, so not theirs)
    assert zpp.memory.peak_phase == zero3.memory.peak_phase == "backward_loss"
    assert zpp.memory.total - zero3.memory.total == (PSI - PERSISTENT) // 8 * BF16
    assert "hpz_secondary_params" in zpp.memory.peak_alive
    assert zpp.memory.params - zero3.memory.params == secondary


def test_no_hpz_no_secondary(setup):
    zero3, one = _estimate(setup, None), _estimate(setup, 1)
    assert one.memory.total == zero3.memory.total and one.memory.hpz_secondary_params == 0
    # qwZ / qgZ alone allocate nothing persistent (their int8 buffers live only inside the collective)
    assert _estimate(setup, 1, zero_quantized_weights=True, zero_quantized_gradients=True).memory.total \
        == zero3.memory.total


def test_hpz_over_the_whole_dp_group_still_allocates_the_copy(setup):
    """hpz == dp (32): DeepSpeed 0.19.8 still builds the hpZ group (Init.__init__: any zero_hpz_partition_size > 1)
    and `_partition_param_sec` still allocates a secondary tensor, now as large as the primary partition."""
    zero3, full = _estimate(setup, None), _estimate(setup, 32)
    assert full.memory.hpz_secondary_params == PSI // 32 * BF16
    assert _phase(full, "optimizer_step").device_bytes - _phase(zero3, "optimizer_step").device_bytes \
        == PSI // 32 * BF16


def test_offload_param_puts_the_secondary_in_host_ram(setup):
    """partition_parameters.py: the secondary is made on self.remote_device, the host under offload_param."""
    off = {"offload_param": {"device": "cpu", "pin_memory": True},
           "offload_optimizer": {"device": "cpu", "pin_memory": True}}
    zero3, zpp = _estimate(setup, None, **off), _estimate(setup, 8, **off)
    assert zpp.memory.total == zero3.memory.total and zpp.memory.hpz_secondary_params == 0
    assert zpp.host_memory_per_rank_bytes - zero3.host_memory_per_rank_bytes == PSI // 8 * BF16


def test_sweep_zeropp_row_costs_more_memory_than_zero3(setup):
    spec, shape, cand, _ = setup
    gpu = get_gpu(spec.cluster.gpu)
    z3 = estimate_candidate(spec, shape, cand, gpu)
    zpp = estimate_candidate(spec, shape, Candidate(zero_stage=3, zeropp=True, micro_batch=1,
                                                    checkpoint=cand.checkpoint), gpu)
    assert zpp.memory_per_rank_bytes - z3.memory_per_rank_bytes == (PSI - PERSISTENT) // 8 * BF16

"""Step-time model: composition, overlap assumption, calibration interpolation."""
import pytest

from dstoolkit.estimate import Calibration, estimate_run
from dstoolkit.runplan import RunPlan
from dstoolkit.models import get_preset
from dstoolkit.spec.checkpoint import CheckpointPolicy
from dstoolkit.hardware.table import get_gpu

CAL = Calibration(matmul_flops_per_s=1e10, matmul_work=1e5, matmul_flops_per_s_large=2e10, matmul_work_large=4e5,
                  mem_bw_bytes_per_s=1e9, comm_busbw_bytes_per_s=3e8, comm_latency_s=0.01, step_overhead_s=0.05)


def _plan(stage=2, ckpt="none", cal=CAL, overlap=None, gpu="cpu", world=2):
    ds = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
          "zero_optimization": {"stage": stage}, "optimizer": {"type": "AdamW"}}
    if overlap is not None:
        ds["zero_optimization"]["overlap_comm"] = overlap
    return RunPlan(shape=get_preset("tiny"), ds_config=ds, world_size=world, gpus_per_node=world, gpu=get_gpu(gpu),
                   seq_len=128, checkpoint=CheckpointPolicy(kind=ckpt), calibration=cal)


def test_rate_is_interpolated_in_log_size_and_clamped():
    assert CAL.rate_at(5e4) == CAL.matmul_flops_per_s
    assert CAL.rate_at(2e5) == pytest.approx(1.5e10)
    assert CAL.rate_at(1e7) == CAL.matmul_flops_per_s_large


def test_step_time_is_the_sum_of_its_parts():
    st = estimate_run(_plan()).step_time
    assert st.total_s == pytest.approx(st.compute_s + st.comm_exposed_s + st.optimizer_s + st.memory_s + st.offload_s + st.overhead_s)
    assert st.overhead_s == CAL.step_overhead_s
    assert st.comm_exposed_s == st.comm_total_s  # calibrated CPU ranks: nothing overlaps (eta = 0)


def test_full_recompute_adds_a_forward_to_compute():
    base = estimate_run(_plan()).step_time.compute_s
    full = estimate_run(_plan(ckpt="full")).step_time.compute_s
    assert 1.2 < full / base < 4 / 3 + 1e-9  # the LM head is not recomputed


def test_overlap_hides_comm_on_gpus_only_when_enabled():
    on = estimate_run(_plan(cal=None, overlap=True, gpu="H100-SXM", world=8)).step_time
    off = estimate_run(_plan(cal=None, overlap=False, gpu="H100-SXM", world=8)).step_time
    assert off.comm_exposed_s == pytest.approx(off.comm_total_s)
    assert on.comm_exposed_s < on.comm_total_s
    assert on.overlap_efficiency == pytest.approx(0.8)


def test_mfu_and_hfu():
    from dstoolkit.estimate.cluster_model import attention_work_fraction
    from dstoolkit.estimate.flops import plan_flops_per_token

    plan = _plan(ckpt="full", cal=None, gpu="H100-SXM", world=8)
    est = estimate_run(plan)
    # HFU: the FLOPs the kernels run (recompute in, the causal kernel's masked half of the attention term out)
    executed = plan_flops_per_token(plan).executed(attention_work_fraction(plan))
    assert est.flops_per_token < executed < est.hardware_flops_per_token
    assert est.hfu / est.mfu == pytest.approx(executed / est.flops_per_token)
    assert est.mfu == pytest.approx(est.tokens_per_step / est.step_time_s * est.flops_per_token / (989e12 * 8))

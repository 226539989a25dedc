"""The tuner's search space and its pre-run checks (rules, validate_config, memory estimate)."""
from __future__ import annotations

import signal

import pytest

from dstoolkit.models import resolve_spec_model
from dstoolkit.spec import Spec, load_spec
from dstoolkit.validate.engine import validate_config
from dstoolkit.tune.objective import _failure
from dstoolkit.tune.space import TuneInputError, TuneSpace, trial_spec_dict

GB = 1e9


def _space(repo_root, name, **kw):
    spec = load_spec(repo_root / "ds_configs" / f"{name}.yaml")
    return TuneSpace.from_spec(spec, resolve_spec_model(spec), **kw)


def test_tiny_space_is_the_sweep_space_times_bucket_choices(repo_root):
    sp = _space(repo_root, "tiny_cpu", bucket_scales=(1.0,), data_parallel_only=True)
    spec = sp.spec
    # zero modes allowed by the spec (stage auto, offload true, zeropp false): 0, 1, 1+opt, 2, 2+opt, 3, 3+opt,
    # 3+opt+param; micro-batches giving an integer grad accumulation at dp = world size.
    assert list(sp.zero) == ["0", "1", "1+opt", "2", "2+opt", "3", "3+opt", "3+opt+param"]
    world = spec.cluster.world_size
    assert sp.micro_batch == [m for m in (1, 2, 4, 8, 16, 32) if spec.training.global_batch % (m * world) == 0]
    assert sp.size == len(sp.zero) * len(sp.micro_batch)
    assert sp.size >= 24
    # On CPU overlap_comm is not a dimension, and why is recorded.
    assert sp.overlap_comm == [None] and "CPU" in sp.fixed_reasons["overlap_comm"]
    with_buckets = _space(repo_root, "tiny_cpu", bucket_scales=(0.25, 1.0), data_parallel_only=True)
    stage0 = len(sp.micro_batch)  # stage 0 has no buckets: not multiplied
    assert with_buckets.size == stage0 + 2 * (sp.size - stage0)


def test_point_params_round_trip_and_unique_keys(repo_root):
    sp = _space(repo_root, "llama3_8b_1x8_h100")
    pts = list(sp.points())
    assert len({p.key for p in pts}) == len(pts)
    for p in pts[:: max(1, len(pts) // 50)]:
        assert sp.point_from_params(sp.params_of(p)) == p


def test_bucket_scale_and_overlap_reach_the_ds_config(repo_root):
    sp = _space(repo_root, "llama3_8b_1x8_h100")
    base = next(p for p in sp.points() if p.candidate.zero_stage == 2 and p.bucket_scale == 1.0 and p.overlap_comm)
    small = base.model_copy(update={"bucket_scale": 0.25, "overlap_comm": False})
    z1, z2 = sp.ds_config(base)["zero_optimization"], sp.ds_config(small)["zero_optimization"]
    assert z1["overlap_comm"] is True and z2["overlap_comm"] is False
    assert z2["reduce_bucket_size"] == z1["reduce_bucket_size"] // 4
    assert z2["allgather_bucket_size"] == z1["allgather_bucket_size"] // 4


def test_memory_pruning_llama8b_zero0_with_reason(repo_root):
    """Llama-3-8B (8.03B params) with plain data parallel needs >= 16 bytes/param of model states in mixed
    precision (ZeRO §3.1: 2 weights + 2 grads + 12 Adam) = 128 GB > 80 GB on an H100: every ZeRO-0 point
    without TP/PP is pruned for memory before anything runs; ZeRO-3 over 8 GPUs (16 GB of states) is not."""
    sp = _space(repo_root, "llama3_8b_1x8_h100")
    z0 = [p for p in sp.points() if p.candidate.zero_stage == 0 and p.candidate.tp == 1 and p.candidate.pp == 1
          and p.candidate.micro_batch == 1]
    assert z0
    for p in z0:
        chk = sp.check(p)
        assert chk.pruned and chk.pruned_code == "memory", (p.label, chk.pruned_reason)
        assert "GiB per rank >" in chk.pruned_reason and "H100" in chk.pruned_reason
        assert chk.estimate.memory_per_rank_bytes > 16 * 8.0e9
    z3 = next(p for p in sp.points() if p.candidate.zero_stage == 3 and not p.candidate.offload_optimizer
              and not p.candidate.zeropp and p.candidate.tp == 1 and p.candidate.pp == 1
              and p.candidate.micro_batch == 1 and p.candidate.checkpoint.kind == "full")
    assert not sp.check(z3).pruned


def test_rule_pruning_moe_stage3(repo_root):
    sp = _space(repo_root, "tiny_moe_cpu")
    z3 = [p for p in sp.points() if p.candidate.zero_stage == 3]
    assert z3
    for p in z3:
        chk = sp.check(p)
        assert chk.pruned_code == "rule:moe-zero3"
        assert "Native DeepSpeed MoE is not supported with ZeRO Stage 3" in chk.pruned_reason


def test_runnable_points_pass_validate_config(repo_root):
    sp = _space(repo_root, "tiny_moe_cpu")
    ok = [c for c in (sp.check(p) for p in sp.points()) if not c.pruned]
    assert ok
    for c in ok:
        findings = validate_config(c.ds_config, world_size=sp.spec.cluster.world_size, ep_size=c.point.candidate.ep,
                                   num_experts=sp.shape.num_experts, mode="strict")
        assert not [f for f in findings if str(f.severity).lower().endswith("error")], c.point.label


def test_trial_spec_reloads_with_the_point_fixed(repo_root):
    sp = _space(repo_root, "tiny_cpu")
    for p in sp.points():
        data = trial_spec_dict(sp.spec, p)
        spec = Spec.model_validate(data)  # e.g. zero_stage 0 must not keep offload: true
        assert spec.training.zero_stage == p.candidate.zero_stage
        assert spec.training.micro_batch == p.candidate.micro_batch
        assert spec.training.offload == (p.candidate.offload_optimizer or p.candidate.offload_param)


def test_real_mode_space_refuses_fixed_tp(repo_root, tmp_path):
    text = (repo_root / "ds_configs" / "tiny_cpu.yaml").read_text().replace("tp: 1 ", "tp: 2 ")
    assert "tp: 2" in text
    f = tmp_path / "s.yaml"
    f.write_text(text)
    spec = load_spec(f)
    with pytest.raises(TuneInputError, match=r"training.tp=2.*data parallel"):
        TuneSpace.from_spec(spec, resolve_spec_model(spec), data_parallel_only=True)


def test_failure_classification():
    assert _failure(-signal.SIGKILL, "", 10, False)[0] == "oom"
    st, why = _failure(1, "x\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n", 10, False)
    assert st == "oom" and "Tried to allocate" in why
    assert _failure(-9, "", 30, True) == ("timeout", "no result within 30 s (--trial-timeout)")
    st, why = _failure(1, "noise\ndstoolkit.runtime.train.trainer: training failed on rank 0: RuntimeError: boom\ntb\n", 10,
                       False)
    assert st == "error" and "RuntimeError: boom" in why and "(exit 1)" in why


def test_stale_torch_extension_lock_is_removed_only_if_new(tmp_path, monkeypatch):
    import os
    import time

    from dstoolkit.tune.objective import clear_stale_extension_locks

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    old = tmp_path / "py311_cpu" / "fused_adam" / "lock"
    new = tmp_path / "py311_cpu" / "cpu_adam" / "lock"
    for p in (old, new):
        p.parent.mkdir(parents=True)
        p.write_text("")
    past = time.time() - 3600
    os.utime(old, (past, past))  # someone else's lock, older than the trial: left alone
    removed = clear_stale_extension_locks(time.time() - 10, grace_s=0.2)
    assert removed == [str(new)] and not new.exists() and old.exists()

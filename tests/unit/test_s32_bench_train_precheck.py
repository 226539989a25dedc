"""bench train refuses, before launching, a config whose estimate per rank exceeds this host's RAM share, and says
when the spec's cluster differs from the ranks it runs; a config generated from a multi-GPU spec that fails at the
bench's world size names the cluster mismatch and the fix, not a temporary file (s32 sweep/tune findings 1 and 9)."""
from __future__ import annotations

import pathlib

import pytest

from dstoolkit.runtime.bench import targets as targets_mod
from dstoolkit.runtime.bench.harness import BenchInputError
from dstoolkit.runtime.bench.targets import BenchTarget
from dstoolkit.runtime.bench.train_precheck import check_targets_fit, cluster_mismatch

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIG = ROOT / "ds_configs" / "llama3_8b_1x8_h100.yaml"
TINY = ROOT / "ds_configs" / "tiny_cpu.yaml"
GiB = 2**30

ZERO1 = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
         "bf16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
         "zero_optimization": {"stage": 1}}


def _target(spec: pathlib.Path) -> BenchTarget:
    return BenchTarget(name="ds_config", ds_config=dict(ZERO1), ds_config_path=None, spec_path=spec, strategy="zero1")


def test_big_spec_refused_before_launch_with_cluster_note(monkeypatch):
    launched = []
    monkeypatch.setattr("subprocess.run", lambda *a, **k: launched.append(a))
    with pytest.raises(BenchInputError) as exc:
        check_targets_fit([_target(BIG)], 2, None, host_bytes=23 * GiB, cuda=False)
    msg = str(exc.value)
    assert msg.startswith("config 'ds_config': spec llama3_8b_1x8_h100 trains llama-3-8b at seq_len 8192: the "
                          "estimate needs ~")
    assert "GiB per rank > this host's RAM share 11.5 GiB (23.0 GiB / 2 ranks); not launched" in msg
    assert "use --shrink auto with an hf_config model, or a smaller spec" in msg
    assert msg.endswith("(spec llama3_8b_1x8_h100 describes 1 x 8 H100-SXM (8 ranks); bench train runs 2 CPU ranks "
                        "here (--world-size 2))")
    assert "\n" not in msg
    assert launched == []


def test_small_spec_passes_and_cluster_note():
    assert check_targets_fit([_target(TINY)], 2, None, host_bytes=23 * GiB, cuda=False) == []
    # a huge host: the 8B spec fits the RAM share, but its cluster differs from the bench's ranks: a note
    notes = check_targets_fit([_target(BIG)], 2, None, host_bytes=4096 * GiB, cuda=False)
    assert notes == ["spec llama3_8b_1x8_h100 describes 1 x 8 H100-SXM (8 ranks); bench train runs 2 CPU ranks here "
                     "(--world-size 2)"]


def test_cluster_mismatch_none_for_matching_cpu_spec():
    from dstoolkit.spec import load_spec

    assert cluster_mismatch(load_spec(TINY), 2, cuda=False) is None


def test_generated_config_failing_at_bench_world_names_cluster_not_temp_file(tmp_path):
    with pytest.raises(BenchInputError) as exc:
        targets_mod.resolve_targets([str(BIG)], None, ["zero1"], tmp_path, 2)
    msg = str(exc.value)
    assert str(tmp_path) not in msg and "dstoolkit validate" not in msg
    assert msg.endswith("-- spec llama3_8b_1x8_h100 is 1 x 8 H100-SXM (8 ranks) and bench train runs --world-size 2: "
                        "use --shrink auto with an hf_config model (it fits the batch to the ranks), or a CPU spec "
                        "(cluster nodes: 1, gpus_per_node: 2, gpu: cpu, and a global_batch 2 divides)")

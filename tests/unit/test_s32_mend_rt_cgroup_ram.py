"""bench train's RAM precheck reads a container's memory limit (finding 12 of the s32 review): the memory a job
may use is min(physical RAM, cgroup v2 memory.max, cgroup v1 memory.limit_in_bytes), skipping 'max' and unlimited
values, and the refusal names the limit it used."""
from __future__ import annotations

import pathlib

import pytest

from dstoolkit.runtime.bench import train_precheck
from dstoolkit.runtime.bench.harness import BenchInputError
from dstoolkit.runtime.bench.targets import BenchTarget
from dstoolkit.runtime.bench.train_precheck import check_targets_fit, host_ram

GiB = 2**30
TINY = pathlib.Path(__file__).resolve().parents[2] / "ds_configs" / "tiny_cpu.yaml"
ZERO1 = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
         "bf16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
         "zero_optimization": {"stage": 1}}


def _limits(tmp_path, v2=None, v1=None):
    out = []
    for name, value in (("cgroup v2", v2), ("cgroup v1", v1)):
        path = tmp_path / name.replace(" ", "_")
        if value is not None:
            path.write_text(f"{value}\n")
        out.append((name, str(path)))
    return out


def test_the_lowest_limit_wins_and_is_named(tmp_path):
    lim = _limits(tmp_path, v2=8 * GiB, v1=12 * GiB)
    assert host_ram(lim, physical=64 * GiB) == (
        8 * GiB, f"cgroup v2 memory limit in {lim[0][1]} (physical RAM 64.0 GiB)")
    lim = _limits(tmp_path, v2="max", v1=12 * GiB)
    assert host_ram(lim, physical=64 * GiB)[0] == 12 * GiB


@pytest.mark.parametrize("v2, v1", [("max", 9223372036854771712), (None, None), ("garbage", 0),
                                    (128 * GiB, None)])
def test_no_limit_or_one_above_ram_is_physical_ram(tmp_path, v2, v1):
    assert host_ram(_limits(tmp_path, v2=v2, v1=v1), physical=64 * GiB) == (64 * GiB, None)


def test_refusal_names_the_cgroup_limit(tmp_path, monkeypatch):
    lim = _limits(tmp_path, v2=GiB // 1024)  # 1 MiB: even the tiny spec does not fit
    monkeypatch.setattr(train_precheck, "CGROUP_LIMITS", lim)
    target = BenchTarget(name="ds_config", ds_config=dict(ZERO1), ds_config_path=None, spec_path=TINY,
                         strategy="zero1")
    with pytest.raises(BenchInputError) as exc:
        check_targets_fit([target], 2, None, cuda=False)
    msg = str(exc.value)
    assert "> this host's RAM share 0.0 GiB (0.0 GiB / 2 ranks; 0.0 GiB is the cgroup v2 memory limit in " \
           f"{lim[0][1]} (physical RAM " in msg
    assert "not launched (it would be killed for memory)" in msg

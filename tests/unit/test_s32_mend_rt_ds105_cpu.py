"""DS105 (optimizer offload at ZeRO stage 0 with an Adam-family optimizer) fails only on GPUs: DeepSpeedCPUAdam's
first step asserts that the parameters are on the CPU. On CPU ranks (gloo) the parameters are already there and the
run trains. Callers that know the ranks are CPU (`estimate --gpu cpu`, bench on gloo ranks) pass `cpu=True` and get
a warning. `dstoolkit validate` knows no device and keeps the error (finding 10 of the s32 review)."""
from __future__ import annotations

import json

import pytest

from dstoolkit.cli import main
from dstoolkit.runtime.bench import targets
from dstoolkit.runtime.bench.harness import BenchInputError
from dstoolkit.validate import validate_config

S0 = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1,
      "zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}


def _ds105(cfg, **kw):
    return [(f.severity, f.message) for f in validate_config(cfg, **kw) if f.code == "DS105"]


def test_cpu_ranks_make_it_a_warning_that_says_they_train():
    [(sev, msg)] = _ds105(S0)
    assert sev == "error" and msg.endswith("only CPU ranks (gloo) train")
    [(sev, msg)] = _ds105(S0, cpu=True)
    assert sev == "warning" and msg.endswith("these ranks are CPU (gloo), where it trains")
    assert "on GPUs its first step asserts" in msg
    client = {k: v for k, v in S0.items() if k != "optimizer"}  # optimizer from code: DeepSpeedCPUAdam trains on CPU
    assert [s for s, _ in _ds105(client)] == ["error"]
    assert [s for s, _ in _ds105(client, cpu=True)] == ["warning"]


def test_estimate_gpu_cpu_estimates_it_and_a_gpu_refuses_it(tmp_path, capsys):
    path = tmp_path / "s0.json"
    path.write_text(json.dumps(S0))
    args = ["estimate", "--config", str(path), "--model", "tiny", "--world-size", "2", "--seq-len", "128"]
    rc = main([*args, "--gpu", "cpu", "--format", "json"])
    out, _ = capsys.readouterr()
    assert rc == 0
    assert [w["code"] for w in json.loads(out)["validation_warnings"]] == ["DS105"]
    rc = main([*args, "--gpu", "H100-SXM"])
    _, err = capsys.readouterr()
    assert rc == 1 and "error(s) from validate_config: not estimated" in err


def test_bench_validation_on_cpu_ranks_passes_and_on_gpus_refuses():
    targets.validate_ds_config(S0, "s0", 2, cpu=True)
    with pytest.raises(BenchInputError, match="DS105|offload_optimizer at stage 0"):
        targets.validate_ds_config(S0, "s0", 2)


def test_resolve_targets_forwards_the_cpu_ranks(tmp_path):
    path = tmp_path / "s0.json"
    path.write_text(json.dumps(S0))
    [t] = targets.resolve_targets([str(path)], None, None, tmp_path, 2, cpu=True)
    assert t.name == "s0"
    with pytest.raises(BenchInputError):
        targets.resolve_targets([str(path)], None, None, tmp_path, 2)

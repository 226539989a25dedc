"""Which calibration an estimate uses: cluster.calibration, the packaged CPU reference, or none (GPU rows)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dstoolkit.estimate import estimate_run
from dstoolkit.runplan import plan_from_spec
from dstoolkit.hardware.calibration import (PACKAGED, CalibrationInputError, calibration_for_spec, calibration_label,
                                            calibration_from_raw, read_calibration_file)
from dstoolkit.generate.ds_json import build_ds_config
from dstoolkit.generate.sweep import run_sweep
from dstoolkit.models import resolve_spec_model
from dstoolkit.spec import SpecError, load_spec

SPEC = """\
name: cal
model:
  preset: tiny
cluster:
  nodes: 1
  gpus_per_node: 2
  gpu: {gpu}
{extra}training:
  seq_len: 128
  global_batch: 8
  micro_batch: 4
  zero_stage: 1
  precision: bf16
"""

RATES = {"matmul_flops_per_s": 1e10, "mem_bw_bytes_per_s": 1e9, "comm_busbw_bytes_per_s": 5e8}


def spec_at(tmp_path, gpu="cpu", calibration=None):
    extra = f"  calibration: {calibration}\n" if calibration is not None else ""
    p = tmp_path / "spec.yaml"
    p.write_text(SPEC.format(gpu=gpu, extra=extra))
    return load_spec(p)


def step_s(spec) -> float:
    shape = resolve_spec_model(spec)
    from dstoolkit.generate.candidates import Candidate

    cand = Candidate(zero_stage=1, micro_batch=4)
    return estimate_run(plan_from_spec(spec, build_ds_config(spec, shape, cand), shape)).step_time_s


def test_cpu_spec_uses_the_packaged_reference(tmp_path):
    spec = spec_at(tmp_path)
    cal = calibration_for_spec(spec)
    ref = json.loads(PACKAGED["cpu"].read_text())["calibration"]["wall"]
    assert cal is not None
    # bf16 spec: the per-precision bf16 rates of the wall clock are the ones used
    assert cal.matmul_flops_per_s == ref["matmul_flops_per_s_bf16"]
    assert cal.matmul_flops_per_s_large == ref["matmul_flops_per_s_bf16_large"]
    assert cal.comm_busbw_bytes_per_s == ref["comm_busbw_bytes_per_s"]
    assert plan_from_spec(spec, {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1},
                          resolve_spec_model(spec)).calibration == cal
    assert calibration_label(spec) == "reference calibration dstoolkit/data/calibration_cpu_reference.json"


def test_gpu_rows_have_no_default_calibration(tmp_path):
    spec = spec_at(tmp_path, gpu="H100-SXM")
    assert calibration_for_spec(spec) is None
    assert calibration_label(spec) == "nominal hardware-table rates"


def test_spec_calibration_file_relative_to_the_spec_and_none(tmp_path):
    (tmp_path / "cal.json").write_text(json.dumps({"calibration": RATES}))
    own = spec_at(tmp_path, calibration="cal.json")
    assert calibration_for_spec(own).matmul_flops_per_s == 1e10
    # a 10x slower machine than the reference: a slower estimated step, and the file is named in summaries
    assert step_s(own) > 2 * step_s(spec_at(tmp_path))
    assert calibration_label(own) == f"calibration {tmp_path / 'cal.json'}"
    nominal = spec_at(tmp_path, calibration="none")
    assert calibration_for_spec(nominal) is None
    assert step_s(nominal) != step_s(spec_at(tmp_path))


def test_missing_calibration_file_is_a_located_spec_error(tmp_path):
    spec = spec_at(tmp_path, calibration="nope.json")
    with pytest.raises(SpecError) as info:
        calibration_for_spec(spec)
    msg = str(info.value)
    assert "spec.yaml:8:16: cluster.calibration:" in msg
    assert "nope.json: no such calibration file" in msg and "'none'" in msg


def test_incomplete_calibration_names_the_missing_fields(tmp_path):
    (tmp_path / "cal.json").write_text(json.dumps({"matmul_flops_per_s": 1e10}))
    with pytest.raises(SpecError, match=r"mem_bw_bytes_per_s: Field required.*comm_busbw_bytes_per_s: Field required"):
        calibration_for_spec(spec_at(tmp_path, calibration="cal.json"))
    with pytest.raises(CalibrationInputError, match=r"greater than 0"):
        calibration_from_raw({**RATES, "matmul_flops_per_s": -1, "_source": "x.json"}, "bf16")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(CalibrationInputError, match="expected a JSON object"):
        read_calibration_file(tmp_path / "list.json")


def test_sweep_names_the_calibration_and_ranks_zero3_below_zero1_on_cpu(tmp_path):
    spec = spec_at(tmp_path)
    text = (tmp_path / "spec.yaml").read_text().replace("zero_stage: 1", "zero_stage: auto").replace(
        "micro_batch: 4", "micro_batch: auto")
    (tmp_path / "spec.yaml").write_text(text)
    spec = load_spec(tmp_path / "spec.yaml")
    res = run_sweep(spec, resolve_spec_model(spec), top=50, validate=False, advise=False)
    assert "reference calibration" in res.estimator
    # measured on the reference machine (benchmarks/results/tune_vs_grid_cpu2_202611.md): ZeRO-3's per-module
    # gathers make it the slowest stage at every micro-batch; the calibrated estimate agrees on the order
    best = {}
    for r in res.ranked:
        c = r.candidate
        best.setdefault(c.zero_stage, r.estimate.step_time_s)
    assert best[1] < best[3] and best[2] < best[3]


def test_sweep_cli_exits_2_on_a_missing_calibration(tmp_path):
    spec_at(tmp_path, calibration="missing.json")
    proc = subprocess.run([sys.executable, "-c", "import sys; from dstoolkit.cli import main; sys.exit(main())", "sweep",
                           str(tmp_path / "spec.yaml")],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "cluster.calibration" in proc.stderr and "missing.json: no such calibration file" in proc.stderr


@pytest.mark.parametrize("verb", [["estimate"], ["generate", "--out", "OUT"], ["tune", "--budget", "1", "--mode",
                                                                              "estimate", "--out", "OUT"]])
def test_every_spec_verb_refuses_a_missing_calibration_cleanly(tmp_path, verb):
    spec_at(tmp_path, calibration="missing.json")
    args = [a.replace("OUT", str(tmp_path / "out")) for a in verb]
    proc = subprocess.run([sys.executable, "-c", "import sys; from dstoolkit.cli import main; sys.exit(main())",
                           args[0], str(tmp_path / "spec.yaml"), *args[1:]], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "cluster.calibration" in proc.stderr and "missing.json: no such calibration file" in proc.stderr
    assert not (tmp_path / "out").exists()


def _estimate_json(*args):
    proc = subprocess.run([sys.executable, "-c", "import sys; from dstoolkit.cli import main; sys.exit(main())",
                           "estimate", *args, "--format", "json"], capture_output=True, text=True)
    return proc.returncode, (json.loads(proc.stdout) if proc.returncode == 0 else proc.stderr)


def test_estimate_cli_calibration_flag(tmp_path, repo_root):
    cfg = str(repo_root / "ds_configs" / "generated" / "tiny_cpu" / "zero1" / "ds_config.json")
    base = ["--config", cfg, "--model", "tiny", "--world-size", "2", "--gpu", "cpu", "--seq-len", "128"]
    rc, ref = _estimate_json(*base)
    assert rc == 0 and ref["step_time_calibration"].startswith("reference calibration dstoolkit/data/")
    rc, nominal = _estimate_json(*base, "--calibration", "none")
    assert rc == 0 and nominal["step_time_calibration"] == "nominal hardware-table rates"
    assert nominal["step_time_s"] != ref["step_time_s"]
    (tmp_path / "slow.json").write_text(json.dumps(RATES))
    rc, slow = _estimate_json(*base, "--calibration", str(tmp_path / "slow.json"))
    assert rc == 0 and slow["step_time_s"] > 2 * ref["step_time_s"]
    # memory does not depend on the calibration
    assert slow["memory_per_rank_bytes"] == ref["memory_per_rank_bytes"] == nominal["memory_per_rank_bytes"]
    rc, err = _estimate_json(*base, "--calibration", str(tmp_path / "missing.json"))
    assert rc == 2 and "--calibration:" in err and "no such calibration file" in err and "Traceback" not in err
    # the spec form: the flag overrides cluster.calibration
    spec_at(tmp_path, calibration="missing.json")
    rc, over = _estimate_json(str(tmp_path / "spec.yaml"), "--calibration", "none")
    assert rc == 0 and over["step_time_calibration"] == "nominal hardware-table rates"

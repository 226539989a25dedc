"""`dstoolkit estimate` input errors name what the user gave, and ZeRO++ hpZ alone is not refused on CPU.

Before: `--seq-len 0` said "seq_len=0: ..." (RunPlan's field); `estimate SPEC.yaml --calibration base.json` with an
unusable file blamed "SPEC.yaml:3:1: cluster.calibration", a key the spec does not have; and an hpZ-only config
(zero_hpz_partition_size 8, no qwZ / qgZ) on --gpu cpu was refused by LY014 "ZeRO++ qwZ/qgZ need DeepSpeed's CUDA
quantizer kernels": the flag form handed the layout rules zeropp = qwZ or qgZ or hpZ > 1. hpZ is collectives only
(DS221's docstring: hpZ trains on 2 gloo ranks), so only qwZ / qgZ reach LY014 now.
"""
from __future__ import annotations

import json

from tests.unit.estimate_cli_runs import run_estimate as _run, estimate_error as _error

SPEC = """\
name: t
model: {preset: llama-3-8b}
cluster: {nodes: 1, gpus_per_node: 8, gpu: H100-SXM}
training: {seq_len: 4096, global_batch: 64, micro_batch: 1, precision: bf16, zero_stage: 1, tp: 1, pp: 1, ep: 1,
           activation_checkpointing: none}
"""


def test_seq_len_names_the_flag(tmp_path, capsys):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}}))
    for value in ("0", "-5"):
        assert _error(capsys, "--config", cfg, "--model", "llama-3-8b", "--world-size", "8", "--seq-len", value) == (
            f"--seq-len={value}: the sequence length must be > 0 (e.g. --seq-len 4096)")


def test_calibration_beside_a_spec_names_the_flag(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.yaml").write_text(SPEC)
    (tmp_path / "base.json").write_text(json.dumps({"matmul_flops_per_s": 1}))
    assert _error(capsys, "spec.yaml", "--calibration", "base.json") == (
        f"--calibration: {tmp_path / 'base.json'}: not a usable calibration (mem_bw_bytes_per_s: Field required; "
        "comm_busbw_bytes_per_s: Field required); it needs at least matmul_flops_per_s, mem_bw_bytes_per_s and "
        "comm_busbw_bytes_per_s (benchmarks/step_time_fidelity.py writes such a file) (--calibration none for the "
        "hardware table's nominal rates)")
    assert _error(capsys, "spec.yaml", "--calibration", "missing.json") == (
        f"--calibration: {tmp_path / 'missing.json'}: no such calibration file (give a calibration JSON written by "
        "benchmarks/step_time_fidelity.py, 'auto' (the spec's own), 'reference' or 'machine' (--gpu cpu), or "
        "--calibration none for the hardware table's nominal rates)")
    # words stay words, as in the flag form
    rc, out, err = _run(capsys, "spec.yaml", "--calibration", "none", "--format", "json")
    assert rc == 0, err
    assert json.loads(out)["step_time_calibration"] == "nominal hardware-table rates"
    # a word the GPU row cannot use is refused (before: 'reference' fell back to the nominal rates without a word)
    assert _error(capsys, "spec.yaml", "--calibration", "reference").startswith(
        "--calibration: 'reference': there is no packaged reference calibration for H100-SXM (only for cpu)")


def test_hpz_alone_runs_on_cpu_ranks_qwz_does_not(tmp_path, capsys):
    base = ["--model", "tiny", "--world-size", "16", "--gpus-per-node", "8", "--gpu", "cpu", "--seq-len", "128",
            "--calibration", "none"]
    hpz = tmp_path / "hpz.json"
    hpz.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                               "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}}))
    rc, out, err = _run(capsys, "--config", hpz, *base)
    assert rc == 0, err  # before: exit 2, LY014
    assert "16 x cpu, tp=1 pp=1 ep=1 dp=16; ZeRO-3, bf16" in out.splitlines()[0]
    for key in ("zero_quantized_weights", "zero_quantized_gradients"):
        q = tmp_path / f"{key}.json"
        q.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                                 "zero_optimization": {"stage": 3, key: True}}))
        assert _error(capsys, "--config", q, *base).startswith(
            "ZeRO++ qwZ/qgZ need DeepSpeed's CUDA quantizer kernels; the CPU accelerator has no QuantizerBuilder "
            "(--gpu cpu)")  # the flag, not the spec's cluster.gpu

"""SP007 (`dstoolkit validate SPEC.yaml`) says which budget fails, as `dstoolkit estimate` does (s36): device memory
per rank, host RAM per node, or both, with estimate's figures; the layout is the sweep's candidate label, offload
included. Before, the message always said "not to fit in 80 GiB per H100-SXM" and left the offload out, also for a
layout whose device peak fits and whose offloaded states overflow the node's host RAM."""
from __future__ import annotations

import json
from types import SimpleNamespace

from dstoolkit.cli import main
from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.costing import CandidateEstimate
from dstoolkit.generate.io import spec_file_findings
from dstoolkit.spec.checkpoint import CheckpointPolicy

GiB = 2**30

SPEC_405B = """name: l405_1node
model:
  preset: llama-3.1-405b
cluster:
  nodes: 1
  gpus_per_node: 8
  gpu: H100-SXM
training:
  seq_len: 8192
  global_batch: 128
  micro_batch: auto
  precision: bf16
  optimizer: adamw
  lr: 0.0003
  warmup_steps: 2000
  train_steps: 100000
  activation_checkpointing: auto
  tp: auto
  pp: auto
  zero_stage: auto
  offload: {offload}
  zeropp: true
"""


def _estimate(device_fits: bool, host_fits: bool) -> CandidateEstimate:
    return CandidateEstimate(
        memory_per_rank_bytes=100 * GiB if not device_fits else 40 * GiB, memory_breakdown_bytes={},
        host_memory_per_rank_bytes=300 * GiB, device_memory_bytes=80 * GiB, step_time_s=1.0, mfu=0.1,
        fits=device_fits and host_fits, source="test", allowance_bytes=GiB,
        host_memory_per_node_bytes=2400 * GiB, host_memory_node_capacity_bytes=int(1862.6 * GiB),
        host_fits=host_fits, device_fits=device_fits, host_source="cluster.host_memory_per_node_gib")


def _resolution() -> SimpleNamespace:
    cand = Candidate(zero_stage=3, offload_optimizer=True, offload_param=True, tp=1, pp=1, micro_batch=1,
                     checkpoint=CheckpointPolicy(kind="full"))
    return SimpleNamespace(candidate=cand, plan=SimpleNamespace(dp=8, gpu=SimpleNamespace(name="H100-SXM")))


def test_message_names_each_failing_budget_with_its_figures():
    from dstoolkit.generate.io import fit_warning_text  # new in this fix: the other tests run against the old code

    r = _resolution()
    assert fit_warning_text(r, _estimate(device_fits=True, host_fits=False)) == (
        "layout zero3 offload=opt+param tp1 pp1 mb1 ckpt=full (dp=8) is estimated not to fit in host RAM per node: "
        "needs 2400.00 GiB (offloaded states) > 1862.6 GiB available (cluster.host_memory_per_node_gib)")
    assert fit_warning_text(r, _estimate(device_fits=False, host_fits=True)) == (
        "layout zero3 offload=opt+param tp1 pp1 mb1 ckpt=full (dp=8) is estimated not to fit in 80 GiB per H100-SXM: "
        "needs 101.00 GiB per rank (peak + allowance)")
    assert fit_warning_text(r, _estimate(device_fits=False, host_fits=False)) == (
        "layout zero3 offload=opt+param tp1 pp1 mb1 ckpt=full (dp=8) is estimated not to fit in 80 GiB per H100-SXM: "
        "needs 101.00 GiB per rank (peak + allowance), nor in host RAM per node: needs 2400.00 GiB (offloaded states) "
        "> 1862.6 GiB available (cluster.host_memory_per_node_gib)")


def _estimate_json(path: str, capsys) -> dict:
    main(["estimate", path, "--format", "json"])
    return json.loads(capsys.readouterr().out)


def test_host_ram_only_failure_is_said_as_estimate_says_it(tmp_path, capsys):
    """The tester's spec: llama-3.1-405b with offload on one 8 x H100 node. estimate: the device peak fits (47.61 GiB
    with the allowance), host RAM per node does not; validate said 'not to fit in 80 GiB per H100-SXM'."""
    path = tmp_path / "l405_1node.yaml"
    path.write_text(SPEC_405B.format(offload="true"))
    [sp007] = [f for f in spec_file_findings(path) if f.code == "SP007"]
    e = _estimate_json(str(path), capsys)
    assert e["device_fits"] is True and e["host_memory"]["fits"] is False  # the verdict estimate prints
    label = e["assumptions"][0].removeprefix("least memory-hungry layout of the sweep: ")
    assert label == "zero3 offload=opt+param tp1 pp1 mb1 ckpt=full"
    h = e["host_memory"]
    assert sp007.severity == "warning" and sp007.message == (
        f"layout {label} (dp=8) is estimated not to fit in host RAM per node: needs "
        f"{h['per_node_bytes'] / GiB:.2f} GiB (offloaded states) > 1862.6 GiB available (default: 2 TB, an NVIDIA "
        "DGX H100/H200 node's system memory (cluster.host_memory_per_node_gib sets it))")
    assert "80 GiB" not in sp007.message


def test_device_memory_failure_is_said_as_estimate_says_it(tmp_path, capsys):
    """offload: false: no layout's peak fits one H100; host RAM holds nothing offloaded, so it is not named."""
    path = tmp_path / "l405_no_offload.yaml"
    path.write_text(SPEC_405B.format(offload="false"))
    [sp007] = [f for f in spec_file_findings(path) if f.code == "SP007"]
    e = _estimate_json(str(path), capsys)
    assert e["device_fits"] is False and e["host_memory"]["fits"] is True
    label = e["assumptions"][0].removeprefix("least memory-hungry layout of the sweep: ")
    assert label == "zero0 tp1 pp8 mb1 ckpt=full"
    assert sp007.message == (
        f"layout {label} (dp={e['parallel']['dp']}) is estimated not to fit in 80 GiB per H100-SXM: needs "
        f"{e['memory_per_rank_bytes']['required_bytes'] / GiB:.2f} GiB per rank (peak + allowance)")

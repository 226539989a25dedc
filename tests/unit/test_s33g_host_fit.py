"""`estimate` applies the sweep's fit test: the device peak AND host RAM per node (s33 estimator finding 1).

Before: `estimate` printed "fits in 80 GiB: yes", exit 0, JSON fits: true for ZeRO-3 + offload layouts whose
offloaded states need more host RAM per node than cluster.host_memory_per_node_gib (or the default 2 TB), while
`sweep` dropped them for host memory; the sweep's "fits nowhere" sentence gave the device figure as the reason.
Now one function, `generate.costing.fit_verdict`, decides for both.
"""
from __future__ import annotations

import json

from dstoolkit.cli import main
from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.costing import estimate_candidate, fit_verdict
from dstoolkit.generate.sweep import run_sweep
from dstoolkit.models.resolve import resolve_spec_model
from dstoolkit.spec import load_spec
from dstoolkit.spec.checkpoint import CheckpointPolicy

HOST70 = """name: host70
model: {preset: llama-3-70b}
cluster: {nodes: 1, gpus_per_node: 8, gpu: H100-SXM, host_memory_per_node_gib: 512}
training: {seq_len: 4096, global_batch: 16, micro_batch: 1, precision: bf16, optimizer: adamw,
           activation_checkpointing: full, tp: 1, pp: 1, zero_stage: 3, offload: true}
"""


def _spec(tmp_path, text=HOST70):
    p = tmp_path / "host70.yaml"
    p.write_text(text)
    return p


def test_estimate_spec_refuses_a_layout_over_host_ram(tmp_path, capsys):
    rc = main(["estimate", str(_spec(tmp_path))])
    out = capsys.readouterr().out
    assert rc == 1
    assert "does not fit: host RAM 1182.7 GiB per node" in out and "> 512.0 GiB (cluster.host_memory_per_node_gib)" in out
    assert "fix: offload less" in out
    assert "assumed: nothing fits: the layouts that fit in 80 GiB need more host RAM per node than 512.0 GiB" in out
    assert "MFU: none" in out


def test_estimate_spec_json_fits_false_over_host_ram(tmp_path, capsys):
    rc = main(["estimate", str(_spec(tmp_path)), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert doc["fits"] is False and doc["device_fits"] is True and doc["mfu"] is None
    assert doc["host_memory"]["fits"] is False and doc["host_memory"]["node_capacity_bytes"] == 512 * 2**30


def test_estimate_config_applies_the_default_host_ram_and_says_so(tmp_path, capsys):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                               "bf16": {"enabled": True},
                               "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                                     "offload_param": {"device": "cpu"}}}))
    rc = main(["estimate", "--config", str(cfg), "--model", "llama-3.1-405b", "--world-size", "8", "--tp", "8",
               "--checkpoint", "full"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "does not fit: host RAM" in out and "the --config form has no flag for it" in out


def test_sweep_fits_nowhere_names_the_host_ram_limit(tmp_path):
    spec = load_spec(_spec(tmp_path))
    res = run_sweep(spec, resolve_spec_model(spec), advise=False)
    nowhere = res.fits_nowhere
    assert nowhere is not None and nowhere.host_limited
    assert nowhere.host_capacity_bytes == 512 * 2**30
    msg = nowhere.message(spec, spec.cluster.gpu_spec, "llama-3-70b")
    assert "host RAM per node" in msg and "> 512.0 GiB" in msg


def test_estimate_candidate_fits_is_fit_verdict(tmp_path):
    spec = load_spec(_spec(tmp_path))
    shape = resolve_spec_model(spec)
    cand = Candidate(zero_stage=3, offload_optimizer=True, offload_param=True, tp=1, pp=1, micro_batch=1,
                     checkpoint=CheckpointPolicy(kind="full"))
    est = estimate_candidate(spec, shape, cand, spec.cluster.gpu_spec)
    v = fit_verdict(est.memory_per_rank_bytes, spec.cluster.gpu_spec, est.host_memory_per_rank_bytes,
                    spec.cluster.gpus_per_node, spec.cluster)
    assert (est.fits, est.device_fits, est.host_fits) == (v.fits, v.device_fits, v.host_fits) == (False, True, False)

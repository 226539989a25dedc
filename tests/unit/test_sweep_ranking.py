"""`dstoolkit sweep`: enumeration, drop reasons, ranking, explanation, fits-nowhere advice."""
from __future__ import annotations

import json

import pytest
import yaml

from dstoolkit.cli import main
from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.costing import estimate_candidate
from dstoolkit.generate.io import load_spec_and_shape
from dstoolkit.generate.rules import check_candidate
from dstoolkit.generate.candidate_grid import enumerate_candidates
from dstoolkit.generate.sweep import model_state_lower_bound_bytes, run_sweep, zero_model_state_bytes

GB = 1e9


def test_zero_paper_model_states_anchor():
    # ZeRO §3.1 (docs/anchors.md): psi = 7.5B, N = 64: DP 120 GB, ZeRO-2 16.6 GB, ZeRO-3 1.88 GB.
    psi = 7.5e9
    assert zero_model_state_bytes(psi, 0, dp=1, ep=1, zero_stage=0) / GB == pytest.approx(120, rel=0.01)
    assert zero_model_state_bytes(psi, 0, dp=64, ep=1, zero_stage=2) / GB == pytest.approx(16.6, rel=0.01)
    assert zero_model_state_bytes(psi, 0, dp=64, ep=1, zero_stage=3) / GB == pytest.approx(1.88, rel=0.01)
    # stage 1 counted with partitioned gradients (DeepSpeed's stage 1 partitions them too): below the paper's 31.4 GB
    assert zero_model_state_bytes(psi, 0, dp=64, ep=1, zero_stage=1) / GB < 31.4


@pytest.mark.parametrize("stem", ["tiny_moe_cpu", "llama3_8b_1x8_h100"])
def test_lower_bound_never_exceeds_the_estimate(repo_root, stem):
    """The sweep drops candidates whose lower bound exceeds the device without estimating them; that is only
    safe if the bound is below the estimator's total for every candidate it does estimate."""
    spec, shape = load_spec_and_shape(repo_root / "ds_configs" / f"{stem}.yaml")
    gpu = spec.cluster.gpu_spec
    checked = 0
    for c in enumerate_candidates(spec, shape):
        if check_candidate(spec, shape, c) is not None or c.micro_batch != 1:
            continue
        est = estimate_candidate(spec, shape, c, gpu)
        assert model_state_lower_bound_bytes(spec, shape, c) <= est.memory_per_rank_bytes, c.label
        checked += 1
        if checked >= 60:
            break
    assert checked > 5


def test_every_drop_has_a_reason_and_rules_are_named(repo_root):
    spec, shape = load_spec_and_shape(repo_root / "ds_configs" / "mixtral_8x7b_2x8_h100.yaml")
    res = run_sweep(spec, shape, top=3)
    assert res.ranked and res.considered == len(res.dropped) + res.all_ranked_count
    assert all(d.reason and d.code for d in res.dropped)
    # Mixtral: 8 experts; 32 heads; DeepSpeed refuses MoE at stage 3 and ZeRO-2/3 with pipelines
    assert {"moe-zero3", "pp-zero", "memory"} <= set(res.dropped_by_code)
    assert all(r.candidate.zero_stage < 3 for r in res.ranked)
    assert all(r.estimate.fits for r in res.ranked)
    times = [r.estimate.step_time_s for r in res.ranked]
    assert times[0] <= min(times) * 1.005  # ranked by step time (ties within 3 significant digits)


def test_rule_messages_name_fields_and_values(repo_root):
    spec, shape = load_spec_and_shape(repo_root / "ds_configs" / "mixtral_8x7b_2x8_h100.yaml")
    v = check_candidate(spec, shape, Candidate(zero_stage=1, ep=3, micro_batch=1))
    assert v.code == "ep-experts" and "ep=3" in v.message and "8" in v.message
    v = check_candidate(spec, shape, Candidate(zero_stage=1, tp=3, micro_batch=1))
    assert v.code in ("tp-node", "mp-world")
    v = check_candidate(spec, shape, Candidate(zero_stage=2, pp=2, micro_batch=1))
    assert v.code == "pp-zero" and "incompatible with pipeline" in v.message


def test_cli_table_and_json(repo_root, capsys):
    spec = str(repo_root / "ds_configs" / "tiny_moe_cpu.yaml")
    assert main(["sweep", spec, "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "Why #1:" in out and " 1  zero" in out and "moe-zero3" in out
    assert main(["sweep", spec, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["ranked"]) == 3 and doc["winner_reason"].startswith(doc["ranked"][0]["label"] + " wins")
    assert doc["considered"] == len(doc["dropped"]) + doc["fitting"]
    assert all(d["reason"] for d in doc["dropped"])
    assert doc["fits_nowhere"] is None


def test_fits_nowhere_says_what_is_needed_and_what_would_fit(tmp_path, capsys):
    spec = {"name": "big", "model": {"preset": "llama-3-70b"},
            "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "A100-40G"},
            "training": {"seq_len": 4096, "global_batch": 64, "tp": 1, "pp": 1, "zero_stage": 2,
                         "micro_batch": 1, "activation_checkpointing": "full"}}
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["sweep", str(path)]) == 1
    out = capsys.readouterr().out
    assert "fits nowhere on 1 x 8 A100-40G" in out and "GiB per GPU" in out
    # 70.6B params (docs/anchors.md) at ZeRO-2 on 8 GPUs: 2 bytes/param of weights alone is ~131 GiB > 40 GiB
    needed = float(out.split("still needs at least ")[1].split(" GiB")[0])
    assert needed > 70.6e9 * 2 / 2**30
    assert "What would make it fit:" in out
    assert "offload" in out or "more GPUs" in out or "TP and PP" in out
    assert main(["sweep", str(path), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ranked"] == [] and doc["fits_nowhere"]["suggestions"]


def test_bad_input_exit_2(tmp_path, capsys):
    assert main(["sweep", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml: no such file (check the path)" in capsys.readouterr().err

"""cluster.nvlink_domain_gpus: an NVLink fabric that joins several hosts (GB200 / GB300 NVL72). The network model
and the layout rules treat the domain as one node; hosts (launch files, host memory) keep gpus_per_node."""
from __future__ import annotations

import pytest

from dstoolkit.estimate import estimate_run
from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.costing import run_plan_for
from dstoolkit.generate.launch import render_hostfile
from dstoolkit.generate.rules import candidate_names, dims_for
from dstoolkit.hardware.table import get_gpu
from dstoolkit.models import resolve_model
from dstoolkit.spec import Spec, SpecError


def _spec(nodes: int, gpus_per_node: int, domain=None, gpu="GB200", tp: int = 4, pp: int = 4) -> Spec:
    cluster = {"nodes": nodes, "gpus_per_node": gpus_per_node, "gpu": gpu}
    if domain is not None:
        cluster["nvlink_domain_gpus"] = domain
    return Spec.model_validate({
        "name": "nvl", "model": {"preset": "llama-3-70b"}, "cluster": cluster,
        "training": {"seq_len": 8192, "global_batch": 256, "micro_batch": 1, "precision": "fp8", "tp": tp,
                     "pp": pp, "zero_stage": 1, "activation_checkpointing": "none", "framework": "megatron",
                     "offload": False, "zeropp": False}})


def _estimate(spec: Spec):
    t = spec.training
    cand = Candidate(zero_stage=1, tp=t.tp, pp=t.pp, micro_batch=1, sequence_parallel=True)
    return estimate_run(run_plan_for(spec, resolve_model(spec.model), cand))


def test_domain_of_hosts_estimates_as_one_node_of_that_size():
    """16 hosts of 4 GPUs in one 64-GPU NVLink domain price every collective as a 64-GPU node does; without the
    domain the same hosts send TP 4 x PP 4's pipeline and data-parallel traffic over the NICs."""
    hosts = _spec(16, 4, domain=64)
    # one 64-GPU host of the same GPU: a GB200 host holds 4 (gpus_per_host), so its facts are given with that bound
    # lifted, everything else the table's
    gb200 = get_gpu("GB200").model_dump()
    node = _spec(1, 64, gpu={**gb200, "gpus_per_host": 64})
    assert hosts.world_size == node.world_size == 64
    assert hosts.cluster.nvlink_domain == 64 and _spec(16, 4).cluster.nvlink_domain == 4
    a, b, c = _estimate(hosts), _estimate(node), _estimate(_spec(16, 4))
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-12)
    assert c.step_time_s > a.step_time_s  # the same job with NVLink ending at each 4-GPU host
    assert a.memory.total == b.memory.total == c.memory.total


def test_layout_rules_read_the_domain_and_name_it():
    spec = _spec(16, 4, domain=64, tp=8, pp=2)
    cand = Candidate(tp=8, pp=2, zero_stage=1, micro_batch=1)
    assert dims_for(spec, cand).gpus_per_node == 64
    assert candidate_names(spec)["gpus_per_node"] == "cluster.nvlink_domain_gpus"
    assert candidate_names(_spec(16, 4))["gpus_per_node"] == "cluster.gpus_per_node"


def test_launch_files_keep_the_host():
    text = render_hostfile(_spec(16, 4, domain=64))
    assert "node-00 slots=4" in text and "node-15 slots=4" in text and "slots=64" not in text


def test_describe_names_the_domain():
    assert _spec(16, 4, domain=64).cluster.describe("GB200") == "16 x 4 GB200 (NVLink domains of 64)"
    assert _spec(8, 8, gpu="H100-SXM").cluster.describe("H100-SXM") == "8 x 8 H100-SXM"


@pytest.mark.parametrize("nodes,gpn,domain,gpu,needle", [
    (16, 4, 6, "GB200", "nvlink_domain_gpus=6 is not whole hosts of gpus_per_node=4"),
    (32, 4, 128, "GB200", "GB200's NVLink domain is at most 72 GPUs"),
    (4, 8, 16, "H100-SXM", "H100-SXM has NVLink only inside its host"),
])
def test_impossible_domains_are_refused_at_the_field(nodes, gpn, domain, gpu, needle):
    with pytest.raises((SpecError, ValueError)) as exc:
        _spec(nodes, gpn, domain=domain, gpu=gpu, tp=1, pp=1)
    assert needle in str(exc.value) and "nvlink_domain_gpus" in str(exc.value)


def test_estimate_flags_take_the_domain(tmp_path, capsys):
    """`dstoolkit estimate --config/--model` form: --nvlink-domain-gpus prices the 64 GPUs as one NVLink domain
    (faster than 16 separate 4-GPU hosts) and is refused by the spec's own rule, exit 2, naming the flag."""
    import json

    from dstoolkit.cli import main

    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8,
                               "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}))
    base = ["estimate", "--config", str(cfg), "--model", "llama-3-70b", "--world-size", "64", "--gpus-per-node", "4",
            "--gpu", "GB200", "--tp", "4", "--pp", "4", "--seq-len", "8192", "--format", "json"]
    times = []
    for extra in ([], ["--nvlink-domain-gpus", "64"]):
        capsys.readouterr()
        assert main(base + extra) == 0
        times.append(json.loads(capsys.readouterr().out)["step_time_s"])
    assert times[1] < times[0]
    capsys.readouterr()
    assert main(base + ["--nvlink-domain-gpus", "6"]) == 2
    assert "--nvlink-domain-gpus=6 is not whole hosts of gpus_per_node=4" in capsys.readouterr().err

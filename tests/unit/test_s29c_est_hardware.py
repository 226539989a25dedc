"""The hardware table bounds the GPUs of one host, and an unknown --gpu suggests the names that start with it.

Before, `estimate --gpu H100-SXM --gpus-per-node 64` (or 32) was accepted and priced as one NVLink host of 64 while
`--nvlink-domain-gpus 16` was refused ("NVLink only inside its host ... at most 8"), and `--gpu H100` suggested
'H800' (difflib's closest spelling) rather than H100-SXM. The bound lives in the table (GpuSpec.gpus_per_host,
checked by hardware.table.check_gpus_per_host, the one statement of it); the flag form asks it.
"""
from __future__ import annotations

import json

import pytest

from dstoolkit.cli import main
from dstoolkit.hardware.hosts import GpusPerHostError, check_gpus_per_host
from dstoolkit.hardware.table import GPU_TABLE, get_gpu, gpu_name_error


def _error(capsys, *argv) -> str:
    capsys.readouterr()
    rc = main(["estimate", *map(str, argv)])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, out + err
    return err.removeprefix("dstoolkit estimate: error: ").rstrip("\n")


def test_every_gpu_row_states_its_host():
    assert {name: row.gpus_per_host for name, row in GPU_TABLE.items()} == {
        "H100-SXM": 8, "H200": 8, "H800": 8, "B200": 8, "B300": 8, "GB200": 4, "GB300": 4, "A100-80G": 16,
        "A100-40G": 16, "L40S": None, "MI300X": 8, "cpu": None}


def test_check_gpus_per_host():
    check_gpus_per_host(8, get_gpu("H100-SXM"))
    check_gpus_per_host(64, get_gpu("cpu"))  # CPU ranks: no bound
    with pytest.raises(GpusPerHostError) as exc:
        check_gpus_per_host(64, get_gpu("H100-SXM"))
    assert (exc.value.problem, exc.value.fix) == (
        "one H100-SXM host holds at most 8 GPUs (the hardware table's gpus_per_host), not 64",
        "use at most 8 GPUs per node: more GPUs are more nodes; or give the GPU's facts with gpus_per_host")
    with pytest.raises(GpusPerHostError, match=r"NVLink across hosts is nvlink_domain_gpus \(up to 72\)"):
        check_gpus_per_host(8, get_gpu("GB200"))


@pytest.mark.parametrize("gpn", ["64", "32", "16"])
def test_the_flag_form_refuses_more_gpus_than_a_host_holds(tmp_path, capsys, gpn):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}}))
    assert _error(capsys, "--config", cfg, "--model", "llama-3-8b", "--world-size", "64", "--gpus-per-node", gpn) == (
        f"--gpus-per-node {gpn} with --gpu H100-SXM: one H100-SXM host holds at most 8 GPUs (the hardware table's "
        f"gpus_per_host), not {gpn} (use --gpus-per-node 8 or fewer: more GPUs are more nodes of --world-size)")


def test_gb200_hosts_hold_4_and_the_default_follows(tmp_path, capsys):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}}))
    base = ["--config", cfg, "--model", "llama-3-8b", "--world-size", "16", "--gpu", "GB200"]
    assert _error(capsys, *base, "--gpus-per-node", "8") == (
        "--gpus-per-node 8 with --gpu GB200: one GB200 host holds at most 4 GPUs (the hardware table's "
        "gpus_per_host), not 8 (use --gpus-per-node 4 or fewer: more GPUs are more nodes of --world-size; NVLink "
        "across hosts is --nvlink-domain-gpus, up to 72)")
    capsys.readouterr()
    # no --gpus-per-node: min(the host's 4, the world), 4 hosts of 4 (before: 8, a host GB200 does not have)
    assert main(["estimate", *map(str, base), "--format", "json"]) == 0
    with_flag = capsys.readouterr().out
    assert main(["estimate", *map(str, base), "--gpus-per-node", "4", "--format", "json"]) == 0
    assert capsys.readouterr().out == with_flag


@pytest.mark.parametrize("typed,suggested", [
    ("H100", "'H100-SXM'"),  # before: 'H800'
    ("A100", "'A100-80G' or 'A100-40G'"),
    ("GB", "'GB200' or 'GB300'"),
])
def test_did_you_mean_prefers_what_the_name_starts_with(typed, suggested):
    assert gpu_name_error(typed).startswith(f"unknown GPU {typed!r} (did you mean {suggested}? known: H100-SXM, ")
    # where nothing starts with it, the closest spelling, as before
    for other in ("H10-SXM", "h100 sxm5"):
        assert gpu_name_error(other).startswith(f"unknown GPU {other!r} (did you mean 'H100-SXM'? known: ")


def test_the_gpu_flag_is_named(tmp_path, capsys):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}}))
    assert _error(capsys, "--config", cfg, "--model", "llama-3-8b", "--world-size", "8", "--gpu", "H100").startswith(
        "--gpu: unknown GPU 'H100' (did you mean 'H100-SXM'? known: H100-SXM, H200, H800, ")

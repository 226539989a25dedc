"""`dstoolkit estimate` says what is offloaded where, and that NVMe offload is counted as host memory.

Before, the header read "ZeRO-3 + optimizer offload" for offload_param nvme + offload_optimizer cpu, and plain
"ZeRO-3" for offload_param cpu alone, though the parameters were modelled off the GPU; NVMe-offloaded bytes were
counted in "host (offload) per rank" exactly like cpu, without a word. The estimator's formulas are unchanged
(estimate/zero_states.py counts host_params / host_master_params / host_optimizer_states for cpu and nvme alike, and
step_time.py times both at PCIE_BYTES_PER_S): the output now names the devices and says so.
"""
from __future__ import annotations

import json

import pytest

from dstoolkit.cli import main

BASE = ["--model", "llama-3-8b", "--world-size", "8"]
NVME_NOTE = ("NVMe offload: the parameter partition is counted in 'host (offload) per rank' as host RAM (the "
             "estimator has no disk term); the run keeps it in swap files under nvme_path and holds DeepSpeed's "
             "pinned swap buffers in host RAM instead (offload_param.buffer_count x buffer_size elements), which are "
             "not counted; the offload traffic is timed at PCIe rates (estimate.step_time PCIE_BYTES_PER_S), not the "
             "drive's, so the step time is optimistic")


def _cfg(tmp_path, stage, **offload):
    path = tmp_path / "ds.json"
    zero = {"stage": stage, **{k: ({"device": d, "nvme_path": "/local_nvme"} if d == "nvme" else {"device": d})
                               for k, d in offload.items()}}
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                                "aio": {"block_size": 1048576}, "zero_optimization": zero}))
    return path


def _run(capsys, *argv):
    capsys.readouterr()
    rc = main(["estimate", *map(str, argv)])
    out, err = capsys.readouterr()
    assert rc == 0 and "Traceback" not in err, out + err
    return out


@pytest.mark.parametrize("stage,offload,header", [
    (3, {"offload_param": "nvme", "offload_optimizer": "cpu"}, "ZeRO-3 + offload: optimizer -> cpu, params -> nvme, "),
    (3, {"offload_param": "cpu"}, "ZeRO-3 + offload: params -> cpu, "),  # before: "ZeRO-3, "
    (3, {"offload_param": "nvme"}, "ZeRO-3 + offload: params -> nvme, "),
    (3, {"offload_optimizer": "nvme"}, "ZeRO-3 + offload: optimizer -> nvme, "),
    (2, {"offload_optimizer": "cpu"}, "ZeRO-2 + offload: optimizer -> cpu, "),
])
def test_the_header_names_what_goes_where(tmp_path, capsys, stage, offload, header):
    out = _run(capsys, "--config", _cfg(tmp_path, stage, **offload), *BASE)
    assert f"dp=8; {header}bf16, micro batch 1" in out.splitlines()[0]
    nvme = "nvme" in offload.values()
    host = next(x for x in out.splitlines() if x.startswith("host (offload) per rank"))
    assert host.endswith("   (NVMe-offloaded bytes counted here: see assumed)") == nvme
    assert ("  assumed: NVMe offload: " in out) == nvme


def test_nvme_is_said_to_be_counted_as_host(tmp_path, capsys):
    cfg = _cfg(tmp_path, 3, offload_param="nvme")
    out = json.loads(_run(capsys, "--config", cfg, *BASE, "--format", "json"))
    assert out["offload"] == {"optimizer": None, "params": "nvme", "nvme_counted_as_host": True}
    assert NVME_NOTE in out["assumptions"]
    # the bytes are the cpu run's: only the labels differ
    cpu = json.loads(_run(capsys, "--config", _cfg(tmp_path, 3, offload_param="cpu"), *BASE, "--format", "json"))
    assert cpu["offload"] == {"optimizer": None, "params": "cpu", "nvme_counted_as_host": False}
    assert out["host_memory_per_rank_bytes"] == cpu["host_memory_per_rank_bytes"] > 0
    assert not any(a.startswith("NVMe offload") for a in cpu["assumptions"])
    both = json.loads(_run(capsys, "--config", _cfg(tmp_path, 3, offload_param="nvme", offload_optimizer="nvme"),
                           *BASE, "--format", "json"))
    assert [a for a in both["assumptions"] if a.startswith("NVMe offload")] == [
        "NVMe offload: the optimizer states (fp32 master weights and moments) and the parameter partition are counted "
        "in 'host (offload) per rank' as host RAM (the estimator has no disk term); the run keeps them in swap files "
        "under nvme_path and holds DeepSpeed's pinned swap buffers in host RAM instead (offload_optimizer.buffer_count "
        "buffers; offload_param.buffer_count x buffer_size elements), which are not counted; the offload traffic is "
        "timed at PCIe rates (estimate.step_time PCIE_BYTES_PER_S), not the drive's, so the step time is optimistic"]


def test_no_offload_json(tmp_path, capsys):
    out = json.loads(_run(capsys, "--config", _cfg(tmp_path, 1), *BASE, "--format", "json"))
    assert out["offload"] == {"optimizer": None, "params": None, "nvme_counted_as_host": False}

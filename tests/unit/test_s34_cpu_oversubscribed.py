"""s34: a CPU estimate from this machine's calibration says when the spec puts more ranks on a node than the
calibrated machine has cores. The probe measures ranks that each have a core (torch.set_num_threads(1), PROBE_RANKS
side by side), so its per-rank rates hold on a host with a core per rank; 16 ranks on this 2-core machine would
share 2 cores (~8x slower each), and the estimate said nothing."""
from __future__ import annotations

import json

from dstoolkit.hardware import calibration as cal
from dstoolkit.hardware import machine_calibration as machine


def test_note_only_when_ranks_exceed_cores():
    assert cal.oversubscribed_note(2, 2) == ""
    assert cal.oversubscribed_note(8, 16) == ""
    assert cal.oversubscribed_note(16, None) == ""
    assert cal.oversubscribed_note(16, 2) == (
        " (measured with a core per rank; this machine has 2 cores, so 16 ranks per node would share them here, "
        "~8x slower per rank: the step time holds on hosts with at least 16 cores)")


def _spec(tmp_path, ranks):
    from dstoolkit.generate.io import load_spec_and_shape

    p = tmp_path / f"cpu{ranks}.yaml"
    p.write_text(f"name: cpu{ranks}\nmodel: {{preset: tiny}}\n"
                 f"cluster: {{nodes: 1, gpus_per_node: {ranks}, gpu: cpu}}\n"
                 "training: {seq_len: 128, global_batch: 64, micro_batch: 1, precision: bf16, tp: 1, pp: 1, "
                 "zero_stage: 1}\n")
    return load_spec_and_shape(p)[0]


def test_label_of_a_machine_calibration(tmp_path, monkeypatch):
    monkeypatch.setenv("DSTOOLKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(cal.ENV_VAR, raising=False)  # the test session pins the reference calibration
    key = machine.machine_key()
    target = machine.cache_dir() / f"cpu-{machine._key_digest(key)}.json"
    target.parent.mkdir(parents=True)
    ref = json.loads(cal.DATA_DIR.joinpath("calibration_cpu_reference.json").read_text())
    target.write_text(json.dumps({**ref, "machine": {**key, "cores": 2}}))
    assert machine.cached_machine_calibration_path(key) == target
    two, sixteen = cal.calibration_label(_spec(tmp_path, 2)), cal.calibration_label(_spec(tmp_path, 16))
    assert two == f"this machine's calibration {target}"
    assert sixteen == two + cal.oversubscribed_note(16, 2)

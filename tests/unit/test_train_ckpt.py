"""Checkpoint manifest: truncation and corruption are detected, the previous checkpoint is chosen."""
import json

from dstoolkit.runtime.train.ckpt import MANIFEST_NAME, CheckpointManager, tag_for, verify, write_manifest


def _fake_ckpt(root, step, healthy=True):
    d = root / tag_for(step)
    d.mkdir(parents=True)
    (d / "mp_rank_00_model_states.pt").write_bytes(bytes(range(256)) * 8)
    (d / "zero_pp_rank_1_optim_states.pt").write_bytes(b"x" * 1000)
    write_manifest(d, {"step": step, "healthy": healthy})
    return d


def test_intact_truncated_corrupt_and_unfinished(tmp_path):
    d = _fake_ckpt(tmp_path, 3)
    assert verify(d) is None
    f = d / "zero_pp_rank_1_optim_states.pt"
    f.write_bytes(b"x" * 10)
    assert verify(d) == "step_00000003: zero_pp_rank_1_optim_states.pt is 10 bytes, the manifest says 1000 (truncated)"
    f.write_bytes(b"y" * 1000)
    assert verify(d) == ("step_00000003: zero_pp_rank_1_optim_states.pt does not match its SHA-256 in the manifest "
                         "(corrupted)")
    (d / MANIFEST_NAME).write_text('{"format": 1, "files": {"a.pt": {"size": 3}}}')  # a damaged record: no traceback
    assert verify(d).startswith(f"step_00000003: {MANIFEST_NAME} is damaged: the record of 'a.pt' is ")
    (d / MANIFEST_NAME).write_text('{"format": 1, "files": []}')
    assert verify(d).startswith(f"step_00000003: {MANIFEST_NAME} is damaged: its \"files\" is a JSON list")
    (d / MANIFEST_NAME).write_text('{"format": 1, "files": {}}')
    assert verify(d).startswith(f"step_00000003: {MANIFEST_NAME} lists no files")
    (d / MANIFEST_NAME).unlink()
    assert verify(d) == f"step_00000003: {MANIFEST_NAME} is missing: the save did not finish (the trainer writes it last)"


def test_latest_valid_falls_back_and_honours_limits(tmp_path):
    mgr = CheckpointManager(tmp_path)
    _fake_ckpt(tmp_path, 3)
    _fake_ckpt(tmp_path, 6, healthy=False)
    d9 = _fake_ckpt(tmp_path, 9)
    (d9 / "mp_rank_00_model_states.pt").write_bytes(b"")
    assert mgr.tags() == [tag_for(9), tag_for(6), tag_for(3)]
    found = mgr.latest_valid()
    assert found.tag == tag_for(6) and "truncated" in found.rejected[0]
    found = mgr.latest_valid(require_healthy=True)
    assert found.tag == tag_for(3) and "cooling down" in found.rejected[1]
    assert mgr.latest_valid(max_step=2).tag is None
    manifest = json.loads((tmp_path / tag_for(3) / MANIFEST_NAME).read_text())
    assert manifest["step"] == 3 and len(manifest["files"]) == 2

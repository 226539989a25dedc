"""`estimate --config` reads the DeepSpeed JSON with validate's reader (finding 6 of the s32 validate/fp8 report):
a UTF-8 BOM, comments and trailing commas (hjson, as DeepSpeed reads them) are estimated, with validate's DS010 /
DS011 warnings; YAML gets validate's DS006 message."""
from __future__ import annotations

import json

from dstoolkit.cli import main

BASE = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2}}
ARGS = ["--model", "llama-3-8b", "--world-size", "8", "--seq-len", "2048", "--format", "json"]


def _estimate(path, capsys):
    rc = main(["estimate", "--config", str(path), *ARGS])
    out, err = capsys.readouterr()
    return rc, out, err


def test_bom_and_comments_estimate_as_the_plain_json(tmp_path, capsys):
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(BASE))
    rc, out, _ = _estimate(plain, capsys)
    assert rc == 0
    ref = json.loads(out)["memory_per_rank_bytes"]["total"]
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(BASE).encode())
    rc, out, err = _estimate(bom, capsys)
    assert rc == 0 and "Traceback" not in err
    assert json.loads(out)["memory_per_rank_bytes"]["total"] == ref
    hj = tmp_path / "comments.json"
    hj.write_text('{\n  // micro batch\n  "train_micro_batch_size_per_gpu": 1,\n  "gradient_accumulation_steps": 1,\n'
                  '  "bf16": {"enabled": true},\n  "zero_optimization": {"stage": 2,},\n}\n')
    rc, out, err = _estimate(hj, capsys)
    assert rc == 0
    d = json.loads(out)
    assert d["memory_per_rank_bytes"]["total"] == ref
    assert sorted(w["code"] for w in d["validation_warnings"]) == ["DS010", "DS011"]  # one note per kind and file


def test_yaml_gets_validates_ds006_message(tmp_path, capsys):
    y = tmp_path / "ds.yaml"
    y.write_text("train_micro_batch_size_per_gpu: 1\nzero_optimization:\n  stage: 2\n")
    rc, _, err = _estimate(y, capsys)
    assert rc == 2
    assert err.strip().splitlines() == [
        f"dstoolkit estimate: error: {y}:1:1: error[DS006]: this is YAML, not a JSON DeepSpeed config (expected '{{' "
        "at the start of the config, found 't') (DeepSpeed reads JSON/hjson; convert it (e.g. yaml.safe_load + "
        "json.dump) or pass the .json config)"]

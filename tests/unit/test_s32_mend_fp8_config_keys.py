"""s32 review findings 1, 2 and 8: `estimate --config` accepts what `validate` passes (a top-level key validate
reports only as a DS101 warning is dropped, with that warning, not refused with a bare pydantic message); a
top-level `fp8` in a DeepSpeed JSON is refused by `fp8 plan --config` and named by validate; both verbs read a
DeepSpeed JSON with one reader (`validate.parse.read_config_file`)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dstoolkit.cli import main

CORPUS_MSAMP = Path(__file__).parents[1] / "corpus" / "Azure__MS-AMP__examples__ds_config_zero_te_msamp.json"
DS = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
      "zero_optimization": {"stage": 2}}
EST = ["--model", "llama-3-8b", "--world-size", "8", "--seq-len", "2048"]


def _run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_corpus_msamp_config_estimates_as_validate_passes_it(capsys):
    rc, _, _ = _run(["validate", str(CORPUS_MSAMP)], capsys)
    assert rc == 0
    rc, out, err = _run(["estimate", "--config", str(CORPUS_MSAMP), *EST], capsys)
    assert rc == 0, err
    assert "Extra inputs" not in err
    assert "warning[DS101]: unknown key 'msamp' in the top level" in out


@pytest.mark.parametrize("key", ["msamp", "cuda_visible_devices"])
def test_unknown_top_level_key_is_dropped_with_validates_warning(tmp_path, capsys, key):
    plain_cfg = tmp_path / "plain.json"
    plain_cfg.write_text(json.dumps(DS))
    _, plain, _ = _run(["estimate", "--config", str(plain_cfg), *EST, "--format", "json"], capsys)
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({**DS, key: {"enabled": True}}))
    rc, out, err = _run(["estimate", "--config", str(cfg), *EST, "--format", "json"], capsys)
    assert rc == 0, err
    got, want = json.loads(out), json.loads(plain)
    warnings = got.pop("validation_warnings")
    assert [(w["code"], w["severity"], w["pointer"]) for w in warnings] == [("DS101", "warning", f"/{key}")]
    want.pop("validation_warnings")
    assert got == want  # the estimate of the config without the key DeepSpeed ignores


def test_near_miss_top_level_key_still_refused(tmp_path, capsys):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({**DS, "train_micro_batch_size_per_gpus": 1}))
    rc, out, err = _run(["estimate", "--config", str(cfg), *EST], capsys)
    assert rc == 1 and "error[DS101]" in err


def _top_fp8(tmp_path, precision="fp16", dstoolkit=False):
    cfg = tmp_path / "top_fp8.json"
    data = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, precision: {"enabled": True},
            "zero_optimization": {"stage": 2}, "fp8": {"layers": {"skip_first_layers": 16}}}
    if dstoolkit:
        data["dstoolkit"] = {"fp8": {"recipe": "delayed"}}
    cfg.write_text(json.dumps(data))
    return cfg


@pytest.mark.parametrize("dstoolkit", [False, True])
def test_fp8_plan_refuses_top_level_fp8_in_deepspeed_json(tmp_path, capsys, dstoolkit):
    cfg = _top_fp8(tmp_path, "bf16", dstoolkit)
    rc, out, err = _run(["fp8", "plan", "llama-3-8b", "--config", str(cfg)], capsys)
    assert rc == 2 and out == ""
    assert err.splitlines() == [
        f"dstoolkit fp8 plan: error: {cfg} is a DeepSpeed config with a top-level 'fp8' section, which neither "
        "DeepSpeed nor dstoolkit reads there: move it under dstoolkit.fp8 (\"dstoolkit\": {\"fp8\": {...}})"]


def test_fp8_settings_file_with_top_level_fp8_still_read(tmp_path, capsys):
    cfg = tmp_path / "fp8.json"
    cfg.write_text(json.dumps({"fp8": {"layers": {"skip_first_layers": 16}}}))
    rc, out, _ = _run(["fp8", "plan", "llama-3-8b", "--config", str(cfg)], capsys)
    assert rc == 0 and "skip" in out


def test_validate_names_top_level_fp8_in_deepspeed_json(tmp_path, capsys):
    cfg = _top_fp8(tmp_path)
    rc, out, _ = _run(["validate", str(cfg)], capsys)
    assert rc == 0
    line = next(x for x in out.splitlines() if "DS101" in x)
    assert "unknown key 'fp8' in the top level" in line
    assert "move it under dstoolkit.fp8" in line and "MS-AMP" not in line


def test_one_reader_for_both_verbs(tmp_path, monkeypatch):
    from dstoolkit.cli import estimate_flags, fp8
    from dstoolkit.validate import config_file as parse

    bad = tmp_path / "bad.json"
    bad.write_text('{"bf16": ')
    with pytest.raises(ValueError) as e:
        parse.read_config_file(str(bad))
    assert "error[DS0" in str(e.value)
    calls = []
    real = parse.read_config_file
    monkeypatch.setattr(parse, "read_config_file", lambda p: calls.append(p) or real(p))
    good = tmp_path / "good.json"
    good.write_text('{"bf16": {"enabled": true}, // comment\n}')
    assert estimate_flags.read_config(str(good))[1] == {"bf16": {"enabled": True}}
    assert fp8._read_settings(good) == {"bf16": {"enabled": True}}
    assert calls == [str(good), str(good)]
    with pytest.raises(ValueError, match=r"error\[DS0"):
        fp8._read_settings(bad)

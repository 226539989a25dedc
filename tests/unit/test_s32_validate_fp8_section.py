"""A DeepSpeed config with a dstoolkit.fp8 section: DeepSpeedConfig checks it against Fp8Config but keeps the dict the
field is typed as, so dumping the model (its own rule check, estimate --config) prints no pydantic serializer
warning on stderr."""
from __future__ import annotations

import json
import warnings

import pytest
from pydantic import ValidationError

from dstoolkit.dsconfig.deepspeed import DeepSpeedConfig

CFG = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
       "zero_optimization": {"stage": 2},
       "dstoolkit": {"fp8": {"recipe": "delayed", "layers": {"skip_first_layers": 16, "skip_last_layers": 15}}}}


def test_fp8_section_validates_and_dumps_without_serializer_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = DeepSpeedConfig.model_validate(CFG, context={"world_size": 8})
        dumped = model.model_dump(by_alias=True, exclude_unset=True)
    assert model.dstoolkit.fp8 == CFG["dstoolkit"]["fp8"]
    assert dumped["dstoolkit"] == CFG["dstoolkit"]


def test_a_bad_fp8_section_is_still_refused():
    bad = {**CFG, "dstoolkit": {"fp8": {"recipe": "nope"}}}
    with pytest.raises(ValidationError) as exc:
        DeepSpeedConfig.model_validate(bad)
    assert exc.value.errors()[0]["loc"][:2] == ("dstoolkit", "fp8")


def test_estimate_with_an_fp8_section_writes_nothing_to_stderr(tmp_path, capsys):
    from dstoolkit.cli import main

    cfg = tmp_path / "fp8_skip31.json"
    cfg.write_text(json.dumps(CFG))
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")  # every warning a user's shell would show
        rc = main(["estimate", "--config", str(cfg), "--model", "llama-3-8b", "--world-size", "8", "--seq-len", "2048"])
    captured = capsys.readouterr()
    assert [str(w.message) for w in shown] == []
    assert rc == 0 and captured.err == "" and captured.out.startswith("model llama-3-8b")

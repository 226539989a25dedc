"""`ckpt export --config <a folder>` (s31 finding 16c): it said "<folder>: does not exist" for a folder that exists.
Now a folder holding config.json is taken (resolved by models.hf.hf_config_file, as `model.hf_config` is), and one
without it is named as such.
"""
from __future__ import annotations

import json

import pytest

from dstoolkit.ckpt.errors import CkptError
from dstoolkit.cli import main

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")


def _zero0(root):
    from tests.unit.test_ckpt_fuzz_export import _zero0 as make

    return make(root)[0]


def test_export_config_may_be_the_folder_holding_config_json(tmp_path, capsys):
    ck = _zero0(tmp_path / "ck")
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (ck / "config.json").rename(model_dir / "config.json")
    assert main(["ckpt", "export", str(ck), "--hf", str(tmp_path / "hf"), "--config", str(model_dir)]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "llama"
    assert "wrote" in capsys.readouterr().out


def test_export_config_folder_without_config_json_is_named(tmp_path):
    from dstoolkit.runtime.ckpt.export import export_hf

    ck = _zero0(tmp_path / "ck")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CkptError, match=r"is a folder without config\.json; give --config the model's HF "
                                        r"config\.json, or the folder the model was saved to") as e:
        export_hf(ck, tmp_path / "hf", config=empty)
    assert e.value.file == str(empty) and not (tmp_path / "hf").exists()
    with pytest.raises(CkptError, match="does not exist"):
        export_hf(ck, tmp_path / "hf", config=tmp_path / "nope.json")

"""accelerate_config.yaml and training_args.json name the folder's ds_config_hf.json by absolute path when `generate`
knows the folder (accelerate and HF read a relative path against the directory they are launched from), and the YAML
says so in a comment; committed goldens (no folder) keep the bare name and say what it is relative to.

Before: both files held "ds_config_hf.json", so `accelerate launch --config_file DIR/accelerate_config.yaml` from any
other directory failed with accelerate's "Expected a string path to an existing deepspeed config".
"""
from __future__ import annotations

import json

import yaml

from dstoolkit.cli import main
from dstoolkit.generate.hf_launch import accelerate_config_yaml

SPEC = """\
name: hfpaths
model: {preset: tiny}
cluster: {nodes: 1, gpus_per_node: 2, gpu: cpu}
training: {seq_len: 128, global_batch: 8, precision: bf16, zero_stage: 1}
"""


def test_absolute_json_path_from_any_directory(tmp_path, monkeypatch):
    from accelerate.commands.config.config_args import load_config_from_file

    (tmp_path / "spec.yaml").write_text(SPEC)
    out = tmp_path / "a b: c #d" / "out"  # YAML-significant characters in the path
    assert main(["generate", str(tmp_path / "spec.yaml"), "-o", str(out), "--strategy", "zero1",
                 "--target", "accelerate"]) == 0
    folder = out / "zero1"
    want = str(folder / "ds_config_hf.json")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config_from_file(str(folder / "accelerate_config.yaml"))  # accelerate's own loader
    assert cfg.deepspeed_config["deepspeed_config_file"] == want
    assert json.loads((folder / "training_args.json").read_text())["deepspeed"] == want
    text = (folder / "accelerate_config.yaml").read_text()
    assert text.startswith("# deepspeed_config_file is this folder's ds_config_hf.json by absolute path, written by "
                           "dstoolkit generate:\n# `accelerate launch --config_file` works from any directory. After "
                           "moving the folder, regenerate it\n# or run launch_accelerate.sh, which passes the JSON's "
                           "current path.\n")
    # the launch scripts pass the JSON beside them, wherever the folder is now
    assert '--deepspeed "$HERE/ds_config_hf.json"' in (folder / "launch_hf.sh").read_text()
    assert '--deepspeed_config_file "$HERE/ds_config_hf.json"' in (folder / "launch_accelerate.sh").read_text()


def test_relative_path_says_so():
    text = accelerate_config_yaml({"deepspeed_config": {"deepspeed_config_file": "ds_config_hf.json"}, "x": True})
    assert text == ("# deepspeed_config_file (ds_config_hf.json) is relative to the directory accelerate is launched "
                    "from: run\n# launch_accelerate.sh (it passes the JSON's path) or `accelerate launch` from this "
                    "folder; `dstoolkit\n# generate -o DIR` writes it by absolute path.\ndeepspeed_config:\n"
                    "  deepspeed_config_file: ds_config_hf.json\nx: true\n")
    assert yaml.safe_load(text)["deepspeed_config"]["deepspeed_config_file"] == "ds_config_hf.json"



def test_ulysses_note_only_for_a_ulysses_layout(tmp_path):
    """Before: every launch_hf.sh / launch_accelerate.sh held the Ulysses note, with or without Ulysses."""
    from dstoolkit.generate.candidates import Candidate
    from dstoolkit.generate.hf_targets import ULYSSES_NOTE, launch_notes
    from dstoolkit.generate.io import load_spec_and_shape

    (tmp_path / "spec.yaml").write_text(SPEC)
    out = tmp_path / "out"
    assert main(["generate", str(tmp_path / "spec.yaml"), "-o", str(out), "--strategy", "zero1",
                 "--target", "accelerate"]) == 0
    for name in ("launch_hf.sh", "launch_accelerate.sh"):
        assert "NOTE" not in (out / "zero1" / name).read_text()
    spec, shape = load_spec_and_shape(tmp_path / "spec.yaml")
    base = dict(zero_stage=1, tp=1, pp=1, micro_batch=1)
    assert launch_notes(spec, shape, Candidate(**base)) == []
    assert launch_notes(spec, shape, Candidate(**base, ulysses=2)) == [ULYSSES_NOTE]

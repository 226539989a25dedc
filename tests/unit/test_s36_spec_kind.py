"""s36: every verb that reads a SPEC (sweep, estimate SPEC, tune, generate) names a DeepSpeed config given in its
place, once, with the verb the user ran; before, only generate did and the others printed one 'unknown key' line
per DeepSpeed key (`dstoolkit.cli.spec_kind`)."""
from __future__ import annotations

import shutil

import pytest

from dstoolkit.cli import main

TINY_CONFIG = "ds_configs/generated/tiny_cpu/zero2/ds_config.json"


@pytest.mark.parametrize("verb, extra, name", [
    ("sweep", [], "sweep"),
    ("estimate", [], "estimate SPEC"),
    ("tune", ["--budget", "2", "-o", "{tmp}/study"], "tune"),
    ("generate", ["-o", "{tmp}/out"], "generate"),
])
def test_spec_verbs_refuse_a_deepspeed_config_once(verb, extra, name, tmp_path, repo_root, capsys):
    config = tmp_path / "ds.json"
    shutil.copy(repo_root / TINY_CONFIG, config)
    rc = main([verb, str(config), *[a.format(tmp=tmp_path) for a in extra]])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.splitlines() == [
        f"dstoolkit {verb}: error: {config} is a DeepSpeed config (top-level train_batch_size, "
        f"train_micro_batch_size_per_gpu, gradient_accumulation_steps, ...), not a spec: {name} takes a spec "
        "(model + cluster + training sections), e.g. ds_configs/tiny_cpu.yaml; a DeepSpeed config goes to "
        f"`dstoolkit validate {config}` or `dstoolkit estimate --config {config} --model NAME --world-size N`"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.json"]  # nothing written


@pytest.mark.parametrize("verb", ["sweep", "estimate", "tune"])
def test_a_spec_with_a_stray_deepspeed_key_keeps_the_spec_loaders_error(verb, tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    spec.write_text("name: x\nmodel: {preset: tiny}\ntrain_batch_size: 8\n")
    extra = ["--budget", "2", "-o", str(tmp_path / "study")] if verb == "tune" else []
    assert main([verb, str(spec), *extra]) == 2
    err = capsys.readouterr().err
    assert "is a DeepSpeed config" not in err and "train_batch_size: unknown key" in err

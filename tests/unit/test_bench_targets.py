"""Bench targets: specs expand to generated strategies (unique names, ep from launch.sh), bad configs refused."""
import json

import pytest

from dstoolkit.runtime.bench import targets
from dstoolkit.runtime.bench.harness import BenchInputError


def test_two_specs_give_unique_prefixed_names_and_ep(tmp_path, repo_root):
    specs = [str(repo_root / "ds_configs" / "tiny_cpu.yaml"), str(repo_root / "ds_configs" / "tiny_moe_cpu.yaml")]
    ts = targets.resolve_targets(specs, None, None, tmp_path, 2)
    names = [t.name for t in ts]
    assert len(names) == len(set(names)) >= 6
    assert "tiny_cpu/zero2" in names and "tiny_moe_cpu/zero2" in names
    eps = {t.name: t.ep_size for t in ts}
    assert eps["tiny_moe_cpu/zero1-ep"] == 2 and eps["tiny_moe_cpu/zero1"] == 1
    assert all(t.spec_path is not None and t.spec_path.is_file() for t in ts)
    only = targets.resolve_targets(specs[1:], None, ["zero2-ep"], tmp_path, 2)
    assert [(t.name, t.ep_size) for t in only] == [("zero2-ep", 2)]
    with pytest.raises(BenchInputError, match="no such strategy"):
        targets.resolve_targets(specs[:1], None, ["zero9"], tmp_path, 2)


def test_invalid_json_and_invalid_config_are_input_errors(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{"zero_optimization": ')
    with pytest.raises(BenchInputError, match="not valid JSON"):
        targets.resolve_targets([str(broken)], None, None, tmp_path, 2)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"train_batch_size": 6, "train_micro_batch_size_per_gpu": 4,
                               "gradient_accumulation_steps": 1}))
    with pytest.raises(BenchInputError, match="fails validation.*train_batch_size"):
        targets.resolve_targets([str(bad)], None, None, tmp_path, 2)


def test_generated_folders_given_relative_give_absolute_paths_and_spec_names(tmp_path, repo_root, monkeypatch):
    """`bench train ds_configs/generated/tiny_cpu ds_configs/generated/tiny_moe_cpu/zero1-ep` from the repo root:
    the ranks run in their own folder, so every path must be absolute; a strategy folder given directly is named
    spec/strategy."""
    monkeypatch.chdir(repo_root)
    ts = targets.resolve_targets(["ds_configs/generated/tiny_cpu", "ds_configs/generated/tiny_moe_cpu/zero1-ep"],
                                 None, None, tmp_path, 2)
    names = [t.name for t in ts]
    assert "tiny_cpu/zero2" in names and "tiny_moe_cpu/zero1-ep" in names
    for t in ts:
        assert t.ds_config_path.is_absolute() and t.spec_path is not None and t.spec_path.is_absolute()
        assert t.spec_path.is_file()
    moe = next(t for t in ts if t.name == "tiny_moe_cpu/zero1-ep")
    assert moe.ep_size == 2


def test_trainer_command_paths_are_absolute(tmp_path, monkeypatch):
    from dstoolkit.runtime.bench import train

    monkeypatch.chdir(tmp_path)
    cmd = train.trainer_command("ds.json", "s.yaml", 5, "m.jsonl", 2, 1, 12345)
    for flag, name in (("--deepspeed_config", "ds.json"), ("--spec", "s.yaml"), ("--metrics-out", "m.jsonl")):
        assert cmd[cmd.index(flag) + 1] == str(tmp_path / name)

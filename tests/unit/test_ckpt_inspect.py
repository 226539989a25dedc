"""The torch-free checkpoint reader (dstoolkit/ckpt): torch.save archives read without torch, file-name rules,
folder resolution and the errors. Real DeepSpeed checkpoints of every kind: tests/dist/test_ckpt_resume.py."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dstoolkit.ckpt import names as N
from dstoolkit.ckpt.errors import CkptError
from dstoolkit.ckpt.inspect import inspect_checkpoint, resolve
from dstoolkit.ckpt.layout import Target, check_target, parse_target
from dstoolkit.ckpt.torchzip import TensorMeta, TorchFileError, check_archive, payload_bytes, read_meta, tensors


@pytest.fixture()
def saved(tmp_path):
    torch = pytest.importorskip("torch")
    obj = {"module": {"w": torch.zeros(3, 4, dtype=torch.bfloat16), "b": torch.ones(5)},
           "global_steps": 7, "ds_config": {"zero_optimization": {"stage": 2}}, "shapes": [torch.Size([2, 3])]}
    path = tmp_path / "mp_rank_00_model_states.pt"
    torch.save(obj, path)
    return path


def test_reads_metadata_without_tensors(saved):
    meta = read_meta(saved)
    assert meta["global_steps"] == 7 and meta["ds_config"]["zero_optimization"]["stage"] == 2
    assert meta["shapes"] == [(2, 3)]
    found = dict(tensors(meta["module"]))
    assert found == {"w": TensorMeta("bfloat16", (3, 4), 24), "b": TensorMeta("float32", (5,), 20)}
    assert payload_bytes(saved) == 24 + 20


def test_reader_imports_no_torch(saved):
    code = ("import sys; from pathlib import Path; from dstoolkit.ckpt.torchzip import read_meta; "
            f"read_meta(Path({str(saved)!r})); import dstoolkit.ckpt.inspect; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_truncated_and_damaged_archives(saved, tmp_path):
    assert check_archive(saved) is None
    cut = tmp_path / "cut.pt"
    cut.write_bytes(saved.read_bytes()[: saved.stat().st_size // 2])
    assert "truncated" in check_archive(cut)
    with pytest.raises(TorchFileError, match="truncated"):
        read_meta(cut)
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    assert "empty" in check_archive(empty)
    data = bytearray(saved.read_bytes())
    i = data.index(b"\x00\x00\x80?")  # the float 1.0 of tensor b, stored uncompressed
    data[i + 2] ^= 0xFF
    flipped = tmp_path / "flipped.pt"
    flipped.write_bytes(bytes(data))
    assert "CRC" in check_archive(flipped)


@pytest.mark.parametrize("name,pattern", [
    ("mp_rank_00_model_states.pt", N.MODEL_STATES),
    ("zero_pp_rank_1_mp_rank_00_model_states.pt", N.ZERO3_MODEL_STATES),
    ("zero_pp_rank_3_mp_rank_01_optim_states.pt", N.OPTIM_STATES),
    ("bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", N.OPTIM_STATES),
    ("expp_rank_1_mp_rank_00_optim_states.pt", N.EXPERT_OPTIM_STATES),
    ("layer_1_expert_3_mp_rank_00_model_states.pt", N.EXPERT_STATES),
    ("layer_02-model_00-model_states.pt", N.PIPE_LAYER),
    ("layer_05-model_states.pt", N.PIPE_LAYER),
])
def test_deepspeed_file_names(name, pattern):
    assert pattern.match(name)
    others = [p for p in (N.MODEL_STATES, N.ZERO3_MODEL_STATES, N.OPTIM_STATES, N.EXPERT_OPTIM_STATES,
                          N.EXPERT_STATES, N.PIPE_LAYER) if p is not pattern]
    assert not any(p.match(name) for p in others)


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CkptError, match="is not a checkpoint folder") as e:
        inspect_checkpoint(tmp_path)
    assert e.value.file == str(tmp_path)
    with pytest.raises(CkptError, match="does not exist"):
        resolve(tmp_path / "nope")
    f = tmp_path / "x.pt"
    f.write_text("x")
    with pytest.raises(CkptError, match="is a file, not a checkpoint folder"):
        resolve(f)


def test_latest_naming_a_missing_tag(tmp_path, saved):
    tag = tmp_path / "global_step7"
    tag.mkdir()
    os.replace(saved, tag / saved.name)
    (tmp_path / "latest").write_text("global_step9")
    with pytest.raises(CkptError, match="names tag 'global_step9'") as e:
        inspect_checkpoint(tmp_path)
    assert e.value.file.endswith("latest") and "global_step7" in e.value.fix


def test_parse_target_errors():
    assert parse_target("world=1,zero=3") == Target(world=1, zero=3)
    with pytest.raises(CkptError, match="is not KEY=N"):
        parse_target("dp2")
    with pytest.raises(CkptError, match="not a positive integer"):
        parse_target("zero=x")


def test_check_target_rules():
    class Info:
        tp, pp, ep, num_experts = 1, 1, None, None
    assert check_target(Info, Target(world=4, zero=3)) == []
    (problem, fix), = check_target(Info, Target(tp=2))
    assert "tp=2" in problem and "keep tp=1" in fix
    Info.ep, Info.num_experts = 2, [4, 4]
    (problem, fix), = check_target(Info, Target(ep=1))
    assert "ds_to_universal.py:1250-1252" in problem and "ep=2" in fix


@pytest.mark.parametrize("sub", ["inspect", "reshard", "export"])
def test_each_sub_verb_has_help(sub, capsys):
    from dstoolkit.cli import main

    with pytest.raises(SystemExit) as e:
        main(["ckpt", sub, "--help"])
    assert e.value.code == 0
    assert f"dstoolkit ckpt {sub}" in capsys.readouterr().out


def test_cli_bad_input_exit_2_one_line(tmp_path, capsys):
    from dstoolkit.cli import main

    assert main(["ckpt", "inspect", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dstoolkit ckpt inspect: error: {tmp_path}: is not a checkpoint folder")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert main(["ckpt", "reshard", str(tmp_path), "--out", str(tmp_path), "--to", "tp=x"]) == 2
    assert "--to: tp='x' is not a positive integer" in capsys.readouterr().err

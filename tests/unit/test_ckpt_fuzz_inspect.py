"""Fuzz findings on the torch-free checkpoint reader (dstoolkit/ckpt) and `ckpt inspect` / `reshard --to`: damaged
universal checkpoints, malformed manifests and `latest` files, legacy torch.save files, outputs inside the source,
byte totals, help texts and a closed stdout. The checkpoints are written here with torch.save in DeepSpeed 0.19.8's
layout (file names and the keys the reader uses); the real engines' checkpoints are tests/dist/test_ckpt_resume.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dstoolkit.ckpt.errors import CkptError
from dstoolkit.ckpt.inspect import inspect_checkpoint, resolve
from dstoolkit.ckpt.layout import Target, check_target, parse_target
from dstoolkit.ckpt.paths import check_output_outside
from dstoolkit.ckpt.torchzip import check_archive, is_legacy, payload_bytes, read_meta, tensors

torch = pytest.importorskip("torch")

PARAMS = {"embed.weight": (8, 4), "layer.weight": (4, 4), "norm.weight": (4,)}
TAG = "global_step3"


def _zero2(root: Path, *, legacy: bool = False, manifest: bool = False) -> Path:
    """A ZeRO-2 checkpoint of 2 data-parallel ranks: ROOT/latest, ROOT/global_step3/{model states, 2 optim files}."""
    tag = root / TAG
    tag.mkdir(parents=True)
    kw = {"_use_new_zipfile_serialization": False} if legacy else {}
    gen = torch.Generator().manual_seed(0)
    module = {k: torch.randn(*s, generator=gen).bfloat16() for k, s in PARAMS.items()}
    torch.save({"module": module, "param_shapes": [{k: torch.Size(s) for k, s in PARAMS.items()}],
                "buffer_names": [], "global_steps": 3, "dp_world_size": 2, "mp_world_size": 1,
                "ds_config": {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}},
                "ds_version": "0.19.8", "lr_scheduler": None}, tag / "mp_rank_00_model_states.pt", **kw)
    for r in range(2):
        flat = torch.randn(22, generator=gen)
        torch.save({"optimizer_state_dict": {
            "zero_stage": 2, "single_partition_of_fp32_groups": [flat],
            "base_optimizer_state": {"state": {0: {"exp_avg": flat * 0, "exp_avg_sq": flat * 0}},
                                     "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95)}]}}},
                   tag / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt", **kw)
    (root / "latest").write_text(TAG)
    if manifest:
        from dstoolkit.common.filehash import sha256_file

        files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted(tag.iterdir())}
        (tag / "dstoolkit_manifest.json").write_text(json.dumps({"format": 1, "files": files, "step": 3}))
    return root


def _universal(root: Path) -> Path:
    """What `ckpt reshard` writes: ROOT/latest_universal, ROOT/global_step3/{model states, zero/...}."""
    tag = root / TAG
    zero = tag / "zero"
    zero.mkdir(parents=True)
    torch.save({"module": {k: torch.zeros(s) for k, s in PARAMS.items()},
                "param_shapes": [{k: torch.Size(s) for k, s in PARAMS.items()}], "frozen_param_shapes": {},
                "global_steps": 3, "dp_world_size": 2, "ds_config": {"zero_optimization": {"stage": 2}},
                "ds_version": "0.19.8"}, tag / "mp_rank_00_model_states.pt")
    torch.save({"param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": [0]}], "ds_version": "0.19.8",
                "optimizer_state_dict": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": []}},
               zero / "optimizer_state.pt")
    for name, shape in PARAMS.items():
        d = zero / name
        d.mkdir()
        for state in ("fp32", "exp_avg", "exp_avg_sq"):
            torch.save({"param": torch.ones(shape), "cat_dim": 0}, d / f"{state}.pt")
        torch.save(torch.tensor(3.0), d / "step.pt")
    (root / "latest_universal").write_text(TAG)
    return root


def _files(info) -> set[str]:
    return {p.file for p in info.problems}


# ---------------------------------------------------------------------------------------------------------------
# 2. a universal checkpoint is complete only when DeepSpeed's universal loader finds what it reads


def test_whole_universal_checkpoint_is_complete(tmp_path):
    info = inspect_checkpoint(_universal(tmp_path / "u"))
    assert info.format == "deepspeed-universal" and info.complete, info.problems
    assert info.optimizer_states and "3 parameters under zero/ (layout-free: resumable at another dp)" in info.notes
    # the model states only under the ZeRO-1/2 name: a ZeRO-3 engine would not find them
    assert any(n.startswith("model states only as mp_rank_00_model_states.pt") and "ZeRO-1/2 only" in n
               for n in info.notes)
    tag = tmp_path / "u" / TAG
    os.link(tag / "mp_rank_00_model_states.pt", tag / "zero_pp_rank_0_mp_rank_00_model_states.pt")
    info = inspect_checkpoint(tmp_path / "u")
    assert "3 parameters under zero/ (layout-free: resumable at any dp / ZeRO stage)" in info.notes
    # every file of zero/ counted once: the tag's files and zero/ only, the hard-linked model states once (s33)
    on_disk = sum({(st.st_dev, st.st_ino): st.st_size for p in (tmp_path / "u" / TAG).rglob("*") if p.is_file()
                   for st in [p.stat()]}.values())
    assert info.total_bytes == on_disk
    assert info.model_state_bytes + info.optimizer_state_bytes + info.other_bytes == info.total_bytes


def test_empty_zero_folder_is_incomplete(tmp_path):
    u = _universal(tmp_path / "u")
    zero = u / TAG / "zero"
    for d in zero.iterdir():
        if d.is_dir():
            for f in d.iterdir():
                f.unlink()
            d.rmdir()
        else:
            d.unlink()
    info = inspect_checkpoint(u)
    assert not info.complete
    assert _files(info) == {str(zero / "optimizer_state.pt"), str(zero)}
    assert "holds no parameter folders" in {p.file: p.problem for p in info.problems}[str(zero)]


def test_missing_and_truncated_moments_are_named(tmp_path):
    u = _universal(tmp_path / "u")
    zero = u / TAG / "zero"
    (zero / "embed.weight" / "exp_avg.pt").unlink()
    cut = zero / "layer.weight" / "exp_avg_sq.pt"
    cut.write_bytes(cut.read_bytes()[:100])
    info = inspect_checkpoint(u)
    problems = {p.file: p.problem for p in info.problems}
    assert set(problems) == {str(zero / "embed.weight" / "exp_avg.pt"), str(cut)}
    assert problems[str(zero / "embed.weight" / "exp_avg.pt")].startswith("is missing")
    assert "truncated" in problems[str(cut)]


def test_universal_needs_optimizer_state_and_every_listed_parameter(tmp_path):
    u = _universal(tmp_path / "u")
    zero = u / TAG / "zero"
    (zero / "optimizer_state.pt").unlink()
    for f in (zero / "norm.weight").iterdir():
        f.unlink()
    (zero / "norm.weight").rmdir()
    info = inspect_checkpoint(u)
    assert _files(info) == {str(zero / "optimizer_state.pt"), str(zero / "norm.weight")}
    # all moments gone from every parameter: Adam's betas in optimizer_state.pt still require them
    u2 = _universal(tmp_path / "u2")
    for f in (u2 / TAG / "zero").glob("*/exp_avg*.pt"):
        f.unlink()
    info = inspect_checkpoint(u2)
    assert len(info.problems) == 6 and all(p.problem.startswith("is missing") for p in info.problems)


# ---------------------------------------------------------------------------------------------------------------
# 4. a malformed manifest is a problem naming the manifest, never a traceback


@pytest.mark.parametrize("files,expect", [
    ({"mp_rank_00_model_states.pt": {}}, "the record of 'mp_rank_00_model_states.pt' is {}"),
    (["mp_rank_00_model_states.pt"], 'its "files" is a JSON list'),
    ({"../../etc/passwd": {"bytes": 1, "sha256": "x"}}, "it lists '../../etc/passwd', which is not a file inside"),
    ({"mp_rank_00_model_states.pt": {"bytes": "12", "sha256": "x"}}, "is {\"bytes\": \"12\""),
])
def test_malformed_manifest(tmp_path, files, expect, capsys):
    ck = _zero2(tmp_path / "ck", manifest=True)
    mpath = ck / TAG / "dstoolkit_manifest.json"
    mpath.write_text(json.dumps({"format": 1, "files": files}))
    info = inspect_checkpoint(ck)
    assert not info.complete and info.manifest_verified is False
    (problem,) = info.problems
    assert problem.file == str(mpath) and expect in problem.problem and "re-save" in problem.problem
    from dstoolkit.cli import main

    assert main(["ckpt", "inspect", str(ck)]) == 1
    assert f"{mpath}: is damaged" in capsys.readouterr().out


def test_manifest_that_is_not_an_object(tmp_path):
    ck = _zero2(tmp_path / "ck", manifest=True)
    mpath = ck / TAG / "dstoolkit_manifest.json"
    for text, expect in (("[1, 2]", "it is a JSON list"), ("{}", 'it has no "files" object'),
                         ("\xff", "is not valid JSON")):
        mpath.write_bytes(text.encode("latin-1"))
        (problem,) = inspect_checkpoint(ck).problems
        assert problem.file == str(mpath) and expect in problem.problem


# ---------------------------------------------------------------------------------------------------------------
# 5. `latest`: not text, empty, missing, escaping


def test_binary_latest_names_the_file_and_the_fix(tmp_path):
    ck = _zero2(tmp_path / "ck")
    (ck / "latest").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(CkptError) as e:
        inspect_checkpoint(ck)
    assert e.value.file == str(ck / "latest") and "is not text (byte 0xff at offset 0)" in e.value.problem
    assert TAG in e.value.fix


@pytest.mark.parametrize("tag", ["..", ".", "../ck", "global_step3/../..", "/etc"])
def test_latest_that_leaves_the_checkpoint_is_refused(tmp_path, tag):
    ck = _zero2(tmp_path / "ck")
    (ck / "latest").write_text(tag)
    with pytest.raises(CkptError, match="which is not a tag folder inside") as e:
        resolve(ck)
    assert e.value.file == str(ck / "latest")


@pytest.mark.parametrize("content", ["", "  \n", None])
def test_empty_or_missing_latest_is_said(tmp_path, content):
    ck = _zero2(tmp_path / "ck")
    (ck / "global_step1").mkdir()
    os.link(ck / TAG / "mp_rank_00_model_states.pt", ck / "global_step1" / "mp_rank_00_model_states.pt")
    if content is None:
        (ck / "latest").unlink()
    else:
        (ck / "latest").write_text(content)
    info = inspect_checkpoint(ck)
    assert info.tag == TAG
    (note,) = [n for n in info.notes if "took the newest tag" in n]
    assert f"took the newest tag, {TAG}" in note and "would load nothing" in note and f"tag={TAG!r}" in note
    assert ("is empty" in note) == (content is not None)
    # a tag folder given directly needs no pointer
    assert not [n for n in inspect_checkpoint(ck / TAG).notes if "newest tag" in n]


# ---------------------------------------------------------------------------------------------------------------
# 5. --to: duplicates, empty values, ep on a dense model


@pytest.mark.parametrize("text,expect", [
    ("zero=1,zero=3", "zero is given twice (zero=1 and zero=3)"),
    ("", "names no layout"),
    (",", "names no layout"),
    ("world=2,", "has an empty item between commas"),
    ("world=", "world='' is not a positive integer"),
    ("world=\u00b2", "is not a positive integer"),
])
def test_parse_target_refuses(text, expect):
    with pytest.raises(CkptError) as e:
        parse_target(text)
    assert e.value.file == "--to" and expect in e.value.problem


def test_ep_on_a_dense_model_is_refused():
    class Dense:
        tp, pp, ep, num_experts = 1, 1, None, None
    (problem, fix), = check_target(Dense, Target(ep=2))
    assert "target ep=2 but the checkpoint's model has no MoE layers" in problem and "ep=1" in fix
    assert check_target(Dense, Target(ep=1)) == []


def test_cli_empty_to_is_refused(tmp_path, capsys):
    from dstoolkit.cli import main

    ck = _zero2(tmp_path / "ck")
    assert main(["ckpt", "reshard", str(ck), "--out", str(tmp_path / "u"), "--to", ""]) == 2
    assert "--to: '' names no layout" in capsys.readouterr().err
    assert not (tmp_path / "u").exists()


# ---------------------------------------------------------------------------------------------------------------
# 6. legacy (non-zip) torch.save files


def test_legacy_files_are_read_and_checked(tmp_path):
    obj = {"module": {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(4).bfloat16()},
           "n": 7, "shape": torch.Size([2, 3])}
    zipf, leg = tmp_path / "z.pt", tmp_path / "l.pt"
    torch.save(obj, zipf)
    torch.save(obj, leg, _use_new_zipfile_serialization=False)
    assert is_legacy(leg) and not is_legacy(zipf)
    assert check_archive(leg) is None
    a, b = read_meta(zipf), read_meta(leg)
    assert b["n"] == 7 and b["shape"] == (2, 3)
    assert dict(tensors(a["module"])) == dict(tensors(b["module"]))
    assert payload_bytes(leg) == payload_bytes(zipf) == 24 + 8
    data = leg.read_bytes()
    for n in (40, len(data) // 2, len(data) - 1):
        (tmp_path / "cut.pt").write_bytes(data[:n])
        assert "cut short" in check_archive(tmp_path / "cut.pt")
    (tmp_path / "tail.pt").write_bytes(data + b"x")
    assert "1 bytes after its last storage" in check_archive(tmp_path / "tail.pt")
    (tmp_path / "junk.pt").write_bytes(b"not torch at all")
    assert "is not a torch.save file" in check_archive(tmp_path / "junk.pt")


def test_legacy_checkpoint_is_complete_with_a_note(tmp_path):
    info = inspect_checkpoint(_zero2(tmp_path / "ck", legacy=True))
    assert info.complete and info.zero_stage == 2 and info.dp == 2 and info.dtypes["model"] == "bfloat16"
    assert any("3 file(s) in torch's legacy (non-zip) format" in n and "no checksums" in n for n in info.notes)
    shard = tmp_path / "ck" / TAG / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    os.truncate(shard, shard.stat().st_size - 10)
    info = inspect_checkpoint(tmp_path / "ck")
    assert _files(info) == {str(shard)} and "cut short" in info.problems[0].problem


# ---------------------------------------------------------------------------------------------------------------
# 3. outputs inside (or around) the source are refused; inspect counts no foreign sub-folder


def test_output_inside_the_source_is_refused(tmp_path):
    ck = _zero2(tmp_path / "ck")
    for out, what in ((ck / TAG / "univ", "is inside the checkpoint folder"), (ck / "univ", "is inside"),
                      (ck, "is the checkpoint folder"), (ck / TAG, "is the checkpoint folder"),
                      (tmp_path, "contains the checkpoint folder")):
        with pytest.raises(CkptError, match=what) as e:
            check_output_outside(ck, out, "--out", "_universal")
        assert e.value.file == str(out) and str(tmp_path / "ck_universal") in e.value.fix
    check_output_outside(ck, tmp_path / "ck_universal", "--out", "_universal")  # beside it: fine
    # a tag folder given directly: its save_dir (with `latest`) is protected too
    with pytest.raises(CkptError, match="is inside"):
        check_output_outside(ck / TAG, ck / "univ", "--out", "_universal")


@pytest.mark.parametrize("verb,flag", [("reshard", "--out"), ("export", "--hf")])
def test_cli_refuses_writing_into_the_source(tmp_path, capsys, verb, flag):
    from dstoolkit.cli import main

    ck = _zero2(tmp_path / "ck")
    before = sorted(str(p) for p in ck.rglob("*"))
    assert main(["ckpt", verb, str(ck), flag, str(ck / TAG / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{ck / TAG / 'out'}: is inside the checkpoint folder" in err, err
    assert sorted(str(p) for p in ck.rglob("*")) == before


def test_nested_folder_is_not_counted_and_totals_add_up(tmp_path):
    ck = _zero2(tmp_path / "ck", manifest=True)
    tag = ck / TAG
    top = sum(p.stat().st_size for p in tag.iterdir() if p.is_file())
    (tag / "univ" / TAG).mkdir(parents=True)
    (tag / "univ" / TAG / "big.pt").write_bytes(b"x" * 5000)
    info = inspect_checkpoint(ck)
    assert info.complete and info.total_bytes == top
    manifest = (tag / "dstoolkit_manifest.json").stat().st_size
    assert info.other_bytes == manifest
    assert info.model_state_bytes + info.optimizer_state_bytes + info.other_bytes == info.total_bytes
    assert sum(r.bytes for r in info.ranks) + info.shared_bytes == info.total_bytes
    assert any("sub-folder(s) univ" in n and "not counted" in n for n in info.notes)


# ---------------------------------------------------------------------------------------------------------------
# 8. one problem per file


def test_a_missing_rank_file_is_listed_once(tmp_path):
    ck = _zero2(tmp_path / "ck", manifest=True)
    gone = ck / TAG / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    gone.unlink()
    info = inspect_checkpoint(ck)
    assert [(p.file, p.problem) for p in info.problems] == [
        (str(gone), "is missing (listed in the manifest; rank 1 of dp 2)")]
    cut = ck / TAG / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    cut.write_bytes(cut.read_bytes()[:200])
    info = inspect_checkpoint(ck)
    assert len([p for p in info.problems if p.file == str(cut)]) == 1
    assert len(info.problems) == 2


# ---------------------------------------------------------------------------------------------------------------
# 7. help texts; 8. a closed stdout


@pytest.mark.parametrize("argv,last_words", [
    (["ckpt"], "refuse, with the reason, a checkpoint they cannot convert (docs/checkpoints.md)."),
    (["ckpt", "inspect"], "without torch."),
    (["ckpt", "reshard"], '{"load_universal": true}`.'),
    (["ckpt", "export"], "transformers `from_pretrained`."),
])
def test_help_descriptions_are_whole_sentences(argv, last_words, capsys):
    from dstoolkit.cli import main

    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert last_words in text, text


def test_inspect_into_a_closed_pipe_exits_quietly(tmp_path):
    ck = _zero2(tmp_path / "ck")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for fmt, rc in (("json", 0), ("text", 0)):
        p = subprocess.Popen([sys.executable, "-m", "dstoolkit", "ckpt", "inspect", str(ck), "--format", fmt],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        p.stdout.close()  # the reader (`| head -0`) is gone before anything is written
        err = p.stderr.read().decode()
        assert p.wait() == rc and err == "", err


def test_hf_trainer_output_dir_may_hold_the_export(tmp_path):
    out_dir = tmp_path / "run"
    ck = _zero2(out_dir / "checkpoint-3")  # HF Trainer: output_dir/checkpoint-N/{latest, global_stepN/}
    check_output_outside(out_dir, out_dir / "final_hf", "--hf", "_hf")  # beside checkpoint-N: fine
    for out in (ck / "hf", ck / TAG / "hf", out_dir):
        with pytest.raises(CkptError):
            check_output_outside(out_dir, out, "--hf", "_hf")

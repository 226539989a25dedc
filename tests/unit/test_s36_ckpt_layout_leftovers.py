"""s36 ckpt findings 2a, 2b, 4, 7 (`dstoolkit ckpt inspect / reshard / export`), on folders laid out as DeepSpeed 0.19.8
saves them (runtime/engine.py `_get_ckpt_name` / `_get_zero_ckpt_name`; the model states' keys):

2a. a stray mp_rank_01_model_states.pt (an earlier tp=2 save into the same tag) in a tp=1 ZeRO-2 tag: inspect said
    "complete yes" and counted it in the model-state bytes; reshard then failed inside ds_to_universal ("model-state
    file count 2 does not match pp_degree=1 * tp_degree=1"). Now it is a leftover of another layout (the model
    states' mp_world_size=1: DeepSpeed names files mp_rank_00 only, engine.py:2166-2169), not counted, and
    reshard / export refuse it up front with inspect's fix;
2b. the same with a stray bf16_zero_pp_rank_0_mp_rank_01_optim_states.pt: inspect listed it as "rank 2" and asked for
    a missing bf16_zero_pp_rank_1_mp_rank_01 file that a tp=1 save never writes;
    a genuine tp=2 checkpoint (mp_world_size=2) is unchanged;
4.  `ckpt --help` claimed inspect says which of reshard / export applies, which it never did;
7.  a `latest` that is a folder: inspect said "there is no latest file ... write the tag into .../latest", complete
    yes; reshard went ahead. Now every verb refuses, saying it is a folder and how to replace it by the file.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from dstoolkit.ckpt.errors import CkptError
from dstoolkit.ckpt.inspect import inspect_checkpoint

torch = pytest.importorskip("torch")


def _tag(tag_dir: Path, *, dp: int = 2, mp: int = 1, dims: bool = True, stage: int = 2) -> Path:
    """A bf16 ZeRO-`stage` tag saved at data-parallel size `dp` and model-parallel size `mp` (tp=mp, pp=1): one
    mp_rank_NN_model_states.pt per mp rank (ZeRO-3: one zero_pp_rank_R_mp_rank_NN per rank), one optimizer partition
    per (dp, mp) rank; `dims`: with DeepSpeed's checkpoint_parallel_dimensions (engine.py
    `_checkpoint_parallel_metadata`), else mp_world_size alone (an older DeepSpeed)."""
    tag_dir.mkdir(parents=True, exist_ok=True)
    head = {"module": {"w": torch.zeros(4, dtype=torch.bfloat16)}, "dp_world_size": dp, "mp_world_size": mp,
            "global_steps": 4, "lr_scheduler": None, "ds_version": "0.19.8", "param_shapes": [{"w": torch.Size([4])}],
            "ds_config": {"bf16": {"enabled": True}, "zero_optimization": {"stage": stage}}}
    if dims:
        head["checkpoint_parallel_dimensions"] = {"pp_degree": 1, "tp_degree": mp}
    for m in range(mp):
        if stage < 3:
            torch.save(head, tag_dir / f"mp_rank_{m:02d}_model_states.pt")
        for r in range(dp):
            if stage == 3:
                torch.save(head, tag_dir / f"zero_pp_rank_{r}_mp_rank_{m:02d}_model_states.pt")
            osd = {"optimizer_state_dict": {"zero_stage": stage, "base_optimizer_state": {"state": {}}}}
            torch.save(osd, tag_dir / f"bf16_zero_pp_rank_{r}_mp_rank_{m:02d}_optim_states.pt")
    return tag_dir


def _layout_problem(m: int, mpw: int, wrote: str) -> str:
    return (f"is left over from an earlier save at another layout: model-parallel rank {m} is outside the saved "
            f"layout (mp_world_size={mpw} in the model states; this save wrote {wrote}); DeepSpeed's load_checkpoint "
            "skips it, but ds_to_universal (reshard) and zero_to_fp32 (export) take every *_model_states.pt / "
            "*_optim_states.pt in the folder for part of the checkpoint")


def _layout_fix(name: str, tag: Path, mpw: int = 1) -> str:
    return (f"move {name} (and any other mp_rank >= {mpw:02d}) out of {tag}: it belongs to an older save at another "
            "layout")


STRAYS = {"2a": ("mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"),
          "2b": ("bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "bf16_zero_pp_rank_0_mp_rank_01_optim_states.pt")}


@pytest.mark.parametrize("case", sorted(STRAYS))
def test_a_file_of_another_tp_is_a_leftover_not_counted(tmp_path, case):
    clean = inspect_checkpoint(_tag(tmp_path / "clean" / "global_step4"))
    tag = _tag(tmp_path / "ck" / "global_step4")
    src, stray = STRAYS[case]
    (tag / stray).write_bytes((tag / src).read_bytes())  # `cp` of this save's own file, as the tester did
    info = inspect_checkpoint(tag)
    assert (info.complete, info.world_size, info.dp, info.tp, info.pp) == (False, 2, 2, 1, 1)
    assert [(Path(p.file).name, p.problem, p.fix) for p in info.problems] == [
        (stray, _layout_problem(1, 1, "mp_rank_00"), _layout_fix(stray, tag))]
    # not counted: ranks and bytes as without the stray file (2a counted it in the model states, 2b as `rank 2`)
    assert [(r.rank, r.files) for r in info.ranks] == [(r.rank, r.files) for r in clean.ranks] == [
        (0, ("bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",)),
        (1, ("bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",))]
    for k in ("total_bytes", "model_state_bytes", "optimizer_state_bytes", "shared_bytes"):
        assert getattr(info, k) == getattr(clean, k), k


def test_reshard_and_export_refuse_the_stray_with_inspects_sentence(tmp_path):
    from dstoolkit.runtime.ckpt.export import export_hf
    from dstoolkit.runtime.ckpt.reshard import to_universal

    tag = _tag(tmp_path / "ck" / "global_step4")
    (tag / "mp_rank_01_model_states.pt").write_bytes((tag / "mp_rank_00_model_states.pt").read_bytes())
    for call in (lambda: to_universal(tag, tmp_path / "uni"), lambda: export_hf(tag, tmp_path / "hf")):
        with pytest.raises(CkptError) as e:
            call()
        assert (e.value.file, e.value.problem, e.value.fix) == (
            str(tag / "mp_rank_01_model_states.pt"), _layout_problem(1, 1, "mp_rank_00"),
            _layout_fix("mp_rank_01_model_states.pt", tag))
    assert not (tmp_path / "hf").exists() and not (tmp_path / "uni").exists()


@pytest.mark.parametrize("dims", [True, False])
@pytest.mark.parametrize("stage", [2, 3])
def test_a_genuine_tp2_checkpoint_is_complete(tmp_path, dims, stage):
    info = inspect_checkpoint(_tag(tmp_path / "global_step4", mp=2, dims=dims, stage=stage))
    assert (info.complete, info.problems, info.tp, info.world_size) == (True, [], 2, 4)
    assert len(info.ranks) == 4


def test_a_tp2_tag_with_a_stray_tp4_file_names_the_range(tmp_path):
    tag = _tag(tmp_path / "global_step4", mp=2)
    (tag / "bf16_zero_pp_rank_1_mp_rank_02_optim_states.pt").write_bytes(
        (tag / "bf16_zero_pp_rank_1_mp_rank_01_optim_states.pt").read_bytes())
    info = inspect_checkpoint(tag)
    assert [(Path(p.file).name, p.problem, p.fix) for p in info.problems] == [(
        "bf16_zero_pp_rank_1_mp_rank_02_optim_states.pt", _layout_problem(2, 2, "mp_rank_00 to mp_rank_01"),
        _layout_fix("bf16_zero_pp_rank_1_mp_rank_02_optim_states.pt", tag, 2))]


def test_a_leftover_dp_rank_is_not_counted_either(tmp_path):
    """One rule for both leftovers (ckpt.inspect_files.leftover_rank_files): the dp one was listed as a rank."""
    tag = _tag(tmp_path / "global_step4", dp=1)
    (tag / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").write_bytes(
        (tag / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt").read_bytes())
    info = inspect_checkpoint(tag)
    assert [Path(p.file).name for p in info.problems] == ["bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    assert [r.files for r in info.ranks] == [("bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",)]


def test_latest_that_is_a_folder_is_refused_by_every_verb(tmp_path, capsys):
    from dstoolkit.cli import main

    root = tmp_path / "ck"
    _tag(root / "global_step4")
    (root / "latest").mkdir()
    fix = (f"move what {root / 'latest'} holds elsewhere and remove the folder, then write the tag into a file of "
           f"that name, e.g. `printf %s global_step4 > {root / 'latest'}`; or give the tag folder itself")
    with pytest.raises(CkptError) as e:
        inspect_checkpoint(root)
    assert (e.value.file, e.value.fix) == (str(root / "latest"), fix)
    assert e.value.problem == (
        "is a folder, not the file DeepSpeed reads the tag from: engine.load_checkpoint without tag= loads nothing "
        f"from {root} and the next save_checkpoint fails writing latest")
    for argv in (["inspect", str(root)], ["reshard", str(root), "--out", str(tmp_path / "uni")]):
        assert main(["ckpt", *argv]) == 2
        captured = capsys.readouterr()
        assert "is a folder, not the file DeepSpeed reads the tag from" in captured.err and captured.out == ""
    assert not (tmp_path / "uni").exists()
    assert inspect_checkpoint(root / "global_step4").complete  # the tag folder itself is still inspected


def test_ckpt_help_claims_only_what_inspect_does(capsys):
    from dstoolkit.cli import main

    with pytest.raises(SystemExit):
        main(["ckpt", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "which of reshard / export applies" not in text
    assert ("it says what the folder is and whether it is complete; reshard and export check what they need before "
            "writing anything and refuse, with the reason, a checkpoint they cannot convert") in text

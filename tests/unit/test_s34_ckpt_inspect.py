"""s34 ckpt findings 2-4 (`dstoolkit ckpt inspect / export / reshard`), on folders laid out as DeepSpeed 0.19.8 saves
them (file names of runtime/engine.py `_get_ckpt_name` / `_get_zero_ckpt_name`, the model states' keys):

2. a tag folder re-saved at a smaller world size keeps the larger run's rank files (DeepSpeed overwrites only its
   own ranks): inspect said "complete yes" while export / reshard then failed inside DeepSpeed; now each leftover
   file is a problem (complete NO, exit 1) and export / reshard refuse it up front with the same fix;
3. a folder holding latest_universal (an older universal tag) and latest (a newer ZeRO tag): the verbs took the
   universal one silently; now they refuse, naming both (which one DeepSpeed loads depends on the loading run's
   checkpoint.load_universal, and `dstoolkit train --resume` loads neither);
4. parameter offload (zero_optimization.offload_param) is reported (it was not mentioned).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from dstoolkit.ckpt.errors import CkptError
from dstoolkit.ckpt.inspect import inspect_checkpoint

torch = pytest.importorskip("torch")


def _zero_tag(tag_dir: Path, *, stage: int, dp: int, ranks: range, step: int = 3, zero: dict | None = None) -> Path:
    """A ZeRO-`stage` tag saved at data-parallel size `dp`, with the per-rank files of `ranks` (a leftover rank is
    one >= dp). The model states name the run's dp_world_size, as engine.py `_save_checkpoint` writes it."""
    tag_dir.mkdir(parents=True, exist_ok=True)
    head = {"module": {"w": torch.zeros(4)}, "dp_world_size": dp, "mp_world_size": 1, "global_steps": step,
            "lr_scheduler": None, "ds_version": "0.19.8", "param_shapes": [{"w": torch.Size([4])}],
            "ds_config": {"zero_optimization": {"stage": stage, **(zero or {})}}}
    if stage < 3:
        torch.save(head, tag_dir / "mp_rank_00_model_states.pt")
    for r in ranks:
        if stage == 3:
            torch.save(head, tag_dir / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt")
        osd = {"optimizer_state_dict": {"zero_stage": stage, "base_optimizer_state": {"state": {}}}}
        torch.save(osd, tag_dir / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
    return tag_dir


@pytest.mark.parametrize("stage", [2, 3])
def test_leftover_rank_file_of_a_larger_world_is_a_problem(tmp_path, stage):
    tag = _zero_tag(tmp_path / "ck" / "global_step3", stage=stage, dp=1, ranks=range(2))
    (tmp_path / "ck" / "latest").write_text("global_step3")
    info = inspect_checkpoint(tmp_path / "ck")
    assert info.complete is False and info.dp == 1
    leftovers = [f"zero_pp_rank_1_mp_rank_00_{k}_states.pt" for k in (("model", "optim") if stage == 3 else ("optim",))]
    assert [Path(p.file).name for p in info.problems] == leftovers
    for p in info.problems:
        assert p.problem.startswith("is left over from an earlier save: rank 1 is outside dp=1 (the model states' "
                                    "dp_world_size; this save wrote rank 0)")
        assert p.fix == f"move {Path(p.file).name} (and any other rank >= 1) out of {tag}: it belongs to an older save"


def test_all_ranks_of_the_world_are_not_leftovers(tmp_path):
    _zero_tag(tmp_path / "global_step3", stage=2, dp=2, ranks=range(2))
    info = inspect_checkpoint(tmp_path / "global_step3")
    assert info.complete and info.problems == []


def test_export_and_reshard_refuse_the_leftover_with_inspects_fix(tmp_path):
    from dstoolkit.runtime.ckpt.export import export_hf
    from dstoolkit.runtime.ckpt.reshard import to_universal

    tag = _zero_tag(tmp_path / "ck" / "global_step3", stage=2, dp=1, ranks=range(3))
    leftover = tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    for call in (lambda: export_hf(tmp_path / "ck" / "global_step3", tmp_path / "hf"),
                 lambda: to_universal(tmp_path / "ck" / "global_step3", tmp_path / "uni")):
        with pytest.raises(CkptError) as e:
            call()
        assert e.value.file == str(leftover)
        assert e.value.fix == (f"move {leftover.name} (and any other rank >= 1) out of {tag}: it belongs to an "
                               "older save")
    assert not (tmp_path / "hf").exists() and not (tmp_path / "uni").exists()


def test_a_missing_rank_keeps_the_resave_advice(tmp_path):
    from dstoolkit.runtime.ckpt.reshard import to_universal

    _zero_tag(tmp_path / "global_step3", stage=2, dp=2, ranks=range(1))
    with pytest.raises(CkptError) as e:
        to_universal(tmp_path / "global_step3", tmp_path / "uni")
    assert e.value.problem == "is missing (rank 1 of dp 2)"
    assert e.value.fix == ("reshard a complete checkpoint: pick an older tag (`dstoolkit ckpt inspect` lists them) "
                           "or re-save it")


def _mixed(root: Path, universal_pointer: str = "global_step3", latest: str = "global_step5") -> Path:
    """A universal checkpoint (`ckpt reshard` output) that a run loaded and then saved into: latest_universal ->
    global_step3 (zero/ folders), latest -> global_step5 (DeepSpeed's own save)."""
    uni = _zero_tag(root / "global_step3", stage=2, dp=2, ranks=range(0))
    (uni / "zero" / "w").mkdir(parents=True)
    _zero_tag(root / "global_step5", stage=2, dp=1, ranks=range(1), step=5)
    (root / "latest_universal").write_text(universal_pointer)
    (root / "latest").write_text(latest)
    return root


def test_two_pointers_naming_different_tags_are_refused_naming_both(tmp_path):
    root = _mixed(tmp_path / "ck")
    with pytest.raises(CkptError) as e:
        inspect_checkpoint(root)
    assert e.value.file == str(root)
    assert e.value.problem == (
        "holds two pointers naming different tags: latest_universal -> global_step3 (a universal checkpoint, "
        "step 3), latest -> global_step5 (a ZeRO checkpoint, step 5); DeepSpeed's engine.load_checkpoint reads "
        "latest_universal with checkpoint.load_universal true and latest without it (runtime/engine.py:4428)")
    assert e.value.fix == f"give the tag folder you mean: {root / 'global_step5'} or {root / 'global_step3'}"
    # every verb resolves through the same rule
    from dstoolkit.runtime.ckpt.export import export_hf
    from dstoolkit.runtime.ckpt.reshard import to_universal

    for call in (lambda: export_hf(root, tmp_path / "hf"), lambda: to_universal(root, tmp_path / "uni")):
        with pytest.raises(CkptError, match="holds two pointers naming different tags"):
            call()
    # the tag folder given directly is inspected as it is
    info = inspect_checkpoint(root / "global_step5")
    assert (info.tag, info.step, info.format, info.complete) == ("global_step5", 5, "deepspeed-zero", True)


def test_two_pointers_naming_the_same_tag_resolve_to_it(tmp_path):
    root = _mixed(tmp_path / "ck", latest="global_step3")
    info = inspect_checkpoint(root)
    assert (info.tag, info.format) == ("global_step3", "deepspeed-universal")


def test_parameter_offload_is_reported(tmp_path):
    off = {"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "nvme"}}
    _zero_tag(tmp_path / "global_step3", stage=3, dp=1, ranks=range(1), zero=off)
    info = inspect_checkpoint(tmp_path / "global_step3")
    assert (info.offload, info.offload_param) == ("cpu", "nvme")
    assert ("parameter offload to nvme (zero_optimization.offload_param of the saved config): the files are the "
            "same as without it") in info.notes
    assert info.as_dict()["offload_param"] == "nvme"
    plain = _zero_tag(tmp_path / "p" / "global_step3", stage=3, dp=1, ranks=range(1),
                      zero={"offload_param": {"device": "none"}})
    info = inspect_checkpoint(plain)
    assert info.offload_param is None and not any("parameter offload" in n for n in info.notes)


def test_inspect_screen_shows_the_fix_of_a_leftover(tmp_path, capsys):
    from dstoolkit.cli import main

    tag = _zero_tag(tmp_path / "ck" / "global_step3", stage=2, dp=1, ranks=range(2))
    (tmp_path / "ck" / "latest").write_text("global_step3")
    assert main(["ckpt", "inspect", str(tmp_path / "ck")]) == 1
    out = capsys.readouterr().out
    name = "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    assert f"(move {name} (and any other rank >= 1) out of {tag}: it belongs to an older save)" in out

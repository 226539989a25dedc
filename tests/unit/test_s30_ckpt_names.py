"""`ckpt inspect` names a missing optimizer file as DeepSpeed writes it: with the bf16_ prefix when the run had
bf16 on (engine.py _get_zero_ckpt_name), read from the files left or, when none is left, from the saved ds_config.
Before: with every optimizer file of a bf16 run gone, the missing ones were named without bf16_ (a file DeepSpeed
never writes), so a user copying shards back looked for the wrong name."""
from __future__ import annotations

import pytest

from dstoolkit.ckpt.inspect import inspect_checkpoint
from tests.unit.test_ckpt_fuzz_inspect import TAG, _zero2

torch = pytest.importorskip("torch")


def _strip_optim(ck, bf16: bool):
    tag = ck / TAG
    for p in tag.glob("*_optim_states.pt"):
        p.unlink()
    head = torch.load(tag / "mp_rank_00_model_states.pt", weights_only=False)
    head["ds_config"] = {"zero_optimization": {"stage": 2}, ("bf16" if bf16 else "fp16"): {"enabled": True}}
    torch.save(head, tag / "mp_rank_00_model_states.pt")
    return tag


@pytest.mark.parametrize("bf16,prefix", [(True, "bf16_"), (False, "")])
def test_missing_optimizer_files_are_named_as_deepspeed_writes_them(tmp_path, bf16, prefix):
    tag = _strip_optim(_zero2(tmp_path / "ck"), bf16)
    info = inspect_checkpoint(tmp_path / "ck")
    assert [p.file for p in info.problems] == [
        str(tag / f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt") for r in range(2)]


def test_generate_out_that_is_a_link_to_a_folder_says_so(tmp_path):
    # fuzz finding 15: it said "exists and is not a folder"; replacing the link would not write into its folder
    from dstoolkit.generate.writer import OutputExistsError, check_target

    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(OutputExistsError) as e:
        check_target(link, force=True)
    assert str(e.value) == (f"{link} is a link to the folder {real}; generate replaces its --out folder whole, which "
                            f"would replace the link, not that folder: pass --out {real}, or choose another --out")
    assert real.is_dir() and link.is_symlink()

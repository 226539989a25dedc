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

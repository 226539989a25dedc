"""`dstoolkit.runtime.fp8.convert` refuses layer skips that keep every transformer block in bf16, with the check and
the message `dstoolkit fp8 plan` refuses them with (`dstoolkit.fp8.report.layer_skip_problem`).

Before, convert(tiny, {"layers": {"skip_first_layers": 2, "skip_last_layers": 2}}) on the 4-block tiny model swapped
0 layers and returned a report (28 kept "one of the first 2 / last 2 ... kept in bf16", lm_head excluded): a run
that believed it trained in FP8 trained in bf16, while `dstoolkit fp8 plan tiny --skip-first 2 --skip-last 2`
exited 2.
"""
import pytest

from dstoolkit.cli import main
from dstoolkit.dsconfig.fp8 import Fp8Config
from dstoolkit.fp8.report import layer_skip_problem
from dstoolkit.models.presets import get_preset

# torch is imported inside the tests: collecting this module must not import it (as tests/unit/test_fp8_convert.py)

ALL_SKIPPED = {"layers": {"skip_first_layers": 2, "skip_last_layers": 2}}
MESSAGE = ("fp8.layers.skip_first_layers=2 + fp8.layers.skip_last_layers=2 keeps all 4 transformer blocks of "
           "TinyTransformer in bf16 (4 >= 4), so no block would run in FP8 (pick at most 3 in total; to train without "
           "FP8 set fp8.enabled false)")


def _tiny():
    from dstoolkit.runtime.model import build_model

    return build_model(get_preset("tiny"), seed=0)


def test_convert_refuses_skips_that_cover_every_block_and_leaves_the_model_alone(capsys):
    from dstoolkit.runtime.fp8 import EmulatedFp8Linear, convert

    model = _tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError) as info:
        convert(model, ALL_SKIPPED, backend="emulated")
    assert str(info.value) == MESSAGE
    # the one check, shared with the plan verb
    assert str(info.value) == layer_skip_problem(Fp8Config.model_validate(ALL_SKIPPED), 4, model="TinyTransformer")
    assert not any(isinstance(m, EmulatedFp8Linear) for m in model.modules())
    assert "forward" not in model.__dict__  # not wrapped in the FP8 autocast
    after = model.state_dict()
    assert after.keys() == before.keys() and all(after[k].equal(v) for k, v in before.items())
    # the plan verb refuses the same settings with the same text, naming its flags
    assert main(["fp8", "plan", "tiny", "--skip-first", "2", "--skip-last", "2"]) == 2
    err = capsys.readouterr().err
    assert err == ("dstoolkit fp8 plan: error: --skip-first=2 + --skip-last=2 keeps all 4 transformer blocks of tiny "
                   "in bf16 (4 >= 4), so no block would run in FP8 (pick at most 3 in total; to train without FP8 set "
                   "fp8.enabled false)\n")


def test_one_block_left_still_converts_and_fp8_off_is_not_refused():
    from dstoolkit.runtime.fp8 import Fp8Converter

    conv = Fp8Converter({"layers": {"skip_first_layers": 3}}, backend="emulated")
    rep = conv.convert(_tiny())
    assert sorted({e.name.split(".")[1] for e in rep.swapped}) == ["3"] and len(rep.swapped) == 7
    # the check is per model: the same converter refuses a model with fewer blocks
    from torch import nn

    class _Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(32, 32) for _ in range(2)])

    with pytest.raises(ValueError, match=r"^fp8\.layers\.skip_first_layers=3 keeps all 2 transformer blocks of _Two "):
        conv.convert(_Two())
    off = Fp8Converter({"enabled": False, "layers": {"skip_first_layers": 9}}, backend="emulated").convert(_tiny())
    assert off.swapped == [] and {s.reason for s in off.skipped if s.type == "Linear"} == {"fp8.enabled is false"}

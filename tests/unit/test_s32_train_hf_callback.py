"""s32 findings 9 and 12 on `DstoolkitCallback` (HF Trainer hooks driven by hand, no launch): the estimate and MFU
are not shown from a spec whose model is not the Trainer's (parameter count, batch sequence length), and every
argument is checked when the callback is built, naming the parameter."""
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from dstoolkit.runtime.train import hf  # noqa: E402
from dstoolkit.runtime.train.spike import SettingError  # noqa: E402

from tests.unit.hf_callback_fakes import SPEC, Engine, tiny_params  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(n))

    def forward(self, input_ids=None, labels=None):
        return {"loss": self.w[:1].sum() + 1.0}


def _begin(monkeypatch, tmp_path, n):
    monkeypatch.setattr(hf, "_find_engine", lambda model: Engine())
    cb = hf.DstoolkitCallback(spec=str(SPEC), cross_rank_every=0)
    state, args = types.SimpleNamespace(global_step=0), types.SimpleNamespace(output_dir=str(tmp_path))
    m = Net(n)
    cb.on_train_begin(args, state, None, model=m)
    return cb, m, state, args


def _log_line(cb, m, state, args, seq, capsys):
    m(input_ids=torch.zeros(2, seq, dtype=torch.long))
    state.global_step = 1
    cb.on_step_end(args, state, None)
    cb.on_log(args, state, None)
    return capsys.readouterr().err


def test_spec_of_another_model_shows_no_estimate(monkeypatch, tmp_path, capsys):
    cb, m, state, args = _begin(monkeypatch, tmp_path, 110_000)
    err = capsys.readouterr().err
    assert "[dstoolkit] spec model tiny has 3.95M parameters, the Trainer's model 110.00K: the estimate is not shown " \
           "and MFU counts 6 x the Trainer model's parameters per token (pass the spec of this model and seq_len " \
           "for the estimate)\n" in err  # before: nothing; MFU and 'est' from the 3.95M model
    assert cb._estimate is None and cb._flops_per_token == 6 * 110_000
    line = _log_line(cb, m, state, args, 128, capsys)
    assert "(est " not in line and "[dstoolkit] step 1: " in line
    assert ("(6N, live model)" in line) == (cb._peak is not None)
    assert [e["event"] for e in cb.events if e["event"] == "spec_mismatch"] == ["spec_mismatch"]


def test_spec_of_this_model_keeps_the_estimate(monkeypatch, tmp_path, capsys):
    cb, m, state, args = _begin(monkeypatch, tmp_path, tiny_params())
    if cb._estimate is None:
        pytest.skip("no estimate on this machine (no cached calibration)")
    line = _log_line(cb, m, state, args, 128, capsys)
    assert "spec model" not in line and "(est " in line and "live model" not in line


def test_batches_longer_than_seq_len_drop_the_estimate(monkeypatch, tmp_path, capsys):
    cb, m, state, args = _begin(monkeypatch, tmp_path, tiny_params())
    if cb._estimate is None:
        pytest.skip("no estimate on this machine (no cached calibration)")
    line = _log_line(cb, m, state, args, 256, capsys)  # shorter batches are padding (test_s32_mend_rt_hf_seq.py)
    assert ("[dstoolkit] spec model tiny trains at seq_len 128, the Trainer's batches hold 256 tokens per sequence: "
            "the estimate is not shown") in line
    assert "(est " not in line and cb._flops_per_token == 6 * tiny_params()


@pytest.mark.parametrize("kw, want", [
    ({"cross_rank_every": -5}, "DstoolkitCallback: cross_rank_every=-5 must be a whole number >= 0 (optimizer steps "
                               "between cross-rank views; 0: off)"),
    ({"cross_rank_every": 2.5}, "DstoolkitCallback: cross_rank_every=2.5 must be a whole number >= 0"),
    ({"poison_step": -1}, "DstoolkitCallback: poison_step=-1 must be a whole number >= 1 (an optimizer step, counted "
                          "from 1; None: off)"),
    ({"lr_blowup": (5,)}, "DstoolkitCallback: lr_blowup=(5,) must be (step, factor): a whole step >= 1 and a finite "
                          "factor > 0, e.g. (5, 100.0); None: off"),
    ({"lr_blowup": (3, float("nan"))}, "DstoolkitCallback: lr_blowup=(3, nan) must be (step, factor)"),
    ({"max_rollbacks": -1}, "DstoolkitCallback: max_rollbacks=-1 must be a whole number >= 0"),
    ({"spec": "nope.yaml"}, "DstoolkitCallback: spec='nope.yaml' is not a file: give the spec.yaml of the generated "
                            "folder (or leave spec out: no estimate beside the measured figures)"),
])
def test_arguments_are_checked_at_construction(kw, want):
    with pytest.raises(SettingError) as info:  # before: accepted; failed later on every rank, or a log line
        hf.DstoolkitCallback(**kw)
    assert str(info.value).startswith(want)


def test_spec_from_the_environment_is_named_as_such(monkeypatch, tmp_path):
    monkeypatch.setenv("DSTOOLKIT_SPEC", str(tmp_path / "gone.yaml"))
    with pytest.raises(SettingError, match=r"^DstoolkitCallback: DSTOOLKIT_SPEC='.*gone.yaml' is not a file"):
        hf.DstoolkitCallback()
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")
    with pytest.raises(SettingError, match=r"^DstoolkitCallback: spec='.*bad.yaml' does not load: "):
        hf.DstoolkitCallback(spec=str(bad))


def test_metrics_path_folder_and_output_dir_none_are_refused(tmp_path):
    with pytest.raises(SettingError) as info:
        hf.DstoolkitCallback(metrics_path=str(tmp_path))
    assert str(info.value).startswith(f"DstoolkitCallback: metrics_path={str(tmp_path)!r}: is a folder, not a file")
    with pytest.raises(TypeError) as info:  # before: "expected str, bytes or os.PathLike object, not NoneType"
        hf.last_complete_checkpoint(None)
    assert str(info.value) == ("last_complete_checkpoint(output_dir=None): give the Trainer's output_dir, the folder "
                               "its checkpoint-N folders are in (TrainingArguments.output_dir)")

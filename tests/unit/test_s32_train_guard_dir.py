"""s32 findings 1, 2 and 11 on `Guard` (a user's own loop, fake CPU engine): another run's checkpoints are never
overwritten by a fresh run, a resume from another ZeRO stage / dp size (a universal checkpoint, only rejected ones)
is refused in one line as `dstoolkit train` refuses it, and the paths are checked at construction, each message in
Guard's terms (checkpoint_dir, guard.resume(), keep=), never the command line's flags."""
import errno
import json
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from dstoolkit.runtime.train import ckpt as ckpt_mod  # noqa: E402
from dstoolkit.runtime.train.guard import CheckpointDirError, Guard  # noqa: E402
from dstoolkit.runtime.train.spike import SettingError  # noqa: E402


class Opt:
    def __init__(self):
        self.param_groups = [{"lr": 1.0}]


class FakeEngine:
    """The calls Guard makes, on CPU; `stage` / `dp` as DeepSpeed's engine reports them; `marker` written into every
    checkpoint (which run saved it)."""

    def __init__(self, marker="A", stage=1, dp=1):
        self.global_steps, self.optimizer, self.device, self.marker = 0, Opt(), None, marker
        self.stage, self.dp_world_size, self.loaded = stage, dp, []

    def zero_optimization_stage(self):
        return self.stage

    def backward(self, loss):
        pass

    def step(self):
        self.global_steps += 1

    def get_global_grad_norm(self):
        return 1.0

    def save_checkpoint(self, d, tag, client_state, save_latest=True):
        os.makedirs(os.path.join(d, tag), exist_ok=True)
        torch.save({"gs": self.global_steps, "cs": client_state, "run": self.marker,
                    "dp_world_size": self.dp_world_size, "ds_config": {"zero_optimization": {"stage": self.stage}}},
                   os.path.join(d, tag, "mp_rank_00_model_states.pt"))

    def load_checkpoint(self, root, tag):
        p = os.path.join(root, tag, "mp_rank_00_model_states.pt")
        s = torch.load(p, weights_only=False)
        self.global_steps = s["gs"]
        self.loaded.append((tag, s["run"]))
        return p, s["cs"]


def _guard(ck, engine=None, **kw):
    return Guard(engine or FakeEngine(), checkpoint_dir=str(ck), save_every=5, monitor_every=0, log=lambda m: None,
                 **kw)


def _train(g, steps):
    while g.step_count < steps:
        g.step(torch.tensor(2.0))


def _tree(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_fresh_guard_never_overwrites_another_runs_checkpoints(tmp_path):
    ck = tmp_path / "ck"
    _train(_guard(ck), 20)  # run A: step_10, step_15, step_20 (keep=3)
    before = _tree(ck)
    g = _guard(ck, FakeEngine(marker="B"))  # run B, no guard.resume()
    want = (f"Guard: checkpoint_dir={str(ck)!r}: already holds checkpoints (step_00000020, step_00000015, "
            "step_00000010, latest) and this run has no guard.resume(): it would overwrite the tags it saves again "
            "and prune the others; call guard.resume() before the first step (to continue from them), or give a new "
            "checkpoint_dir")
    with pytest.raises(CheckpointDirError) as info:  # before: trained, replaced step_10, latest -> B's step_10
        g.step(torch.tensor(2.0))
    assert str(info.value) == want
    with pytest.raises(CheckpointDirError, match="already holds checkpoints"):
        g.save()
    assert _tree(ck) == before and g.engine.global_steps == 0


def test_the_same_text_as_the_trainer_with_its_flags(tmp_path):
    from dstoolkit.runtime.train.resume_check import fresh_run_refusal

    ck = tmp_path / "ck"
    _train(_guard(ck), 5)
    assert fresh_run_refusal(ck) == (
        f"--checkpoint-dir {ck}: already holds checkpoints (step_00000005, latest) and this run has no --resume: it "
        "would overwrite the tags it saves again and prune the others; add --resume (to continue from them), or give "
        "a new --checkpoint-dir")


def test_resume_then_train_continues_the_folder(tmp_path):
    ck = tmp_path / "ck"
    _train(_guard(ck), 20)
    g = _guard(ck, FakeEngine(marker="B"))
    assert g.resume() == "step_00000020" and g.engine.loaded == [("step_00000020", "A")]
    _train(g, 25)
    assert g.mgr.tags() == ["step_00000025", "step_00000020", "step_00000015"]
    assert (ck / "latest").read_text() == "step_00000025"


def test_new_or_empty_folder_and_resume_with_nothing_are_not_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    for ck in (tmp_path / "empty", tmp_path / "new"):
        _train(_guard(ck), 5)
        assert (ck / "latest").read_text() == "step_00000005"
    g = _guard(tmp_path / "new2")
    assert g.resume() is None
    _train(g, 5)


def _saved_by(ck, stage, dp):
    eng = FakeEngine(stage=stage, dp=dp)
    _train(_guard(ck, eng), 20)


def test_resume_from_another_zero_stage_is_refused_in_one_line(tmp_path):
    ck = tmp_path / "ck"
    _saved_by(ck, stage=3, dp=2)
    eng = FakeEngine(stage=1, dp=1)
    g = _guard(ck, eng)
    with pytest.raises(CheckpointDirError) as info:  # before: load_checkpoint ran (DeepSpeed: bare AssertionError)
        g.resume()
    assert str(info.value) == (
        f"Guard: checkpoint_dir={str(ck)!r}: guard.resume() would load step_00000020, saved at ZeRO-3, dp 2, but "
        "this run is ZeRO-1 and dp 1; DeepSpeed loads a ZeRO checkpoint only at the stage and data-parallel size it "
        "was saved at. Resume with a ZeRO-3 config and a world size of 2, or `dstoolkit ckpt reshard` it to a "
        "universal checkpoint and load that in your own DeepSpeed trainer with checkpoint.load_universal true "
        "(Guard.resume() resumes only its own checkpoints)")
    assert eng.loaded == []


def test_resume_at_the_same_layout_loads(tmp_path):
    ck = tmp_path / "ck"
    _saved_by(ck, stage=2, dp=2)
    eng = FakeEngine(stage=2, dp=2)
    assert _guard(ck, eng).resume() == "step_00000020" and eng.loaded == [("step_00000020", "A")]


def test_resume_whose_every_checkpoint_is_rejected_is_refused(tmp_path):
    ck = tmp_path / "ck"
    _train(_guard(ck), 5)
    (ck / "step_00000005" / "mp_rank_00_model_states.pt").write_bytes(b"x")
    g = _guard(ck)
    with pytest.raises(CheckpointDirError) as info:  # before: None, then training from step 0 over the folder
        g.resume()
    assert str(info.value).startswith(f"Guard: checkpoint_dir={str(ck)!r}: guard.resume() found no checkpoint it can "
                                      "load (1 rejected: step_00000005: mp_rank_00_model_states.pt ")
    assert str(info.value).endswith("or start afresh without guard.resume() in a new checkpoint_dir")


def test_resume_from_a_universal_checkpoint_is_refused(tmp_path):
    ck = tmp_path / "uni"
    (ck / "step_00000006" / "zero" / "lm_head.weight").mkdir(parents=True)
    (ck / "latest_universal").write_text("step_00000006")
    with pytest.raises(CheckpointDirError, match=r"^Guard: checkpoint_dir='.*uni': holds a DeepSpeed universal "
                                                 r"checkpoint \(step_00000006: .* which Guard.resume\(\) does not "
                                                 r"resume .* or guard.resume\(\) from the original checkpoint folder "
                                                 r"with the config and a world size of it was saved with$"):
        _guard(ck).resume()


def test_paths_are_checked_at_construction_naming_the_parameter(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(SettingError) as info:  # before: FileExistsError: [Errno 17] File exists
        _guard(f)
    assert str(info.value) == (f"Guard: checkpoint_dir={str(f)!r}: is a file, not a folder; give a new or existing "
                               "folder to write into (or move the file away)")
    with pytest.raises(SettingError) as info:  # before: NotADirectoryError: [Errno 20] Not a directory
        _guard(f / "sub")
    assert str(info.value).startswith(f"Guard: checkpoint_dir={str(f / 'sub')!r}: {f} is a file, not a folder")
    with pytest.raises(SettingError) as info:  # before: IsADirectoryError: [Errno 21] Is a directory
        Guard(FakeEngine(), metrics_path=str(tmp_path), monitor_every=0, log=lambda m: None)
    assert str(info.value).startswith(f"Guard: metrics_path={str(tmp_path)!r}: is a folder, not a file")
    with pytest.raises(SettingError, match=r"^Guard: metrics_path='.*afile/m.jsonl': .*afile is a file, not a "):
        Guard(FakeEngine(), metrics_path=str(f / "m.jsonl"), monitor_every=0, log=lambda m: None)
    with pytest.raises(SettingError, match=r"^checkpoints: keep=0 must be a whole number >= 1"):
        _guard(tmp_path / "k", keep=0)
    assert not (tmp_path / "k").exists()  # checked before the folder is made


def test_metrics_path_in_a_new_folder_is_written(tmp_path):
    g = Guard(FakeEngine(), metrics_path=str(tmp_path / "logs" / "m.jsonl"), monitor_every=0, log=lambda m: None)
    _train(g, 1)
    g.close()
    assert json.loads((tmp_path / "logs" / "m.jsonl").read_text().splitlines()[0])["step"] == 1


class _FullDisk(FakeEngine):
    def save_checkpoint(self, d, tag, client_state, save_latest=True):
        os.makedirs(os.path.join(d, tag), exist_ok=True)
        raise OSError(errno.ENOSPC, "No space left on device")


def test_full_disk_message_names_guards_parameters(tmp_path, monkeypatch):
    usage = ckpt_mod.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(ckpt_mod.shutil, "disk_usage", lambda p: usage._replace(free=0, total=200 << 10))
    g = _guard(tmp_path / "ck", _FullDisk())
    with pytest.raises(ckpt_mod.CheckpointSaveError) as info:
        _train(g, 5)
    ck = tmp_path / "ck"
    assert str(info.value) == (  # before: "(--keep-checkpoints), or give --checkpoint-dir ..., rerun with --resume"
        f"checkpoint {ck / 'step_00000005'}: no space left on device (0.0 MiB free of 0.2 MiB); the partial save "
        f"({ck / '.staging' / 'step_00000005'}) is removed. Free space, keep fewer checkpoints (a lower Guard(keep=...)), or give "
        "checkpoint_dir a folder on a larger disk, then rerun with guard.resume()")

"""Fault-injection and slow-rank flags that could never fire are refused before any rank starts (s37 finding 4).

Was: `dstoolkit train ... -- --data-delay-rank 5` on 2 ranks, `--kill-rank 7 --kill-at-step 1`, `--inject-poison 5:9`
with --steps 2 and gradient accumulation 1, `--link-probe-bytes -5` and `--data-delay-s -1` each ran the whole demo
without the fault (completed, exit 0, no note). Now `fault_flags.fault_flags_problem` refuses each in one line naming
the flag, the value and the range: in `dstoolkit train`'s pre-flight at its --nproc, and in the trainer's own read of
its flags at the launch's WORLD_SIZE. --inject-poison STEP:MICRO fires when step STEP has trained MICRO micro-batches
(`FaultInjector.poison_due(target, len(accepted))`), so MICRO must be below that step's gradient accumulation; with
a batch ramp, the ramp's at that step."""
import json

import pytest

from dstoolkit.cli import main
from dstoolkit.runtime.train import trainer
from dstoolkit.runtime.train.fault_flags import World, step_accum
from dstoolkit.runtime.train.faults import FaultInjector
from dstoolkit.runtime.train.preflight import UsageError, check_launch
from dstoolkit.spec import load_spec

RANKS_2 = "it has 2 ranks, 0..1 (--nproc 2)"


@pytest.mark.parametrize("extra, message", [
    (["--data-delay-rank", "5", "--data-delay-s", "0.1"],
     f"--data-delay-rank=5 is not a rank of this run: {RANKS_2}; give one of them, or leave the flag out to slow "
     "every rank"),
    (["--data-delay-rank", "-1", "--data-delay-s", "0.1"],
     "--data-delay-rank=-1 must be a rank, a whole number >= 0; give one of them, or leave the flag out to slow every "
     "rank"),
    (["--data-delay-rank", "1"], "--data-delay-rank=1 without --data-delay-s: no rank sleeps; add --data-delay-s "
                                 "SECONDS, e.g. --data-delay-s 0.3"),
    (["--kill-rank", "7", "--kill-at-step", "1"],
     f"--kill-rank=7 is not a rank of this run: {RANKS_2}; give the rank to kill with --kill-rank 0..1"),
    (["--kill-rank", "0"], "--kill-rank=0 without --kill-at-step: no rank is killed; add --kill-at-step STEP (1..2)"),
    (["--kill-at-step", "3"], "--kill-at-step=3: step 3 is beyond --steps 2, so it never fires; give a step 1..2"),
    (["--kill-at-step", "0"], "--kill-at-step=0: step 0 never comes (steps count from 1), so it never fires; give a "
                              "step 1..2"),
    (["--inject-poison", "5:9"], "--inject-poison=5:9: step 5 is beyond --steps 2, so it never fires; give a step 1..2"),
    (["--inject-poison", "1", "--inject-poison", "1:0"],
     "--inject-poison is given twice for step 1 (1:0 and 1:0); only one fires: give each step once"),
    (["--inject-lr-blowup", "3:10"],
     "--inject-lr-blowup=3:10: step 3 is beyond --steps 2, so it never fires; give a step 1..2"),
    (["--inject-lr-blowup", "1:0"], "--inject-lr-blowup=1:0: factor 0.0 must be a finite number > 0, e.g. 1:1000"),
    (["--inject-lr-blowup", "1:10", "--inject-lr-blowup", "1:20"],
     "--inject-lr-blowup is given twice for step 1 (1:10 and 1:20); only one fires: give each step once"),
    (["--inject-lr-blowup", "x"], "--inject-lr-blowup 'x': expected STEP:FACTOR, e.g. 18:1000"),
    (["--link-probe-bytes", "-5"], "--link-probe-bytes=-5 must be 0 (off) or a byte count >= 4 (the probe sends "
                                   "float32 values), e.g. 1048576 (the default)"),
    (["--data-delay-s", "-1"], "--data-delay-s=-1.0 must be a finite number of seconds >= 0 (0: no delay), e.g. 0.3"),
    (["--data-delay-s", "nan"], "--data-delay-s=nan must be a finite number of seconds >= 0 (0: no delay), e.g. 0.3"),
])
def test_dstoolkit_train_refuses_a_fault_that_never_fires(train_files, tmp_path, capsys, monkeypatch, extra, message):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    spec, ds = train_files
    rc = main(["train", "--spec", str(spec), "--config", str(ds), "--steps", "2", "--metrics-out",
               str(tmp_path / "m.jsonl"), "--dry-run", "--", *extra])
    assert (rc, capsys.readouterr().err) == (2, f"dstoolkit train: error: {message}\n")


def test_a_micro_batch_beyond_the_steps_accumulation_is_refused(train_files, tmp_path):
    spec, ds = train_files  # train_batch_size 8 = micro 4 x 2 ranks x gradient_accumulation_steps 1
    with pytest.raises(UsageError) as info:
        check_launch(["--deepspeed_config", str(ds), "--spec", str(spec), "--steps", "2", "--metrics-out",
                      str(tmp_path / "m.jsonl"), "--inject-poison", "2:9"], 2, config_flag="--config")
    assert str(info.value) == (f"--inject-poison=2:9: step 2 trains 1 micro-batch per rank (gradient_accumulation_"
                               f"steps 1 of --config {ds}), so micro-batch 9 never comes; give a 0-based MICRO 0..0, "
                               "e.g. 2:0")


def test_the_accumulation_is_completed_from_the_ranks_when_the_config_leaves_it_out(train_files, tmp_path):
    spec, _ = train_files
    ds = tmp_path / "ds2.json"  # DeepSpeed derives gradient_accumulation_steps = 16 / (4 x 2) = 2
    ds.write_text(json.dumps({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4}))
    base = ["--deepspeed_config", str(ds), "--spec", str(spec), "--steps", "2", "--metrics-out",
            str(tmp_path / "m.jsonl")]
    assert check_launch(base + ["--inject-poison", "2:1"], 2).blowups == {}
    with pytest.raises(UsageError) as info:
        check_launch(base + ["--inject-poison", "2:2"], 2)
    assert str(info.value) == (f"--inject-poison=2:2: step 2 trains 2 micro-batches per rank (gradient_accumulation_"
                               f"steps 2 of --deepspeed_config {ds} at --nproc 2), so micro-batch 2 never comes; give "
                               "a 0-based MICRO 0..1, e.g. 2:1")


@pytest.fixture
def ramp_files(tmp_path):
    """Megatron ramp 8 -> 32 by 8 over 64 samples at micro 4 x 2 ranks: global batch 8,8,8,16,16,24,32 (gas = /8)."""
    spec = tmp_path / "ramp.yaml"
    spec.write_text("name: r\nmodel: {preset: tiny}\ncluster: {nodes: 1, gpus_per_node: 2, gpu: cpu}\n"
                    "training: {seq_len: 16, global_batch: 32, micro_batch: 4, batch_ramp: {kind: megatron, "
                    "start_batch: 8, increment: 8, ramp_samples: 64}}\n")
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4,
                              "gradient_accumulation_steps": 4}))
    return spec, ds


def test_with_a_batch_ramp_the_micro_batch_is_checked_against_that_steps_accumulation(ramp_files, tmp_path):
    spec, ds = ramp_files
    cfg, sp = json.loads(ds.read_text()), load_spec(spec)
    got = [step_accum(cfg, sp, World(2, "--nproc 2"), s, "--config", str(ds)).count for s in range(1, 10)]
    assert got == [1, 1, 1, 2, 2, 3, 4, 4, 4]
    base = ["--deepspeed_config", str(ds), "--spec", str(spec), "--steps", "9", "--metrics-out",
            str(tmp_path / "m.jsonl")]
    check_launch(base + ["--inject-poison", "4:1", "--inject-poison", "7:3"], 2)
    with pytest.raises(UsageError) as info:
        check_launch(base + ["--inject-poison", "3:1"], 2, config_flag="--config")
    assert str(info.value) == ("--inject-poison=3:1: step 3 trains 1 micro-batch per rank (the spec's batch_ramp at "
                               "step 3: global batch 8 = micro batch 4 x 2 ranks x 1 (--nproc 2)), so micro-batch 1 "
                               "never comes; give a 0-based MICRO 0..0, e.g. 3:0")


def test_flags_that_fire_are_accepted_and_the_default_kill_rank_is_1(train_files, tmp_path):
    spec, ds = train_files
    inputs = check_launch(["--deepspeed_config", str(ds), "--spec", str(spec), "--steps", "2", "--metrics-out",
                           str(tmp_path / "m.jsonl"), "--inject-poison", "2:0", "--inject-lr-blowup", "1:100",
                           "--kill-at-step", "2", "--data-delay-rank", "1", "--data-delay-s", "0.1",
                           "--link-probe-bytes", "0"], 2)
    assert inputs.blowups == {1: 100.0}
    args = trainer.build_parser().parse_args(["--deepspeed_config", "x", "--spec", "y", "--steps", "2",
                                              "--metrics-out", "m", "--kill-at-step", "2"])
    assert FaultInjector(args, {}, writer=None).kill_rank == 1


class Started(BaseException):  # past the trainer's `except Exception`
    pass


@pytest.fixture
def trainer_run(train_files, tmp_path, monkeypatch):
    """The trainer launched directly (a torchrun of its module), stopped where the process group would start."""
    def start(*_a, **_k):
        raise Started

    monkeypatch.setattr(trainer, "setup", start)
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE", raising=False)
    spec, ds = train_files

    def run(*extra):
        try:
            return trainer.main(["--deepspeed_config", str(ds), "--spec", str(spec), "--steps", "2", "--metrics-out",
                                 str(tmp_path / "m.jsonl"), "--no-progress", *extra])
        except Started:
            return "started"
    return run


def test_the_trainer_refuses_a_rank_beyond_its_launch_world_size(trainer_run, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    assert trainer_run("--data-delay-rank", "5", "--data-delay-s", "0.1") == 2
    assert capsys.readouterr().err == (
        "dstoolkit.runtime.train.trainer: error: --data-delay-rank=5 is not a rank of this run: it has 2 ranks, 0..1 "
        "(WORLD_SIZE=2, the launch's world size); give one of them, or leave the flag out to slow every rank\n")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert trainer_run("--kill-at-step", "1") == 2  # the default --kill-rank 1 on one rank
    assert capsys.readouterr().err == (
        "dstoolkit.runtime.train.trainer: error: --kill-rank=1 (the default) is not a rank of this run: it has 1 "
        "rank, 0..0 (WORLD_SIZE=1, the launch's world size); give the rank to kill with --kill-rank 0..0\n")
    assert trainer_run("--kill-at-step", "1", "--kill-rank", "0") == "started"


def test_without_a_known_world_size_only_the_rank_independent_ranges_are_checked(trainer_run, monkeypatch, capsys):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert trainer_run("--data-delay-rank", "5", "--data-delay-s", "0.1") == "started"
    assert trainer_run("--data-delay-rank", "-1", "--data-delay-s", "0.1") == 2
    assert "--data-delay-rank=-1 must be a rank, a whole number >= 0" in capsys.readouterr().err

"""bench train: metric summary, errors, and refusing bad configs before launching anything."""
import json
import pathlib

import pytest

from dstoolkit.runtime.bench import train, train_estimate, train_report
from dstoolkit.runtime.bench.harness import BenchInputError
from dstoolkit.cli import main


def _rows():
    rows = [{"step": i, "loss": 8.0 - 0.1 * i, "step_time_s": t, "tokens_per_s": 512 / t, "global_batch": 8,
             "micro_batch": 4, "grad_accum": 1, "peak_rss_bytes": 100 + i, "lr": 1e-3}
            for i, t in enumerate([5.0, 2.0, 1.0, 1.0, 1.0, 2.0], start=1)]
    return rows + [{"event": "done", "steps": 6}]


def test_summarize_metrics_skips_warmup_steps():
    m = train_report.summarize_metrics(_rows(), skip_steps=2, seq_len=64)
    assert m["timed_steps"] == 4 and m["steps"] == 6
    assert m["step_time_s_median"] == pytest.approx(1.0)
    assert m["step_time_s_p90"] == pytest.approx(1.7)  # linear interpolation of [1, 1, 1, 2]
    assert m["tokens_per_s"] == pytest.approx(8 * 64 / 1.0)
    assert m["peak_memory_bytes"] == 106
    assert m["loss_first"] == pytest.approx(7.9) and m["loss_last"] == pytest.approx(7.4)
    with pytest.raises(RuntimeError, match="skip-steps"):
        train_report.summarize_metrics(_rows(), skip_steps=6, seq_len=64)


def test_rel_error():
    assert train_report.rel_error(1.2, 1.0) == pytest.approx(0.2)
    assert train_report.rel_error(None, 1.0) is None and train_report.rel_error(1.0, 0) is None


def test_trainer_command_is_the_deepspeed_launcher(tmp_path):
    cmd = train.trainer_command(tmp_path / "ds.json", tmp_path / "s.yaml", 5, tmp_path / "m.jsonl", 2, 2, 12345)
    assert "--module" in cmd and "dstoolkit.runtime.train.trainer" in cmd
    assert cmd[cmd.index("--num_gpus") + 1] == "2" and cmd[cmd.index("--ep-size") + 1] == "2"
    assert cmd[0].endswith("deepspeed") or "deepspeed" in " ".join(cmd[:3])


def test_config_failing_validation_exits_2(tmp_path, repo_root, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"train_batch_size": 7, "train_micro_batch_size_per_gpu": 4,
                               "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2}}))
    rc = main(["bench", "train", str(bad), "--spec", str(repo_root / "ds_configs" / "tiny_cpu.yaml"), "--steps", "3"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "fails validation" in err and "train_batch_size" in err and str(bad) in err, err


def test_missing_target_and_bad_steps_exit_2(tmp_path, capsys):
    assert main(["bench", "train", str(tmp_path / "nope.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    cfg = tmp_path / "ok.json"
    cfg.write_text("{}")
    assert main(["bench", "train", str(cfg), "--steps", "2", "--skip-steps", "2"]) == 2
    assert "must exceed" in capsys.readouterr().err


def test_overlap_bad_world_size_exits_2(tmp_path, capsys):
    cfg = tmp_path / "z.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1}}))
    assert main(["bench", "overlap", str(cfg), "--world-size", "100000"]) == 2
    assert "--world-size 100000" in capsys.readouterr().err


def test_calibration_reads_per_clock_files_with_per_precision_rates(tmp_path):
    cal = {"calibration": {"wall": {"matmul_flops_per_s_bf16": 2e10, "matmul_flops_per_s_bf16_large": 3e10,
                                    "matmul_flops_per_s_fp32": 4e10, "matmul_work": 1e4, "matmul_work_large": 4e4,
                                    "mem_bw_bytes_per_s": 3e9, "comm_busbw_bytes_per_s": 1e9},
                           "cpu": {"matmul_flops_per_s_bf16": 9e10}}}
    path = tmp_path / "calibration_cpu_x.json"
    path.write_text(json.dumps(cal))
    raw = train_estimate.load_calibration(str(path))
    c = train_estimate.calibration_for(raw, "bf16")
    assert (c.matmul_flops_per_s, c.matmul_flops_per_s_large, c.comm_busbw_bytes_per_s) == (2e10, 3e10, 1e9)
    assert train_estimate.calibration_for(raw, "fp32").matmul_flops_per_s == 4e10
    assert train_estimate.load_calibration(None) is None
    path.write_text("{")
    with pytest.raises(BenchInputError, match="cannot read calibration JSON"):
        train_estimate.load_calibration(str(path))


def test_bench_tune_and_hf_callback_estimate_through_one_path(monkeypatch, repo_root):
    """`bench train` (default --calibration auto), the HF callback (calibration None) and the tuner give the same
    estimate for the same config: all of them use the spec's own calibration (before: bench's 'auto' read the
    checkout's benchmarks/results/calibration_cpu_*.json, 20,843 vs the tuner's 7,652 tok/s on zero0 mb1 here)."""
    from dstoolkit.models import resolve_model
    from dstoolkit.spec import load_spec
    from dstoolkit.tune.space import TuneSpace, estimated_tokens_per_s

    monkeypatch.setenv("DSTOOLKIT_CALIBRATION", "reference")  # the packaged file: no probe of this machine
    path = repo_root / "tests" / "dist" / "user_scripts" / "spec.yaml"
    spec = load_spec(path)
    shape = resolve_model(spec.model, path.parent)
    space = TuneSpace.from_spec(spec, shape, data_parallel_only=True)
    checked = [c for c in (space.check(p) for p in space.points()) if not c.pruned][:4]
    assert checked
    assert train_estimate.load_calibration("auto") is None and train_estimate.load_calibration(None) is None
    for chk in checked:
        tune = estimated_tokens_per_s(spec, chk.estimate)
        bench = train_estimate.estimate_for(spec, shape, chk.ds_config, 2, 1, train_estimate.load_calibration("auto"))
        assert bench["tokens_per_s"] == pytest.approx(tune, rel=1e-9), chk.point.label
        assert bench["calibration_source"].startswith("reference calibration")
    nominal = train_estimate.estimate_for(spec, shape, checked[0].ds_config, 2, 1, train_estimate.load_calibration("none"))
    assert nominal["calibration_source"] == "nominal hardware-table rates" and not nominal["calibrated"]


def test_user_config_with_auto_values_runs_as_given_and_is_resolved_for_the_estimate_only(tmp_path):
    """An HF-style config ("auto" values) passes HF-mode validation, goes to the command unchanged as {config},
    and is made concrete for the estimate from the command's flags, then the spec, then HF defaults."""
    import json as _json

    from dstoolkit.runtime.bench import targets
    from dstoolkit.runtime.bench.usercmd import command_values, resolve_user_config
    from dstoolkit.spec import load_spec

    user = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "bf16": {"enabled": "auto"},
            "zero_optimization": {"stage": 2}}
    targets.validate_ds_config(user, "hf", 2)  # strict mode would refuse every "auto"
    spec = load_spec(pathlib.Path(__file__).resolve().parents[1] / "dist" / "user_scripts" / "spec.yaml")
    cmd = ["torchrun", "train.py", "--deepspeed", "{config}", "--per_device_train_batch_size", "4", "--bf16",
           "--gradient_accumulation_steps", "{grad_accum}"]
    resolved, assumed = resolve_user_config(user, command=cmd, spec=spec, world_size=2)
    assert resolved["train_micro_batch_size_per_gpu"] == 4 and resolved["bf16"]["enabled"] is True
    assert resolved["gradient_accumulation_steps"] == spec.training.global_batch // (4 * 2)
    assert resolved["train_batch_size"] == spec.training.global_batch and resolved["gradient_clipping"] == 1.0
    assert "/train_micro_batch_size_per_gpu = 4 (--per_device_train_batch_size 4 in the command)" in assumed
    assert "/bf16/enabled = true (--bf16 in the command)" in assumed
    assert any(a.startswith("/gradient_clipping = 1.0 (HF default") for a in assumed), assumed
    vals = command_values(user, tmp_path, world_size=2, steps=3, resolved=resolved)
    assert _json.loads(pathlib.Path(vals["config"]).read_text()) == user  # the user's file as given
    assert vals["micro_batch"] == "4" and vals["precision_flag"] == "--bf16"


def test_launcher_found_beside_the_interpreter_else_named_with_the_path_fix(tmp_path, monkeypatch):
    import sys as _sys

    from dstoolkit.runtime.bench.harness import BenchInputError
    from dstoolkit.runtime.bench.usercmd import find_launcher

    bindir = tmp_path / "venv" / "bin"
    bindir.mkdir(parents=True)
    (bindir / "torchrun").write_text("#!/bin/sh\n")
    (bindir / "torchrun").chmod(0o755)
    monkeypatch.setattr(_sys, "executable", str(bindir / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert find_launcher(["torchrun", "x.py"]) == [str(bindir / "torchrun"), "x.py"]
    assert find_launcher(["python", "x.py"]) == ["python", "x.py"]  # not a launcher: left alone
    with pytest.raises(BenchInputError) as exc:
        find_launcher(["accelerate", "launch", "x.py"])
    msg = str(exc.value)
    assert "'accelerate'" in msg and "not on PATH" in msg and "export PATH=" in msg and str(bindir) in msg


def test_user_command_runs_in_the_callers_directory_so_a_relative_script_is_found(tmp_path, monkeypatch):
    """`bench train CFG -- torchrun ... train.py` as typed in the user's folder: the script path is relative to
    where the user is, not to the run folder dstoolkit writes the config into."""
    import sys as _sys

    from dstoolkit.runtime.bench.usercmd import run_command

    work = tmp_path / "project"
    work.mkdir()
    (work / "train.py").write_text("import os, sys\nopen(os.path.join(sys.argv[1], 'ran'), 'w').write(os.getcwd())\n")
    monkeypatch.chdir(work)
    run_dir = tmp_path / "runs" / "c1"
    res = run_command([_sys.executable, "train.py", "{out}"], {"train_micro_batch_size_per_gpu": 1}, run_dir,
                      steps=2, skip_steps=0, world_size=1, timeout_s=60)
    assert (run_dir / "ran").read_text() == str(work)  # it ran, in the user's folder, and wrote to {out}
    assert res["status"] == "error" and "no DeepSpeed engine step was seen" in res["reason"]


def test_failure_reason_is_the_ranks_error_not_torchruns_banner():
    from dstoolkit.runtime.bench.usercmd import _failure

    tail = "\n".join([
        "/venv/bin/python: can't open file '/w/train.py': [Errno 2] No such file or directory",
        "E1202 17:43:24.574000 11111 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 2)",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================"])
    status, reason = _failure(1, tail, 60, False)
    assert status == "error" and reason.startswith("/venv/bin/python: can't open file '/w/train.py'"), reason
    assert reason.endswith("(exit 1)")


def test_failed_row_in_the_table_prints_its_reason():
    rec = {"config_name": "mine", "status": "failed", "returncode": 1, "reason": "ValueError: bad (exit 1)",
           "error_tail": "x\n====="}
    line = train_report.format_table([rec]).splitlines()[-1]
    assert line.split() == ["mine", "FAILED", "(exit", "1):", "ValueError:", "bad", "(exit", "1)"]

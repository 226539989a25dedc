"""The Megatron launch scripts stop before any rank starts (exit 2, one line naming PRETRAIN and the fix) when
PRETRAIN is not a file, and `generate --help` says what PRETRAIN's default is.

Before: the scripts fell back to Megatron-LM/pretrain_gpt.py (or Megatron-DeepSpeed/...) relative to the current
directory without checking it; torchrun started every rank, each printed "can't open file", and torchrun ended with
ChildFailedError (and the Megatron-DeepSpeed QKV-split check was skipped). --help said "PRETRAIN must be set".
"""
from __future__ import annotations

import os
import subprocess

import pytest

from dstoolkit.cli import main

SPEC = """\
name: pre
model: {preset: tiny}
cluster: {nodes: 1, gpus_per_node: 2, gpu: cpu}
training: {seq_len: 128, global_batch: 8, precision: bf16, zero_stage: 1}
"""
GPU_SPEC = SPEC.replace("gpu: cpu", "gpu: H100-SXM")  # Megatron-LM runs on GPUs only (last test)
NAMES = {"launch_megatron_lm.sh": "Megatron-LM", "launch_megatron_deepspeed.sh": "Megatron-DeepSpeed"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("s32pre")
    (tmp / "spec.yaml").write_text(GPU_SPEC)
    assert main(["generate", str(tmp / "spec.yaml"), "-o", str(tmp / "out"), "--strategy", "zero1",
                 "--target", "megatron-lm", "--target", "megatron-deepspeed"]) == 0
    return tmp / "out" / "zero1"


def _run(script, cwd, env, fake_bin):
    e = {k: v for k, v in os.environ.items() if k not in ("PRETRAIN", "DATA_ARGS", "MOCK_DATA", "NNODES")}
    e["PATH"] = f"{fake_bin}{os.pathsep}{e['PATH']}"
    return subprocess.run(["bash", str(script)], env={**e, **env}, cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.fixture()
def fake_bin(tmp_path):
    b = tmp_path / "bin"
    b.mkdir()
    (b / "torchrun").write_text('#!/usr/bin/env bash\necho "TORCHRUN $*"\n')  # never reached on a refusal
    (b / "torchrun").chmod(0o755)
    return b


@pytest.mark.parametrize("script", sorted(NAMES))
@pytest.mark.parametrize("pretrain", [None, "/no/such dir/pretrain_gpt.py"])
def test_missing_pretrain_is_refused_before_torchrun(folder, tmp_path, fake_bin, script, pretrain):
    env = {"DATA_ARGS": "--data-path x", "MOCK_DATA": "1"}
    if pretrain is not None:
        env["PRETRAIN"] = pretrain
    r = _run(folder / script, tmp_path, env, fake_bin)
    shown = pretrain or f"{NAMES[script]}/pretrain_gpt.py"
    quoted = f"'{shown}'"
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (f"{script}: PRETRAIN={quoted} is not a file (from {tmp_path}): set PRETRAIN=/path/to/"
                        f"{NAMES[script]}/pretrain_gpt.py (or dstoolkit generate --pretrain-script PATH)\n")


@pytest.mark.parametrize("script", sorted(NAMES))
def test_default_relative_pretrain_runs_when_present(folder, tmp_path, fake_bin, script):
    (tmp_path / NAMES[script]).mkdir()
    (tmp_path / NAMES[script] / "pretrain_gpt.py").write_text("")
    r = _run(folder / script, tmp_path, {"DATA_ARGS": "--data-path x"}, fake_bin)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("TORCHRUN ") and f" {NAMES[script]}/pretrain_gpt.py " in r.stdout


def test_help_names_the_default(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = "".join(capsys.readouterr().out.split())  # argparse wraps lines (and breaks at hyphens)
    assert "PRETRAINmustbeset" not in text
    assert "".join(("as PRETRAIN's default (default: Megatron-LM/pretrain_gpt.py or Megatron-DeepSpeed/pretrain_gpt.py, "
            "relative to where the script is launched); PRETRAIN=... overrides it when launching, and the script "
            "stops before starting ranks when it is not a file").split()) in text


def test_cpu_spec_gets_no_megatron_lm_files(tmp_path, capsys):
    """Megatron-LM asserts CUDA at initialize (megatron/training/initialize.py at d98e8a64): a CPU spec's megatron-lm
    target is refused with that reason. Before: files and a 'run megatron-lm' line, with the nccl default backend."""
    from dstoolkit.generate.megatron_lm import CPU_REASON

    (tmp_path / "spec.yaml").write_text(SPEC)
    out = tmp_path / "out"
    assert main(["generate", str(tmp_path / "spec.yaml"), "-o", str(out), "--strategy", "zero1",
                 "--target", "megatron-lm"]) == 2  # megatron-lm alone: the spec is refused at load (generate.io)
    err = capsys.readouterr().err
    assert "cluster.gpu: --target megatron-lm on this cluster: " + CPU_REASON.split("; use ")[0] in err
    assert not out.exists()
    assert main(["generate", str(tmp_path / "spec.yaml"), "-o", str(out), "--strategy", "zero1",
                 "--target", "megatron-lm", "--target", "megatron-deepspeed"]) == 0
    text = capsys.readouterr().out
    assert f"  zero1: no megatron-lm files: {CPU_REASON}\n" in text and "run megatron-lm" not in text
    assert sorted(p.name for p in (out / "zero1").iterdir() if "megatron" in p.name) == [
        "launch_megatron_deepspeed.sh", "megatron_deepspeed_args.txt"]

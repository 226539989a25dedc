"""s31 generate findings 3, 8 and 16e: launch.sh of a layout the bundled (data-parallel) trainer cannot run, user paths
as shell defaults, printed commands quoted."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from dstoolkit.cli import main
from dstoolkit.generate.bundled import cached_bundled
from dstoolkit.generate.launch import TRAIN_MODULE
from dstoolkit.generate.summary import run_hints

REPO = Path(__file__).resolve().parents[2]
TINY = (REPO / "ds_configs" / "tiny_cpu.yaml").read_text()


def _spec(tmp_path: Path, name: str, **layout) -> Path:
    text = TINY
    for k, v in layout.items():
        text, n = re.subn(rf"^  {k}: 1\b", f"  {k}: {v}", text, flags=re.M)
        assert n == 1, k
    p = tmp_path / f"{name}.yaml"
    p.write_text(text.replace("name: tiny_cpu", f"name: {name}"))
    return p


def _bash(script: Path, env: dict, *args) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("TRAIN_MODULE", "PRETRAIN", "DATA_ARGS")}
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env={**e, **env}, timeout=60,
                          cwd=script.parent)


def _run_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("run ")]


# finding 3: launch.sh ran the data-parallel example trainer for tp / pp > 1 layouts (DeepSpeed batch assertion)

@pytest.mark.parametrize("layout", [{"tp": 2}, {"pp": 2}])
def test_split_layout_launch_sh_requires_own_trainer_before_anything_starts(tmp_path, capsys, layout):
    spec = _spec(tmp_path, "split", **layout)
    out = tmp_path / "g"
    assert main(["generate", str(spec), "--out", str(out), "--strategy", "zero1"]) == 0
    printed = capsys.readouterr().out
    folder = out / "zero1"
    (k, v), = layout.items()
    for env in ({}, {"TRAIN_MODULE": TRAIN_MODULE}):  # unset, or the bundled trainer named by hand
        r = _bash(folder / "launch.sh", {"DRY_RUN": "1", **env})
        assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "TRAIN_MODULE must name your own trainer" in lines[0], r.stderr
        assert f"has {k} {v}" in lines[0] and "data parallel only" in lines[0] and "launch_megatron_lm.sh" in lines[0]
    r = _bash(folder / "launch.sh", {"DRY_RUN": "1", "TRAIN_MODULE": "my_pkg.train"})
    assert r.returncode == 0, r.stderr
    argv = shlex.split(r.stdout)
    assert argv[argv.index("--module") + 1] == "my_pkg.train" and "--deepspeed_config" in argv
    # what generate prints and writes says which file to run and how
    hint, = _run_lines(printed)
    assert f"TRAIN_MODULE=YOUR.TRAINER.MODULE bash {out}/zero1/launch.sh" in hint and "launch_megatron_deepspeed.sh" in hint
    index = (out / "summary.md").read_text()
    assert "TRAIN_MODULE=YOUR.TRAINER.MODULE bash ./zero1/launch.sh" in index
    note = next(ln for ln in (folder / "summary.md").read_text().splitlines() if ln.startswith("- `launch.sh`"))
    assert "needs your own trainer" in note and "TRAIN_MODULE=your.module" in note


def test_data_parallel_launch_sh_still_runs_the_bundled_trainer(tmp_path, capsys):
    out = tmp_path / "g"
    assert main(["generate", str(REPO / "ds_configs" / "tiny_cpu.yaml"), "--out", str(out), "--strategy", "zero1"]) == 0
    hint, = _run_lines(capsys.readouterr().out)
    assert hint.endswith(f"bash {out}/zero1/launch.sh") and "TRAIN_MODULE" not in hint
    r = _bash(out / "zero1" / "launch.sh", {"DRY_RUN": "1"})
    assert r.returncode == 0, r.stderr
    argv = shlex.split(r.stdout)
    assert argv[argv.index("--module") + 1] == TRAIN_MODULE


def test_llama3_hints_name_own_trainer_for_tp2_and_the_fastest_bundled_trainer_folder():
    res = cached_bundled(str(REPO / "ds_configs"), "llama3_8b_1x8_h100")
    hints = run_hints(res, "out/llama3")
    fastest = next(h for h in hints if h.startswith("deepspeed, fastest"))
    assert "TRAIN_MODULE=YOUR.TRAINER.MODULE bash out/llama3/zero1/launch.sh" in fastest and "has tp 2" in fastest
    dp = [o for o in res.generated if o.per_target["deepspeed"].candidate.tp == o.per_target["deepspeed"].candidate.pp == 1]
    best = min(dp, key=lambda o: o.per_target["deepspeed"].estimate.step_time_s)
    bundled = next(h for h in hints if h.startswith("deepspeed with the bundled trainer"))
    assert bundled.endswith(f"bash out/llama3/{best.name}/launch.sh")
    # the committed folder's script says the same before anything starts
    folder = REPO / "ds_configs" / "generated" / "llama3_8b_1x8_h100"
    assert "NEEDS_OWN_TRAINER=" in (folder / "zero1" / "launch.sh").read_text()
    assert "NEEDS_OWN_TRAINER=" not in (folder / best.name / "launch.sh").read_text()


# finding 16e: the printed run command was not shell-quoted

def test_printed_run_command_is_shell_quoted(tmp_path, capsys):
    out = tmp_path / "out dir"
    assert main(["generate", str(REPO / "ds_configs" / "tiny_cpu.yaml"), "--out", str(out), "--strategy", "zero1"]) == 0
    hint, = _run_lines(capsys.readouterr().out)
    assert shlex.split(hint.split(": ", 1)[1]) == ["bash", f"{out}/zero1/launch.sh"]


# finding 8: --pretrain-script with a space reached torchrun with literal single quotes

FAKE_TORCHRUN = "#!/usr/bin/env bash\nprintf '%s\\0' \"$@\" > \"$ARGV_OUT\"\n"


@pytest.mark.parametrize("name", ["mega path", "it's {odd} $HOME `x` \"q\" \\"])
def test_pretrain_script_reaches_torchrun_exactly(tmp_path, name):
    script = tmp_path / name / "pretrain_gpt.py"
    script.parent.mkdir()
    script.write_text("print(1)\n")
    out = tmp_path / "g"
    gpu = tmp_path / "tiny_gpu.yaml"  # Megatron-LM runs on GPUs only: generate gives a CPU spec no megatron-lm files
    gpu.write_text(TINY.replace("gpu: cpu", "gpu: H100-SXM"))
    assert main(["generate", str(gpu), "--out", str(out), "--strategy", "zero1",
                 "--target", "megatron-lm", "--target", "megatron-deepspeed", "--pretrain-script", str(script)]) == 0
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "torchrun").write_text(FAKE_TORCHRUN)
    (bindir / "torchrun").chmod(0o755)
    for launch in ("launch_megatron_lm.sh", "launch_megatron_deepspeed.sh"):
        argv_out = tmp_path / f"{launch}.argv"
        env = {"PATH": f"{bindir}:{os.environ['PATH']}", "ARGV_OUT": str(argv_out), "DATA_ARGS": "--mock-data"}
        r = _bash(out / "zero1" / launch, env)
        assert r.returncode == 0, r.stderr
        argv = argv_out.read_bytes().split(b"\0")[:-1]
        assert str(script).encode() in argv, argv[:12]

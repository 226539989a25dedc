"""`pip install dstoolkit` (the core, no extras) into a clean venv: no torch, and the core verbs still work.

The package is built from a copy of the repo's pyproject.toml, README.md and dstoolkit/ (so the build writes
nothing into the working tree) and installed non-editable into a fresh `python -m venv` (no system site
packages). pip's own configuration (index, find-links) is kept. The test then checks that torch, deepspeed,
optuna, matplotlib and transformers are not installed, and that `import dstoolkit.cli` plus `validate`,
`estimate` and `generate` run from that venv with none of them in sys.modules.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = pathlib.Path(__file__).resolve().parents[2]
HEAVY = ("torch", "deepspeed", "optuna", "matplotlib", "transformers")
"""Distributions the core must not pull in (each is also its import name)."""
CONFIG = REPO / "ds_configs" / "generated" / "tiny_cpu" / "zero2" / "ds_config.json"
SPEC = REPO / "ds_configs" / "tiny_cpu.yaml"


def _env() -> dict[str, str]:
    """The caller's environment minus anything that would let the venv see the repo or the test venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.fixture(scope="module")
def core_venv(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("core_install")
    venv = root / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True, env=_env())
    if made.returncode != 0 or not (venv / "bin" / "python").is_file():
        pytest.skip(f"python -m venv cannot create a venv here: {made.stderr.strip()[-300:]}")
    src = root / "src"
    src.mkdir()
    shutil.copy2(REPO / "pyproject.toml", src)
    shutil.copy2(REPO / "README.md", src)
    shutil.copytree(REPO / "dstoolkit", src / "dstoolkit", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    inst = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(src)],
                          capture_output=True, text=True, env=_env(), cwd=root, timeout=540)
    assert inst.returncode == 0, inst.stdout[-2000:] + inst.stderr[-4000:]
    return venv


def _run(venv: pathlib.Path, *args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / a) if i == 0 else a for i, a in enumerate(args)],
                          capture_output=True, text=True, env=_env(), cwd=cwd, timeout=120)


def test_core_install_has_no_heavy_dependency(core_venv, tmp_path):
    out = _run(core_venv, "python", "-m", "pip", "list", "--format=json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    installed = {d["name"].lower().replace("_", "-") for d in json.loads(out.stdout)}
    assert "dstoolkit" in installed
    assert not installed & set(HEAVY), sorted(installed & set(HEAVY))


def test_core_cli_runs_without_torch(core_venv, tmp_path):
    probe = (
        "import importlib.util, json, sys\n"
        "import dstoolkit, dstoolkit.cli\n"
        f"rc = dstoolkit.cli.main(['validate', {str(CONFIG)!r}, '--world-size', '2'])\n"
        f"heavy = {HEAVY!r}\n"
        "print(json.dumps({'rc': rc, 'file': dstoolkit.__file__,\n"
        "                  'loaded': [m for m in heavy if m in sys.modules],\n"
        "                  'findable': [m for m in heavy if importlib.util.find_spec(m) is not None]}))\n"
    )
    out = _run(core_venv, "python", "-c", probe, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["rc"] == 0, out.stdout
    assert got["file"].startswith(str(core_venv)), got["file"]  # the installed copy, not the repo's
    assert got["loaded"] == [] and got["findable"] == [], got

    val = _run(core_venv, "dstoolkit", "validate", str(CONFIG), "--world-size", "2", cwd=tmp_path)
    assert val.returncode == 0, val.stdout + val.stderr
    assert "0 error(s)" in val.stdout + val.stderr, val.stdout + val.stderr  # the summary line goes to stderr


def test_core_estimate_and_generate(core_venv, tmp_path):
    est = _run(core_venv, "dstoolkit", "estimate", str(SPEC), cwd=tmp_path)
    assert est.returncode == 0, est.stdout + est.stderr
    assert "memory per rank" in est.stdout and "step time" in est.stdout, est.stdout
    gen = _run(core_venv, "dstoolkit", "generate", str(SPEC), "--out", str(tmp_path / "gen"), cwd=tmp_path)
    assert gen.returncode == 0, gen.stdout + gen.stderr
    configs = sorted(tmp_path.glob("gen/*/ds_config.json"))
    assert configs, gen.stdout
    again = _run(core_venv, "dstoolkit", "validate", *map(str, configs), "--world-size", "2", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr


@pytest.mark.parametrize("argv, extra, module", [
    (("train", "--spec", str(SPEC), "--config", str(CONFIG), "--steps", "2"), "train", "deepspeed"),
    (("bench", "train", str(CONFIG)), "bench", "deepspeed"),
    (("tune", str(SPEC), "--budget", "2", "-o", "tune_out"), "tune", "optuna"),
    (("report", str(REPO / "benchmarks" / "results")), "bench", "matplotlib"),
])
def test_verbs_that_need_an_extra_name_it(core_venv, tmp_path, argv, extra, module):
    out = _run(core_venv, "dstoolkit", *argv, cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr == (f"dstoolkit {argv[0]}: error: {module} is not installed: dstoolkit {argv[0]} needs "
                          f"dstoolkit[{extra}]: pip install 'dstoolkit[{extra}]'\n"), out.stderr
    assert not (tmp_path / "tune_out").exists()  # nothing was started or written

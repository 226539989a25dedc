import functools
import os
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

# Subprocesses (launchers, ranks) must find this interpreter's tools first: DeepSpeed JIT-builds its C++ ops
# with whichever `ninja` is on PATH, and a different ninja than the last build's forces a ~30 s rebuild of
# shm_comm / cpu_adam, which made timing-bounded dist tests flaky when pytest ran without the venv on PATH.
_BIN = os.path.dirname(os.path.abspath(sys.executable))  # the venv's bin/ (no realpath: that leaves the venv)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _BIN:
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")
# CPU estimates calibrate the machine they run on by default (dstoolkit.hardware.calibration). Tests pin
# the packaged reference so estimates and goldens are the same on every machine; the tests of the machine
# calibration itself set or clear this variable explicitly.
os.environ.setdefault("DSTOOLKIT_CALIBRATION", "reference")
CORPUS = REPO / "tests" / "corpus"
"""The DeepSpeed config corpus (real configs + SOURCES.tsv with origin and DeepSpeed's verdicts), in the repo."""


@functools.lru_cache(maxsize=None)
def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_runtest_setup(item):
    """gpu tests skip without CUDA. Checked when such a test is set up, not at collection: asking torch at
    collection would import it (seconds) for every run, --collect-only included."""
    if "gpu" in item.keywords and not _has_cuda():
        pytest.skip("needs a CUDA GPU (none on this machine)")


@pytest.fixture(scope="session")
def corpus_dir() -> pathlib.Path:
    # Part of the repo: a missing corpus is a broken checkout and must fail, never skip.
    if not (CORPUS / "SOURCES.tsv").is_file():
        pytest.fail(f"corpus missing: {CORPUS}/SOURCES.tsv not found (tests/corpus/ is part of the repo)")
    return CORPUS


@pytest.fixture(scope="session")
def repo_root() -> pathlib.Path:
    return REPO


def pytest_sessionstart(session):
    """A torch-extension lock left by a killed build would make every DeepSpeed test wait forever, silently:
    remove stale ones, wait (with a message) on live ones (dstoolkit.runtime.jitlock)."""
    from dstoolkit.runtime.jitlock import check_locks, pin_ninja

    pin_ninja()  # every rank a test starts builds ops with the venv's ninja (see pin_ninja for why)
    check_locks(who="conftest")


def pytest_sessionfinish(session, exitstatus):
    """Remove DeepSpeed CPU all-reduce buffers that tests' killed or crashed ranks left in /dev/shm (the trainer
    unlinks its own; scripts that call deepspeed.init_distributed directly do not). Only buffers no live
    process maps are removed (dstoolkit.runtime.train.shm)."""
    from dstoolkit.runtime.train.shm import remove_orphaned_buffers

    removed = remove_orphaned_buffers()
    if removed:
        print(f"\nconftest: removed {len(removed)} orphaned DeepSpeed buffer(s) from /dev/shm", file=sys.stderr)


@pytest.fixture
def train_files(tmp_path):
    """A spec and a DeepSpeed JSON for `dstoolkit train` on 2 CPU ranks (train_batch_size 8 = micro batch 4 x 2)."""
    import json

    spec = tmp_path / "spec.yaml"
    spec.write_text("name: t\nmodel: {preset: tiny}\ncluster: {nodes: 1, gpus_per_node: 2, gpu: cpu}\n"
                    "training: {seq_len: 16, global_batch: 8, micro_batch: 4}\n")
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4,
                              "gradient_accumulation_steps": 1}))
    return spec, ds

import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpus" / "deepspeed_configs"


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def corpus_dir() -> pathlib.Path:
    if not CORPUS.is_dir():
        pytest.skip(f"corpus not found at {CORPUS}")
    return CORPUS


@pytest.fixture(scope="session")
def repo_root() -> pathlib.Path:
    return REPO

"""Golden test: regenerating every bundled spec reproduces ds_configs/generated/<spec>/ byte for byte.

After an intended change to the generator or the estimator, rewrite the committed outputs with
`python -m dstoolkit.generate.bundled` and review the diff.
"""
from __future__ import annotations

import os

import pytest

from dstoolkit.generate.bundled import BUNDLED_SPECS, GENERATED_DIR, cached_bundled
from dstoolkit.generate.writer import MARKER_FILE, manifest_text


def _committed_tree(root) -> dict[str, str]:
    files = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            path = os.path.join(dirpath, n)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            with open(path, encoding="utf-8") as fh:
                files[rel] = fh.read()
    return files


@pytest.mark.parametrize("stem", BUNDLED_SPECS)
def test_regenerated_outputs_equal_committed(repo_root, stem):
    ds_configs = repo_root / "ds_configs"
    committed_root = ds_configs / GENERATED_DIR / stem
    assert committed_root.is_dir(), f"{committed_root} missing: run python -m dstoolkit.generate.bundled"
    committed = _committed_tree(committed_root)
    fresh = dict(cached_bundled(str(ds_configs), stem).files)
    fresh[MARKER_FILE] = manifest_text(fresh)
    assert sorted(fresh) == sorted(committed), "file set differs from the committed outputs"
    diffs = [rel for rel in fresh if fresh[rel] != committed[rel]]
    assert not diffs, (f"{stem}: regenerated files differ from the committed ones: {diffs[:5]} "
                       "(regenerate with `python -m dstoolkit.generate.bundled` if the change is intended)")


@pytest.mark.parametrize("stem", BUNDLED_SPECS)
def test_outputs_have_no_machine_paths_or_timestamps(repo_root, stem):
    result = cached_bundled(str(repo_root / "ds_configs"), stem)
    for rel, text in result.files.items():
        for needle in (str(repo_root), "/tmp/", "/home/", "/work/", os.path.expanduser("~/.cache")):
            assert needle not in text, f"{stem}/{rel} contains the machine path {needle!r}"
        assert "2026-" not in text and "UTC" not in text, f"{stem}/{rel} looks timestamped"


def test_generation_is_deterministic(repo_root):
    from dstoolkit.generate.bundled import generate_bundled

    a = generate_bundled(repo_root / "ds_configs", "tiny_moe_cpu").files
    b = generate_bundled(repo_root / "ds_configs", "tiny_moe_cpu").files
    assert a == b

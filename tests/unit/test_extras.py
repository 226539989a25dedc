"""Which extra names a missing module: read back from the installed metadata, which pyproject.toml writes."""
from __future__ import annotations

import pathlib
import tomllib

import pytest

from dstoolkit.common import extras

PYPROJECT = pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_extras_read_from_metadata_match_pyproject():
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    got = extras.extras_modules()
    for extra, reqs in declared.items():
        if extra == "dev":
            continue
        projects = [r.split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip() for r in reqs]
        assert got[extra] == tuple(extras._import_name(p) for p in projects), extra
    assert "megatron" in got["megatron"] and "transformer_engine" in got["te"]


@pytest.mark.parametrize("verb, module, extra", [
    ("train", "torch", "train"),        # the verb's own extra holds torch
    ("bench", "torch", "bench"),        # ... so bench names bench, not train
    ("report", "matplotlib", "bench"),  # report has no extra of its own: the first that installs matplotlib
    ("estimate", "transformers", "hf"),
    ("tune", "optuna", "tune"),
    ("estimate", "megatron", "megatron"),
])
def test_extra_for_prefers_the_verbs_own_extra(verb, module, extra):
    assert extras.extra_for(module, verb) == extra
    assert extras.missing_extra_message(verb, module) == (
        f"{module} is not installed: dstoolkit {verb} needs dstoolkit[{extra}]: pip install 'dstoolkit[{extra}]'")


def test_a_module_no_extra_installs_is_named_plainly():
    assert extras.extra_for("numpy_not_a_dep", "train") is None
    assert extras.missing_extra_message("train", "numpy_not_a_dep") == (
        "numpy_not_a_dep is not installed; `dstoolkit train` needs it")


def test_require_verb_extra_raises_for_the_first_missing_module(monkeypatch):
    monkeypatch.setattr(extras, "extras_modules", lambda: {"train": ("json", "no_such_mod_xyz", "other_missing")})
    with pytest.raises(ModuleNotFoundError, match="no_such_mod_xyz") as err:
        extras.require_verb_extra("train")
    assert err.value.name == "no_such_mod_xyz"
    extras.require_verb_extra("validate")  # no extra: nothing to check

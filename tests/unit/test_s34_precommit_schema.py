"""The pre-commit hooks for DeepSpeed JSON pass no JSON Schema file (*.schema.json), as `dstoolkit validate FOLDER`
skips them (`cli.validate.collect_files`). Was: the hooks' `files` pattern matched ds_configs/schema/
deepspeed_config.schema.json (and any deepspeed_config.schema.json copied into a user's repository); pre-commit names
the files it passes, and a file named on the command line is checked as a config: 62 errors in the two schema files
of this repository. pre-commit selects a file when `files` and `types` match and `exclude` does not, each pattern
with re.search (pre_commit/commands/run.py filter_by_include_exclude)."""
import re
import subprocess

import pytest
import yaml

from dstoolkit.cli.validate import collect_files

JSON_HOOKS = ("dstoolkit-validate", "dstoolkit-validate-hf")


def _hooks(repo_root):
    return {h["id"]: h for h in yaml.safe_load((repo_root / ".pre-commit-hooks.yaml").read_text())}


def _selected(hook, paths):
    exclude = hook.get("exclude", "^$")
    return sorted(p for p in paths if p.endswith(".json") and re.search(hook["files"], p)
                  and not re.search(exclude, p))


@pytest.mark.parametrize("hook_id", JSON_HOOKS)
@pytest.mark.parametrize("path,passed", [
    ("ds_configs/schema/deepspeed_config.schema.json", False),
    ("dstoolkit/dsconfig/deepspeed_config.schema.json", False),
    ("configs/deepspeed_config.schema.json", False),
    ("configs/ds_config.json", True),
    ("ds_configs/generated/tiny_cpu/zero2/ds_config.json", True),
    ("deepspeed_zero3.json", True),
])
def test_hook_file_selection(repo_root, hook_id, path, passed):
    assert _selected(_hooks(repo_root)[hook_id], [path]) == ([path] if passed else [])


@pytest.mark.parametrize("hook_id", JSON_HOOKS)
def test_hook_agrees_with_the_folder_walk(repo_root, hook_id):
    tracked = subprocess.run(["git", "ls-files", "ds_configs"], cwd=repo_root, capture_output=True, text=True,
                             check=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    walked, problems = collect_files([str(repo_root / "ds_configs")])
    walked_json = sorted(str(p.relative_to(repo_root)) for p in map(type(repo_root), walked)
                         if str(p).endswith(".json"))
    assert problems == []
    assert _selected(_hooks(repo_root)[hook_id], tracked) == [p for p in walked_json if p in tracked]

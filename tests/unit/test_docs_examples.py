"""Every code example in README.md and docs/*.md runs (house style: examples that run; an API move cannot leave
a dead example behind).

Generic over the Markdown files: each fenced ```python block runs as a script in a fresh interpreter (exit 0);
each command of a ```bash / ```sh / ```shell block (continuation lines joined, comments dropped) runs in a
scratch folder that holds the files the examples name (ds_config.json, configs/, ds_configs/ ...), and must
finish without a traceback and with exit 0 or 1 (1: the verb reported findings; 2 would be a usage/input
error). An example that cannot run here is listed in SKIP with the reason (real multi-rank runs already run by
a dist test, more than one host, Slurm, a checkpoint); a SKIP entry that matches no example fails, so the list
cannot go stale."""
from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_LANGS = {"bash", "sh", "shell", "console"}

# substring of the command -> why it does not run here
SKIP = {
    "launch/demo.sh": "a real 2-rank run end to end: tests/dist/test_demo.py runs it",
    "launch/test.sh": "the test suite itself",
    "dstoolkit bench comm": "real 2-rank collectives: tests/dist/test_bench_dist.py::test_comm_bench_two_ranks_correct_and_resumable",
    "dstoolkit bench overlap": "real 2-rank runs: tests/dist/test_bench_dist.py::test_overlap_bench_two_ranks",
    "dstoolkit bench train": "real 2-rank runs: tests/dist/test_bench_dist.py, tests/dist/test_user_scripts.py",
    "dstoolkit report benchmarks/results": "rewrites the committed report: tests/dist/test_bench_dist.py::test_report_renders_from_bench_results",
    "dstoolkit ckpt": "needs a DeepSpeed checkpoint folder: the ckpt tests (tests/*/test_ckpt_*)",
    "dstoolkit tune": "real tuning runs of a user script: tests/dist/test_user_scripts.py",
    "dstoolkit train --spec": "a real 2-rank run: the trainer through run_local in tests/dist/test_train_features.py, the verb in tests/unit/test_train_cli.py",
    "NODE_RANK=k": "two hosts: tests/dist/test_multinode_launch.py (network-namespace hosts)",
    "deepspeed --hostfile": "two hosts: tests/dist/test_multinode_launch.py",
    "sbatch": "needs Slurm",
    "torchrun --nnodes 2": "two hosts: tests/dist/test_multinode_launch.py",
}

FENCE = re.compile(r"^```(\w*)\s*$")


def blocks(path: pathlib.Path) -> list[tuple[str, int, str]]:
    """(language, first line number, text) of every fenced block of a Markdown file."""
    out, lang, start, buf = [], None, 0, []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = FENCE.match(line.strip())
        if m and lang is None:
            lang, start, buf = m.group(1).lower(), n + 1, []
        elif line.strip() == "```" and lang is not None:
            out.append((lang, start, "\n".join(buf)))
            lang = None
        elif lang is not None:
            buf.append(line)
    return out


def shell_commands(text: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comment-only lines and comments dropped."""
    cmds, cur = [], ""
    for line in text.splitlines():
        cur += line.rstrip()
        if cur.endswith("\\"):
            cur = cur[:-1] + " "
            continue
        words = shlex.split(cur, comments=True)
        if words:
            cmds.append(shlex.join(words))
        cur = ""
    return cmds


def examples() -> list[tuple[str, str, str]]:
    """(id, language, code) of every python block and every shell command in README.md and docs/*.md."""
    out = []
    for path in DOCS:
        for lang, line, text in blocks(path):
            where = f"{path.relative_to(REPO)}:{line}"
            if lang == "python":
                out.append((where, "python", text))
            elif lang in SHELL_LANGS:
                out += [(f"{where}:{cmd[:40]}", "shell", cmd) for cmd in shell_commands(text)]
    return out


EXAMPLES = examples()


def _skip_reason(cmd: str):
    return next((why for key, why in SKIP.items() if key in cmd), None)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> pathlib.Path:
    """A folder holding the files the examples name."""
    return _scratch(tmp_path_factory.mktemp("docs"))


def _scratch(d: pathlib.Path) -> pathlib.Path:
    """Fill `d` with the files the examples name."""
    (d / "ds_configs").symlink_to(REPO / "ds_configs")
    shutil.copy(REPO / "ds_configs" / "generated" / "llama3_8b_1x8_h100" / "zero2" / "ds_config.json",
                d / "ds_config.json")
    (d / "configs").mkdir()
    (d / "configs" / "ds_hf.json").write_text(json.dumps({
        "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto", "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2}}))
    return d


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def test_there_are_examples_and_every_skip_entry_is_used():
    assert any(lang == "python" for _, lang, _ in EXAMPLES) and any(lang == "shell" for _, lang, _ in EXAMPLES)
    unused = [k for k in SKIP if not any(k in code for _, lang, code in EXAMPLES if lang == "shell")]
    assert not unused, f"SKIP entries that match no example (remove them): {unused}"


@pytest.mark.parametrize("where,lang,code", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_example_runs(where, lang, code, scratch):
    if lang == "python":
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=scratch,
                           env=_env())
        assert p.returncode == 0, f"{where}:\n{code}\n--- stderr:\n{p.stderr[-3000:]}"
        return
    why = _skip_reason(code)
    if why:
        pytest.skip(why)
    argv = shlex.split(code)
    if argv[0] == "dstoolkit":  # the installed entry point may not be on PATH: the same CLI through this interpreter
        argv = [sys.executable, "-m", "dstoolkit", *argv[1:]]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=scratch, env=_env())
    out = p.stdout + p.stderr
    assert p.returncode in (0, 1) and "Traceback" not in out, f"{where}: {code}\nexit {p.returncode}\n{out[-3000:]}"


def shown_outputs() -> list[tuple[str, list[str], str]]:
    """(where, commands, shown output) of every README shell block followed at once by a ```text block: the output
    the README shows for those commands."""
    out = []
    found = blocks(REPO / "README.md")
    for (lang, line, text), (next_lang, _, shown) in zip(found, found[1:]):
        if lang in SHELL_LANGS and next_lang == "text":
            out.append((f"README.md:{line}", shell_commands(text), shown))
    return out


def _shown_line_pattern(line: str) -> "re.Pattern[str]":
    """A shown output line as a pattern: '(...)' stands for an elided parenthesis, the rest is literal."""
    return re.compile(r"\(.*\)".join(re.escape(part) for part in line.split("(...)")))


SHOWN = shown_outputs()


@pytest.mark.parametrize("where,cmds,shown", SHOWN, ids=[s[0] for s in SHOWN])
def test_readme_shows_what_the_commands_print(where, cmds, shown, tmp_path):
    """The README's shown outputs are the tool's: every shown line (but '...') is printed by its commands, run in
    order in a fresh folder (before: the llama3 example showed a 59.09 GiB peak the estimator had stopped
    printing)."""
    scratch = _scratch(tmp_path)
    why = next((r for r in map(_skip_reason, cmds) if r), None)
    if why:
        pytest.skip(why)
    printed = ""
    for cmd in cmds:
        argv = shlex.split(cmd)
        if argv[0] == "dstoolkit":
            argv = [sys.executable, "-m", "dstoolkit", *argv[1:]]
        p = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=scratch, env=_env())
        printed += p.stdout + p.stderr
    missing = [line for line in shown.splitlines()
               if line.strip() not in ("", "...") and not _shown_line_pattern(line).search(printed)]
    assert not missing, f"{where}: shown but not printed now:\n" + "\n".join(missing)

"""README's `tune` example shows what its command prints: the summary lines of the ```text block after the command
are lines of the output (estimate mode is a pure estimate: deterministic per seed, the same on every machine). Was:
'12 trials (ok 4, pruned 8)' and '56,819 tok/s', stale; the command prints '13 trials (ok 4, pruned 9)' and
'55,802 tok/s' (1,048,576 tokens / the 18.79 s step README's sweep and estimate blocks show)."""
import re
import shlex

from dstoolkit.cli import main


def _readme_example(repo_root):
    text = (repo_root / "README.md").read_text()
    m = re.search(r"```bash\n(dstoolkit tune [^\n]*--mode estimate[^\n]*)\n```\n```text\n(.*?)\n```", text, re.S)
    assert m, "README has no tune estimate example followed by its output"
    return shlex.split(m.group(1)), m.group(2).splitlines()


def test_readme_tune_output_is_current(repo_root, tmp_path, monkeypatch, capsys):
    argv, shown = _readme_example(repo_root)
    argv = [str(repo_root / a) if a.endswith(".yaml") else a for a in argv[1:]]
    monkeypatch.chdir(tmp_path)  # --out tune_est lands here
    assert main([*argv, "--no-progress"]) == 0
    captured = capsys.readouterr()
    printed = (captured.out + captured.err).splitlines()
    missing = [line for line in shown if line not in printed]
    assert missing == [], f"README lines the command does not print: {missing}"

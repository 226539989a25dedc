"""Every `dstoolkit report` command in README.md and docs/ writes its markdown to a `.md` file, as the verb's help
says (`-o REPORT.md`, default RESULTS_DIR/report.md). Was: docs/benchmarks.md showed `--out benchmarks/results/report`,
which writes a markdown file named `report` with no extension."""
import re
import shlex


def _report_commands(repo_root):
    for doc in [repo_root / "README.md", *sorted((repo_root / "docs").glob("*.md"))]:
        for line in doc.read_text().splitlines():
            m = re.search(r"dstoolkit report [^`\n]*", line)
            if m:
                yield doc.name, shlex.split(m.group(0))


def _out(argv):
    for i, a in enumerate(argv):
        if a in ("--out", "-o") and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--out="):
            return a.split("=", 1)[1]
    return None


def test_report_commands_in_the_docs_write_md(repo_root):
    commands = list(_report_commands(repo_root))
    assert any(name == "benchmarks.md" for name, _ in commands)
    outs = [(name, _out(argv)) for name, argv in commands if _out(argv) is not None]
    assert outs and all(out.endswith(".md") for _, out in outs), outs


def test_the_help_names_a_markdown_file(capsys):
    import pytest

    from dstoolkit.cli import main

    with pytest.raises(SystemExit):
        main(["report", "--help"])
    assert "-o REPORT.md, --out REPORT.md" in capsys.readouterr().out

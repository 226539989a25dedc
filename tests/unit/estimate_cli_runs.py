"""Running `dstoolkit estimate` in-process for the CLI tests: exit code and output, never a traceback."""
from __future__ import annotations

from dstoolkit.cli import main


def run_estimate(capsys, *argv) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `dstoolkit estimate ARGV`; fails the test on a traceback."""
    capsys.readouterr()
    rc = main(["estimate", *map(str, argv)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


def estimate_error(capsys, *argv) -> str:
    """The one-line input error of `dstoolkit estimate ARGV` (exit 2, nothing on stdout), without its prefix."""
    rc, out, err = run_estimate(capsys, *argv)
    assert rc == 2 and out == "" and err.count("\n") == 1, out + err
    return err.removeprefix("dstoolkit estimate: error: ").rstrip("\n")

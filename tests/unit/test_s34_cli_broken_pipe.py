"""Output piped into a reader that stops early (`dstoolkit ... | head -1`) ends the command quietly with exit 0
(`dstoolkit.cli.main`; CPython's note on SIGPIPE). Was: 'dstoolkit sweep: error: Broken pipe' on stderr and exit 2
(exit_map read the BrokenPipeError as an input error), which failed `set -o pipefail` scripts."""
import subprocess
import sys

import pytest

from dstoolkit.cli.options import exit_code_for


@pytest.mark.parametrize("argv", [["validate", "--explain", "SP007"], ["validate", "--help"], ["--help"],
                                  ["schema"]])
def test_reader_gone_before_the_first_write(repo_root, argv):
    p = subprocess.Popen([sys.executable, "-c", "import sys; from dstoolkit.cli import main; sys.exit(main())", *argv],
                         cwd=repo_root, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the only reader leaves before anything is written: every write gets EPIPE
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0
    assert err == ""


def test_reader_gone_after_the_first_line(repo_root):
    p = subprocess.Popen(f"set -o pipefail; {sys.executable} -c 'import sys; from dstoolkit.cli import main; "
                         "sys.exit(main())' validate --explain SP007 | head -1", shell=True, executable="/bin/bash",
                         cwd=repo_root, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=120)
    assert (p.returncode, err.decode()) == (0, "")
    assert out.decode().startswith("SP007: ")


def test_broken_pipe_is_not_an_input_error():
    assert exit_code_for("sweep", BrokenPipeError(32, "Broken pipe")) is None
    assert exit_code_for("sweep", FileNotFoundError(2, "No such file or directory", "x.json")) == (
        2, "dstoolkit sweep: error: x.json: No such file or directory")

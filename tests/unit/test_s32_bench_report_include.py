"""report --include: an absolute pattern, or one that climbs out of RESULTS_DIR, is a one-line error naming the flag,
the value and the fix (exit 2), not a NotImplementedError traceback (finding 8)."""
from __future__ import annotations

import pytest

from dstoolkit.cli import main


@pytest.mark.parametrize("pat", ["ABS/*.jsonl", "../other/*.jsonl"])
def test_include_outside_results_dir_refused(tmp_path, capsys, pat):
    res = tmp_path / "res"
    res.mkdir()
    (res / "comm_x.jsonl").write_text("")
    pat = pat.replace("ABS", str(res))
    rc = main(["report", str(res), "--include", pat, "-o", str(tmp_path / "r.md")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err == (f"dstoolkit report: error: --include {pat!r}: patterns are relative to RESULTS_DIR; use '*.jsonl' "
                   "(and pass the folder holding those files as RESULTS_DIR)\n")

"""tune: SIGTERM answers 143 (128 + SIGTERM, as `dstoolkit train` does), Ctrl-C 130; --help lists the exit codes
(finding 12)."""
from __future__ import annotations

import signal

from dstoolkit.cli import tune as tune_cli


def test_help_lists_exit_codes(capsys):
    import pytest

    from dstoolkit.cli import main

    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "exit codes: 0 a best config was written; 1 no trial succeeded" in out
    assert "130 interrupted by Ctrl-C, 143 by SIGTERM" in out


def test_sigterm_is_143_ctrl_c_130(monkeypatch, tmp_path):
    import argparse

    import dstoolkit.tune.study as study

    args = argparse.Namespace(spec="x.yaml", model_class=None, out=str(tmp_path / "o"), budget=1,
                              objective="throughput", mode="estimate", seed=0, force=False, seed_trials=None,
                              bucket_scales="1", steps=None, skip_steps=None, trial_timeout=None,
                              launcher="torchrun", progress=False, shrink=None, command=[], format="table")

    def term(*a, **k):
        tune_cli._raise_interrupt(signal.SIGTERM, None)

    monkeypatch.setattr(study, "run_study", term)
    assert tune_cli.run(args) == 143

    def ctrl_c(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(study, "run_study", ctrl_c)
    assert tune_cli.run(args) == 130

"""--calibration has one parser for every verb (`cli.options.calibration_arg`): 'auto' is what leaving the flag out
means (the spec's own calibration), in `estimate` as in `bench train`. Was: `bench train` took 'auto' (its default)
and `estimate --calibration auto` read it as a file: 'auto: no such calibration file', exit 2, and its fix named
neither 'reference' nor 'machine'. `bench train --help` listed reference|machine, which its loader refuses."""
import argparse
import json

import pytest

from dstoolkit.cli import main

CONFIG = ["--config", "ds_configs/generated/tiny_cpu/zero2/ds_config.json", "--model", "tiny", "--world-size", "2",
          "--gpu", "cpu", "--seq-len", "128"]


def _json(capsys, *argv):
    rc = main(["estimate", *argv, "--format", "json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


@pytest.mark.parametrize("form", [CONFIG, ["ds_configs/tiny_cpu.yaml"]])
@pytest.mark.parametrize("word", ["auto", "AUTO", " auto "])
def test_estimate_auto_is_the_default(repo_root, monkeypatch, capsys, form, word):
    monkeypatch.chdir(repo_root)
    monkeypatch.delenv("DSTOOLKIT_CALIBRATION", raising=False)
    assert _json(capsys, *form, "--calibration", word) == _json(capsys, *form)


def test_one_parser():
    from dstoolkit.cli.options import add_calibration_flag, calibration_arg

    assert [calibration_arg(v) for v in ("auto", "Auto", "none", "reference", "cal.json")] == [
        None, None, "none", "reference", "cal.json"]
    p = argparse.ArgumentParser()
    add_calibration_flag(p, words=())
    assert p.parse_args([]).calibration is None and p.parse_args(["--calibration", "auto"]).calibration is None


def test_help_lists_what_each_verb_takes(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "train", "--help"])
    assert "--calibration FILE.json|auto|none\n" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["estimate", "--help"])
    assert "--calibration FILE.json|auto|reference|machine|none\n" in capsys.readouterr().out


def test_a_missing_file_names_every_word(repo_root, monkeypatch, capsys):
    monkeypatch.chdir(repo_root)
    assert main(["estimate", *CONFIG, "--calibration", "nofile.json"]) == 2
    assert capsys.readouterr().err == (
        "dstoolkit estimate: error: --calibration: nofile.json: no such calibration file (give a calibration JSON "
        "written by benchmarks/step_time_fidelity.py, 'auto' (the spec's own), 'reference' or 'machine' (--gpu cpu), "
        "or --calibration none for the hardware table's nominal rates)\n")

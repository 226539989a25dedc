"""sweep counts the undecided layouts from step times only (review s32 #14): with #1..--top all undecided it ranked
again with validate_config on every fitting layout (319 on llama3_8b_1x8_h100); now only the shown rows are
validated, and the count is unchanged."""
from __future__ import annotations

import json
import pathlib

from dstoolkit.cli import main
from dstoolkit.generate import sweep as sweep_mod

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_top_1_validates_only_the_shown_layouts(monkeypatch, capsys):
    calls = []
    real = sweep_mod.validate_candidate_config

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(sweep_mod, "validate_candidate_config", counting)
    assert main(["sweep", str(ROOT / "ds_configs" / "llama3_8b_1x8_h100.yaml"), "--top", "1", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["undecided"]["positions"]) > 1  # the second ranking ran
    assert len(calls) <= 3, len(calls)

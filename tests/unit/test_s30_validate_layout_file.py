"""`dstoolkit validate FOLDER` on a generated folder whose layout.json is damaged names what is wrong (missing key,
wrong type or value, not an object, not JSON) and the fix, instead of raw exception text (tester finding s30 #12:
"not a dstoolkit layout file ('gpus_per_node')", "list indices must be integers or slices, not str")."""
from __future__ import annotations

import json

import pytest

from dstoolkit.cli import main
from dstoolkit.validate.folder import LAYOUT_FILE, MARKER_FILE, LayoutFileError, read_layouts

GOOD = {"world_size": 8, "gpus_per_node": 8, "nodes": 1,
        "files": {"ds_config.json": {"tp": 2, "pp": 1, "ep": 1, "label": "zero1", "targets": ["deepspeed"],
                                     "num_experts": None}}}


def _folder(tmp_path, layout_text: str):
    (tmp_path / MARKER_FILE).write_text("written by dstoolkit generate\n")
    strat = tmp_path / "zero1"
    strat.mkdir()
    (strat / "ds_config.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 1,
                                                      "gradient_accumulation_steps": 1, "train_batch_size": 4}))
    (strat / LAYOUT_FILE).write_text(layout_text)
    return strat


@pytest.mark.parametrize("doc,needle", [
    ({"world_size": 0, "files": {"ds_config.json": {"tp": 2, "pp": 1}}}, "missing keys gpus_per_node, nodes"),
    ([1], "holds a list, not a JSON object"),
    ("x", "holds a string, not a JSON object"),
    ({**GOOD, "files": []}, "files is a list, not an object"),
    ({**GOOD, "world_size": "8"}, 'world_size is "8" (a string), not a positive integer'),
    ({**GOOD, "nodes": 0}, "nodes is 0, not a positive integer"),
    ({**GOOD, "files": {"ds_config.json": [2]}}, "files.ds_config.json is a list, not an object"),
    ({**GOOD, "files": {"ds_config.json": {"tp": True}}}, "files.ds_config.json.tp is true (a boolean)"),
    ({**GOOD, "files": {"ds_config.json": {"num_experts": "8"}}}, "files.ds_config.json.num_experts is \"8\""),
])
def test_damaged_layout_names_the_key(tmp_path, doc, needle):
    strat = _folder(tmp_path, json.dumps(doc))
    with pytest.raises(LayoutFileError, match="not the layout file dstoolkit generate writes") as info:
        read_layouts(str(strat))
    assert needle in info.value.problem and "list indices" not in str(info.value)


def test_layout_not_json(tmp_path):
    with pytest.raises(LayoutFileError, match="is not valid JSON"):
        read_layouts(str(_folder(tmp_path, "{bad")))


def test_good_layout_reads(tmp_path):
    lay = read_layouts(str(_folder(tmp_path, json.dumps(GOOD))))["ds_config.json"]
    assert (lay.world_size, lay.tp, lay.pp, lay.num_experts) == (8, 2, 1, None)


def test_cli_prints_problem_and_fix(tmp_path, capsys):
    strat = _folder(tmp_path, json.dumps({"world_size": 0, "files": {"ds_config.json": {"tp": 2, "pp": 1}}}))
    assert main(["validate", str(strat)]) == 2
    out = capsys.readouterr()
    text = out.out + out.err
    assert "error[DS008]" in text and "missing keys gpus_per_node, nodes" in text
    assert "('gpus_per_node')" not in text
    assert f"dstoolkit generate SPEC --out {tmp_path} --force" in text and "--world-size" in text


def test_without_layout_json_the_flags_give_the_layout(tmp_path, capsys):
    # before: inside a generated folder, --world-size / --tp / --pp were ignored without a word when layout.json did
    # not list the file (the batch triad below is only checkable with the world size)
    strat = _folder(tmp_path, json.dumps(GOOD))
    (strat / LAYOUT_FILE).unlink()
    assert main(["validate", str(strat / "ds_config.json"), "--world-size", "8"]) == 1
    assert "train_batch_size" in capsys.readouterr().out
    assert main(["validate", str(strat / "ds_config.json"), "--world-size", "4"]) == 0
    assert main(["validate", str(strat / "ds_config.json")]) == 0  # no layout at all: the triad is not asked

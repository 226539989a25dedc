"""A YAML file given where a DeepSpeed JSON config goes says DS006 only: its '#' lines are comments to the hjson
reader, and the DS010 warnings about them preceded the real finding (s34 newcomer note; resolve filtered them in
600290c, validate reads the same parser)."""
from __future__ import annotations

from dstoolkit.validate.parse import parse_text


def test_yaml_with_comments_is_ds006_alone():
    res = parse_text("# DeepSpeed\ntrain_batch_size: 8\nzero_optimization:\n  stage: 2\n", "ds.yaml")
    assert res.fatal
    assert [f.code for f in res.findings] == ["DS006"]


def test_json_with_a_comment_keeps_its_ds010():
    res = parse_text('{\n  // note\n  "train_batch_size": 8\n}\n', "ds.json")
    assert not res.fatal
    assert [f.code for f in res.findings] == ["DS010"]

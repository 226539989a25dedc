"""Property tests: the validator never raises on arbitrary JSON or text, and the CLI always exits 0, 1 or 2."""
from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dstoolkit.cli import main
from dstoolkit.validate import validate_config
from dstoolkit.validate.findings import Finding

VALID = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
         "gradient_clipping": 1.0, "bf16": {"enabled": True},
         "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}},
         "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 100}},
         "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, "reduce_bucket_size": 5e8,
                               "stage3_prefetch_bucket_size": 5e7},
         "activation_checkpointing": {"partition_activations": True}}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
    | st.just("auto"),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=20)
KEYS = ["stage", "train_batch_size", "zero_optimization", "offload_param", "device", "fp16", "bf16", "enabled",
        "optimizer", "type", "params", "lr", "scheduler", "dstoolkit", "moe", "num_experts", "ep_size"]


def _check(findings):
    assert isinstance(findings, list) and all(isinstance(f, Finding) for f in findings)
    assert all(f.message for f in findings)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_arbitrary_json_value_never_raises(value):
    _check(validate_config(value if isinstance(value, dict) else {"x": value}))
    _check(validate_config(json.dumps(value)))


@st.composite
def mutated(draw):
    cfg = json.loads(json.dumps(VALID))
    for _ in range(draw(st.integers(1, 4))):
        node = cfg
        path = draw(st.lists(st.sampled_from(KEYS), min_size=0, max_size=3))
        for k in path[:-1]:
            nxt = node.get(k) if isinstance(node, dict) else None
            if not isinstance(nxt, dict):
                break
            node = nxt
        key = path[-1] if path else draw(st.sampled_from(KEYS))
        if isinstance(node, dict):
            if draw(st.booleans()) and key in node:
                del node[key]
            else:
                node[key] = draw(json_values)
    return cfg


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated(), st.integers(1, 64), st.sampled_from(["strict", "hf"]), st.sampled_from(["0.16", "0.19"]))
def test_mutated_valid_config_never_raises(cfg, world, mode, version):
    _check(validate_config(cfg, world_size=world, gpus_per_node=8, mode=mode, deepspeed_version=version,
                           num_experts=8, ep_size=2))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_arbitrary_text_never_raises(text):
    _check(validate_config(text))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(st.one_of(mutated().map(json.dumps), st.text(max_size=80)))
def test_cli_exit_code_is_0_1_or_2(tmp_path, capsys, text):
    path = tmp_path / "c.json"
    path.write_text(text, encoding="utf-8")
    rc = main(["validate", str(path), "--world-size", "4"])
    captured = capsys.readouterr()
    assert rc in (0, 1, 2)
    assert "Traceback" not in captured.out + captured.err
    assert captured.err.strip()  # always says something


def test_python_dict_edge_cases_are_findings_not_crashes():
    deep: dict = {}
    node = deep
    for _ in range(10_000):
        node["a"] = {}
        node = node["a"]
    assert [f.code for f in validate_config(deep)] == ["DS003"]
    found = validate_config({1: 2, "train_batch_size": 8, "gradient_clipping": float("nan"),
                             "optimizer": {"type": "AdamW", "params": {"betas": (0.9, 0.95)}}})
    assert {(f.code, f.pointer) for f in found} == {("DS002", "/gradient_clipping"), ("DS101", "/1")}
    assert [f.code for f in validate_config(["not", "a", "dict"])] == ["DS007"]
    assert [f.code for f in validate_config(b'{"train_batch_size": 8}')] == []

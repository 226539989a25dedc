"""The fast path (JSON Schema file + schema_check) and the pydantic models must say the same thing, and the
plain-data tables in facts.py must match the models they mirror."""
from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dstoolkit.dsconfig import DeepSpeedConfig
from dstoolkit.dsconfig import facts
from dstoolkit.dsconfig.ds_misc import ActivationCheckpointingConfig
from dstoolkit.dsconfig.ds_zero import ALIASES, OffloadOptimizerConfig, OffloadParamConfig
from dstoolkit.validate.parse import parse_text
from dstoolkit.validate.schema_check import check_config, load_schema
from dstoolkit.validate.engine import pydantic_schema_issues

_KIND = {"unknown_key": "DS101", "type": "DS102", "range": "DS103", "missing": "DS108"}


def fast_issues(cfg: dict) -> set[tuple[str, str]]:
    out = set()
    for i in check_config(cfg):
        out.add((_KIND[i.kind], "".join(f"/{p}" for p in i.path)))
    return out


def _strip_auto(node):
    if isinstance(node, dict):
        return {k: _strip_auto(v) for k, v in node.items() if v != "auto"}
    if isinstance(node, list):
        return [_strip_auto(v) for v in node]
    return node


def test_facts_match_the_models():
    assert ALIASES == facts.ZERO_ALIASES
    assert set(OffloadParamConfig.model_fields) | set(OffloadOptimizerConfig.model_fields) == facts.OFFLOAD_KEYS
    assert "partition_activations" in ActivationCheckpointingConfig.model_fields
    assert set(load_schema()["properties"]) >= set(DeepSpeedConfig.model_fields)


def test_fast_path_agrees_with_pydantic_on_the_corpus(corpus_dir):
    compared = 0
    for path in sorted(corpus_dir.iterdir()):
        if path.suffix in (".tsv", ".yaml"):
            continue
        data = parse_text(path.read_text(encoding="utf-8"), path.name).data
        data = _strip_auto({k: v for k, v in data.items() if k != "dstoolkit"})
        assert fast_issues(data) == pydantic_schema_issues(data), path.name
        compared += 1
    assert compared == 107


VALID = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
         "bf16": {"enabled": True}, "fp16": {"enabled": False, "loss_scale": 0},
         "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
         "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "buffer_count": 4},
                               "reduce_bucket_size": 5e8, "stage3_prefetch_bucket_size": 5e7},
         "activation_checkpointing": {"partition_activations": True, "number_checkpoints": 4},
         "tensorboard": {"enabled": False}, "aio": {"block_size": 1048576}}
values = st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-2, 2, allow_nan=False) | st.sampled_from(
    ["x", "cpu", "1", "fp32", "nvme"]) | st.lists(st.integers(), max_size=2) | st.dictionaries(
    st.sampled_from(["enabled", "stage", "device", "zz"]), st.integers(0, 3), max_size=2)


@st.composite
def mutated(draw):
    cfg = json.loads(json.dumps(VALID))
    for _ in range(draw(st.integers(1, 3))):
        section = draw(st.sampled_from([None, "bf16", "fp16", "zero_optimization", "activation_checkpointing",
                                        "tensorboard", "aio", "optimizer"]))
        node = cfg if section is None else cfg.get(section)
        if not isinstance(node, dict):  # an earlier mutation replaced the section
            node = cfg
        key = draw(st.sampled_from(sorted(node) + ["zz_new", "enabled", "stage", "offload_param"]))
        node[key] = draw(values)
    return cfg


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_fast_path_agrees_with_pydantic_on_mutations(cfg):
    assert fast_issues(cfg) == pydantic_schema_issues(cfg)

"""The spec's whole-number fields are read strictly, and gpus_per_node is bounded by what one host of the GPU holds.

Before: `ulysses: '4'` (a string) and `ulysses: 4.5`'s neighbour `4.0` were accepted while `ulysses: true` was refused
(and a DeepSpeed JSON's `"sequence_parallel_size": "4"` is refused, DS102); `ulysses: auto` got pydantic's "Input should
be a valid integer, unable to parse string as an integer". The same held for every int field of the training, cluster
and batch-ramp sections. A whole float (4.0) stays accepted, as the JSON side takes it (`dsconfig.registry.as_int`).
`cluster.gpus_per_node: 64` with H100-SXM loaded and was priced as one NVLink host of 64 GPUs.
"""
from __future__ import annotations

import pytest
import yaml

from dstoolkit.spec import SpecError, load_spec
from dstoolkit.spec.cluster import ClusterSpec
from dstoolkit.spec.model import BatchRampSpec, TrainingSpec
from dstoolkit.spec.whole_numbers import _whole_number_fields

SPEC = """\
name: n
model: {{preset: tiny}}
cluster: {{nodes: 1, gpus_per_node: 2, gpu: cpu{cluster}}}
training:
  seq_len: 64
  global_batch: 8
  micro_batch: 1
  zero_stage: 1
{training}
"""

WHOLE_NUMBER_FIELDS = {
    "training": ["seq_len", "global_batch", "micro_batch", "warmup_steps", "train_steps", "checkpoint_every_k",
                 "tp", "pp", "ep", "zero_stage", "save_interval_steps", "virtual_stages", "cp", "ulysses"],
    "cluster": ["nodes", "gpus_per_node", "nvlink_domain_gpus"],
    "batch_ramp": ["start_batch", "increment", "ramp_tokens", "ramp_samples"],
}


def test_every_int_field_of_the_sections_is_a_whole_number_field():
    for section, cls in (("training", TrainingSpec), ("cluster", ClusterSpec), ("batch_ramp", BatchRampSpec)):
        assert sorted(_whole_number_fields(cls)) == sorted(WHOLE_NUMBER_FIELDS[section])


def load(tmp_path, *, training: str = "", cluster: str = ""):
    p = tmp_path / "s.yaml"
    p.write_text(SPEC.format(training=training, cluster=cluster))
    return load_spec(p)


def load_with(tmp_path, section: str, field: str, value):
    """The base spec with one whole-number field set to `value` (written as YAML writes that Python value)."""
    data = yaml.safe_load(SPEC.format(training="", cluster=""))
    where = data["training"].setdefault("batch_ramp", {}) if section == "batch_ramp" else data[section]
    where[field] = value
    p = tmp_path / "v.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_spec(p)


ALL = [(s, f) for s, fields in WHOLE_NUMBER_FIELDS.items() for f in fields]


@pytest.mark.parametrize("section,field", ALL)
def test_a_quoted_number_is_refused_naming_the_field_the_value_and_the_fix(tmp_path, section, field):
    with pytest.raises(SpecError) as exc:
        load_with(tmp_path, section, field, "2")
    assert f"{field}: {field}='2' is a string, not a number (write it without quotes: `{field}: 2`)" in str(exc.value)


@pytest.mark.parametrize("section,field", ALL)
def test_a_fraction_and_a_boolean_are_refused(tmp_path, section, field):
    with pytest.raises(SpecError, match=rf"{field}: {field}=2\.5 is not a whole number \(give "):
        load_with(tmp_path, section, field, 2.5)
    with pytest.raises(SpecError, match=rf"{field}: {field}=True is a boolean \(give "):
        load_with(tmp_path, section, field, True)


def _edited(tmp_path, old: str, new: str):
    p = tmp_path / "e.yaml"
    p.write_text(SPEC.format(training="", cluster="").replace(old, new))
    return load_spec(p)


def test_what_each_field_takes_is_in_the_fix(tmp_path):
    with pytest.raises(SpecError, match=r"training\.ulysses: ulysses='auto': the sweep does not choose ulysses; only "
                                        r"micro_batch, tp, pp, ep, zero_stage and activation_checkpointing take 'auto' "
                                        r"\(give a whole number >= 1\)"):
        load(tmp_path, training="  ulysses: auto")
    with pytest.raises(SpecError, match=r"training\.zero_stage: zero_stage=2\.5 is not a whole number \(give 0, 1, 2 "
                                        r"or 3, or 'auto'\)"):
        _edited(tmp_path, "zero_stage: 1", "zero_stage: 2.5")
    with pytest.raises(SpecError, match=r"training\.micro_batch: micro_batch='two' is not a number \(give a whole "
                                        r"number or 'auto'\)"):
        _edited(tmp_path, "micro_batch: 1", "micro_batch: two")
    with pytest.raises(SpecError, match=r"training\.seq_len: seq_len=0\.5 is not a whole number \(give a whole number "
                                        r"> 0\)"):
        _edited(tmp_path, "seq_len: 64", "seq_len: 0.5")


def test_a_whole_float_is_its_int(tmp_path):
    spec = load(tmp_path, training="  tp: 2.0\n  ulysses: 1.0\n  warmup_steps: 10.0", cluster=", nvlink_domain_gpus: 2.0")
    t, c = spec.training, spec.cluster
    assert (t.tp, t.ulysses, t.warmup_steps, c.nvlink_domain_gpus) == (2, 1, 10, 2)
    assert all(type(v) is int for v in (t.tp, t.ulysses, t.warmup_steps, c.nvlink_domain_gpus))
    assert load(tmp_path, training="  tp: auto").training.tp == "auto"


@pytest.mark.parametrize("gpu,per_node,most", [("H100-SXM", 32, 8), ("H100-SXM", 64, 8), ("GB200", 8, 4)])
def test_more_gpus_per_node_than_one_host_holds_is_refused(tmp_path, gpu, per_node, most):
    p = tmp_path / "g.yaml"
    p.write_text(f"model: {{preset: tiny}}\ncluster: {{nodes: 2, gpus_per_node: {per_node}, gpu: {gpu}}}\n"
                 "training: {seq_len: 64, global_batch: 256}\n")
    with pytest.raises(SpecError) as exc:
        load_spec(p)
    assert (f"g.yaml:2:36: cluster.gpus_per_node: gpus_per_node={per_node}: one {gpu} host holds at most {most} GPUs "
            f"(the hardware table's gpus_per_host), not {per_node} (set nodes: {2 * per_node // most}, gpus_per_node: "
            f"{most} (the same {2 * per_node} GPUs), or use at most {most} GPUs per node") in str(exc.value)


def test_hosts_the_table_bounds_and_does_not(tmp_path):
    for cluster in ("{gpus_per_node: 8, gpu: H100-SXM}", "{gpus_per_node: 4, gpu: GB200}",
                    "{gpus_per_node: 16, gpu: A100-80G}", "{gpus_per_node: 64, gpu: cpu}",
                    "{gpus_per_node: 4, gpu: GB200, nvlink_domain_gpus: 72}",
                    "{gpus_per_node: 32, gpu: {name: mine, memory_bytes: 80000000000, peak_bf16_flops: 1.0e15, "
                    "intra_node_bw_bytes_per_s: 4.5e11, inter_node_bw_bytes_per_s: 5.0e10}}"):
        p = tmp_path / "h.yaml"
        p.write_text(f"model: {{preset: tiny}}\ncluster: {cluster}\ntraining: {{seq_len: 64, global_batch: 576}}\n")
        assert load_spec(p).cluster.gpus_per_node in (4, 8, 16, 32, 64)

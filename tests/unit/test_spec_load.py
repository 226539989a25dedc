"""Spec YAML loading: valid specs, and errors that point at the YAML line with the field path and a fix."""
import json
import pathlib
import textwrap

import pytest

from dstoolkit.models import count_params, get_preset, resolve_model, resolve_spec_model
from dstoolkit.spec.checkpoint import CheckpointPolicy
from dstoolkit.spec import Spec, SpecError, TrainingSpec, load_spec, spec_from_dict

HF = pathlib.Path(__file__).resolve().parents[1] / "golden" / "hf_configs"

GOOD = """\
name: demo
model:
  preset: tiny
cluster:
  nodes: 1
  gpus_per_node: 2
  gpu: cpu
training:
  seq_len: 128
  global_batch: 8
  micro_batch: 2
  zero_stage: 2
"""


def write(tmp_path, text, name="spec.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def error_lines(tmp_path, text):
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, text))
    return str(info.value).splitlines(), info.value


def test_good_spec_loads_and_resolves(tmp_path):
    spec = load_spec(write(tmp_path, GOOD))
    assert spec.world_size == 2
    assert spec.training.micro_batch == 2 and spec.training.zero_stage == 2
    assert spec.cluster.gpu_spec.name == "cpu"
    assert spec.source_path == tmp_path / "spec.yaml" and spec.base_dir == tmp_path
    shape = resolve_model(spec.model, spec.base_dir)
    assert shape == get_preset("tiny")


def test_wrong_type_points_at_value(tmp_path):
    lines, err = error_lines(tmp_path, GOOD.replace("seq_len: 128", "seq_len: abc"))
    assert len(lines) == 1
    assert lines[0].startswith(f"{tmp_path / 'spec.yaml'}:9:12: training.seq_len: seq_len='abc' is not a number")
    assert lines[0].endswith("(give a whole number > 0)")  # what the field takes (spec.whole_numbers)
    assert err.findings[0].line == 9


def test_int_or_auto_union_reports_both_choices_once(tmp_path):
    lines, _ = error_lines(tmp_path, GOOD.replace("micro_batch: 2", "micro_batch: many"))
    assert len(lines) == 1
    assert ":11:16: training.micro_batch: micro_batch='many' is not a number (give a whole number or 'auto')" in lines[0]
    assert lines[0].count("'auto'") == 1  # both choices, once


def test_unknown_key_did_you_mean_points_at_key(tmp_path):
    lines, _ = error_lines(tmp_path, GOOD.replace("global_batch: 8", "global_batch: 8\n  micro_bach: 2"))
    assert any(":11:3: training.micro_bach: unknown key 'micro_bach' (did you mean 'micro_batch'?)" in l for l in lines)


def test_unknown_section_key_lists_allowed(tmp_path):
    lines, _ = error_lines(tmp_path, GOOD + "zzz: 1\n")
    assert lines == [f"{tmp_path / 'spec.yaml'}:13:1: zzz: unknown key 'zzz' (remove it; allowed keys: name, model, cluster, training, targets)"]


def test_missing_required_field_points_at_section(tmp_path):
    lines, _ = error_lines(tmp_path, GOOD.replace("  global_batch: 8\n", ""))
    assert lines == [
        f"{tmp_path / 'spec.yaml'}:8:1: training.global_batch: required field is missing "
        "(add `global_batch:` under training; expected: Sequences per optimizer step over all data-parallel ranks.)"
    ]


def test_missing_section(tmp_path):
    lines, _ = error_lines(tmp_path, "model:\n  preset: tiny\n")
    assert lines[0].endswith("1:1: training: required field is missing (add `training:` under the top level; expected: How it trains.)")


def test_several_errors_sorted_by_line(tmp_path):
    text = GOOD.replace("gpu: cpu", "gpu: H10-SXM").replace("seq_len: 128", "seq_len: -1").replace("zero_stage: 2", "zero_stage: 5")
    lines, err = error_lines(tmp_path, text)
    assert [f.line for f in err.findings] == [7, 9, 12]
    assert "cluster.gpu: unknown GPU 'H10-SXM' (did you mean 'H100-SXM'? known: H100-SXM, H200" in lines[0]
    assert "training.seq_len: -1 is not valid: Input should be greater than 0" in lines[1]
    assert "training.zero_stage: 5 is not valid: Input should be 0, 1, 2 or 3 or Input should be 'auto'" in lines[2]


def test_yaml_boolean_is_not_a_stage(tmp_path):
    # YAML `yes` is True, which pydantic would otherwise accept as ZeRO stage 1.
    lines, _ = error_lines(tmp_path, GOOD.replace("zero_stage: 2", "zero_stage: yes"))
    assert ":12:15: training.zero_stage: zero_stage=True is a boolean (give 0, 1, 2 or 3, or 'auto')" in lines[0]


def test_yaml_syntax_error_has_position(tmp_path):
    lines, _ = error_lines(tmp_path, GOOD.replace("  seq_len: 128", "  seq_len: [128"))
    assert lines[0].startswith(str(tmp_path / "spec.yaml") + ":10:")
    assert "<yaml>: YAML syntax error" in lines[0]


def test_duplicate_key_is_an_error(tmp_path):
    lines, _ = error_lines(tmp_path, GOOD + "name: again\n")
    assert lines == [f"{tmp_path / 'spec.yaml'}:13:1: name: duplicate key 'name' (first given on line 1) (remove one of them)"]


@pytest.mark.parametrize("text,expect", [("", "spec file is empty"), ("- 1\n- 2\n", "spec file is a list, not a mapping")])
def test_not_a_mapping(tmp_path, text, expect):
    lines, _ = error_lines(tmp_path, text)
    assert expect in lines[0]


def test_unreadable_file(tmp_path, monkeypatch):
    # a missing path, a folder and a file the OS will not read: each named for what it is, with its fix
    with pytest.raises(SpecError, match=r"nope.yaml: no such file \(check the path\)"):
        load_spec(tmp_path / "nope.yaml")
    with pytest.raises(SpecError, match=r": is a folder, not a file \(give the spec's YAML file\)"):
        load_spec(tmp_path)
    locked = tmp_path / "locked.yaml"
    locked.write_text("model: tiny\n")

    def denied(self, *a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(type(locked), "read_text", denied)
    with pytest.raises(SpecError, match=r"locked.yaml: cannot read spec file: Permission denied \(check the file's "
                                        r"permissions\)"):
        load_spec(locked)


def test_explicit_gpu_facts(tmp_path):
    text = GOOD.replace(
        "  gpu: cpu",
        "  gpu:\n    name: mygpu\n    memory_bytes: 1000000000\n    peak_bf16_flops: 1.0e+12\n"
        "    intra_node_bw_bytes_per_s: 1.0e+9\n    inter_node_bw_bytes_per_s: 1.0e+8",
    )
    spec = load_spec(write(tmp_path, text))
    assert spec.cluster.gpu_spec.name == "mygpu" and spec.cluster.gpu_spec.peak_fp8_flops is None


def test_explicit_gpu_missing_fact_is_reported_not_the_string_branch(tmp_path):
    text = GOOD.replace("  gpu: cpu", "  gpu:\n    memory_bytes: 1000\n    peak_bf16_flops: 1.0e+12\n    inter_node_bw_bytes_per_s: 1.0")
    lines, _ = error_lines(tmp_path, text)
    assert len(lines) == 1
    assert ":7:3: cluster.gpu.intra_node_bw_bytes_per_s: required field is missing (add `intra_node_bw_bytes_per_s:` under cluster.gpu" in lines[0]


# ------------------------------------------------------------------ model forms


def test_hf_config_relative_to_spec_file(tmp_path):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text((HF / "qwen2-7b.json").read_text())
    spec = load_spec(write(tmp_path, GOOD.replace("preset: tiny", "hf_config: cfg/config.json")))
    shape = resolve_model(spec.model, spec.base_dir)
    assert shape.name == "cfg" and shape.model_type == "qwen2"
    assert count_params(shape).total == pytest.approx(7.61e9, rel=0.005)


def test_hf_config_missing_file_points_at_line(tmp_path):
    spec = load_spec(write(tmp_path, GOOD.replace("preset: tiny", "hf_config: missing/config.json")))
    with pytest.raises(SpecError, match=r"spec.yaml:3:14: model.hf_config: cannot read HF config .*missing/config.json"):
        resolve_model(spec.model, spec.base_dir)


def test_hf_config_missing_field_names_it(tmp_path):
    cfg = json.loads((HF / "mixtral-8x7b.json").read_text())
    del cfg["num_local_experts"]
    (tmp_path / "m.json").write_text(json.dumps(cfg))
    spec = load_spec(write(tmp_path, GOOD.replace("preset: tiny", "hf_config: m.json")))
    with pytest.raises(SpecError, match=r"model.hf_config: in .*m.json: num_local_experts: required field is missing"):
        resolve_model(spec.model, spec.base_dir)


def test_unknown_preset_points_at_line(tmp_path):
    spec = load_spec(write(tmp_path, GOOD.replace("preset: tiny", "preset: tiny-mo")))
    with pytest.raises(SpecError, match=r"spec.yaml:3:11: model.preset: unknown model preset 'tiny-mo' \(did you mean 'tiny-moe'\?"):
        resolve_model(spec.model, spec.base_dir)


INLINE = """\
model:
  model_type: mixtral
  hidden_size: 256
  num_hidden_layers: 4
  num_attention_heads: 8
  num_key_value_heads: 4
  intermediate_size: 688
  vocab_size: 2048
  num_local_experts: 4
  num_experts_per_tok: 2
  rope_theta: 10000.0
training:
  seq_len: 64
  global_batch: 16
"""


def test_inline_hf_fields_resolve(tmp_path):
    spec = load_spec(write(tmp_path, INLINE))
    shape = resolve_model(spec.model, spec.base_dir)
    assert spec.model.form == "inline"
    assert count_params(shape).total == count_params(get_preset("tiny-moe")).total


def test_inline_typo_did_you_mean_at_key(tmp_path):
    spec = load_spec(write(tmp_path, INLINE.replace("num_local_experts", "num_local_expert")))
    with pytest.raises(SpecError, match=r"spec.yaml:9:3: model.num_local_expert: unknown field \(did you mean 'num_local_experts'\?\)"):
        resolve_model(spec.model, spec.base_dir)


def test_inline_missing_field_named(tmp_path):
    spec = load_spec(write(tmp_path, INLINE.replace("  vocab_size: 2048\n", "")))
    with pytest.raises(SpecError, match=r"spec.yaml:1:1: model.vocab_size: required field is missing \(add 'vocab_size'; or let "
                                         r"transformers read the config, with its defaults: --model-class MixtralForCausalLM"):
        resolve_model(spec.model, spec.base_dir)


def test_inline_unknown_model_type(tmp_path):
    spec = load_spec(write(tmp_path, INLINE.replace("model_type: mixtral", "model_type: mixtrall")))
    # models/hf.py (93cc0bd) no longer guesses a spelling neighbour for model_type (it could miscount a
    # different architecture); the finding still points at the line and lists the readers
    with pytest.raises(SpecError, match=r"spec.yaml:2:15: model.model_type: unsupported model_type 'mixtrall'") as info:
        resolve_model(spec.model, spec.base_dir)
    assert "did you mean" not in str(info.value) and "mixtral" in str(info.value).split("'mixtrall'")[-1]


def test_inline_wrong_type(tmp_path):
    spec = load_spec(write(tmp_path, INLINE.replace("hidden_size: 256", "hidden_size: big")))
    with pytest.raises(SpecError, match=r"spec.yaml:3:16: model.hidden_size: expected a non-negative integer, got 'big'"):
        resolve_model(spec.model, spec.base_dir)


def test_model_forms_are_exclusive(tmp_path):
    lines, _ = error_lines(tmp_path, GOOD.replace("preset: tiny", "preset: tiny\n  hf_config: x.json"))
    assert "spec.yaml:4:14: model.hf_config: preset='tiny' and hf_config='x.json' are exclusive" in lines[0]
    lines, _ = error_lines(tmp_path, GOOD.replace("preset: tiny", "preset: tiny\n  hidden_size: 8"))
    assert "spec.yaml:4:16: model.hidden_size: inline field 'hidden_size' cannot be combined with preset" in lines[0]


def test_model_misspelt_form_key(tmp_path):
    lines, _ = error_lines(tmp_path, GOOD.replace("preset: tiny", "presett: tiny"))
    assert "spec.yaml:3:12: model.presett: unknown key 'presett' (did you mean 'preset'?)" in lines[0]


def test_model_empty(tmp_path):
    lines, _ = error_lines(tmp_path, GOOD.replace("  preset: tiny\n", "  {}\n").replace("model:\n  {}", "model: {}"))
    assert "model: no model given (set `preset: NAME`, `hf_config: path/to/config.json`, or inline HF fields" in lines[0]


# ------------------------------------------------------------------ cross-field rules


@pytest.mark.parametrize(
    "old,new,expect",
    [
        ("global_batch: 8", "global_batch: 6",
         ":10:17: training.global_batch: training.global_batch=6 is not a multiple of training.micro_batch * dp = 2 * 2 = 4"),
        ("micro_batch: 2", "micro_batch: 2\n  tp: 4",
         "training.tp: training.tp * training.pp = 4 * 1 = 4 does not divide the world size 2"),
        ("micro_batch: 2", "micro_batch: 2\n  ep: 4",
         "training.ep: training.ep=4 does not divide the data-parallel size 2"),
        ("micro_batch: 2", "micro_batch: 2\n  zeropp: true",
         "training.zeropp: training.zeropp=True needs ZeRO stage 3 (training.zero_stage=2)"),
        ("zero_stage: 2", "zero_stage: 0\n  offload: true",
         "training.offload: training.offload=True needs ZeRO stage 1-3 (training.zero_stage=0)"),
        ("micro_batch: 2", "micro_batch: 1\n  pp: 2",
         "training.zero_stage: training.zero_stage=2 is incompatible with training.pp=2"),
        ("micro_batch: 2", "micro_batch: 2\n  checkpoint_every_k: 2",
         "training.checkpoint_every_k: checkpoint_every_k=2 is only used with activation_checkpointing='every-k'"),
        ("micro_batch: 2", "micro_batch: 2\n  batch_ramp: {start_batch: 16, ramp_tokens: 1000}",
         "training.batch_ramp.start_batch: training.batch_ramp.start_batch=16 exceeds training.global_batch=8"),
        ("micro_batch: 2", "micro_batch: 2\n  batch_ramp: {kind: megatron, start_batch: 2, ramp_samples: 100}",
         "training.batch_ramp.increment: kind='megatron' needs increment"),
        ("micro_batch: 2", "micro_batch: 2\n  batch_ramp: {kind: megatron, start_batch: 2, increment: 4, ramp_samples: 100}",
         "training.batch_ramp.increment: training.global_batch - training.batch_ramp.start_batch = 6 is not a multiple"),
    ],
)
def test_cross_field_rules(tmp_path, old, new, expect):
    lines, _ = error_lines(tmp_path, GOOD.replace(old, new))
    assert any(expect in l for l in lines), lines


def test_fp8_needs_fp8_gpu(tmp_path):
    text = GOOD.replace("gpu: cpu", "gpu: A100-80G").replace("zero_stage: 2", "zero_stage: 2\n  precision: fp8")
    lines, _ = error_lines(tmp_path, text)
    assert "training.precision: training.precision='fp8' but cluster.gpu='A100-80G' has no fp8 tensor cores" in lines[0]
    assert ":13:14:" in lines[0]
    assert load_spec(write(tmp_path, text.replace("A100-80G", "h100-sxm"))).training.precision == "fp8"


def test_auto_degrees_skip_divisibility(tmp_path):
    spec = load_spec(write(tmp_path, GOOD.replace("micro_batch: 2", "micro_batch: auto\n  tp: auto\n  ep: auto")))
    assert spec.training.tp == "auto"


def test_checkpoint_policy_from_training():
    base = dict(seq_len=8, global_batch=8)
    assert TrainingSpec(**base).checkpoint_policy() == CheckpointPolicy(kind="none")
    t = TrainingSpec(**base, activation_checkpointing="every-k", checkpoint_every_k=4)
    assert t.checkpoint_policy() == CheckpointPolicy(kind="every-k", every_k=4)
    assert t.checkpoint_policy().checkpointed_layers(8) == [True, False, False, False, True, False, False, False]
    t = TrainingSpec(**base, activation_checkpointing="ratio", checkpoint_ratio=0.5)
    assert t.checkpoint_policy() == CheckpointPolicy(kind="ratio", ratio=0.5)
    assert TrainingSpec(**base, activation_checkpointing="selective").checkpoint_policy().recomputes_attention_core
    with pytest.raises(ValueError, match="activation_checkpointing='auto' has no policy yet"):
        TrainingSpec(**base, activation_checkpointing="auto").checkpoint_policy()


def test_spec_from_dict_errors_have_paths_without_lines():
    with pytest.raises(SpecError) as info:
        spec_from_dict({"model": {"preset": "tiny"}, "training": {"seq_len": 8, "global_batch": 8, "micro_batch": "x"}})
    assert str(info.value).startswith("<spec>: training.micro_batch: micro_batch='x' is not a number")


def test_spec_built_in_python_reports_model_errors_without_lines():
    spec = Spec(model={"preset": "nope"}, training={"seq_len": 8, "global_batch": 8})
    with pytest.raises(SpecError, match=r"^model.preset: unknown model preset 'nope'"):
        resolve_model(spec.model)


def test_bundled_specs_load_and_resolve(repo_root):
    specs = sorted((repo_root / "ds_configs").glob("*.yaml"))
    for path in specs:
        spec = load_spec(path)
        assert resolve_spec_model(spec).name == spec.model.preset


MODEL_RULES = """\
model:
  preset: {preset}
cluster:
  gpus_per_node: 16
  gpu: cpu
training:
  seq_len: 8
  global_batch: 16
  micro_batch: 1
  {field}
"""


@pytest.mark.parametrize(
    "preset,field,expect",
    [
        ("tiny", "ep: 2", r"spec.yaml:10:7: training.ep: training.ep=2 but model 'tiny' is dense"),
        ("tiny-moe", "ep: 2", None),
        ("tiny-moe", "ep: 8", r"spec.yaml:10:7: training.ep: training.ep=8 does not divide the 4 routed experts of 'tiny-moe'"),
        ("tiny", "tp: 4", None),
        ("tiny", "tp: 16", r"spec.yaml:10:7: training.tp: training.tp=16 does not divide num_attention_heads=8"),
        ("tiny", "tp: 8", r"training.tp=8 does not divide num_key_value_heads=4 \(pick a divisor of 4"),
    ],
)
def test_model_dependent_rules(tmp_path, preset, field, expect):
    spec = load_spec(write(tmp_path, MODEL_RULES.format(preset=preset, field=field)))
    if expect is None:
        resolve_spec_model(spec)
    else:
        with pytest.raises(SpecError, match=expect):
            resolve_spec_model(spec)


def test_tp_must_divide_kv_heads():
    spec = Spec(model={"preset": "tiny"}, cluster={"gpus_per_node": 8, "gpu": "cpu"},
                training={"seq_len": 8, "global_batch": 8, "tp": 8})
    with pytest.raises(SpecError, match=r"^training.tp: training.tp=8 does not divide num_key_value_heads=4"):
        resolve_spec_model(spec)


# ------------------------------------------------------------------ robustness

from hypothesis import given, settings, strategies as st  # noqa: E402
import yaml  # noqa: E402

_value = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 10**4) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_PATHS = [(), ("name",), ("model",), ("model", "preset"), ("cluster",), ("cluster", "gpu"), ("cluster", "nodes"),
          ("training",), ("training", "micro_batch"), ("training", "zero_stage"), ("training", "batch_ramp"),
          ("training", "tp"), ("training", "precision"), ("training", "seq_len")]


@settings(max_examples=150, deadline=None)
@given(path=st.sampled_from(_PATHS), key=st.text(max_size=6) | st.none(), value=_value)
def test_load_spec_never_crashes(tmp_path_factory, path, key, value):
    # Any perturbation of a good spec loads, or fails with SpecError whose lines all carry file:line:col.
    data = yaml.safe_load(GOOD)
    parent = data
    for p in path[:-1]:
        parent = parent.setdefault(p, {}) if isinstance(parent, dict) else parent
    if not path:
        data = value if key is None else {**data, key: value}
    elif isinstance(parent, dict):
        parent[path[-1]] = value if key is None else {key: value}
    p = tmp_path_factory.mktemp("fuzz") / "spec.yaml"
    p.write_text(yaml.safe_dump(data))
    try:
        load_spec(p)
    except SpecError as exc:
        for line in str(exc).split("\n"):
            assert line.startswith(f"{p}:"), line


def test_section_that_is_not_a_mapping(tmp_path):
    lines, _ = error_lines(tmp_path, GOOD.replace("model:\n  preset: tiny", "model: llama-3-8b"))
    assert lines[0].endswith(":2:8: model: 'llama-3-8b' is not a mapping (write `model: {preset: llama-3-8b}` (or hf_config: / inline HF fields))")
    lines, _ = error_lines(tmp_path, GOOD.replace("cluster:\n  nodes: 1\n  gpus_per_node: 2\n  gpu: cpu", "cluster: 2"))
    assert "cluster: 2 is not a mapping (write cluster as a mapping with keys: nodes, gpus_per_node, gpu, cuda_version, calibration, host_memory_per_node_gib, memory_headroom_fraction, nvlink_domain_gpus)" in lines[0]


def test_spec_findings_are_findings_with_codes(tmp_path):
    # one Finding type for specs and DeepSpeed configs; spec problems carry SPxxx codes, the spec text format
    from dstoolkit.validate.findings import Finding

    cases = [
        (GOOD.replace("global_batch: 8", "global_batch: 8\n  micro_bach: 2"), "SP002", "training.micro_bach",
         "/training/micro_bach"),
        (GOOD.replace("seq_len: 128", "seq_len: abc"), "SP003", "training.seq_len", "/training/seq_len"),
        (GOOD.replace("  seq_len: 128", "  seq_len: [128"), "SP001", "<yaml>", ""),
        (GOOD.replace("  seq_len: 128\n", ""), "SP005", "training.seq_len", "/training/seq_len"),
        (GOOD.replace("zero_stage: 2", "zero_stage: 2\n  checkpoint_every_k: 2"), "SP004", "training.checkpoint_every_k",
         "/training/checkpoint_every_k"),
    ]
    for text, code, path, pointer in cases:
        _, err = error_lines(tmp_path, text)
        [f] = err.findings
        assert isinstance(f, Finding) and (f.code, f.path, f.pointer, f.severity) == (code, path, pointer, "error"), f
        assert str(f) == f"{f.file}:{f.line}:{f.column}: {f.path}: {f.message} ({f.suggestion})"
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "nope.yaml")
    assert info.value.findings[0].code == "SP006" and info.value.findings[0].line is None

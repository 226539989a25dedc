"""s31 findings 9, 10, 13, 15 and 16d: infinite spec numbers, an unreadable hf_config, the warmup > train_steps warning
on the spec and on generate's stdout, Megatron-Core's reason for ZeRO beside a pipeline, numpy integers in a ramp."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dstoolkit.cli import main
from dstoolkit.spec import SpecError, load_spec

REPO = Path(__file__).resolve().parents[2]
TINY = (REPO / "ds_configs" / "tiny_cpu.yaml").read_text()


def _write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _validate(capsys, path: Path) -> tuple[int, list[dict]]:
    rc = main(["validate", str(path), "--format", "json"])
    return rc, json.loads(capsys.readouterr().out)


def _line_of(text: str, key: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if ln.strip().startswith(f"{key}:"))


# finding 9: lr 1e1000 (inf) passed the field check and ended in a pydantic dump

@pytest.mark.parametrize("value", ["1e1000", ".inf", "-.inf", ".nan", '"inf"'])
def test_lr_must_be_finite_at_its_line(tmp_path, capsys, value):
    text = TINY.replace("lr: 0.003", f"lr: {value}")
    rc, found = _validate(capsys, _write(tmp_path, text))
    assert rc == 1 and len(found) == 1, found
    f = found[0]
    assert (f["path"], f["line"], f["code"]) == ("training.lr", _line_of(text, "lr"), "SP003")
    assert "is not a finite number" in f["message"] and f["suggestion"] == "give a finite number > 0"
    assert "pydantic" not in f["message"]


def test_every_float_field_refuses_inf_by_the_same_rule(tmp_path):
    text = TINY.replace("  gpu: cpu", "  gpu: cpu\n  host_memory_per_node_gib: .inf")
    with pytest.raises(SpecError) as info:
        load_spec(_write(tmp_path, text))
    f, = info.value.findings
    assert f.path == "cluster.host_memory_per_node_gib" and f.line == _line_of(text, "host_memory_per_node_gib")
    assert "=inf is not a finite number" in f.message and f.suggestion == "give a finite number > 0"


# finding 10: a non-UTF-8 hf_config gave a bare codec error, and validate exited 1

def test_binary_hf_config_names_file_field_and_fix_and_is_an_input_error(tmp_path, capsys):
    (tmp_path / "bin.json").write_bytes(b"\x00\x01\x02\xff\xfe")
    text = TINY.replace("  preset: tiny", "  hf_config: bin.json")
    spec = _write(tmp_path, text)
    rc, found = _validate(capsys, spec)
    assert rc == 2, found
    f, = found
    assert (f["path"], f["line"], f["code"]) == ("model.hf_config", _line_of(text, "hf_config"), "SP006")
    assert "bin.json" in f["message"] and "not UTF-8" in f["message"] and "codec" not in f["message"]
    assert "config.json" in f["suggestion"]
    assert main(["estimate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "model.hf_config: cannot read HF config" in err and "codec" not in err


# finding 13: validate of the spec said 0 warnings for warmup_steps > train_steps; generate said nothing on stdout

def test_warmup_longer_than_training_warns_on_the_spec_and_on_generate(tmp_path, capsys):
    text = TINY + "  warmup_steps: 500\n  train_steps: 100\n"
    spec = _write(tmp_path, text)
    rc, found = _validate(capsys, spec)
    assert rc == 0, found
    f, = found
    assert (f["code"], f["severity"], f["path"]) == ("DS235", "warning", "training.warmup_steps")
    assert f["line"] == _line_of(text, "warmup_steps")
    assert "total_num_steps=100 < warmup_num_steps=500" in f["message"]
    assert "training.train_steps" in f["suggestion"]
    assert main(["generate", str(spec), "--out", str(tmp_path / "g"), "--strategy", "zero1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^warning\[DS235\] \(zero1\) /scheduler/params/total_num_steps: WarmupCosineLR: "
                     r"total_num_steps=100 < warmup_num_steps=500", out, re.M), out
    ok = _write(tmp_path, TINY + "  warmup_steps: 10\n  train_steps: 100\n", "ok.yaml")
    assert _validate(capsys, ok) == (0, [])


# finding 15: the Megatron-Core group dropped ZeRO-2 + PP citing DeepSpeed's pipeline engine

def test_pp_zero_reason_is_the_engines_own(capsys):
    from dstoolkit.layout import LayoutFacts, first_violation

    deepspeed = first_violation(LayoutFacts(zero_stage=2, pp=2, framework="deepspeed"), ("LY006",))
    megatron = first_violation(LayoutFacts(zero_stage=2, pp=2, framework="megatron"), ("LY006",))
    fsdp3 = first_violation(LayoutFacts(zero_stage=3, pp=2, framework="megatron"), ("LY006",))
    assert "DeepSpeed's pipeline engine" in str(deepspeed)
    assert "DeepSpeed" not in str(megatron) and "distributed optimizer" in str(megatron) and "ZeRO-1" in str(megatron)
    assert "Megatron-FSDP" in str(fsdp3) and "DeepSpeed" not in str(fsdp3)
    # a DeepSpeed config's own check (framework unknown) keeps DeepSpeed's reason
    assert "DeepSpeed's pipeline engine" in str(first_violation(LayoutFacts(zero_stage=2, pp=2), ("LY006",)))
    rc = main(["sweep", str(REPO / "ds_configs" / "llama3_8b_1x8_h100.yaml"), "--target", "megatron-lm", "--top", "1"])
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "pp-zero" in ln)
    assert rc == 0 and "Megatron-Core" in line and "DeepSpeed's pipeline engine" not in line, line


def test_spec_for_megatron_lm_gets_megatron_reason(tmp_path):
    text = (re.sub(r"^  pp: 1", "  pp: 2", TINY, flags=re.M).replace("zero_stage: auto", "zero_stage: 2")
            + "targets: [megatron-lm]\n")
    with pytest.raises(SpecError) as info:
        load_spec(_write(tmp_path, text))
    f, = info.value.findings
    assert f.code == "LY006" and "under Megatron-Core" in f.message and "DeepSpeed" not in f.message


# finding 16d: a numpy integer was refused as "must be > 0 (a whole number)"

def test_batch_ramp_takes_numpy_integers_as_ints():
    np = pytest.importorskip("numpy")
    from dstoolkit.estimate.batch_ramp import BatchRamp

    ramp = BatchRamp(np.int64(8), np.int32(64), 8, 100, 2, 4)
    assert type(ramp.start_batch) is int and type(ramp.end_batch) is int
    assert [p.global_batch for p in ramp.schedule(np.int64(3))] == [8, 8, 16]
    with pytest.raises(ValueError, match=r"batch_ramp.start_batch=True must be > 0 \(a whole number\)"):
        BatchRamp(True, 64, 8, 100, 2, 4)

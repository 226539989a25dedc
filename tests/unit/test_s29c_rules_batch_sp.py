"""DS201's data-parallel arithmetic names the sequence-parallel term as DS213 does; sequence_parallel_size 4.0 is
taken as 4, "4" refused, as DeepSpeed 0.19.8 does; DS234 judges warmup_num_steps as DeepSpeed receives it: through
its own hjson reader of the file (strict) or HF's json.load (hf). Each DeepSpeed behaviour was measured on a 1-rank
gloo CPU engine (see the rule explanations and registry.as_deepspeed_reads)."""
from __future__ import annotations

import json

import pytest

from dstoolkit.cli import main
from dstoolkit.dsconfig.registry import as_deepspeed_reads
from dstoolkit.validate import validate_config

T1 = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
      "zero_optimization": {"stage": 2}, "sequence_parallel_size": 4, "train_batch_size": 32}


def found(cfg, codes, **ctx):
    return [(f.code, f.pointer, f.message, f.suggestion) for f in validate_config(cfg, **ctx) if f.code in codes]


def test_ds201_names_the_sequence_parallel_term(tmp_path, capsys):
    path = tmp_path / "t1.json"
    path.write_text(json.dumps(T1))
    assert main(["validate", str(path), "--world-size", "32", "--tp", "2"]) == 1
    assert ("error[DS201]: train_batch_size 32 != train_micro_batch_size_per_gpu 1 x gradient_accumulation_steps 1 x "
            "data-parallel size 4 (world size 32 / (tp 2 x pp 1 x sp 4)) = 4 (set \"gradient_accumulation_steps\": 8)"
            ) in capsys.readouterr().out
    # the same terms as DS213 (layout constraint LY009) prints for the same layout
    moe = {**T1, "train_batch_size": 4, "dstoolkit": {"moe": {"num_experts": 8, "ep_size": 8}}}
    [(_, _, message, _)] = found(moe, ("DS213",), world_size=32, tp=2)
    assert "(world 32 / (tp 2 x pp 1 x sp 4))" in message
    # sp alone; no model parallelism at all keeps the short form the README shows
    [(_, _, message, _)] = found(T1, ("DS201",), world_size=32)
    assert "data-parallel size 8 (world size 32 / (tp 1 x pp 1 x sp 4)) = 8" in message
    [(_, _, message, _)] = found({**T1, "sequence_parallel_size": 1}, ("DS201",), world_size=8)
    assert "data-parallel size 8 (world size 8) = 8" in message


def test_sequence_parallel_size_written_as_a_float_is_taken_as_deepspeed_takes_it():
    # DeepSpeed divides the world by it with true division (runtime/config.py: dist.get_world_size() /
    # config["sequence_parallel_size"]), so 4.0 and 4 give the same (float) data-parallel size, and its hjson reader
    # reads 4.0 as 4 anyway; "4" raises TypeError there (measured: "1" -> unsupported operand type(s) for /)
    as_int = found(T1, ("DS201", "DS102", "DS226"), world_size=32, tp=2)
    assert found({**T1, "sequence_parallel_size": 4.0}, ("DS201", "DS102", "DS226"), world_size=32, tp=2) == as_int
    text = json.dumps({**T1, "sequence_parallel_size": "4"})
    assert found(text, ("DS201", "DS102"), world_size=32, tp=2) == [
        ("DS102", "/sequence_parallel_size",
         "sequence_parallel_size = '4': expected an integer, got string '4'",
         "write the number without quotes: 4")]
    assert [c for c, *_ in found({**T1, "sequence_parallel_size": 3}, ("DS226",), world_size=32)] == ["DS226"]
    assert [c for c, *_ in found({**T1, "sequence_parallel_size": 3.0}, ("DS226",), world_size=32)] == ["DS226"]


WARMUP = '{"train_micro_batch_size_per_gpu": 1, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": %s}}}'


@pytest.mark.parametrize("literal", ["1000", "1000.0", "1e3", "2e0", "9999999999.0"])
def test_strict_follows_deepspeeds_hjson_reader(literal):
    # measured with deepspeed.initialize(config=path): each builds WarmupLR (hjson turns integral numbers below 1e10
    # into ints: hjson/decoder.py scantfnns)
    assert found(WARMUP % literal, ("DS234",)) == []


def test_hf_follows_json_load():
    # HF Trainer / Accelerate read the file with json.load and pass the dict: 1000.0 stays a float (measured:
    # deepspeed.initialize(config=dict) raises)
    assert found(WARMUP % "1000.0", ("DS234",), mode="hf") == [
        ("DS234", "/scheduler/params/warmup_num_steps",
         "scheduler.params warmup_num_steps=1000.0: HF Trainer / Accelerate read the file with json.load, which keeps "
         "the float (accelerate/utils/deepspeed.py), and WarmupLR raises ValueError('warmup_num_steps must be a "
         "positive integer, got 1000.0') (runtime/lr_schedules.py: `not isinstance(warmup_num_steps, int) or "
         "warmup_num_steps <= 0`)", 'write it as an integer: "warmup_num_steps": 1000')]
    assert found(WARMUP % "1000", ("DS234",), mode="hf") == []


@pytest.mark.parametrize("value, mode", [(1e10, "strict"), (1e30, "strict"), (1000.5, "strict"), (1000.5, "hf"),
                                         (2.0, "hf")])
def test_floats_deepspeed_refuses(value, mode):
    # measured: 1e10 and 1e30 stay floats through hjson and raise; 1000.5 raises through both readers
    cfg = json.loads(WARMUP % "1")
    cfg["scheduler"]["params"]["warmup_num_steps"] = value
    assert [c for c, *_ in found(cfg, ("DS234",), mode=mode)] == ["DS234"]


def test_as_deepspeed_reads():
    assert [as_deepspeed_reads(v, "strict") for v in (1000.0, 2.0, 9999999999.0, 1e10, 1000.5, "1", True)] == [
        1000, 2, 9999999999, 1e10, 1000.5, "1", True]
    assert as_deepspeed_reads(1000.0, "hf") == 1000.0 and isinstance(as_deepspeed_reads(1000.0, "hf"), float)

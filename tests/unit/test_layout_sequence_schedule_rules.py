"""Layouts the frameworks refuse, refused here with the field, the value and the fix (LY019-LY022), and sequence
sharding written only to the launchers that have it. Before, each of these specs was estimated as if it ran:
seq_len 1001 with cp 2, Ulysses 8 over 4 key/value heads, 16 virtual stages of a 4-stage pipeline over 32 layers
(and virtual stages without a pipeline), the interleaved schedule under DeepSpeed's pipeline engine; and `generate`
wrote a cp 2 spec's Megatron-LM arguments without --context-parallel-size, its gradient accumulation over a dp that
counted the context-parallel ranks."""
import json
import textwrap

import pytest

from dstoolkit.cli import main
from dstoolkit.layout import LayoutFacts, check_layout
from dstoolkit.spec import SpecError, load_spec

BASE = """\
name: rules
model:
  preset: {preset}
cluster:
  nodes: 1
  gpus_per_node: 8
  gpu: H100-SXM
training:
  seq_len: {seq}
  global_batch: {gbs}
  micro_batch: 1
  zero_stage: 1
  activation_checkpointing: full
{extra}
"""


def write(tmp_path, extra, preset="llama-3-8b", seq=4096, gbs=64, name="spec.yaml"):
    p = tmp_path / name
    body = textwrap.indent(textwrap.dedent(extra), "  ")
    p.write_text(BASE.format(preset=preset, seq=seq, gbs=gbs, extra=body))
    return p


def codes(**facts):
    return [v.code for v in check_layout(LayoutFacts(**facts), ("LY019", "LY020", "LY021", "LY022"))]


def test_sequence_must_split_evenly_over_its_shards():
    assert codes(seq_len=1001, sp=2, cp=2) == ["LY019"]  # Megatron CP: 2 * cp chunks
    assert codes(seq_len=4094, sp=2, cp=2) == ["LY019"]  # even, but not a multiple of 4
    assert codes(seq_len=4096, sp=2, cp=2) == []
    assert codes(seq_len=1001, sp=7, cp=1) == []  # Ulysses 7 divides 1001
    assert codes(seq_len=1000, sp=7, cp=1) == ["LY019"]
    assert codes(seq_len=1001, tp=2, megatron_sp=True) == ["LY019"]  # SP scatters the sequence over TP
    assert codes(seq_len=1001, tp=2, megatron_sp=False) == []
    assert codes(seq_len=4098, sp=2, cp=1, tp=2, megatron_sp=True) == ["LY019"]  # 2049 tokens per Ulysses shard


def test_spec_names_seq_len_and_the_fix(tmp_path):
    with pytest.raises(SpecError, match=r"training\.seq_len: training\.seq_len=1001 does not split into 2 x "
                                        r"training\.cp = 4 equal chunks.*use a seq_len divisible by 4"):
        load_spec(write(tmp_path, "cp: 2", seq=1001))
    with pytest.raises(SpecError, match=r"training\.seq_len=1001: 1001 tokens do not split over training\.tp=2"):
        load_spec(write(tmp_path, "tp: 2\nsequence_parallel: true", seq=1001))


def test_every_ulysses_rank_needs_a_key_value_head():
    assert codes(sp=8, cp=1, kv_heads=4, tp=1) == ["LY020"]
    assert codes(sp=4, cp=1, kv_heads=4, tp=1) == []
    assert codes(sp=2, cp=1, kv_heads=8, tp=8) == ["LY020"]  # one KV head per TP rank
    assert codes(sp=8, cp=8, kv_heads=4, tp=1) == []  # context parallelism splits the sequence, not heads
    assert codes(sp=8, cp=1, kv_heads=1, tp=1, is_mla=True) == []


def test_estimate_refuses_ulysses_beyond_the_kv_heads(tmp_path, capsys):
    # tiny: 8 heads, 4 key/value heads
    assert main(["estimate", str(write(tmp_path, "ulysses: 8", preset="tiny", gbs=8))]) == 2
    err = capsys.readouterr().err
    assert "training.ulysses=8 exceeds the 4 key/value heads" in err and "Traceback" not in err


def test_virtual_stages_need_a_pipeline_and_something_to_run():
    assert codes(virtual_stages=4, pp=1, num_layers=32) == ["LY021"]
    assert codes(virtual_stages=16, pp=4, num_layers=32) == ["LY021"]  # 64 chunks > 32 blocks + 2
    assert codes(virtual_stages=3, pp=32, num_layers=94) == []  # 96 = 94 blocks + embedding + output layer
    assert codes(virtual_stages=2, pp=4, num_layers=32) == []


def test_spec_refuses_virtual_stages_without_a_pipeline(tmp_path):
    extra = "pp: 1\nframework: megatron\npipeline_schedule: interleaved\nvirtual_stages: 4"
    with pytest.raises(SpecError, match=r"training\.virtual_stages: training\.virtual_stages=4 with training\.pp=1"):
        load_spec(write(tmp_path, extra))


def test_deepspeed_pipeline_engine_runs_1f1b_only(tmp_path):
    assert codes(pipeline_schedule="interleaved", framework="deepspeed", pp=4) == ["LY022"]
    assert codes(pipeline_schedule="dualpipe", framework="megatron", pp=4) == []
    assert codes(pipeline_schedule="interleaved", framework="deepspeed", pp=1) == []  # no pipeline: nothing runs it
    extra = "pp: 4\npipeline_schedule: interleaved\nvirtual_stages: 2"
    with pytest.raises(SpecError, match=r"training\.pipeline_schedule: .*DeepSpeed's pipeline engine runs 1F1B "
                                        r"only \(set pipeline_schedule: 1f1b, or framework: megatron / fsdp\)"):
        load_spec(write(tmp_path, extra))
    load_spec(write(tmp_path, extra + "\nframework: megatron"))


def test_global_batch_counts_dp_without_the_sequence_shards(tmp_path):
    # 8 GPUs, cp 2: dp 4, so a global batch of 4 is one micro batch per data-parallel rank
    load_spec(write(tmp_path, "cp: 2\nframework: megatron", gbs=4))
    with pytest.raises(SpecError, match=r"training\.global_batch=6 is not a multiple of training\.micro_batch \* dp = "
                                        r"1 \* 4 = 4 \(dp = world 8 / \(training\.tp\*training\.pp\*training\.cp\)\)"):
        load_spec(write(tmp_path, "cp: 2\nframework: megatron", gbs=6))


def test_generate_writes_context_parallelism_for_megatron_lm_only(tmp_path, capsys):
    spec = write(tmp_path, "tp: 2\npp: 1\ncp: 2\nframework: megatron")
    # the default target, the bundled DeepSpeed trainer, shards no sequence: nothing is written, and the reason
    # names the launcher that can
    assert main(["generate", str(spec), "-o", str(tmp_path / "ds"), "--strategy", "zero1"]) != 0
    err = capsys.readouterr().err
    assert "training.cp=2: deepspeed does not split sequences that way; generate with --target megatron-lm" in err
    assert main(["generate", str(spec), "-o", str(tmp_path / "lm"), "--strategy", "zero1",
                 "--target", "megatron-lm"]) == 0
    args = (tmp_path / "lm" / "zero1" / "megatron_lm_args.txt").read_text().split()
    assert args[args.index("--context-parallel-size") + 1] == "2"
    ds = json.loads((tmp_path / "lm" / "zero1" / "ds_config.json").read_text())
    # 64 sequences over dp = 8 / (tp 2 x cp 2) = 2 ranks, one per micro batch: 32 accumulation steps
    assert (ds["gradient_accumulation_steps"], ds["sequence_parallel_size"]) == (32, 2)
    assert main(["generate", str(spec), "-o", str(tmp_path / "mds"), "--strategy", "zero1",
                 "--target", "megatron-deepspeed"]) != 0
    assert "generate with --target megatron-lm" in capsys.readouterr().err


def test_generate_writes_ulysses_for_the_megatron_targets_only(tmp_path, capsys):
    spec = write(tmp_path, "tp: 1\npp: 1\nulysses: 4")
    assert main(["generate", str(spec), "-o", str(tmp_path / "mds"), "--strategy", "zero1",
                 "--target", "megatron-deepspeed"]) == 0
    args = (tmp_path / "mds" / "zero1" / "megatron_deepspeed_args.txt").read_text().split()
    assert args[args.index("--ds-sequence-parallel-size") + 1] == "4"
    ds = json.loads((tmp_path / "mds" / "zero1" / "ds_config.json").read_text())
    assert (ds["gradient_accumulation_steps"], ds["sequence_parallel_size"]) == (32, 4)  # dp = 8 / 4
    # Megatron-LM runs it as Megatron-Core's all-to-all context parallelism
    assert main(["generate", str(spec), "-o", str(tmp_path / "mlm"), "--strategy", "zero1",
                 "--target", "megatron-lm"]) == 0
    args = (tmp_path / "mlm" / "zero1" / "megatron_lm_args.txt").read_text().split()
    assert args[args.index("--context-parallel-size") + 1] == "4" and args[args.index("--cp-comm-type") + 1] == "a2a"
    assert main(["generate", str(spec), "-o", str(tmp_path / "hf"), "--strategy", "zero1", "--target", "hf"]) != 0
    assert "generate with --target megatron-deepspeed / megatron-lm" in capsys.readouterr().err


def test_ulysses_and_megatron_sequence_parallelism_do_not_combine(tmp_path):
    assert [v.code for v in check_layout(LayoutFacts(sp=2, cp=1, megatron_sp=True), ("LY023",))] == ["LY023"]
    assert check_layout(LayoutFacts(sp=2, cp=2, megatron_sp=True), ("LY023",)) == []  # cp and SP do
    with pytest.raises(SpecError, match=r"training\.sequence_parallel: training\.ulysses=2 with "
                                        r"training\.sequence_parallel: DeepSpeed-Ulysses and Megatron sequence "
                                        r"parallelism do not combine"):
        load_spec(write(tmp_path, "tp: 2\nulysses: 2\nsequence_parallel: true"))
    # without it, Megatron-DeepSpeed gets --ds-sequence-parallel-size and no --sequence-parallel at TP 2
    spec = write(tmp_path, "tp: 2\npp: 1\nulysses: 2", name="ok.yaml")
    assert main(["generate", str(spec), "-o", str(tmp_path / "mds"), "--strategy", "zero1",
                 "--target", "megatron-deepspeed"]) == 0
    args = (tmp_path / "mds" / "zero1" / "megatron_deepspeed_args.txt").read_text().split()
    assert "--sequence-parallel" not in args and args[args.index("--ds-sequence-parallel-size") + 1] == "2"


def test_context_parallelism_needs_a_framework_that_has_it(tmp_path):
    """DeepSpeed 0.19.8 has no context parallelism (ring attention): a cp spec under framework deepspeed was
    estimated as if Megatron-LM ran it (LY024); Ulysses is DeepSpeed's sequence parallelism."""
    with pytest.raises(SpecError, match=r"training\.cp: training\.cp=2 with training\.framework='deepspeed': DeepSpeed "
                                        r"has no context parallelism \(ring attention\) \(use ulysses: 2"):
        load_spec(write(tmp_path, "cp: 2\nframework: deepspeed"))
    load_spec(write(tmp_path, "cp: 2\nframework: megatron"))
    load_spec(write(tmp_path, "cp: 2\nframework: fsdp"))
    load_spec(write(tmp_path, "ulysses: 2\nframework: deepspeed"))

"""launch_megatron_deepspeed.sh of a GQA model stops (exit 2, before torchrun) on a Megatron-DeepSpeed tree whose
megatron/model/transformer.py cannot split its QKV output: the equal-thirds split (since 676a482c, "FPDT"; the
pinned f4157bea has it) and, with a Ulysses degree, the assert of equal projections. A tree without those lines (from
before 676a482c, or patched back to the split by key/value group, as benchmarks/megatron_deepspeed_runs.py does)
launches. An MHA model's script has no check.

Before: the script launched every rank, which failed at the first forward ("shape '[128, 4, -1, 32]' is invalid")."""
from __future__ import annotations

import os
import subprocess

from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.megatron import render_launch_script
from dstoolkit.generate.megatron_deepspeed import QKV_THIRDS, ULYSSES_MHA
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import spec_from_dict

SPEC = {"name": "t", "model": {"preset": "tiny"}, "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": 2},
        "training": {"global_batch": 8, "seq_len": 128}}


def _script(tmp_path, *, kv: int, ulysses: int = 1, lines=(QKV_THIRDS,)):
    spec = spec_from_dict(SPEC)
    shape = ModelShape(name="m", model_type="llama", hidden_size=256, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=kv,
                       intermediate_size=688, vocab_size=2048)
    cand = Candidate(tp=1, pp=1, zero_stage=1, micro_batch=1, ulysses=ulysses)
    text = render_launch_script(spec, cand, "megatron-deepspeed", strategy="zero1",
                                pretrain_script="unused", shape=shape)
    tree = tmp_path / "tree"
    (tree / "megatron" / "model").mkdir(parents=True)
    (tree / "pretrain_gpt.py").write_text("")
    (tree / "megatron" / "model" / "transformer.py").write_text("\n".join(f"        {x}" for x in lines) + "\n")
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "launch.sh").write_text(text)
    (folder / "megatron_deepspeed_args.txt").write_text("--num-layers\n2\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text("#!/bin/sh\necho TORCHRUN\n")
    (bin_dir / "torchrun").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PRETRAIN": str(tree / "pretrain_gpt.py"),
           "DATA_ARGS": "--data-path x"}
    return text, subprocess.run(["bash", str(folder / "launch.sh")], env=env, capture_output=True, text=True)


def test_gqa_stops_on_the_thirds_split_and_names_the_ways_out(tmp_path):
    _, r = _script(tmp_path, kv=4)
    assert r.returncode == 2 and "TORCHRUN" not in r.stdout
    assert "splits the fused QKV output into three equal thirds (Megatron-DeepSpeed since 676a482c)" in r.stderr
    assert "4 key/value heads for 8 query heads (GQA)" in r.stderr and "--target megatron-lm" in r.stderr


def test_a_patched_or_older_tree_launches(tmp_path):
    _, r = _script(tmp_path, kv=4, lines=("(query_layer, key_layer, value_layer) = self.split_tensor(x)",))
    assert r.returncode == 0 and "TORCHRUN" in r.stdout, r.stderr


def test_ulysses_checks_the_equal_projection_assert(tmp_path):
    _, r = _script(tmp_path, kv=4, ulysses=2, lines=(ULYSSES_MHA,))
    assert r.returncode == 2 and "asserts equal query and key/value projections" in r.stderr
    assert "--ds-sequence-parallel-size 2" in r.stderr


def test_mha_has_no_check(tmp_path):
    text, r = _script(tmp_path, kv=8)
    assert "TRANSFORMER=" not in text and r.returncode == 0 and "TORCHRUN" in r.stdout

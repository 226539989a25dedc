"""`generate` per target: each target's layout and figures come from the engine its files run, a run that gives no
requested target any file writes nothing, and Ulysses beside Megatron sequence parallelism is refused only where
DeepSpeed's engine runs the Ulysses degree.

Before (b7344e5): every non-HF target shared one sweep under training.framework (default deepspeed), so
`--target megatron-lm` printed and wrote DeepSpeed's figures (llama-3-8b zero1 tp2: 66.57 GiB, 18.79 s; Megatron-Core's
are 59.09 GiB, 18.34 s); `generate` exited 1 for "no strategy has files for megatron-deepspeed" after writing the folder
(ds_config.json, summary.md); and LY023 refused ulysses: 2 with sequence_parallel: true at spec load for every target,
although Megatron-LM writes that Ulysses as --context-parallel-size 2 --cp-comm-type a2a and takes --sequence-parallel
beside it (megatron/training/arguments.py and TransformerConfig at d98e8a64 assert nothing between the two).
"""
from __future__ import annotations

import hashlib
import json
import textwrap

import pytest

from dstoolkit.cli import main
from dstoolkit.generate.core import generate
from dstoolkit.generate.io import load_spec_and_shape
from dstoolkit.generate.planner import estimate_candidate, resolve_spec
from dstoolkit.layout import LayoutFacts, check_layout
from dstoolkit.spec import SpecError, load_spec

SPEC = """\
name: s29
model: {{preset: llama-3-8b}}
cluster: {{nodes: 1, gpus_per_node: 8, gpu: H100-SXM}}
training:
  seq_len: {seq}
  global_batch: 64
  micro_batch: 1
  zero_stage: 1
  tp: 2
  pp: {pp}
  activation_checkpointing: full
{extra}
"""


def write(tmp_path, extra="", *, seq=4096, pp=1, name="spec.yaml"):
    p = tmp_path / name
    p.write_text(SPEC.format(seq=seq, pp=pp, extra=textwrap.indent(textwrap.dedent(extra), "  ")))
    return p


def tree(folder):
    """Every file under `folder` with its SHA-256 (what 'left untouched' compares)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------------------
# 1. each target's figures are its engine's
# ---------------------------------------------------------------------------------------------------------

def _engine_estimates(tmp_path, cand):
    """The candidate estimated for the same spec with framework deepspeed and with framework megatron (loaded as the
    user would write them, not through generate)."""
    out = {}
    for fw in ("deepspeed", "megatron"):
        spec, shape = load_spec_and_shape(write(tmp_path, f"framework: {fw}", name=f"{fw}.yaml"))
        out[fw] = estimate_candidate(spec, shape, cand)
    assert out["deepspeed"] != out["megatron"]  # the engines differ for this layout, so the test can tell them apart
    return out


def test_megatron_lm_alone_gets_megatron_cores_figures(tmp_path):
    spec, shape = load_spec_and_shape(write(tmp_path))  # framework: deepspeed (the default)
    res = generate(spec, shape, strategies=["zero1"], targets=["megatron-lm"])
    (o,) = res.generated
    est = _engine_estimates(tmp_path, o.chosen.candidate)
    assert o.chosen.estimate == est["megatron"]
    assert o.per_target["megatron-lm"].estimate == est["megatron"]
    summary = res.files["zero1/summary.md"]
    assert f"| step time | {est['megatron'].step_time_s:.4g} s |" in summary
    assert "For megatron-lm, under Megatron-Core, the engine its files run." in summary
    assert ("Note: megatron-lm runs Megatron-Core: each target's layout and figures are estimated under the engine its "
            "files run, not under training.framework='deepspeed'") in summary


def test_each_target_of_a_mixed_run_gets_its_own_engines_figures(tmp_path, capsys):
    p = write(tmp_path)
    spec, shape = load_spec_and_shape(p)
    # megatron-lm first: the folder's ds_config.json is still DeepSpeed's layout, its table DeepSpeed's figures
    res = generate(spec, shape, strategies=["zero1"], targets=["megatron-lm", "deepspeed", "hf"])
    (o,) = res.generated
    est = _engine_estimates(tmp_path, o.chosen.candidate)
    assert o.per_target["megatron-lm"].estimate == est["megatron"]
    assert o.per_target["deepspeed"].estimate == est["deepspeed"]
    assert o.per_target["hf"].estimate == est["deepspeed"]  # HF Trainer drives DeepSpeed's engine
    assert o.chosen.estimate == est["deepspeed"] and o.chosen_targets == ["deepspeed"]
    assert json.loads(res.files["zero1/layout.json"])["files"]["ds_config.json"]["targets"] == ["deepspeed"]
    lm = est["megatron"]
    assert (f"- megatron-lm (Megatron-Core): `{o.chosen.candidate.label}`, {lm.step_time_s:.4g} s/step, "
            f"{lm.memory_per_rank_bytes / 2**30:.2f} GiB per rank, MFU {lm.mfu * 100:.1f}%") in res.files["zero1/summary.md"]
    index = res.files["summary.md"]
    assert (f"| zero1 | megatron-lm | `{o.chosen.candidate.label}` | {lm.memory_per_rank_bytes / 2**30:.2f} GiB | "
            f"{lm.step_time_s:.4g} s | {lm.mfu * 100:.1f}% |") in index
    # the CLI prints both, each naming its targets, and --format json gives each target's figures and engine
    assert main(["generate", str(p), "-o", str(tmp_path / "o"), "--strategy", "zero1", "--target", "deepspeed",
                 "--target", "megatron-lm"]) == 0
    text = capsys.readouterr().out
    ds = est["deepspeed"]
    assert (f"{ds.memory_per_rank_bytes / 2**30:8.2f} GiB/rank {ds.step_time_s:10.4g} s/step  deepspeed\n") in text
    assert (f"{lm.memory_per_rank_bytes / 2**30:8.2f} GiB/rank {lm.step_time_s:10.4g} s/step  megatron-lm\n") in text
    assert main(["generate", str(p), "-o", str(tmp_path / "j"), "--strategy", "zero1", "--target", "deepspeed",
                 "--target", "megatron-lm", "--format", "json"]) == 0
    per = json.loads(capsys.readouterr().out)["generated"][0]["per_target"]
    assert (per["megatron-lm"]["engine"], per["megatron-lm"]["step_time_s"]) == ("megatron", lm.step_time_s)
    assert (per["deepspeed"]["engine"], per["deepspeed"]["step_time_s"]) == ("deepspeed", ds.step_time_s)


def test_estimate_and_sweep_for_megatron_lm_use_megatron_core(tmp_path):
    spec, shape = load_spec_and_shape(write(tmp_path))
    r = resolve_spec(spec, shape, ("megatron-lm",))
    assert r.plan.framework == "megatron"
    assert any("megatron-lm runs Megatron-Core" in a for a in r.assumptions)
    assert resolve_spec(spec, shape, ("megatron-deepspeed",)).plan.framework == "deepspeed"
    assert resolve_spec(spec, shape).plan.framework == "deepspeed"  # no target: the spec's framework


def test_a_deepspeed_config_is_not_written_for_a_layout_deepspeed_refuses(repo_root, tmp_path):
    # tiny-moe at ZeRO-3: DeepSpeed refuses its native MoE there; Megatron-LM (Megatron-FSDP) and HF run it. The
    # folder gets their files and no ds_config.json, which no requested DeepSpeed-engine target could start.
    # (on GPUs: generate gives a CPU spec no megatron-lm files, Megatron-LM asserts CUDA)
    gpu = tmp_path / "tiny_moe_gpu.yaml"
    gpu.write_text((repo_root / "ds_configs" / "tiny_moe_cpu.yaml").read_text().replace("gpu: cpu", "gpu: H100-SXM"))
    spec, shape = load_spec_and_shape(gpu)
    res = generate(spec, shape, strategies=["zero3"], targets=["deepspeed", "megatron-lm", "hf"])
    (o,) = res.generated
    assert "megatron_lm_args.txt" in o.files and "ds_config_hf.json" in o.files
    assert "ds_config.json" not in o.files
    assert o.targets_skipped["deepspeed"].startswith("DeepSpeed refuses its native MoE at ZeRO stage 3")
    # asked alone, Megatron-LM's folder keeps the DeepSpeed JSON of its layout, as before
    (alone,) = generate(spec, shape, strategies=["zero3"], targets=["megatron-lm"]).generated
    assert "ds_config.json" in alone.files


# ---------------------------------------------------------------------------------------------------------
# 2. exit 1 writes nothing
# ---------------------------------------------------------------------------------------------------------

def test_no_requested_target_got_files_writes_nothing(tmp_path, capsys):
    # pp 4 of 32 layers is 8 per stage, which 3 virtual stages do not divide: Megatron-LM gets no files
    bad = write(tmp_path, "framework: megatron\npipeline_schedule: interleaved\nvirtual_stages: 3", pp=4, name="bad.yaml")
    out = tmp_path / "o"
    assert main(["generate", str(bad), "-o", str(out), "--strategy", "zero1", "--target", "megatron-lm"]) == 1
    captured = capsys.readouterr()
    assert not out.exists()
    assert captured.out == ""
    # the sweep drops the layouts Megatron-LM refuses (targets.target_refusal, s33), so the strategy is not generated
    assert captured.err.startswith("dstoolkit generate: no configuration written for s29:\n  zero1: megatron-lm: "
                                   "virtual_stages=3 needs every pipeline stage's layer count divisible by 3")
    assert main(["generate", str(bad), "-o", str(out), "--strategy", "zero1", "--target", "megatron-lm",
                 "--format", "json"]) == 1
    assert not out.exists() and capsys.readouterr().out == ""
    # an earlier output is left as it was, even with --force
    assert main(["generate", str(write(tmp_path)), "-o", str(out), "--strategy", "zero1",
                 "--target", "megatron-lm"]) == 0
    before = tree(out)
    capsys.readouterr()
    assert main(["generate", str(bad), "-o", str(out), "--strategy", "zero1", "--target", "megatron-lm",
                 "--force"]) == 1
    assert tree(out) == before
    assert "zero1: megatron-lm: virtual_stages=3 needs" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------
# 3. LY023 where DeepSpeed runs Ulysses, not on Megatron-LM
# ---------------------------------------------------------------------------------------------------------

ULYSSES_SP = "ulysses: 2\nsequence_parallel: true"


def test_ly023_reads_the_engine_that_runs_ulysses():
    facts = dict(sp=2, cp=1, megatron_sp=True)
    assert [v.code for v in check_layout(LayoutFacts(**facts, framework="deepspeed"), ("LY023",))] == ["LY023"]
    assert [v.code for v in check_layout(LayoutFacts(**facts), ("LY023",))] == ["LY023"]  # unknown: refused
    assert check_layout(LayoutFacts(**facts, framework="megatron"), ("LY023",)) == []


def test_ulysses_with_sequence_parallel_loads_for_megatron_lm_only(tmp_path):
    assert load_spec(write(tmp_path, ULYSSES_SP + "\nframework: megatron", seq=32768)).training.ulysses == 2
    spec = load_spec(_with_targets(tmp_path, ULYSSES_SP, ["megatron-lm"]))
    assert spec.targets == ["megatron-lm"]
    with pytest.raises(SpecError, match=r"training\.ulysses=2 with training\.sequence_parallel: DeepSpeed-Ulysses and "
                                        r"Megatron sequence parallelism do not combine \(training\.framework: "
                                        r"deepspeed\) \(turn sequence_parallel off, use cp in place of ulysses, or run "
                                        r"it on Megatron-LM alone \(targets: \[megatron-lm\], or framework: megatron\)"):
        load_spec(write(tmp_path, ULYSSES_SP, seq=32768))
    with pytest.raises(SpecError, match=r"do not combine \(target megatron-deepspeed's engine: deepspeed\)"):
        load_spec(_with_targets(tmp_path, ULYSSES_SP, ["megatron-lm", "megatron-deepspeed"]))


def _with_targets(tmp_path, extra, targets):
    p = write(tmp_path, extra, seq=32768, name="targets.yaml")
    p.write_text(p.read_text() + f"targets: [{', '.join(targets)}]\n")
    return p


def test_generate_writes_ulysses_with_sequence_parallel_for_megatron_lm(tmp_path, capsys):
    p = _with_targets(tmp_path, ULYSSES_SP, ["megatron-lm"])
    assert main(["generate", str(p), "-o", str(tmp_path / "lm"), "--strategy", "zero1"]) == 0
    args = (tmp_path / "lm" / "zero1" / "megatron_lm_args.txt").read_text().split()
    assert "--sequence-parallel" in args
    assert args[args.index("--context-parallel-size") + 1] == "2" and args[args.index("--cp-comm-type") + 1] == "a2a"
    capsys.readouterr()
    # Megatron-DeepSpeed refuses the pair (megatron/initialize.py): --target replaces the spec's targets at spec load
    # (load_spec(targets=)), so it is refused there, at the spec's line, and nothing is written
    assert main(["generate", str(p), "-o", str(tmp_path / "mds"), "--strategy", "zero1",
                 "--target", "megatron-deepspeed"]) == 2
    assert not (tmp_path / "mds").exists()
    assert ("training.sequence_parallel: training.ulysses=2 with training.sequence_parallel: DeepSpeed-Ulysses and "
            "Megatron sequence parallelism do not combine (target megatron-deepspeed's engine: deepspeed) (turn "
            "sequence_parallel off, use cp in place of ulysses, or run it on Megatron-LM alone (--target megatron-lm "
            "alone)") in capsys.readouterr().err

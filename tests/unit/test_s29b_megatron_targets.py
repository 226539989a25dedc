"""Megatron-LM output as Megatron-LM takes it, and the rules that read the engine asked under the engine of each target.

Before (47c4b37):
1. `seq_len: 4098, ulysses: 2, targets: [megatron-lm]` loaded and wrote `--seq-length 4098 --context-parallel-size 2
   --cp-comm-type a2a`, which Megatron-LM refuses ('seq-length should be a multiple of 2 * context-parallel-size',
   megatron/training/arguments.py at d98e8a64, for every cp > 1 whatever --cp-comm-type): LY019 asked seq % ulysses only.
2. LY022 (pipeline schedule) and LY024 (context parallelism) read training.framework at spec load, so
   `targets: [megatron-lm]` with `cp: 2` or the interleaved schedule was refused unless it also said `framework:
   megatron`, although Megatron-Core runs both (LY023 already followed the targets' engines).
3. The Megatron-Core estimate credited `recompute_modules` (layernorm, moe_act, ...), but megatron_lm_args.txt wrote
   `--recompute-granularity selective` alone: Megatron-Core's default list ["core_attn"], a different recompute.
4. `generate -o some_file.json/sub` printed "cannot write some_file.json/sub: File exists" (writer.py's mkdir).
5. `sweep` with targets of both engines ranked one table under training.framework (DeepSpeed's engine by default), the
   megatron-lm layouts among them, saying nothing of the engine; `--tokens` plans were training.framework's too.
"""
from __future__ import annotations

import json
import textwrap

import pytest

from dstoolkit.cli import main
from dstoolkit.generate.io import load_spec_and_shape
from dstoolkit.layout import CONSTRAINTS, LayoutFacts, check_layout
from dstoolkit.spec import SpecError, load_spec

SPEC = """\
name: s29b
model: {{preset: {preset}}}
cluster: {{nodes: {nodes}, gpus_per_node: 8, gpu: H100-SXM}}
training:
  seq_len: {seq}
  global_batch: 64
  micro_batch: 1
  zero_stage: 1
{extra}
"""


def write(tmp_path, extra="", *, seq=4096, preset="llama-3-8b", nodes=1, targets=None, name="spec.yaml"):
    p = tmp_path / name
    text = SPEC.format(seq=seq, preset=preset, nodes=nodes, extra=textwrap.indent(textwrap.dedent(extra), "  "))
    if targets is not None:
        text += f"targets: [{', '.join(targets)}]\n"
    p.write_text(text)
    return p


def args_of(folder):
    """megatron_lm_args.txt as a list of words."""
    return (folder / "megatron_lm_args.txt").read_text().split()


def after(words, flag, n=1):
    i = words.index(flag)
    return words[i + 1:i + 1 + n]


# ---------------------------------------------------------------------------------------------------------
# 1. LY019: Megatron-LM's a2a context parallelism needs seq % (2 x ulysses)
# ---------------------------------------------------------------------------------------------------------

ULYSSES = "tp: 2\nulysses: 2\nactivation_checkpointing: full"


def test_ly019_asks_what_the_engine_running_ulysses_requires():
    facts = dict(seq_len=4098, sp=2, cp=1)
    assert [v.code for v in check_layout(LayoutFacts(**facts, framework="megatron"), ("LY019",))] == ["LY019"]
    assert check_layout(LayoutFacts(**facts, framework="deepspeed"), ("LY019",)) == []  # DeepSpeed-Ulysses: 2049 each
    assert check_layout(LayoutFacts(**facts), ("LY019",)) == []  # engine unknown: what every engine requires
    assert check_layout(LayoutFacts(seq_len=4100, sp=2, cp=1, framework="megatron"), ("LY019",)) == []


def test_spec_refuses_a_seq_len_megatron_lm_refuses_for_megatron_lm_only(tmp_path):
    with pytest.raises(SpecError) as exc:
        load_spec(write(tmp_path, ULYSSES, seq=4098, targets=["megatron-lm"]))
    assert str(exc.value).endswith(
        "training.seq_len: training.seq_len=4098 does not split into 2 x training.ulysses = 4 equal chunks: "
        "Megatron-Core runs Ulysses as all-to-all context parallelism (--context-parallel-size 2 --cp-comm-type a2a), "
        "and Megatron-LM asserts 'seq-length should be a multiple of 2 * context-parallel-size' for it as for any "
        "context parallelism (target megatron-lm's engine: megatron) (use a seq_len divisible by 4, or leave "
        "megatron-lm out of targets: DeepSpeed-Ulysses (Megatron-DeepSpeed) needs only a multiple of 2)")
    assert load_spec(write(tmp_path, ULYSSES, seq=4098, targets=["megatron-deepspeed"])).training.seq_len == 4098
    # the targets decide the engine, not the framework: megatron-deepspeed runs DeepSpeed-Ulysses
    load_spec(write(tmp_path, ULYSSES + "\nframework: megatron", seq=4098, targets=["megatron-deepspeed"]))
    with pytest.raises(SpecError, match=r"\(training\.framework: megatron\) \(use a seq_len divisible by 4, or "
                                        r"framework: deepspeed: DeepSpeed-Ulysses"):
        load_spec(write(tmp_path, ULYSSES + "\nframework: megatron", seq=4098))
    load_spec(write(tmp_path, ULYSSES, seq=4100, targets=["megatron-lm"]))


def test_generate_for_megatron_lm_writes_nothing_megatron_lm_refuses(tmp_path, capsys):
    p = write(tmp_path, ULYSSES, seq=4098)  # no targets: framework deepspeed loads it
    # --target megatron-lm is the run's target at spec load (load_spec(targets=)): refused there, naming the flag
    assert main(["generate", str(p), "-o", str(tmp_path / "lm"), "--strategy", "zero1",
                 "--target", "megatron-lm"]) == 2
    assert not (tmp_path / "lm").exists()
    assert ("training.seq_len: training.seq_len=4098 does not split into 2 x training.ulysses = 4 equal chunks") in (
        err := capsys.readouterr().err) and "or drop --target megatron-lm: DeepSpeed-Ulysses" in err
    assert main(["generate", str(p), "-o", str(tmp_path / "mds"), "--strategy", "zero1",
                 "--target", "megatron-deepspeed"]) == 0
    words = (tmp_path / "mds" / "zero1" / "megatron_deepspeed_args.txt").read_text().split()
    assert after(words, "--ds-sequence-parallel-size") == ["2"] and after(words, "--seq-length") == ["4098"]


# ---------------------------------------------------------------------------------------------------------
# 2. LY022 / LY024 follow the targets' engines, through the one mechanism LY023 uses
# ---------------------------------------------------------------------------------------------------------

INTERLEAVED = "tp: 2\npp: 4\npipeline_schedule: interleaved\nvirtual_stages: 2"


def test_every_rule_that_reads_the_engine_is_asked_per_target():
    from dstoolkit.spec.target_engines import ENGINE_RULE_TARGETS, rule_engines

    reading = sorted(code for code, c in CONSTRAINTS.items() if "framework" in c.fields)
    assert sorted(ENGINE_RULE_TARGETS) == reading == ["LY006", "LY019", "LY022", "LY023", "LY024"]
    assert rule_engines("LY024", ["megatron-deepspeed", "megatron-lm"], "deepspeed") == {"megatron-lm": "megatron"}
    assert rule_engines("LY022", ["hf", "megatron-deepspeed", "megatron-lm"], "megatron") == {
        "megatron-deepspeed": "deepspeed", "megatron-lm": "megatron"}
    assert rule_engines("LY022", [], "fsdp") == {"training.framework": "fsdp"}


def test_megatron_lm_alone_takes_cp_without_framework_megatron(tmp_path, capsys):
    p = write(tmp_path, "tp: 2\ncp: 2\nactivation_checkpointing: full", targets=["megatron-lm"])
    assert load_spec(p).training.framework == "deepspeed"
    assert main(["generate", str(p), "-o", str(tmp_path / "o"), "--strategy", "zero1"]) == 0
    assert after(args_of(tmp_path / "o" / "zero1"), "--context-parallel-size") == ["2"]
    with pytest.raises(SpecError, match=r"training\.cp=2 with training\.framework='deepspeed': DeepSpeed has no context "
                                        r"parallelism \(ring attention\) \(use ulysses: 2 \(DeepSpeed-Ulysses\), or "
                                        r"framework: megatron / fsdp\)"):
        load_spec(write(tmp_path, "tp: 2\ncp: 2", name="no_targets.yaml"))


def test_megatron_lm_alone_takes_the_interleaved_schedule_without_framework_megatron(tmp_path):
    p = write(tmp_path, INTERLEAVED, targets=["megatron-lm"])
    assert main(["generate", str(p), "-o", str(tmp_path / "o"), "--strategy", "zero1"]) == 0
    assert after(args_of(tmp_path / "o" / "zero1"), "--num-virtual-stages-per-pipeline-rank") == ["2"]


def test_a_target_under_deepspeeds_pipeline_engine_is_named_in_the_refusal(tmp_path):
    with pytest.raises(SpecError) as exc:
        load_spec(write(tmp_path, INTERLEAVED + "\nframework: megatron", targets=["megatron-lm", "megatron-deepspeed"]))
    assert str(exc.value).endswith(
        "training.pipeline_schedule: training.pipeline_schedule='interleaved' with target megatron-deepspeed's "
        "engine='deepspeed' and training.pp=4: DeepSpeed's pipeline engine runs 1F1B only (set pipeline_schedule: "
        "1f1b, or leave megatron-deepspeed out of targets)")


# ---------------------------------------------------------------------------------------------------------
# 3. recompute_modules reach Megatron-LM as the estimate counts them
# ---------------------------------------------------------------------------------------------------------

def _lm_words(tmp_path, extra, preset="llama-3-8b", nodes=1, strategy="zero1"):
    p = write(tmp_path, "framework: megatron\n" + extra, preset=preset, nodes=nodes, targets=["megatron-lm"])
    assert main(["generate", str(p), "-o", str(tmp_path / "o"), "--strategy", strategy]) == 0
    return args_of(tmp_path / "o" / strategy)


def test_selective_recompute_writes_core_attn_and_the_named_modules(tmp_path, capsys):
    words = _lm_words(tmp_path, "tp: 2\nep: 8\nsequence_parallel: true\nactivation_checkpointing: selective\n"
                                "recompute_modules: [layernorm, moe_act]", preset="mixtral-8x7b", nodes=2,
                      strategy="zero1-ep")
    i = words.index("--recompute-granularity")
    assert words[i:i + 6] == ["--recompute-granularity", "selective", "--recompute-modules", "core_attn",
                              "layernorm", "moe_act"]
    assert words[i + 6].startswith("--") and words.count("--recompute-granularity") == 1


def _transformer_config():
    pytest.importorskip("torch")
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig


def test_no_recompute_policy_writes_the_named_modules_alone(tmp_path):
    words = _lm_words(tmp_path, "tp: 2\nactivation_checkpointing: none\nrecompute_modules: [layernorm, mlp]")
    i = words.index("--recompute-granularity")
    assert words[i:i + 5] == ["--recompute-granularity", "selective", "--recompute-modules", "layernorm", "mlp"]
    assert words[i + 5].startswith("--")
    # Megatron-Core (the venv's megatron-core; the real Megatron-LM parser at d98e8a64: benchmarks/megatron_parsers.py)
    # builds its TransformerConfig from them, the list in place of its default ["core_attn"]
    cfg = _transformer_config()(num_layers=2, hidden_size=64, num_attention_heads=4, recompute_granularity=words[i + 1],
                                recompute_modules=words[i + 3:i + 5])
    assert cfg.recompute_modules == ["layernorm", "mlp"]


def test_megatron_lm_refuses_modules_megatron_core_refuses_naming_the_field(tmp_path):
    from dstoolkit.generate.candidates import Candidate
    from dstoolkit.generate.megatron_common import UnsupportedTarget
    from dstoolkit.generate.megatron_lm import megatron_lm_args
    from dstoolkit.spec.checkpoint import CheckpointPolicy

    cand = Candidate(zero_stage=1, tp=2, pp=1, micro_batch=1, checkpoint=CheckpointPolicy(kind="selective"))
    spec, shape = load_spec_and_shape(write(tmp_path, "framework: megatron\ntp: 2\nactivation_checkpointing: selective\n"
                                                      "recompute_modules: [moe_act, mla_up_proj]"))
    with pytest.raises(ValueError, match="moe_act in recompute_modules is only supported with moe_grouped_gemm"):
        _transformer_config()(num_layers=2, hidden_size=64, num_attention_heads=4, recompute_granularity="selective",
                              recompute_modules=["moe_act"])  # what Megatron-LM would raise at start
    with pytest.raises(UnsupportedTarget) as exc:
        megatron_lm_args(spec, shape, cand)
    assert str(exc.value) == (
        "megatron-lm: training.recompute_modules=['moe_act', 'mla_up_proj']: moe_act needs routed experts, and "
        f"{shape.name} has none (Megatron-Core takes it only with --moe-grouped-gemm, written for MoE models); "
        f"mla_up_proj needs multi-latent attention, and {shape.name} has none; remove them from "
        "training.recompute_modules")
    spec, shape = load_spec_and_shape(write(tmp_path, "framework: megatron\ntp: 2\nprecision: fp8\n"
                                                      "activation_checkpointing: selective\nrecompute_modules: [layernorm]",
                                            name="fp8.yaml"))
    with pytest.raises(UnsupportedTarget, match=r"layernorm with the FP8 delayed-scaling recipe \(Megatron-Core: "
                                                r"'Delayed scaling does not support moe_act and layernorm recompute"):
        megatron_lm_args(spec, shape, cand)


def test_recompute_modules_follow_the_targets_engine_too(tmp_path):
    """Megatron-Core's switch needs a target that runs Megatron-Core, not framework: megatron (the same false refusal
    as LY022 / LY024's, in ClusterModelFields before)."""
    mods = "tp: 2\nactivation_checkpointing: none\nrecompute_modules: [layernorm]"
    assert load_spec(write(tmp_path, mods, targets=["megatron-lm"])).training.recompute_modules == ["layernorm"]
    with pytest.raises(SpecError) as exc:
        load_spec(write(tmp_path, mods + "\nframework: megatron", targets=["deepspeed", "megatron-deepspeed"]))
    assert str(exc.value).endswith(
        "training.recompute_modules: recompute_modules=['layernorm'] is Megatron's --recompute-modules, and no target "
        "runs Megatron-Core (targets: deepspeed, megatron-deepspeed) (add megatron-lm to targets, or remove "
        "recompute_modules)")
    with pytest.raises(SpecError, match=r"is Megatron's --recompute-modules \(framework='deepspeed'\) \(set framework: "
                                        r"megatron \(or targets: \[megatron-lm\]\), or use activation_checkpointing\)"):
        load_spec(write(tmp_path, mods))


@pytest.mark.parametrize("policy", ["every-k", "ratio"])
def test_spec_refuses_named_modules_beside_block_recompute(tmp_path, policy):
    with pytest.raises(SpecError, match=rf"training\.recompute_modules: recompute_modules=\['layernorm'\] with "
                                        rf"activation_checkpointing='{policy}': Megatron-Core recomputes named modules "
                                        r"only under --recompute-granularity selective"):
        load_spec(write(tmp_path, f"framework: megatron\nactivation_checkpointing: {policy}\n"
                                  "recompute_modules: [layernorm]"))


# ---------------------------------------------------------------------------------------------------------
# 4. -o under a file
# ---------------------------------------------------------------------------------------------------------

def test_generate_refuses_an_output_under_a_file_before_any_work(tmp_path, capsys):
    blocker = tmp_path / "some_file.json"
    blocker.write_text("{}\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    # the spec does not even exist: the output path is checked first
    assert main(["generate", str(tmp_path / "missing.yaml"), "-o", str(blocker / "sub")]) == 2
    assert capsys.readouterr().err == (f"dstoolkit generate: error: -o {blocker}/sub: {blocker} is a file, not a "
                                       "folder, so nothing can be written under it; give a path in a folder\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == before and blocker.read_text() == "{}\n"
    (tmp_path / "specs").mkdir()
    spec = write(tmp_path / "specs")
    for out in (blocker / "sub", blocker / "sub" / "deeper"):
        # before: "dstoolkit generate: error: cannot write .../some_file.json/sub: File exists", after the whole run
        assert main(["generate", str(spec), "-o", str(out), "--strategy", "zero1"]) == 2
        assert capsys.readouterr().err == (f"dstoolkit generate: error: -o {out}: {blocker} is a file, not a folder, "
                                           "so nothing can be written under it; give a path in a folder\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == before + ["specs"] and blocker.read_text() == "{}\n"


# ---------------------------------------------------------------------------------------------------------
# 5. sweep: one ranking per engine group
# ---------------------------------------------------------------------------------------------------------

def test_sweep_ranks_each_engine_group_under_its_own_engine(tmp_path, capsys):
    from dstoolkit.generate.sweep import run_sweep

    p = write(tmp_path, "tp: 2\nactivation_checkpointing: full", targets=["deepspeed", "megatron-lm"])
    spec, shape = load_spec_and_shape(p)
    want = {t: run_sweep(spec, shape, top=1, targets=(t,)).winner.estimate.step_time_s
            for t in ("deepspeed", "megatron-lm")}
    assert want["deepspeed"] != want["megatron-lm"]  # the engines differ here, so the test tells them apart
    assert main(["sweep", str(p), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(g["targets"], g["engine"], g["ranked"][0]["step_time_s"]) for g in doc["groups"]] == [
        (["deepspeed"], "deepspeed", want["deepspeed"]), (["megatron-lm"], "megatron", want["megatron-lm"])]
    assert "ranked" not in doc  # no combined ranking of mixed engines
    assert main(["sweep", str(p)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == ("s29b: llama-3-8b on 1 x 8 H100-SXM; targets deepspeed, megatron-lm: one ranking "
                                   "per engine group, each estimated under the engine its files run")
    ds, lm = out.index("== deepspeed: estimated under DeepSpeed's engine; 1 candidates"), \
        out.index("== megatron-lm: estimated under Megatron-Core; 1 candidates")
    assert ds < out.index(f"{want['deepspeed']:.4g} s") < lm < out.index(f"{want['megatron-lm']:.4g} s")


def test_sweep_for_one_target_says_its_engine_and_plans_under_it(tmp_path, capsys):
    p = write(tmp_path, "tp: 2\nactivation_checkpointing: full", targets=["megatron-lm"])
    assert main(["sweep", str(p), "--format", "json", "--tokens", "1e9"]) == 0
    doc = json.loads(capsys.readouterr().out)
    row = doc["ranked"][0]
    assert doc["engine"] == "megatron" and [g["engine"] for g in doc["groups"]] == ["megatron"]
    assert row["training_plan"]["steady_step_time_s"] == row["step_time_s"]  # before: DeepSpeed's engine's step
    assert main(["sweep", str(p)]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("; estimated under Megatron-Core, the engine of megatron-lm")

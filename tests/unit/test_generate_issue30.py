"""Issue 30: generated files a user launches as they are (everything but the Megatron parts).

One test (or a few) per finding of the issue; each failed on 4734e68 (the message says what it saw there).
Cheap: small specs, the bundled ones, no processes started (the 2-host runs are tests/dist/test_multinode_targets.py).
"""
from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.io import load_spec_and_shape

REPO = Path(__file__).resolve().parents[2]
DS_CONFIGS = REPO / "ds_configs"
GiB = 2**30


def _write_spec(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


# ---------------------------------------------------------------------------------------------------------
# finding 7: parameter offload costed in the step time (4734e68: the same 79.83 s with it on or off)
# ---------------------------------------------------------------------------------------------------------

def test_parameter_offload_costs_pcie_time_on_gpus():
    from dstoolkit.estimate.step_time import PARAM_OFFLOAD_FETCHES_PER_MICRO, PCIE_BYTES_PER_S
    from dstoolkit.generate.planner import estimate_candidate

    spec, shape = load_spec_and_shape(DS_CONFIGS / "llama3_8b_1x8_h100.yaml")
    opt = estimate_candidate(spec, shape, Candidate(zero_stage=3, offload_optimizer=True, micro_batch=1))
    both = estimate_candidate(spec, shape, Candidate(zero_stage=3, offload_optimizer=True, offload_param=True,
                                                     micro_batch=1))
    # the difference is the partition's bf16 bytes fetched twice per micro step over PCIe
    gas = Candidate(zero_stage=3, micro_batch=1).grad_accum(spec.cluster.world_size, spec.training.global_batch)
    from dstoolkit.models import count_params

    partition = count_params(shape).total / spec.cluster.world_size
    expected = partition * 2 * PARAM_OFFLOAD_FETCHES_PER_MICRO * gas / PCIE_BYTES_PER_S
    assert both.step_time_s - opt.step_time_s == pytest.approx(expected, rel=0.02)
    assert both.step_time_s > opt.step_time_s * 1.05


def _gen(spec_path: Path, targets, strategies=None):
    from dstoolkit.generate.core import generate

    spec, shape = load_spec_and_shape(spec_path)
    return spec, shape, generate(spec, shape, strategies=strategies, targets=targets)


def _write(result, out: Path) -> Path:
    from dstoolkit.generate.core import write_generated

    write_generated(result, out)
    return out


TWO_NODE_HF = """\
    name: two_node_hf
    model: {hf_config: config.json}
    cluster: {nodes: 2, gpus_per_node: 8, gpu: H100-SXM}
    training: {seq_len: 1024, global_batch: 64, micro_batch: 1, precision: bf16, lr: 0.001, warmup_steps: 10,
               train_steps: 200, activation_checkpointing: none, tp: 1, pp: 1, zero_stage: 2, offload: false}
    """
LLAMA = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8,
         "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 1024, "max_position_embeddings": 2048}


@pytest.fixture()
def two_node_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    spec_path = _write_spec(tmp_path, TWO_NODE_HF)
    _, _, res = _gen(spec_path, ("deepspeed", "hf", "accelerate"), ["zero2"])
    return _write(res, tmp_path / "out") / "zero2"


def _dry(script: Path, env: dict, *args, cwd=None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("NODE_RANK", "MASTER_ADDR", "MASTER_PORT")}
    e.update(env, DRY_RUN="1")
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env=e, timeout=30,
                          cwd=cwd or "/")


# ---------------------------------------------------------------------------------------------------------
# finding 1: accelerate across nodes trains each node alone (4734e68: num_machines 4, no multinode launcher)
# ---------------------------------------------------------------------------------------------------------

def test_accelerate_multinode_yaml_and_script_form_one_job(two_node_folder):
    import shlex

    import yaml

    cfg = yaml.safe_load((two_node_folder / "accelerate_config.yaml").read_text())
    assert cfg["num_machines"] == 2 and cfg["num_processes"] == 16
    assert cfg["deepspeed_config"]["deepspeed_multinode_launcher"] == "standard"  # torchrun on every node
    r = _dry(two_node_folder / "launch_accelerate.sh", {"NODE_RANK": "1", "MASTER_ADDR": "10.9.0.1",
                                                       "MASTER_PORT": "29611"}, "train.py")
    assert r.returncode == 0, r.stderr
    argv = shlex.split(r.stdout.strip())
    opt = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    assert (opt["--machine_rank"], opt["--main_process_ip"], opt["--main_process_port"]) == ("1", "10.9.0.1", "29611")
    # a hand-made multi-node config without the launcher is what validate refuses (DS121)
    from dstoolkit.validate.folder import check_accelerate_yaml

    bad = dict(cfg, deepspeed_config={k: v for k, v in cfg["deepspeed_config"].items()
                                      if k != "deepspeed_multinode_launcher"})
    codes = [f.code for f in check_accelerate_yaml(yaml.safe_dump(bad), "a.yaml", None, str(two_node_folder))]
    assert codes == ["DS121"]


# ---------------------------------------------------------------------------------------------------------
# finding 4: launch scripts that do not run as described (4734e68: your_train.py hard-coded, relative config,
# "NODE_RANK: unbound variable", the hint names zero0 and launch_hf.sh for accelerate)
# ---------------------------------------------------------------------------------------------------------

def test_hf_launch_script_passes_the_users_script_and_arguments_with_absolute_configs(two_node_folder, tmp_path):
    import shlex

    r = _dry(two_node_folder / "launch_hf.sh", {"NODE_RANK": "0", "MASTER_ADDR": "10.9.0.1"}, "train.py",
             "--my-flag", "x y", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    argv = shlex.split(r.stdout.strip())
    assert argv[argv.index("--nproc_per_node") + 2] == "train.py"
    assert argv[-2:] == ["--my-flag", "x y"]  # after the generated flags: the user's repeat wins
    assert argv[argv.index("--deepspeed") + 1] == str((two_node_folder / "ds_config_hf.json").resolve())
    assert (argv[argv.index("--nnodes") + 1], argv[argv.index("--node_rank") + 1],
            argv[argv.index("--master_addr") + 1]) == ("2", "0", "10.9.0.1")
    acc = shlex.split(_dry(two_node_folder / "launch_accelerate.sh", {"NODE_RANK": "0", "MASTER_ADDR": "h0"},
                           "train.py", "--my-flag").stdout.strip())
    assert acc[acc.index("--config_file") + 1] == str((two_node_folder / "accelerate_config.yaml").resolve())
    assert acc[-1] == "--my-flag" and "train.py" in acc


@pytest.mark.parametrize("script", ["launch_hf.sh", "launch_accelerate.sh"])
@pytest.mark.parametrize("missing", ["NODE_RANK", "MASTER_ADDR"])
def test_multinode_launch_without_rank_or_address_is_one_line_naming_it(two_node_folder, script, missing):
    env = {"NODE_RANK": "0", "MASTER_ADDR": "h0"}
    env.pop(missing)
    r = _dry(two_node_folder / script, env, "train.py")
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{missing} is not set" in lines[0] and "unbound" not in lines[0], r.stderr
    none = _dry(two_node_folder / script, env)  # no script given: usage, not a traceback of bash
    assert none.returncode == 2 and "usage: bash" in none.stderr


def test_run_hints_name_the_fastest_strategy_and_each_targets_own_script(tmp_path, capsys):
    from dstoolkit.cli import main

    out = tmp_path / "g"
    rc = main(["generate", str(DS_CONFIGS / "tiny_moe_cpu.yaml"), "--out", str(out), "--target", "deepspeed",
               "--target", "hf", "--target", "accelerate"])
    assert rc == 0
    text = capsys.readouterr().out
    hints = {ln.split()[1].rstrip(","): ln for ln in text.splitlines() if ln.startswith("run ")}
    from dstoolkit.generate.core import generate

    spec, shape = load_spec_and_shape(DS_CONFIGS / "tiny_moe_cpu.yaml")
    res = generate(spec, shape, targets=("deepspeed", "hf", "accelerate"))
    for target, script in (("deepspeed", "launch.sh"), ("hf", "launch_hf.sh"), ("accelerate", "launch_accelerate.sh")):
        have = [o for o in res.generated if script in o.files]
        best = min(have, key=lambda o: o.per_target[target].estimate.step_time_s)
        assert f"{out}/{best.name}/{script}" in hints[target], hints
    assert hints["deepspeed"] != hints["hf"] and "launch_hf.sh" not in hints["accelerate"]


# ---------------------------------------------------------------------------------------------------------
# finding 2: the ranking answers for the wrong launcher (4734e68: no --target; HF MoE ranked pp2 ep4, ZeRO-3 dropped)
# ---------------------------------------------------------------------------------------------------------

QWEN_MOE = {"model_type": "qwen3_moe", "hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
            "num_key_value_heads": 4, "head_dim": 64, "intermediate_size": 1024, "moe_intermediate_size": 256,
            "num_experts": 16, "num_experts_per_tok": 2, "vocab_size": 4096, "max_position_embeddings": 4096}
MOE_SPEC = """\
    name: hf_moe
    model: {hf_config: config.json}
    cluster: {nodes: 1, gpus_per_node: 8, gpu: H100-SXM}
    training: {seq_len: 2048, global_batch: 64, precision: bf16, micro_batch: auto, tp: auto, pp: auto, ep: auto,
               zero_stage: auto, activation_checkpointing: none, offload: false}
    """


@pytest.fixture()
def moe_spec(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN_MOE))
    return _write_spec(tmp_path, MOE_SPEC)


def test_sweep_target_hf_keeps_only_layouts_hf_runs(moe_spec, capsys):
    from dstoolkit.cli import main
    from dstoolkit.generate.sweep import run_sweep

    spec, shape = load_spec_and_shape(moe_spec)
    res = run_sweep(spec, shape, top=50, targets=("hf",))
    assert res.ranked and all(r.candidate.pp == 1 and r.candidate.ep == 1 for r in res.ranked)
    assert any(r.candidate.zero_stage == 3 for r in res.ranked)  # ZeRO-3 open to HF MoE (plain modules)
    assert "moe-zero3" not in res.dropped_by_code
    ds = run_sweep(spec, shape, top=1, targets=("deepspeed",))
    assert ds.dropped_by_code.get("moe-zero3")  # DeepSpeed's native MoE: refused at stage 3
    assert main(["sweep", str(moe_spec), "--target", "hf", "--target", "deepspeed", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["best_per_target"]) == {"hf", "deepspeed"}
    assert doc["best_per_target"]["hf"]["layout"]["pp"] == 1 and doc["best_per_target"]["hf"]["layout"]["ep"] == 1
    assert main(["estimate", str(moe_spec), "--target", "hf", "--format", "json"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert any("ep: auto -> 1" in a for a in est["assumptions"]) and any("pp: auto -> 1" in a for a in est["assumptions"])


def test_spec_targets_list_is_the_default_target(moe_spec, tmp_path, capsys):
    from dstoolkit.cli import main

    text = moe_spec.read_text() + "targets: [hf]\n"
    p = tmp_path / "with_targets.yaml"
    p.write_text(text)
    assert main(["sweep", str(p), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["targets"] == ["hf"] and all(r["layout"]["pp"] == 1 and r["layout"]["ep"] == 1 for r in doc["ranked"])


# ---------------------------------------------------------------------------------------------------------
# finding 3: two targets at once lose one (4734e68: --target deepspeed --target hf wrote "no hf files" everywhere)
# ---------------------------------------------------------------------------------------------------------

def test_deepspeed_and_hf_together_write_the_hf_files(moe_spec):
    _, _, both = _gen(moe_spec, ("deepspeed", "hf"))
    _, _, hf = _gen(moe_spec, ("hf",))
    hf_both = {o.name for o in both.generated if "launch_hf.sh" in o.files}
    hf_alone = {o.name for o in hf.generated if "launch_hf.sh" in o.files}
    assert hf_alone and hf_both == hf_alone
    z3 = next(o for o in both.generated if o.name == "zero3")  # hf only: native MoE is refused at stage 3
    assert "launch_hf.sh" in z3.files and "launch.sh" not in z3.files and "deepspeed" in z3.targets_skipped


# ---------------------------------------------------------------------------------------------------------
# finding 5: the tool's own output fails its own validator (4734e68: 112 errors on a folder; DS201 without --tp)
# ---------------------------------------------------------------------------------------------------------

def test_validate_checks_each_generated_file_as_what_it_is(two_node_folder, capsys):
    from dstoolkit.cli import main

    rc = main(["validate", str(two_node_folder.parent)])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "0 error(s)" in err and "not DeepSpeed configs left alone" in err and "training_args.json" in err


def test_every_bundled_generated_folder_validates_with_no_error(capsys):
    from dstoolkit.cli import main
    from dstoolkit.generate.bundled import BUNDLED_SPECS

    for stem in BUNDLED_SPECS:
        rc = main(["validate", str(DS_CONFIGS / "generated" / stem)])
        err = capsys.readouterr().err
        assert rc == 0 and " 0 error(s)" in err, (stem, err)


def test_ds201_fix_names_the_model_parallel_layout():
    from dstoolkit.validate import validate_config

    cfg = {"train_batch_size": 256, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 64}
    f = [x for x in validate_config(cfg, world_size=32) if x.code == "DS201"][0]
    assert "tp x pp = 8" in f.suggestion  # was: 'set "gradient_accumulation_steps": 8' alone
    assert not [x for x in validate_config(cfg, world_size=32, tp=8) if x.severity == "error"]


# ---------------------------------------------------------------------------------------------------------
# finding 6: picks at the edge, and a non-fit that exits 0 (4734e68: Mixtral 77.76 of 80 GiB; estimate exit 0 + MFU)
# ---------------------------------------------------------------------------------------------------------

def test_ranking_prefers_a_layout_within_the_memory_headroom():
    from dstoolkit.generate.sweep import run_sweep
    from dstoolkit.spec.cluster_fields import DEFAULT_MEMORY_HEADROOM_FRACTION

    spec, shape = load_spec_and_shape(DS_CONFIGS / "mixtral_8x7b_2x8_h100.yaml")
    res = run_sweep(spec, shape, top=1)
    w = res.winner.estimate
    assert w.within_headroom and w.memory_per_rank_bytes <= (1 - DEFAULT_MEMORY_HEADROOM_FRACTION) * w.device_memory_bytes
    assert "Passed over for the 10% memory headroom" in res.winner_reason
    spec.cluster.memory_headroom_fraction = 0.0  # no headroom asked: the edge pick comes back
    edge = run_sweep(spec, shape, top=1).winner
    assert edge.estimate.step_time_s < w.step_time_s and edge.estimate.memory_per_rank_bytes > w.memory_per_rank_bytes


def test_tp_overlap_buffers_are_counted():
    from dstoolkit.estimate.te_userbuffers import TE_TP_OVERLAP_USERBUFFERS, tp_overlap_buffer_bytes
    from dstoolkit.generate.costing import run_plan_for
    from dstoolkit.generate.planner import estimate_candidate

    spec, shape = load_spec_and_shape(DS_CONFIGS / "llama3_8b_1x8_h100.yaml")
    cand = Candidate(zero_stage=1, tp=2, micro_batch=1, sequence_parallel=True)
    spec.training.sequence_parallel = True  # Megatron runs TP comm overlap only with sequence parallelism
    spec.training.tp_comm_overlap = False
    off = estimate_candidate(spec, shape, cand)
    spec.training.tp_comm_overlap = True
    on = estimate_candidate(spec, shape, cand)
    ub = tp_overlap_buffer_bytes(run_plan_for(spec, shape, cand))  # the estimator's term for this candidate
    assert ub >= TE_TP_OVERLAP_USERBUFFERS * spec.training.seq_len * shape.hidden_size * 2
    assert on.memory_per_rank_bytes - off.memory_per_rank_bytes == ub == on.tp_overlap_buffer_bytes


def test_estimate_of_a_config_that_does_not_fit_exits_1_with_advice_and_no_mfu(tmp_path, capsys):
    from dstoolkit.cli import main

    cfg = tmp_path / "big.json"
    cfg.write_text(json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
                               "gradient_accumulation_steps": 8, "bf16": {"enabled": True},
                               "zero_optimization": {"stage": 0}}))
    rc = main(["estimate", "--config", str(cfg), "--model", "llama-3-70b", "--world-size", "8"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "fits in 80 GiB: NO" in out and "MFU: none" in out and "MFU 4" not in out
    assert "what would make it fit:" in out and "peaks at" in out.split("what would make it fit:")[1]
    rc = main(["estimate", "--config", str(cfg), "--model", "llama-3-70b", "--world-size", "8", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["mfu"] is None and doc["what_would_fit"]


# ---------------------------------------------------------------------------------------------------------
# finding 7: costs and semantics left out (host RAM never totalled; WarmupCosineLR 0.1 vs WarmupDecayLR to 0;
# save_strategy "no"; "fixed by the spec (training.pp: 1)" when the spec said auto). Offload cost: see the top.
# ---------------------------------------------------------------------------------------------------------

def test_host_memory_per_node_is_totalled_and_checked(tmp_path):
    from dstoolkit.generate.planner import estimate_candidate
    from dstoolkit.spec.cluster_fields import DEFAULT_GPU_NODE_HOST_MEMORY_BYTES

    spec, shape = load_spec_and_shape(DS_CONFIGS / "llama3_8b_1x8_h100.yaml")
    cand = Candidate(zero_stage=3, offload_optimizer=True, offload_param=True, micro_batch=1)
    e = estimate_candidate(spec, shape, cand)
    assert e.host_memory_per_node_bytes == e.host_memory_per_rank_bytes * 8 > 0
    assert e.host_memory_node_capacity_bytes == DEFAULT_GPU_NODE_HOST_MEMORY_BYTES and e.host_fits and e.fits
    spec.cluster.host_memory_per_node_gib = e.host_memory_per_node_bytes / GiB / 2  # half of what it needs
    small = estimate_candidate(spec, shape, cand)
    assert not small.host_fits and not small.fits


def _hf_filled_scheduler(ds_hf: dict, args: dict) -> dict:
    """What HF Trainer writes into the scheduler's "auto" (transformers integrations/deepspeed.py)."""
    fill = {"total_num_steps": args.get("max_steps"), "warmup_num_steps": max(1, args["warmup_steps"]),
            "warmup_min_lr": 0, "warmup_max_lr": args["learning_rate"]}
    s = ds_hf["scheduler"]
    return {"type": s["type"], "params": {k: (fill[k] if v == "auto" else v) for k, v in s["params"].items()}}


@pytest.mark.parametrize("stem", ["llama3_8b_1x8_h100", "mixtral_8x7b_2x8_h100"])
def test_lr_schedule_warmup_and_floor_equal_in_deepspeed_and_hf_files(stem):
    from dstoolkit.generate.bundled import cached_bundled

    res = cached_bundled(str(DS_CONFIGS), stem)
    checked = 0
    for o in res.generated:
        if "ds_config_hf.json" not in o.files or "ds_config.json" not in o.files:
            continue
        ds = json.loads(o.files["ds_config.json"])
        hf = json.loads(o.files["ds_config_hf.json"])
        args = json.loads(o.files["training_args.json"])
        assert _hf_filled_scheduler(hf, args) == ds["scheduler"], o.name
        assert ds["scheduler"]["params"]["warmup_type"] == "linear"
        checked += 1
    assert checked


def test_checkpoint_saving_follows_the_spec(tmp_path):
    text = TWO_NODE_HF.replace("train_steps: 200,", "train_steps: 200, save_dir: /ckpt/run1, save_interval_steps: 50,")
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    spec_path = _write_spec(tmp_path, text)
    _, _, res = _gen(spec_path, ("hf", "accelerate"), ["zero2"])
    args = json.loads(res.generated[0].files["training_args.json"])
    assert (args["output_dir"], args["save_strategy"], args["save_steps"]) == ("/ckpt/run1", "steps", 50)
    assert "--output_dir /ckpt/run1" in res.generated[0].files["launch_accelerate.sh"]


def test_summary_says_auto_when_the_spec_said_auto(moe_spec):
    _, _, res = _gen(moe_spec, ("hf",), ["zero3"])
    summary = res.generated[0].files["summary.md"]
    assert "| pipeline parallel | 1 | auto (" in summary and "fixed by the spec (training.pp" not in summary
    assert "memory headroom" in summary and "per node of" in summary


def test_target_names_are_one_list():
    from dstoolkit.cli.generate import TARGET_NAMES as GENERATE_NAMES
    from dstoolkit.cli.options import TARGET_NAMES
    from dstoolkit.generate.core import TARGETS
    from dstoolkit.generate.targets import KNOWN_TARGETS
    from dstoolkit.spec.model import Spec

    spec_names = Spec.model_fields["targets"].annotation.__args__[0].__args__
    assert tuple(TARGETS) == KNOWN_TARGETS == TARGET_NAMES == GENERATE_NAMES == tuple(spec_names)

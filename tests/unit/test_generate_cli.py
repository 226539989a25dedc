"""`dstoolkit generate`: files written, atomic writes, refusal without --force, bad input -> exit 2."""
from __future__ import annotations

import json
import os
import re

import pytest
import yaml

from dstoolkit.cli import main
from dstoolkit.generate.writer import MARKER_FILE, OutputExistsError, write_tree_atomic

FOLDER_FILES = {"ds_config.json", "launch.sh", "hostfile", "slurm.sbatch", "summary.md", "layout.json"}


def _tiny(repo_root):
    return str(repo_root / "ds_configs" / "tiny_cpu.yaml")


def test_writes_one_folder_per_strategy(tmp_path, repo_root, capsys):
    out = tmp_path / "o"
    assert main(["generate", _tiny(repo_root), "--out", str(out), "--strategy", "zero0", "--strategy", "zero3"]) == 0
    assert {p.name for p in out.iterdir()} == {"zero0", "zero3", "spec.yaml", "summary.md", MARKER_FILE}
    for s in ("zero0", "zero3"):
        assert {p.name for p in (out / s).iterdir()} == FOLDER_FILES
    assert "wrote 2 strategies" in capsys.readouterr().out
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temp folders left behind"


def test_refuses_existing_output_without_force(tmp_path, repo_root, capsys):
    out = tmp_path / "o"
    assert main(["generate", _tiny(repo_root), "--out", str(out), "--strategy", "zero1"]) == 0
    before = (out / "zero1" / "ds_config.json").read_text()
    capsys.readouterr()
    assert main(["generate", _tiny(repo_root), "--out", str(out), "--strategy", "zero2"]) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert (out / "zero1" / "ds_config.json").read_text() == before and not (out / "zero2").exists()
    assert main(["generate", _tiny(repo_root), "--out", str(out), "--strategy", "zero2", "--force"]) == 0
    assert (out / "zero2").is_dir() and not (out / "zero1").exists()


def test_force_never_replaces_a_foreign_folder(tmp_path, repo_root, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("precious")
    assert main(["generate", _tiny(repo_root), "--out", str(out), "--force"]) == 2
    assert "was not written by dstoolkit generate" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "precious"


def test_force_refuses_while_the_folder_holds_files_generate_did_not_write(tmp_path, repo_root, capsys):
    out = tmp_path / "g"
    assert main(["generate", _tiny(repo_root), "--out", str(out)]) == 0
    assert main(["generate", _tiny(repo_root), "--out", str(out), "--force"]) == 0  # untouched: replaced
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "step100.pt").write_text("ckpt")  # a checkpoint the launch script saved here
    cfg = out / "zero1" / "ds_config.json"
    cfg.write_text(cfg.read_text().replace('"train_micro_batch_size_per_gpu"', '"train_micro_batch_size_per_gpu" ', 1))
    assert main(["generate", _tiny(repo_root), "--out", str(out), "--force"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "holds 2 file(s) dstoolkit generate did not write or that were edited since: checkpoints/step100.pt, "
        "zero1/ds_config.json; --force would delete them: move them out of the folder, or choose another --out")
    assert (out / "checkpoints" / "step100.pt").read_text() == "ckpt"
    assert '"train_micro_batch_size_per_gpu" ' in cfg.read_text()  # the edit is still there


def test_a_marker_without_a_manifest_protects_files_the_new_tree_does_not_write(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / MARKER_FILE).write_text("This folder was written by `dstoolkit generate`; `--force` may replace it.\n")
    (out / "a.txt").write_text("old")
    write_tree_atomic(out, {"a.txt": "new"}, force=True)  # the same names: replaced, as before manifests
    assert (out / "a.txt").read_text() == "new" and "a.txt" in (out / MARKER_FILE).read_text()
    (out / MARKER_FILE).write_text("This folder was written by `dstoolkit generate`; `--force` may replace it.\n")
    (out / "mine.txt").write_text("precious")
    with pytest.raises(OutputExistsError, match=r"holds 1 file\(s\) .*: mine\.txt; --force would delete them"):
        write_tree_atomic(out, {"a.txt": "newer"}, force=True)
    assert (out / "mine.txt").read_text() == "precious" and (out / "a.txt").read_text() == "new"


def test_failed_write_keeps_old_folder_and_leaves_no_temp(tmp_path):
    out = tmp_path / "o"
    write_tree_atomic(out, {"a.txt": "old"})
    with pytest.raises(ValueError, match="escapes the output folder"):
        write_tree_atomic(out, {"b.txt": "new", "../evil.txt": "x"}, force=True)
    assert (out / "a.txt").read_text() == "old" and not (tmp_path / "evil.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"]
    with pytest.raises(OutputExistsError, match="already exists"):
        write_tree_atomic(out, {"b.txt": "new"})


def test_unknown_and_impossible_strategies_exit_2(tmp_path, repo_root, capsys):
    assert main(["generate", _tiny(repo_root), "--out", str(tmp_path / "a"), "--strategy", "zero9"]) == 2
    assert "unknown strategy 'zero9'" in capsys.readouterr().err
    moe = str(repo_root / "ds_configs" / "tiny_moe_cpu.yaml")
    assert main(["generate", moe, "--out", str(tmp_path / "b"), "--strategy", "zero3"]) == 2
    assert "not supported with ZeRO Stage 3" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_moe_default_skips_stage3_with_reason_in_summary(tmp_path, repo_root):
    out = tmp_path / "m"
    assert main(["generate", str(repo_root / "ds_configs" / "tiny_moe_cpu.yaml"), "--out", str(out)]) == 0
    names = {p.name for p in out.iterdir() if p.is_dir()}
    assert {"zero1-ep", "zero2-ep", "zero1", "zero2"} <= names and not {"zero3", "zero++"} & names
    summary = (out / "summary.md").read_text()
    assert "- zero3: DeepSpeed refuses its native MoE at ZeRO stage 3" in summary


def test_bad_spec_is_a_located_error(tmp_path, repo_root, capsys):
    bad = tmp_path / "bad.yaml"
    spec = yaml.safe_load((repo_root / "ds_configs" / "tiny_cpu.yaml").read_text())
    spec["training"]["zero_stagee"] = 2
    bad.write_text(yaml.safe_dump(spec, sort_keys=False))
    assert main(["generate", str(bad), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml:" in err and "zero_stagee" in err and "Traceback" not in err
    assert main(["generate", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "y")]) == 2
    assert "no such file (check the path)" in capsys.readouterr().err


def test_json_output(tmp_path, repo_root, capsys):
    out = tmp_path / "j"
    assert main(["generate", _tiny(repo_root), "--out", str(out), "--strategy", "zero2", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["generated"][0]["strategy"] == "zero2"
    assert doc["generated"][0]["memory_per_rank_bytes"] > 0 and doc["generated"][0]["step_time_s"] > 0
    assert "ds_config.json" in doc["generated"][0]["files"]


def test_nothing_fits_exits_1_without_writing(tmp_path, repo_root, capsys):
    spec = {"name": "big", "model": {"preset": "llama-3-70b"},
            "cluster": {"nodes": 1, "gpus_per_node": 2, "gpu": "A100-40G"},
            "training": {"seq_len": 4096, "global_batch": 16, "tp": 1, "pp": 1, "zero_stage": 2}}
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "o"
    assert main(["generate", str(path), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "fits nowhere" in err and "GiB per GPU" in err
    assert not out.exists() and not os.listdir(tmp_path) == []


def test_nothing_fits_names_the_strategy_closest_to_fitting(tmp_path, capsys):
    """When no strategy fits (micro batch 4: BLOOM read as built, LayerNorm and a 4h GELU MLP, fits zero3-offload at 2), the closing message is the one whose least memory-hungry layout needs the least (here
    ZeRO-3 with offload), not the first strategy tried (ZeRO-0, 25 GiB further away)."""
    spec = {"name": "b", "model": {"model_type": "bloom", "hidden_size": 2048, "n_layer": 24, "n_head": 16,
                                   "vocab_size": 250880},
            "cluster": {"nodes": 4, "gpus_per_node": 8, "gpu": "A100-40G"},
            "training": {"seq_len": 4096, "global_batch": 512, "micro_batch": 4, "precision": "bf16",
                         "activation_checkpointing": "none", "zero_stage": "auto", "offload": True, "tp": 1, "pp": 1}}
    path = tmp_path / "b.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["generate", str(path), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    closing = err[err.index("closest to fitting:"):]
    assert closing.startswith("closest to fitting: strategy zero3-offload:")
    nearest = float(re.search(r"still needs at least ([0-9.]+) GiB", closing).group(1))
    assert main(["generate", str(path), "--out", str(tmp_path / "o"), "--strategy", "zero0"]) == 1
    first = float(re.search(r"still needs at least ([0-9.]+) GiB", capsys.readouterr().err).group(1))
    assert nearest < first - 10  # 71.3 GiB against zero0's 96.0


def test_generate_demo_helper(tmp_path, repo_root):
    from dstoolkit.generate import GenerateError, generate_demo

    launch = generate_demo(repo_root / "ds_configs" / "tiny_cpu.yaml", tmp_path / "demo")
    assert launch == tmp_path / "demo" / "zero2" / "launch.sh" and launch.is_file()
    assert (tmp_path / "demo" / "zero2" / "ds_config.json").is_file()
    with pytest.raises(GenerateError, match="was not generated"):
        generate_demo(repo_root / "ds_configs" / "tiny_cpu.yaml", tmp_path / "demo2", strategy="zero2-ep")


def test_cli_strategy_list_matches_catalog_and_parser_imports_nothing_heavy():
    import subprocess
    import sys

    from dstoolkit.cli.generate import STRATEGY_NAMES
    from dstoolkit.generate.candidates import STRATEGIES

    assert STRATEGY_NAMES == tuple(STRATEGIES)
    from dstoolkit.cli.generate import TARGET_NAMES
    from dstoolkit.generate.core import TARGETS

    assert TARGET_NAMES == TARGETS
    code = ("import sys; from dstoolkit.cli import build_parser; build_parser(); "
            "print(sorted(m for m in sys.modules if m.startswith(('torch', 'deepspeed', 'dstoolkit.generate'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert out.strip() == "[]"


def test_hf_config_spec_is_copied_next_to_the_spec(tmp_path, repo_root):
    hf = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8,
          "num_key_value_heads": 4, "intermediate_size": 688, "vocab_size": 2048, "tie_word_embeddings": False,
          "max_position_embeddings": 2048}
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "config.json").write_text(json.dumps(hf))
    spec = yaml.safe_load((repo_root / "ds_configs" / "tiny_cpu.yaml").read_text())
    spec["model"] = {"hf_config": "models/config.json"}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    out = tmp_path / "o"
    assert main(["generate", str(tmp_path / "s.yaml"), "--out", str(out), "--strategy", "zero1"]) == 0
    copied = yaml.safe_load((out / "spec.yaml").read_text())
    assert copied["model"] == {"hf_config": "model_config.json"}
    assert json.loads((out / "model_config.json").read_text()) == hf
    from dstoolkit.generate.io import load_spec_and_shape

    _, shape = load_spec_and_shape(out / "spec.yaml")  # the folder is self-contained
    assert shape.hidden_size == 256


def test_targets_write_their_files_with_absolute_config_path(tmp_path, repo_root):
    from dstoolkit.cli import main
    from dstoolkit.generate.megatron import read_args_file

    out = tmp_path / "gen"
    spec = tmp_path / "tiny_gpu.yaml"  # Megatron-LM runs on GPUs only: generate gives a CPU spec no megatron-lm files
    spec.write_text((repo_root / "ds_configs" / "tiny_cpu.yaml").read_text().replace("gpu: cpu", "gpu: H100-SXM"))
    rc = main(["generate", str(spec), "--out", str(out), "--strategy", "zero2",
               "--target", "megatron-lm", "--target", "megatron-deepspeed", "--pretrain-script", "/opt/pretrain_gpt.py"])
    assert rc == 0
    folder = out / "zero2"
    names = {p.name for p in folder.iterdir()}
    assert {"megatron_lm_args.txt", "launch_megatron_lm.sh", "megatron_deepspeed_args.txt",
            "launch_megatron_deepspeed.sh", "ds_config.json", "summary.md"} <= names
    assert "launch.sh" not in names  # the deepspeed target was not asked for
    words = read_args_file((folder / "megatron_deepspeed_args.txt").read_text())
    assert words[words.index("--deepspeed_config") + 1] == str((folder / "ds_config.json").resolve())
    assert "/opt/pretrain_gpt.py" in (folder / "launch_megatron_lm.sh").read_text()
    assert "--deepspeed" not in read_args_file((folder / "megatron_lm_args.txt").read_text())


def test_unknown_target_is_a_usage_error(tmp_path, repo_root, capsys):
    from dstoolkit.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["generate", str(repo_root / "ds_configs" / "tiny_cpu.yaml"), "--out", str(tmp_path / "g"),
              "--target", "megatron"])
    assert exc.value.code == 2 and "invalid choice: 'megatron'" in capsys.readouterr().err


def test_hf_moe_spec_gets_a_zero3_strategy(tmp_path, repo_root):
    # An HF MoE model's experts are plain modules: ZeRO-3 (refused for DeepSpeed's native MoE) is generated for
    # the hf/accelerate targets, with pp and ep swept as 1 (neither the pipeline engine nor AutoEP runs there).
    from dstoolkit.generate import generate, load_spec_and_shape

    spec, shape = load_spec_and_shape(repo_root / "ds_configs" / "mixtral_8x7b_2x8_h100.yaml")
    result = generate(spec, shape, targets=("hf", "accelerate"))
    names = {o.name: o for o in result.generated}
    assert "zero3" in names and not any(n.endswith("-ep") for n in names)
    z3 = names["zero3"]
    assert z3.chosen.candidate.pp == 1 and z3.chosen.candidate.ep == 1
    assert {"ds_config_hf.json", "training_args.json", "launch_hf.sh", "accelerate_config.yaml"} <= set(z3.files)
    assert json.loads(z3.files["ds_config_hf.json"])["zero_optimization"]["stage"] == 3
    native = generate(spec, shape, strategies=None)  # deepspeed target: native MoE, no stage 3
    assert "zero3" not in {o.name for o in native.generated}

"""`dstoolkit estimate` (SPEC.yaml or --config/--model/--world-size), table and JSON."""
import json

import pytest

from dstoolkit.cli import main

CONTRACT = {"params", "memory_per_rank_bytes", "host_memory_per_rank_bytes", "flops_per_step",
            "comm_bytes_per_step", "step_time_s", "mfu"}


@pytest.mark.parametrize("spec", ["tiny_cpu.yaml", "tiny_moe_cpu.yaml", "llama3_8b_1x8_h100.yaml",
                                  "mixtral_8x7b_2x8_h100.yaml", "deepseek_v3_32x8_h800.yaml"])
def test_every_bundled_spec_estimates(repo_root, spec, capsys):
    path = repo_root / "ds_configs" / spec
    if not path.exists():
        pytest.skip(f"{spec} not bundled")
    assert main(["estimate", str(path), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert CONTRACT <= set(out)
    assert out["memory_per_rank_bytes"]["total"] > 0 and out["step_time_s"] > 0


def test_config_model_world_size_table(tmp_path, capsys):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8,
                               "bf16": {"enabled": True}, "zero_optimization": {"stage": 3},
                               "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}}))
    rc = main(["estimate", "--config", str(cfg), "--model", "llama-3-70b", "--world-size", "64",
               "--gpu", "H100-SXM", "--seq-len", "8192", "--checkpoint", "full"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "ZeRO-3" in out and "total" in out and "MFU" in out and "zero3_param_all_gather_fwd" in out


def test_hf_config_json_model(tmp_path, capsys):
    hf = tmp_path / "config.json"
    hf.write_text(json.dumps({"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 4,
                              "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 1376,
                              "vocab_size": 32000, "tie_word_embeddings": False}))
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
                               "zero_optimization": {"stage": 2}}))
    assert main(["estimate", "--config", str(cfg), "--model", str(hf), "--world-size", "2", "--gpu", "cpu",
                 "--seq-len", "128", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["parallel"]["grad_accum"] == 2  # 16 = 4 x 2 x dp 2
    assert out["params"]["total"] > 0


@pytest.mark.parametrize("extra,needle", [
    (["--tp", "3"], "tp=3 does not divide num_attention_heads=32"),
    (["--seq-len", "0"], "--seq-len=0: the sequence length must be > 0 (e.g. --seq-len 4096)"),
])
def test_bad_input_is_exit_2_with_a_message(tmp_path, capsys, extra, needle):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1}}))
    rc = main(["estimate", "--config", str(cfg), "--model", "llama-3-8b", "--world-size", "6", *extra])
    err = capsys.readouterr().err
    assert rc == 2
    assert needle in err and "Traceback" not in err


def test_missing_inputs_and_unknown_model(tmp_path, capsys):
    assert main(["estimate"]) == 2
    assert "missing: --config, --model, --world-size" in capsys.readouterr().err
    cfg = tmp_path / "ds.json"
    cfg.write_text("{\"train_micro_batch_size_per_gpu\": 1")  # truncated: validate's reader refuses it (DS001)
    assert main(["estimate", "--config", str(cfg), "--model", "tiny", "--world-size", "2"]) == 2
    assert f"{cfg}:1:" in capsys.readouterr().err
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1}))
    assert main(["estimate", "--config", str(cfg), "--model", "llama-9", "--world-size", "2"]) == 2
    assert "llama-9" in capsys.readouterr().err


def test_estimate_module_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, dstoolkit.estimate, dstoolkit.cli.estimate; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_config_is_validated_first_errors_exit_1(tmp_path, capsys):
    """--config goes through validate_config (the `dstoolkit validate` engine) before anything is estimated:
    a misspelt section used to be ignored and estimated as ZeRO-0."""
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                               "zero_optimisation": {"stage": 3, "reduce_bucket_sise": 1000}}, indent=2))
    rc = main(["estimate", "--config", str(cfg), "--model", "tiny", "--world-size", "2", "--gpu", "cpu",
               "--seq-len", "64"])
    captured = capsys.readouterr()
    assert rc == 1
    assert "zero_optimisation" in captured.err and "error[" in captured.err and f"{cfg}:" in captured.err
    assert "ZeRO-0" not in captured.out and "MFU" not in captured.out
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                               "zero_optimization": {"stage": 2, "reduce_bucket_sise": 1000}}, indent=2))
    rc = main(["estimate", "--config", str(cfg), "--model", "tiny", "--world-size", "2", "--gpu", "cpu",
               "--seq-len", "64"])
    captured = capsys.readouterr()
    assert rc == 1
    assert "reduce_bucket_sise" in captured.err and "reduce_bucket_size" in captured.err


def test_config_warnings_are_printed_beside_the_estimate(tmp_path, capsys):
    cfg = tmp_path / "ds.json"
    # deprecated key: a warning, not an error
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                               "zero_optimization": {"stage": 1, "cpu_offload": False}}, indent=2))
    args = ["estimate", "--config", str(cfg), "--model", "tiny", "--world-size", "2", "--gpu", "cpu", "--seq-len", "64"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "MFU" in out and "warning[" in out and "cpu_offload" in out
    assert main(args + ["--format", "json"]) == 0
    warns = json.loads(capsys.readouterr().out)["validation_warnings"]
    assert warns and all(w["severity"] == "warning" for w in warns)


def test_spec_autos_are_resolved_by_the_sweep(repo_root, capsys):
    """estimate SPEC.yaml takes the sweep's winner (the same ranking as `dstoolkit sweep` / `generate`)."""
    from dstoolkit.generate import load_spec_and_shape, run_sweep

    path = repo_root / "ds_configs" / "tiny_cpu.yaml"
    spec, shape = load_spec_and_shape(path)
    winner = run_sweep(spec, shape, top=1, validate=True, advise=False).winner.candidate
    assert main(["estimate", str(path), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert f"layout chosen by the sweep (dstoolkit sweep): {winner.label}" in out["assumptions"]
    assert out["parallel"]["micro_batch"] == winner.micro_batch
    assert any(a.startswith("zero_stage: auto -> ") for a in out["assumptions"])


def test_caution_where_only_the_peak_fits(repo_root, capsys):
    from dstoolkit.estimate.core import upper_bound_exceeds

    assert upper_bound_exceeds(80, 1, 80) and not upper_bound_exceeds(79, 1, 80)
    # BLOOM 181B at tp2 pp6 (the logbook reports it OOM): the peak + allowance is 75.7 GiB of 80 (the last of its
    # micro steps, with the earlier ones' gradients), the sum of parts 83.6 GiB (with the attention and hidden
    # dropout masks of the run's dropout 0.1). BLOOM's shape is read from its built modules (LayerNorm, a 4h GELU MLP
    # with biases, ALiBi: models.block_facts.block_facts); before, it was estimated as an RMSNorm SwiGLU RoPE model
    # (75.95 / 83.93 GiB)
    spec = repo_root / "benchmarks" / "specs" / "layout_sweeps" / "bloom_181b_h14336_l72_0225_tp2_pp6_dp32_mb1.yaml"
    assert main(["estimate", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "fits in 80 GiB: yes (peak + allowance = 75.66 GiB)" in out
    assert "caution: the sum of parts + allowance (83.64 GiB) is over the 80 GiB device" in out
    # the layout that ran beside it (tp2 pp12, 63 GB reported): no caution
    spec = repo_root / "benchmarks" / "specs" / "layout_sweeps" / "bloom_181b_h14336_l72_0225_tp2_pp12_dp16_mb2.yaml"
    assert main(["estimate", str(spec)]) == 0
    assert "caution:" not in capsys.readouterr().out


def test_config_path_and_spec_path_agree_on_a_model_with_dropout(tmp_path, capsys):
    """The model's attention dropout (GPT-2's attn_pdrop defaults to 0.1) is read once, from the model, on both
    ways a plan is built: the --config form used to leave its masks and dropout pass out (a GPT-2 1.5B at ZeRO-1 on
    A100-40G: 30.2 GiB, fits, against the spec form's 48.8 GiB, does not fit)."""
    hf = tmp_path / "gpt2.json"
    hf.write_text(json.dumps({"model_type": "gpt2", "n_embd": 512, "n_layer": 4, "n_head": 8, "vocab_size": 50257,
                              "n_positions": 2048}))
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: m\nmodel: {{hf_config: {hf}}}\ncluster: {{nodes: 1, gpus_per_node: 8, gpu: A100-40G}}\n"
                    "training: {seq_len: 2048, global_batch: 64, micro_batch: 2, precision: bf16, "
                    "activation_checkpointing: none, tp: 1, pp: 1, zero_stage: 1, flash_attention: false}\n")
    assert main(["generate", str(spec), "-o", str(tmp_path / "out"), "--strategy", "zero1"]) == 0
    capsys.readouterr()
    [cfg] = list((tmp_path / "out").rglob("ds_config.json"))
    assert main(["estimate", str(spec), "--format", "json"]) == 0
    by_spec = json.loads(capsys.readouterr().out)
    assert main(["estimate", "--config", str(cfg), "--model", str(hf), "--world-size", "8", "--gpu", "A100-40G",
                 "--seq-len", "2048", "--checkpoint", "none", "--no-flash-attention", "--format", "json"]) == 0
    by_config = json.loads(capsys.readouterr().out)
    assert by_config["memory_per_rank_bytes"] == by_spec["memory_per_rank_bytes"]
    assert by_config["step_time_s"] == pytest.approx(by_spec["step_time_s"], rel=1e-9)

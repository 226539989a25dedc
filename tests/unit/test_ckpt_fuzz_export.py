"""Fuzz findings on `dstoolkit ckpt export`: ZeRO-0 mixed-precision checkpoints export their fp32 master copies
(not the bf16-rounded module states), configs transformers rejects are one clear error, the TinyTransformer and
legacy-format ZeRO checkpoints are refused with their cause, and the weights file gets the config's mode.

The checkpoints are written here with torch.save in the layout DeepSpeed 0.19.8's engine saves at ZeRO-0 with bf16
(runtime/engine.py `_save_checkpoint`; the optimizer entry is runtime/fp16/unfused_optimizer.py `state_dict`:
`fp32_groups`, or fused_optimizer.py: `fp32_groups_flat`) around a tiny transformers Llama, as `dstoolkit train
--shrink` wraps it (`hf.` prefix). Real engines' exports: tests/dist/test_ckpt_resume.py.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from dstoolkit.ckpt.errors import CkptError

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

CONFIG = {"model_type": "llama", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
          "num_key_value_heads": 1, "intermediate_size": 32, "vocab_size": 64, "max_position_embeddings": 64,
          "tie_word_embeddings": False}
TAG = "step_00000002"


def _masters(config: dict) -> list[tuple[str, "torch.Tensor"]]:
    """(name, fp32 master) of every parameter of the model, in model.parameters() order, with values that bf16
    cannot hold (so an export of the rounded module states differs from them)."""
    cfg = tf.AutoConfig.for_model(**config)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg)
    names = {id(p): n for n, p in model.named_parameters()}
    out = []
    for p in model.parameters():
        m = p.detach().float().clone() + torch.randn(p.shape) * 1e-3
        out.append((names[id(p)], m))
    return out


def _zero0(root: Path, config: dict = CONFIG, *, optimizer: str = "unfused", drop: int = 0,
           low: "torch.dtype" = torch.bfloat16, perturb: bool = False) -> tuple[Path, dict]:
    """ROOT/latest + ROOT/step_00000002/mp_rank_00_model_states.pt; returns (root, {hf name: fp32 master})."""
    masters = _masters(config)
    module, shared = {}, {}
    for name, m in masters:
        module["hf." + name] = m.to(low)
    if config.get("tie_word_embeddings"):
        module["hf.lm_head.weight"] = module["hf.model.embed_tokens.weight"]  # one storage, two names
    group = [m for _, m in masters][drop:]  # drop: the first parameters frozen (not in the optimizer)
    if perturb:
        group = [m + 0.5 for m in group]
    opt = {"dynamic_loss_scale": False, "cur_scale": 1.0, "cur_iter": 2,
           "optimizer_state_dict": {"state": {}, "param_groups": [{"lr": 1e-3, "params": list(range(len(group)))}]}}
    if optimizer == "unfused":
        opt["fp32_groups"] = [group]
    elif optimizer == "fused":
        opt["fp32_groups_flat"] = [torch.cat([m.reshape(-1) for m in group])]
    tag = root / TAG
    tag.mkdir(parents=True)
    torch.save({"module": module, "buffer_names": [], "optimizer": opt if optimizer else None,
                "param_shapes": None, "global_steps": 2, "dp_world_size": 1, "mp_world_size": 1,
                "ds_config": {"zero_optimization": {"stage": 0}, "bf16": {"enabled": low == torch.bfloat16}},
                "ds_version": "0.19.8", "lr_scheduler": None}, tag / "mp_rank_00_model_states.pt")
    (root / "latest").write_text(TAG)
    (root / "config.json").write_text(json.dumps(config))
    return root, {n: m for n, m in masters}


def _exported(out: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(out / "model.safetensors"))


# ---------------------------------------------------------------------------------------------------------------
# 1. ZeRO-0 bf16: the fp32 masters, not the rounded module states


@pytest.mark.parametrize("optimizer", ["unfused", "fused"])
def test_zero0_bf16_exports_the_fp32_masters(tmp_path, optimizer, capsys):
    from dstoolkit.cli import main

    ck, masters = _zero0(tmp_path / "ck", optimizer=optimizer)
    assert any(not torch.equal(m, m.bfloat16().float()) for m in masters.values())  # rounding would show
    out = tmp_path / "hf"
    assert main(["ckpt", "export", str(ck), "--hf", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "weights from the fp32 master copies in the model states' optimizer" in printed
    assert f"{len(masters)} of {len(masters)} parameters" in printed
    got = _exported(out)
    assert set(got) == set(masters)
    for name, m in masters.items():
        assert got[name].dtype == torch.float32 and torch.equal(got[name], m), name


def test_tied_and_frozen_parameters(tmp_path):
    from dstoolkit.runtime.ckpt.export import export_hf

    cfg = dict(CONFIG, tie_word_embeddings=True)
    ck, masters = _zero0(tmp_path / "ck", cfg, drop=1)  # embed_tokens (tied to lm_head) frozen: no master
    res = export_hf(ck, tmp_path / "hf")
    n = len(masters)
    assert res.weights_from.endswith(f"{n - 1} of {n} parameters; the other 1 (frozen) from the module states")
    got = _exported(tmp_path / "hf")
    assert "lm_head.weight" not in got  # tied: saved once
    emb = masters["model.embed_tokens.weight"]
    assert torch.equal(got["model.embed_tokens.weight"], emb.bfloat16().float())  # its own (bf16) value
    for name, m in masters.items():
        if name != "model.embed_tokens.weight":
            assert torch.equal(got[name], m), name


def test_masters_that_do_not_fit_are_not_used_and_that_is_said(tmp_path):
    from dstoolkit.runtime.ckpt.export import export_hf

    ck, masters = _zero0(tmp_path / "ck", perturb=True)
    res = export_hf(ck, tmp_path / "hf")
    assert "bfloat16, rounded" in res.weights_from and "were not used" in res.weights_from
    got = _exported(tmp_path / "hf")
    assert all(torch.equal(got[n], m.bfloat16().float()) for n, m in masters.items())


def test_fp32_module_states_are_exported_as_they_are(tmp_path):
    from dstoolkit.runtime.ckpt.export import export_hf

    ck, masters = _zero0(tmp_path / "ck", optimizer="", low=torch.float32)
    res = export_hf(ck, tmp_path / "hf")
    assert res.weights_from == "the module states (float32)"
    got = _exported(tmp_path / "hf")
    assert all(torch.equal(got[n], m) for n, m in masters.items())
    # bf16 without any master: the rounded values, said so; tied weights still saved once
    ck2, masters2 = _zero0(tmp_path / "ck2", dict(CONFIG, tie_word_embeddings=True), optimizer="")
    assert "no fp32 master copy was saved" in export_hf(ck2, tmp_path / "hf2").weights_from
    got2 = _exported(tmp_path / "hf2")
    assert "lm_head.weight" not in got2 and set(got2) == set(masters2) - {"lm_head.weight"}
    assert all(torch.equal(got2[n], masters2[n].bfloat16().float()) for n in got2)


def test_weights_file_has_the_config_files_mode(tmp_path):
    from dstoolkit.runtime.ckpt.export import export_hf

    ck, _ = _zero0(tmp_path / "ck")
    old = os.umask(0o022)
    try:
        export_hf(ck, tmp_path / "hf")
    finally:
        os.umask(old)
    modes = {f: stat.S_IMODE((tmp_path / "hf" / f).stat().st_mode) for f in ("model.safetensors", "config.json")}
    assert modes == {"model.safetensors": 0o644, "config.json": 0o644}


# ---------------------------------------------------------------------------------------------------------------
# 4. configs transformers rejects: one line naming the file


@pytest.mark.parametrize("content,expect", [
    ("[1, 2]", "holds a JSON list, not a config object"),
    ('{"model_type": "llama", "hidden_size": 250, "num_attention_heads": 8}',
     "The hidden size (250) is not a multiple of the number of attention heads (8)"),
    ('{"model_type": "llama", "hidden_size": "abc"}', "Field 'hidden_size' expected int, got str"),
    ("not json", "is not valid JSON"),
    (b"\xff\xfe", "is not valid JSON"),
    ('{"hidden_size": 16}', "has no model_type string"),
    ('{"model_type": "nosuchmodel"}', "Unrecognized model identifier: nosuchmodel"),
    ('{"model_type": "t5"}', "AutoModelForCausalLM"),
])
def test_bad_config_is_one_clear_error(tmp_path, capsys, content, expect):
    from dstoolkit.cli import main

    ck, _ = _zero0(tmp_path / "ck")
    cfg = tmp_path / "bad.json"
    cfg.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert main(["ckpt", "export", str(ck), "--hf", str(tmp_path / "hf"), "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dstoolkit ckpt export: error: {cfg}: ") and err.count("\n") == 1, err
    assert expect in err and "pass --config the config.json" in err and "Traceback" not in err
    assert len(err) < 600 and not (tmp_path / "hf").exists() and not (tmp_path / "hf.partial").exists()


def test_wrong_model_points_at_the_config(tmp_path):
    from dstoolkit.runtime.ckpt.export import export_hf

    ck, _ = _zero0(tmp_path / "ck")
    other = tmp_path / "other.json"
    other.write_text(json.dumps(dict(CONFIG, hidden_size=32)))
    with pytest.raises(CkptError, match=r"has shape \(64, 16\)") as e:
        export_hf(ck, tmp_path / "hf", config=other)
    assert "is the config.json of the model that was trained" in e.value.fix


# ---------------------------------------------------------------------------------------------------------------
# 8. the TinyTransformer has no HF export: say so, with or without --config


def test_tiny_transformer_is_refused_with_its_cause(tmp_path, capsys):
    from dstoolkit.cli import main

    tag = tmp_path / "ck" / TAG
    tag.mkdir(parents=True)
    module = {"embed_tokens.weight": torch.zeros(8, 4), "blocks.0.self_attn.q_proj.weight": torch.zeros(4, 4),
              "norm.weight": torch.ones(4), "lm_head.weight": torch.zeros(8, 4)}
    torch.save({"module": module, "dp_world_size": 1, "ds_config": {"zero_optimization": {"stage": 0}}},
               tag / "mp_rank_00_model_states.pt")
    (tmp_path / "ck" / "latest").write_text(TAG)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(CONFIG))
    for extra in ([], ["--config", str(cfg)]):
        assert main(["ckpt", "export", str(tmp_path / "ck"), "--hf", str(tmp_path / "hf"), *extra]) == 2
        err = capsys.readouterr().err
        assert "holds dstoolkit's own TinyTransformer" in err and "not a transformers model" in err, err
        assert "--shrink" in err and err.count("\n") == 1


# ---------------------------------------------------------------------------------------------------------------
# 6. legacy-format ZeRO partitions: DeepSpeed's zero_to_fp32 cannot read them; say precisely why


def test_legacy_zero_checkpoint_export_says_why(tmp_path):
    from dstoolkit.runtime.ckpt.export import export_hf
    from tests.unit.test_ckpt_fuzz_inspect import _zero2

    ck = _zero2(tmp_path / "ck", legacy=True)
    with pytest.raises(CkptError, match=r"torch.load\(mmap=True\)") as e:
        export_hf(ck, tmp_path / "hf", config=tmp_path / "none.json")
    assert e.value.file.endswith("zero_pp_rank_0_mp_rank_00_optim_states.pt")
    assert "ckpt reshard" in e.value.fix and not (tmp_path / "hf").exists()


# ---------------------------------------------------------------------------------------------------------------
# 1. the same on a real DeepSpeed engine (one gloo rank, ZeRO-0, bf16): the export is the optimizer's fp32 masters

_ZERO0_ENGINE = """
import json, sys, torch, deepspeed, transformers as tf
from pathlib import Path
deepspeed.init_distributed(dist_backend="gloo")
out = Path(sys.argv[1])
cfg = tf.AutoConfig.for_model(**json.loads(sys.argv[2]))
torch.manual_seed(0)
model = tf.AutoModelForCausalLM.from_config(cfg)
names = {id(p): n for n, p in model.named_parameters()}
ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "train_batch_size": 2,
      "bf16": {"enabled": True}, "zero_optimization": {"stage": 0}, "steps_per_print": 10 ** 9,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}}}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
ids = torch.randint(0, cfg.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1))
for _ in range(2):
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
engine.save_checkpoint(str(out / "ck"), tag="global_step2")
opt = engine.optimizer  # DeepSpeed's fp16/bf16 wrapper: low-precision params and their fp32 masters, group by group
masters = {names[id(p)]: m.detach().clone() for lo, hi in zip(opt.fp16_groups, opt.fp32_groups) for p, m in zip(lo, hi)}
torch.save(masters, out / "masters.pt")
cfg.to_json_file(str(out / "ck" / "config.json"))
print(type(opt).__name__)
"""


def test_real_zero0_bf16_engine_exports_its_fp32_masters(tmp_path, capsys):
    import subprocess
    import sys

    from dstoolkit.cli import main
    from dstoolkit.runtime.train.launch import free_port

    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    proc = subprocess.run([sys.executable, "-c", _ZERO0_ENGINE, str(tmp_path), json.dumps(CONFIG)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "FP16_UnfusedOptimizer"
    masters = torch.load(tmp_path / "masters.pt", weights_only=False)
    assert any(not torch.equal(m, m.bfloat16().float()) for m in masters.values())
    assert main(["ckpt", "export", str(tmp_path / "ck"), "--hf", str(tmp_path / "hf")]) == 0
    assert "weights from the fp32 master copies" in capsys.readouterr().out
    got = _exported(tmp_path / "hf")
    assert set(got) == set(masters)
    for name, m in masters.items():
        assert torch.equal(got[name], m), name

"""Transformer Engine backend on a real GPU (skipped without CUDA; skipped without transformer_engine).

Run where a GPU is lent: `pytest -m gpu tests/gpu/test_fp8_te.py`. Nothing here ran on the CPU machine
this was written on.
"""
from __future__ import annotations

import pytest

# torch is imported inside the tests (importorskip): collecting this module must not import torch.
pytestmark = pytest.mark.gpu


def _te():
    return pytest.importorskip("transformer_engine.pytorch")


def _tiny_on_gpu(seed=0):
    torch = pytest.importorskip("torch")
    from dstoolkit.models.presets import get_preset
    from dstoolkit.runtime.model import build_model

    shape = get_preset("tiny")
    return shape, build_model(shape, seed=seed).to("cuda", torch.bfloat16)


def _batch(shape):
    from dstoolkit.runtime.synthetic import synthetic_batch

    ids, labels = synthetic_batch(shape, 4, 128, step=0, rank=0)
    return ids.cuda(), labels.cuda()


def test_te_swap_report_forward_backward_and_revert():
    torch = pytest.importorskip("torch")
    _te()
    from dstoolkit.runtime.fp8 import convert, load_state_dict, revert

    shape, model = _tiny_on_gpu()
    _, ref = _tiny_on_gpu()
    ids, labels = _batch(shape)
    ref_loss = ref(ids, labels).item()
    plain_sd = {k: v.clone() for k, v in model.state_dict().items()}
    rep = convert(model, {"recipe": "delayed", "amax_history_len": 16}, backend="te", fuse=False)
    assert len(rep.swapped) == 28 and {e.new_type for e in rep.swapped} == {"te.Linear"}
    assert {s.name for s in rep.skipped if s.type == "Linear"} == {"lm_head"}
    for _ in range(2):  # second step uses real delayed scales
        loss = model(ids, labels)
        loss.backward()
    assert abs(loss.item() - ref_loss) / ref_loss < 0.02
    assert model.blocks[0].self_attn.q_proj.weight.grad is not None
    # Plain state dict into the TE model and back (TE's _extra_state tolerated).
    load_state_dict(model, plain_sd)
    assert revert(model) == 28
    assert type(model.blocks[0].self_attn.q_proj) is torch.nn.Linear
    for k, v in plain_sd.items():
        assert torch.equal(model.state_dict()[k], v), k


def test_te_fused_layernorm_mlp_matches_unfused():
    torch = pytest.importorskip("torch")
    _te()
    from dstoolkit.runtime.fp8 import convert, revert

    shape, model = _tiny_on_gpu()
    _, ref = _tiny_on_gpu()
    rep = convert(model, {"recipe": "delayed"}, backend="te", fuse=True, wrap_forward=False)
    fused = [e for e in rep.swapped if e.new_type == "te.LayerNormMLP"]
    assert len(fused) == 4 and len(rep.swapped) == 4 + 16  # 4 fused MLPs + q/k/v/o per block
    x = torch.randn(2, 64, shape.hidden_size, device="cuda", dtype=torch.bfloat16)
    blk, rblk = model.blocks[1], ref.blocks[1]
    with torch.no_grad():  # outside FP8 autocast TE computes in bf16: checks weight layout ([gate; up], swiglu)
        got = blk.mlp(blk.post_attention_layernorm(x))
        want = rblk.mlp(rblk.post_attention_layernorm(x))
    assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 2e-2
    assert revert(model) == 20
    for k, v in ref.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k


@pytest.mark.parametrize("recipe", ["current", "block"])
def test_te_matches_emulation_numerically(recipe):
    torch = pytest.importorskip("torch")
    _te()
    from dstoolkit.runtime.fp8 import convert
    from dstoolkit.fp8.recipes import Fp8BackendUnavailable
    from dstoolkit.dsconfig.fp8 import Fp8Config

    cfg = Fp8Config(recipe=recipe, format="e4m3")
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(1024, 1024, bias=False)).cuda().bfloat16()
    te_model = torch.nn.Sequential(torch.nn.Linear(1024, 1024, bias=False)).cuda().bfloat16()
    emu_model = torch.nn.Sequential(torch.nn.Linear(1024, 1024, bias=False)).cuda().bfloat16()
    te_model.load_state_dict(base.state_dict())
    emu_model.load_state_dict(base.state_dict())
    try:
        convert(te_model, cfg, backend="te")
    except Fp8BackendUnavailable as exc:
        pytest.skip(str(exc))
    convert(emu_model, cfg, backend="emulated")
    x = torch.randn(2048, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        ref = base(x).float()
        y_te = te_model(x).float()
        y_emu = emu_model(x).float()
    err_te = ((y_te - ref).norm() / ref.norm()).item()
    err_emu = ((y_emu - ref).norm() / ref.norm()).item()
    diff = ((y_te - y_emu).norm() / ref.norm()).item()
    assert 0 < err_te < 0.06 and 0 < err_emu < 0.06
    assert diff < 0.5 * max(err_te, err_emu), (err_te, err_emu, diff)  # same quantisation, not just similar error


def test_te_backend_refuses_recipes_the_gpu_cannot_run():
    torch = pytest.importorskip("torch")
    _te()
    from dstoolkit.runtime.fp8 import Fp8Converter
    from dstoolkit.fp8.recipes import Fp8BackendUnavailable

    major, _ = torch.cuda.get_device_capability()
    if major >= 10:
        pytest.skip("Blackwell runs mxfp8")
    with pytest.raises(Fp8BackendUnavailable, match="mxfp8.*needs compute capability sm_100"):
        Fp8Converter({"recipe": "mxfp8", "format": "e4m3"}, backend="te")

"""convert / revert / SwapReport on CPU with the emulated backend; the TE backend's error path."""
import importlib.util

import pytest

from dstoolkit.fp8 import Fp8BackendUnavailable
from dstoolkit.models.presets import get_preset

# torch, dstoolkit.runtime.fp8 and dstoolkit.runtime.model are imported inside the tests: collecting this
# module must not import torch.


def _Toy():
    """The toy model (classes defined here, not at module level, so that collection does not import torch)."""
    from torch import nn

    class _MyLinear(nn.Linear):
        pass

    class _Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(32)
            self.up = nn.Linear(32, 64)
            self.odd = nn.Linear(64, 24)  # 24 is not a multiple of 16
            self.small = nn.Linear(24, 16)  # in 24: dims fail too
            self.custom = _MyLinear(16, 32)

    class _Toy(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 32)
            self.layers = nn.ModuleList([_Block() for _ in range(3)])
            self.lm_head = nn.Linear(32, 10)

        def forward(self, ids):
            x = self.emb(ids)
            for b in self.layers:
                x = b.custom(b.small(b.odd(b.up(b.norm(x)))))
            return self.lm_head(x)

    return _Toy()


def test_report_lists_every_module_with_a_reason_and_never_stops_early():
    from dstoolkit.runtime.fp8 import convert

    model = _Toy()
    rep = convert(model, {"layers": {"skip_first_layers": 1, "skip_last_layers": 1}}, backend="emulated")
    skipped = {s.name: s.reason for s in rep.skipped}
    # Only layers.1.up passes every rule.
    assert [e.name for e in rep.swapped] == ["layers.1.up"]
    assert rep.swapped[0].params == 32 * 64 + 64
    assert "first 1 (fp8.layers.skip_first_layers)" in skipped["layers.0.up"]
    assert "last 1 (fp8.layers.skip_last_layers)" in skipped["layers.2.up"]
    assert skipped["layers.1.odd"].startswith("dims not divisible by 16: in_features=64, out_features=24")
    assert skipped["layers.1.small"].startswith("dims not divisible by 16")
    assert skipped["layers.1.custom"] == "subclass of nn.Linear (_MyLinear) with its own forward; not swapped"
    assert skipped["lm_head"] == "excluded by pattern '*lm_head*'"
    assert skipped["emb"].startswith("not a linear layer")
    assert skipped["layers.1.norm"].startswith("not a linear layer")
    # 3 blocks x 5 modules + emb + lm_head = 17 modules with parameters, each listed once.
    assert len(rep.swapped) + len(rep.skipped) == 17
    assert "layers.1.up" in rep.to_table() and '"swapped_params": 2112' in rep.to_json()


def test_min_dims_and_include_patterns():
    from dstoolkit.runtime.fp8 import convert

    model = _Toy()
    rep = convert(model, {"layers": {"include": ["*.up"], "min_out_features": 128}}, backend="emulated")
    skipped = {s.name: s.reason for s in rep.skipped}
    assert rep.swapped == []
    assert skipped["layers.0.up"] == "out_features=64 < fp8.layers.min_out_features=128"
    assert "not matched by include patterns" in skipped["layers.0.odd"]
    assert rep.forward_wrapped is False  # nothing swapped: forward left alone


def _tiny():
    from dstoolkit.runtime.model import build_model

    shape = get_preset("tiny")
    return shape, build_model(shape, seed=0)


def test_tiny_model_swap_state_dicts_and_revert():
    import torch
    from torch import nn

    from dstoolkit.runtime.fp8 import EmulatedFp8Linear, convert, load_state_dict, revert
    from dstoolkit.runtime.model import build_model
    from dstoolkit.runtime.synthetic import synthetic_batch

    shape, model = _tiny()
    ref_sd = {k: v.clone() for k, v in model.state_dict().items()}
    ids, labels = synthetic_batch(shape, 2, 32, step=0, rank=0)
    with torch.no_grad():
        ref_loss = model(ids, labels).item()
    rep = convert(model, {"recipe": "block", "format": "e4m3"}, backend="emulated")
    # 4 blocks x 7 linears (q, k, v, o, gate, up, down); lm_head kept.
    assert len(rep.swapped) == 28 and rep.forward_wrapped
    assert {s.name for s in rep.skipped if s.type == "Linear"} == {"lm_head"}
    assert isinstance(model.blocks[0].self_attn.q_proj, EmulatedFp8Linear)
    # Same keys and tensors: plain state dict <-> converted model, both ways.
    assert list(model.state_dict()) == list(ref_sd)
    load_state_dict(model, ref_sd)
    with torch.no_grad():
        fp8_loss = model(ids, labels).item()
    assert fp8_loss != ref_loss and abs(fp8_loss - ref_loss) / ref_loss < 0.01
    fresh = build_model(shape, seed=1)
    fresh.load_state_dict(model.state_dict())
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in ref_sd.items())
    assert revert(model) == 28
    assert type(model.blocks[0].self_attn.q_proj) is nn.Linear and "forward" not in model.__dict__
    with torch.no_grad():
        assert model(ids, labels).item() == ref_loss


def test_optimizer_built_before_convert_still_updates_swapped_layers():
    import torch

    from dstoolkit.runtime.fp8 import convert
    from dstoolkit.runtime.synthetic import synthetic_batch

    shape, model = _tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.blocks[0].mlp.down_proj.weight.detach().clone()
    convert(model, {"recipe": "delayed", "amax_history_len": 16}, backend="emulated")
    opt_ids = {id(p) for g in opt.param_groups for p in g["params"]}
    assert {id(p) for p in model.parameters()} == opt_ids  # same Parameter objects after the swap
    for step in range(2):
        ids, labels = synthetic_batch(shape, 2, 32, step=step, rank=0)
        loss = model(ids, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert not torch.equal(model.blocks[0].mlp.down_proj.weight, before)
    hist = model.blocks[0].mlp.down_proj.amax_state()
    assert set(hist) == {"input", "weight", "grad"}
    assert hist["grad"]["history"][:2].gt(0).all() and hist["grad"]["history"][2:].eq(0).all()


def test_convert_twice_reports_already_converted():
    from dstoolkit.runtime.fp8 import convert

    _, model = _tiny()
    convert(model, backend="emulated", cfg={"recipe": "current"})
    again = convert(model, backend="emulated", cfg={"recipe": "current"})
    assert again.swapped == [] and sum(s.reason == "already an FP8 module" for s in again.skipped) == 28


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None, reason="TE installed here")
def test_te_backend_missing_says_what_to_do():
    from torch import nn

    from dstoolkit.runtime.fp8 import convert

    _, model = _tiny()
    with pytest.raises(Fp8BackendUnavailable, match=r"pip install 'dstoolkit\[te\]'.*backend='emulated'"):
        convert(model, backend="te")
    assert type(model.blocks[0].self_attn.q_proj) is nn.Linear  # untouched
    from dstoolkit.fp8 import build_te_recipe
    from dstoolkit.dsconfig.fp8 import Fp8Config

    with pytest.raises(Fp8BackendUnavailable, match="Transformer Engine is not importable"):
        build_te_recipe(Fp8Config(recipe="block", format="e4m3"))


def test_unknown_backend():
    from torch import nn

    from dstoolkit.runtime.fp8 import convert

    with pytest.raises(ValueError, match="backend='tpu' is not one of 'te', 'emulated'"):
        convert(nn.Linear(16, 16), backend="tpu")

"""Emulation numerics against hand-computed values (scale, saturation, amax history, block scales)."""
import pytest

from dstoolkit.dsconfig.fp8 import Fp8Config

# torch and dstoolkit.runtime.fp8 are imported inside the tests: collecting this module must not import torch.


def test_scale_is_fp8_max_over_amax_times_two_to_minus_margin():
    import torch

    from dstoolkit.runtime.fp8 import quant

    amax = torch.tensor([2.0, 7.0, 0.0, float("inf")])
    # 448 / 2 = 224; 448 / 7 = 64; zero or non-finite amax -> neutral scale 1.
    assert quant.scale_from_amax(amax, 448.0).tolist() == [224.0, 64.0, 1.0, 1.0]
    # margin 2 divides by 2^2: 224 / 4 = 56.
    assert quant.scale_from_amax(torch.tensor(2.0), 448.0, margin=2).item() == 56.0
    assert quant.scale_from_amax(torch.tensor(7.0), 57344.0).item() == 8192.0


def test_saturation_at_448_and_57344():
    import torch

    from dstoolkit.runtime.fp8 import quant

    one = torch.tensor(1.0)
    q = quant.cast_fp8(torch.tensor([1000.0, -1000.0, 448.0, 500.0]), one, "e4m3")
    assert q.dtype == torch.float8_e4m3fn and q.float().tolist() == [448.0, -448.0, 448.0, 448.0]
    q5 = quant.cast_fp8(torch.tensor([1e6, -1e6, 57344.0]), one, "e5m2")
    assert q5.dtype == torch.float8_e5m2 and q5.float().tolist() == [57344.0, -57344.0, 57344.0]  # not inf


def test_rounding_is_the_format_grid():
    import torch

    from dstoolkit.runtime.fp8 import quant

    one = torch.tensor(1.0)
    # E4M3 spacing in [1, 2) is 1/8: 1.06 -> 1.0, 1.07 -> 1.125 (midpoint 1.0625).
    assert quant.fake_quant(torch.tensor([1.06, 1.07, 0.5]), one, "e4m3").tolist() == [1.0, 1.125, 0.5]
    # E5M2 spacing in [1, 2) is 1/4: 1.1 -> 1.0, 1.2 -> 1.25.
    assert quant.fake_quant(torch.tensor([1.1, 1.2]), one, "e5m2").tolist() == [1.0, 1.25]


def test_amax_history_roll_and_algorithms():
    import torch

    from dstoolkit.runtime.fp8 import quant

    h = quant.AmaxHistory(3, "max", 448.0)
    assert h.scale.item() == 1.0  # TE's initial scale
    for a in (1.0, 2.0, 3.0, 4.0):
        h.record(torch.tensor(a))
    assert h.history.tolist() == [4.0, 3.0, 2.0]  # oldest (1.0) rolled out
    assert h.scale.item() == pytest.approx(448.0 / 4.0)
    h.record(torch.tensor(10.0))
    h.record(torch.tensor(1.0))
    assert h.history.tolist() == [1.0, 10.0, 4.0]
    assert h.scale.item() == pytest.approx(44.8)  # max of the window

    r = quant.AmaxHistory(3, "most_recent", 448.0, margin=1)
    for a in (10.0, 1.0):
        r.record(torch.tensor(a))
    assert r.scale.item() == pytest.approx(448.0 / 1.0 / 2.0)
    r.record(torch.tensor(0.0))  # zero amax keeps the previous scale (TE)
    assert r.scale.item() == pytest.approx(224.0)


def test_delayed_quantizer_uses_previous_steps_scale():
    import torch

    from dstoolkit.runtime.fp8.emulated import _RoleQuantizer

    q = _RoleQuantizer(Fp8Config(amax_history_len=4), "input")
    x = torch.tensor([[0.001, -0.0005]])
    first = q.per_tensor(x)
    # Step 1 uses scale 1: E4M3's smallest subnormal is 2^-9 = 0.001953125; 0.001 rounds up to it, 0.0005 to 0.
    assert first.tolist() == [[2.0 ** -9, 0.0]]
    second = q.per_tensor(x)  # scale now 448 / 0.001
    assert second[0, 0].item() == pytest.approx(0.001, rel=1e-6)
    assert q.history.history.tolist()[:2] == pytest.approx([0.001, 0.001])


def test_block_scales_on_256x256_with_planted_outliers():
    import torch

    from dstoolkit.runtime.fp8 import quant

    x = torch.full((256, 256), 0.5)
    x[5, 200] = 100.0
    x[130, 3] = -50.0
    wq = quant.quantize_blocks(x, (128, 128), "e4m3")
    # Per-block scale = 448 / block amax: 0.5 -> 896, 100 -> 4.48, 50 -> 8.96.
    assert wq.scale.shape == (2, 2)
    assert wq.scale.flatten().tolist() == pytest.approx([896.0, 4.48, 8.96, 896.0])
    deq = wq.dequantize()
    # Blocks without an outlier keep 0.5 exactly (0.5 * 896 = 448 is on the grid).
    assert deq[:128, :128].eq(0.5).all() and deq[128:, 128:].eq(0.5).all()
    # In the outlier's block 0.5 * 4.48 = 2.24 rounds to 2.25 (E4M3 spacing 1/4 in [2, 4)).
    assert deq[0, 128].item() == pytest.approx(2.25 / 4.48)
    assert deq[5, 200].item() == pytest.approx(100.0)
    # 1x128 activation tiles: only the outlier rows' tiles get a small scale.
    tq = quant.quantize_blocks(x, (1, 128), "e4m3")
    assert tq.scale.shape == (256, 2)
    assert tq.scale[5].tolist() == pytest.approx([896.0, 4.48])
    assert tq.scale[130].tolist() == pytest.approx([8.96, 896.0])
    assert (tq.scale == 896.0).sum().item() == 256 * 2 - 2
    # One per-tensor scale (448/100) damages every element instead.
    per_tensor = quant.fake_quant(x, quant.scale_from_amax(quant.amax(x), 448.0), "e4m3")
    assert per_tensor[0, 0].item() == pytest.approx(2.25 / 4.48)


def test_partial_blocks_and_mx_power_of_two_scales():
    import torch

    from dstoolkit.runtime.fp8 import quant

    x = torch.tensor([[3.0] + [0.0] * 31 + [0.3] + [0.0] * 7])  # 40 columns: a full and a partial 32-block
    mx = quant.quantize_blocks(x, (1, 32), "e4m3", power_of_two=True)
    # OCP MX: scale = 2^(8 - floor(log2 amax)): amax 3 -> 2^7, amax 0.3 -> 2^10.
    assert mx.scale.tolist() == [[128.0, 1024.0]]
    d = mx.dequantize()
    assert d[0, 0].item() == 3.0  # 384 on the grid
    assert d[0, 32].item() == pytest.approx(320.0 / 1024.0)  # 307.2 rounds to 320 (spacing 32)


def _identity_linear(cfg):
    import torch

    from dstoolkit.runtime.fp8.emulated import EmulatedFp8Linear

    lin = torch.nn.Linear(16, 16, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(16))
    return EmulatedFp8Linear.from_linear(lin, cfg)


@pytest.mark.parametrize("fmt,expected", [("hybrid", 20480.0 / 57344.0), ("e4m3", 144.0 / 448.0)])
def test_gradients_use_e5m2_for_hybrid(fmt, expected):
    import torch

    from dstoolkit.runtime.fp8.emulated import fp8_autocast

    mod = _identity_linear(Fp8Config(recipe="current", format=fmt))
    x = torch.zeros(1, 16, requires_grad=True)
    g = torch.zeros(1, 16)
    g[0, 0], g[0, 1] = 1.0, 0.33
    with fp8_autocast():
        mod(x).backward(g)
    # amax 1 -> scale fp8_max; 0.33 * 57344 = 18923 -> 20480 in E5M2; 0.33 * 448 = 147.8 -> 144 in E4M3.
    assert x.grad[0, 0].item() == 1.0
    assert x.grad[0, 1].item() == pytest.approx(expected)


def test_forward_exact_on_grid_and_plain_outside_autocast():
    import torch

    from dstoolkit.runtime.fp8.emulated import EmulatedFp8Linear, fp8_autocast

    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 16)
    with torch.no_grad():  # values on a grid that a power-of-two scale maps onto E4M3 exactly
        lin.weight.copy_(torch.randint(-14, 15, (16, 32)) / 4.0)  # amax 3.5 -> scale 128
    x = torch.randint(-7, 8, (4, 32)) / 2.0  # amax 3.5
    ref = lin(x)
    mod = EmulatedFp8Linear.from_linear(lin, Fp8Config(recipe="current", format="e4m3"))
    with fp8_autocast():
        assert torch.equal(mod(x), ref)
    noisy = torch.randn(4, 32)
    assert torch.equal(mod(noisy), lin(noisy))  # outside the context: an ordinary linear
    with fp8_autocast():
        assert not torch.equal(mod(noisy), lin(noisy))


@pytest.mark.parametrize("recipe", ["delayed", "current", "block", "mxfp8"])
def test_every_recipe_tracks_bf16_closely(recipe):
    import torch

    from dstoolkit.runtime.fp8.emulated import EmulatedFp8Linear, fp8_autocast

    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 128)
    cfg = Fp8Config(recipe=recipe, format="e4m3" if recipe in ("block", "mxfp8") else "hybrid")
    mod = EmulatedFp8Linear.from_linear(lin, cfg)
    x = torch.randn(64, 256, requires_grad=True)
    xr = x.detach().clone().requires_grad_(True)
    with fp8_autocast():
        for _ in range(2):  # delayed: the 2nd step has real scales
            y = mod(x)
    lin.weight.grad = None
    y.square().sum().backward()
    gw = lin.weight.grad.clone()
    lin.weight.grad = None
    yr = lin(xr)
    yr.square().sum().backward()
    rel = ((y - yr).norm() / yr.norm()).item()
    assert 0 < rel < 0.06, rel  # E4M3 has 3 mantissa bits: relative rounding error <= 2^-4 per element
    assert ((x.grad - xr.grad).norm() / xr.grad.norm()).item() < 0.15
    assert ((gw - lin.weight.grad).norm() / lin.weight.grad.norm()).item() < 0.15


def test_activation_checkpoint_recompute_repeats_the_fp8_forward():
    import torch

    from dstoolkit.runtime.fp8.emulated import EmulatedFp8Linear, fp8_autocast

    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    grads = []
    for use_ckpt in (False, True):
        torch.manual_seed(1)  # identical weights, biases and input in both runs
        lin1, lin2 = torch.nn.Linear(64, 64), torch.nn.Linear(64, 32)
        cfg = Fp8Config(amax_history_len=4)
        m1, m2 = EmulatedFp8Linear.from_linear(lin1, cfg), EmulatedFp8Linear.from_linear(lin2, cfg)
        x = torch.randn(8, 64)

        def block(inp):
            return m2(torch.relu(m1(inp)))

        for _ in range(2):
            lin1.weight.grad = None
            with fp8_autocast():  # the context covers the forward only, as convert's wrapper does
                y = checkpoint(block, x, use_reentrant=False) if use_ckpt else block(x)
            y.square().sum().backward()
        grads.append(lin1.weight.grad.clone())
        # Recompute did not add amax records: 2 forwards -> 2 entries.
        assert int((m1.q_input.history.history > 0).sum()) == 2
    assert torch.equal(grads[0], grads[1])

"""Forward FLOPs of the chunked scans and the DSA indexer (dstoolkit.models.flop_count), on hand-computed small
cases and against torch.utils.flop_counter on transformers' own torch functions."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from dstoolkit.estimate.flops import layer_scan_flops
from dstoolkit.models.flop_count import dsa_indexer_score_flops, gated_delta_chunk_flops, mamba2_ssd_chunk_flops


def test_gated_delta_by_hand():
    # T=8, C=4: 2 chunks; 4 value heads, dk=3, dv=5. Per chunk and head: k_beta·kᵀ and q·kᵀ 2·2·16·3 = 192,
    # k_cumdecay·S, q·S, kᵀ·v_new 3·2·4·3·5 = 360, attn·v_new 2·16·5 = 160 -> 712; solves 4·3·(5+3) = 96.
    f = gated_delta_chunk_flops(8, 4, 3, 5, 4)
    assert (f.matmul, f.triangular_solve, f.total) == (712 * 8, 96 * 8, 808 * 8)
    assert gated_delta_chunk_flops(9, 4, 3, 5, 4).matmul == 712 * 12  # T=9 pads to 3 chunks


def test_mamba2_ssd_by_hand():
    # T=8, C=4: 2 chunks; 4 heads, P=3, N=5. Per chunk and head: C·Bᵀ 2·16·5 = 160, (G∘L)·x 2·16·3 = 96, Bᵀ·x and
    # C·S 2·2·4·3·5 = 240 -> 496; per head the recurrence over the 3 chunk boundaries 2·3²·3·5 = 270.
    f = mamba2_ssd_chunk_flops(8, 4, 3, 5, 4)
    assert (f.matmul, f.triangular_solve) == (4 * (2 * 496 + 270), 0)


def test_dsa_indexer_by_hand():
    # T=4, 2 heads of 3: q·kᵀ 2·2·4·4·3 = 192, head weighting 2·2·4·4 = 64.
    assert dsa_indexer_score_flops(4, 2, 3) == 256


def test_training_flops_per_token_of_each_kind():
    gd = SimpleNamespace(kind="gated_delta", heads=4, key_dim=3, value_dim=5, chunk=4)
    ssd = SimpleNamespace(kind="mamba2_ssd", heads=4, key_dim=5, value_dim=3, chunk=4)
    idx = SimpleNamespace(kind="dsa_indexer", heads=2, key_dim=3, value_dim=0, chunk=0)
    assert layer_scan_flops(gd, 8) == 3 * 808 * 8 / 8  # forward + backward = 3x forward
    assert layer_scan_flops(ssd, 8) == 3 * 4 * (2 * 496 + 270) / 8
    assert layer_scan_flops(idx, 4) == 256 / 4  # forward only: transformers runs the indexer under no_grad
    with pytest.raises(ValueError, match="unknown scan kind 'rwkv'"):
        layer_scan_flops(SimpleNamespace(kind="rwkv"), 8)


def test_chunk_and_length_must_be_positive():
    with pytest.raises(ValueError, match="seq_len=0, chunk=4: both must be > 0"):
        gated_delta_chunk_flops(0, 1, 1, 1, 4)


@pytest.mark.parametrize("T", [8, 11])
def test_gated_delta_matches_flop_counter_on_transformers(T):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from torch.utils.flop_counter import FlopCounterMode
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    nk, nv, dk, dv, C = 2, 4, 3, 5, 4
    q, k = torch.randn(1, T, nk, dk), torch.randn(1, T, nk, dk)
    v, g, b = torch.randn(1, T, nv, dv), -torch.rand(1, T, nv), torch.rand(1, T, nv)
    c = FlopCounterMode(display=False)
    with c:
        torch_chunk_gated_delta_rule(q, k, v, g, b, chunk_size=C, use_qk_l2norm_in_kernel=True)
    # The counter has no formula for linalg.solve_triangular: it sees the matmuls only.
    assert c.get_total_flops() == gated_delta_chunk_flops(T, nv, dk, dv, C).matmul


@pytest.mark.parametrize("T", [8, 11])
def test_mamba2_ssd_matches_flop_counter_on_transformers(T):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from torch.utils.flop_counter import FlopCounterMode
    from transformers.models.nemotron_h.modeling_nemotron_h import mamba2_chunk_scan

    H, P, N, G, C = 4, 3, 5, 2, 4
    x, dt, A = torch.randn(1, T, H, P), torch.rand(1, T, H), -torch.rand(H)
    B, Cm = torch.randn(1, T, G, N), torch.randn(1, T, G, N)
    c = FlopCounterMode(display=False)
    with c:
        mamba2_chunk_scan(x, dt, A, B, Cm, chunk_size=C, D=torch.ones(H), dt_softplus=True)
    assert c.get_total_flops() == mamba2_ssd_chunk_flops(T, H, P, N, C).matmul

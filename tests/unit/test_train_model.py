"""TinyTransformer: exact parameter counts vs count_params, determinism, learnable synthetic data."""
import pytest

from dstoolkit.models import count_params, get_preset
from dstoolkit.models.shape import ModelShape

# torch and dstoolkit.runtime.* are imported inside the tests: collecting this module must not import torch.

SMALL = ModelShape(name="small", model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=128, vocab_size=256)


def _numel(model) -> int:  # model: a torch.nn.Module
    return sum(p.numel() for p in model.parameters())  # tied weights are one Parameter, counted once


@pytest.mark.parametrize("name", ["tiny", "tiny-moe"])
def test_built_tiny_presets_match_count_params(name):
    from dstoolkit.runtime.model import build_model

    shape = get_preset(name)
    assert _numel(build_model(shape)) == count_params(shape).total


@pytest.mark.parametrize("name", ["llama-3-8b", "llama-3-70b", "mixtral-8x7b"])
def test_full_size_presets_match_count_params_on_meta(name):
    import torch

    from dstoolkit.runtime.model import TinyTransformer

    shape = get_preset(name)
    with torch.device("meta"):
        model = TinyTransformer(shape)
    assert _numel(model) == count_params(shape).total


@pytest.mark.parametrize("extra", [
    {"attention_bias": True},                                  # Qwen2: q/k/v biases
    {"tie_word_embeddings": True},
    {"qk_norm": True},                                         # Qwen3 per-head q/k norms
    {"mlp_bias": True, "o_proj_bias": True},
    {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
     "shared_expert_intermediate_size": 48, "model_type": "qwen2_moe"},  # Qwen-MoE shared expert + gate
    {"num_experts": 4, "num_experts_per_tok": 1, "moe_intermediate_size": 32, "num_shared_experts": 2,
     "first_k_dense_replace": 1, "model_type": "deepseek_v2"},           # DeepSeek dense-first + shared experts
])
def test_family_variants_match_count_params(extra):
    from dstoolkit.runtime.model import build_model

    shape = SMALL.model_copy(update=extra)
    shape = ModelShape(**shape.model_dump())  # re-validate
    assert _numel(build_model(shape)) == count_params(shape).total


def test_mla_shape_is_refused_with_reason():
    from dstoolkit.runtime.model import build_model

    with pytest.raises(NotImplementedError, match="multi-head latent attention"):
        build_model(get_preset("deepseek-v3").model_copy(update={"num_hidden_layers": 1}))


def test_moe_ep_must_divide_experts():
    from dstoolkit.runtime.model import build_model

    with pytest.raises(ValueError, match="ep_size=3 must divide num_experts=4"):
        build_model(get_preset("tiny-moe"), ep_size=3)


def test_build_is_deterministic_per_seed():
    import torch

    from dstoolkit.runtime.model import build_model

    a, b, c = build_model(SMALL, seed=1), build_model(SMALL, seed=1), build_model(SMALL, seed=2)
    for (na, pa), (_, pb), (_, pc) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters()):
        assert torch.equal(pa, pb), na
        if "norm" not in na:
            assert not torch.equal(pa, pc), na


def test_synthetic_batch_is_a_pure_function_of_seed_step_rank():
    import torch

    from dstoolkit.runtime.synthetic import synthetic_batch

    x1, y1 = synthetic_batch(SMALL, 3, 16, step=5, rank=1, seed=0)
    x2, y2 = synthetic_batch(SMALL, 3, 16, step=5, rank=1, seed=0)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert x1.shape == (3, 16) and x1.dtype == torch.long
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # labels are the inputs shifted by one
    for other in ({"step": 6, "rank": 1}, {"step": 5, "rank": 0}):
        assert not torch.equal(synthetic_batch(SMALL, 3, 16, seed=0, **other)[0], x1)
    with pytest.raises(ValueError, match="micro_batch=0"):
        synthetic_batch(SMALL, 0, 16, step=0, rank=0)


def test_loss_falls_visibly_within_twenty_steps():
    import torch

    from dstoolkit.runtime.model import build_model
    from dstoolkit.runtime.synthetic import loss_floor, synthetic_batch

    torch.manual_seed(0)
    model = build_model(SMALL)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for step in range(20):
        x, y = synthetic_batch(SMALL, 4, 32, step=step, rank=0)
        loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(5.55, abs=0.1)  # ln(256) = 5.545 at init (std-0.02 weights)
    assert losses[-1] < losses[0] - 1.5
    assert loss_floor(SMALL) < losses[-1]

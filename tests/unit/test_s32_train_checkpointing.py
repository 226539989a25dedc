"""s32 finding 10: `apply_checkpoint_policy` on a user's own module. A module with `.blocks` whose forward never
reads the flags really recomputes the marked blocks (forward calls counted under backward); a transformers model and
a module without blocks are refused pointing at what works; `selective` without the attention switch is refused."""
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from dstoolkit.runtime.train.checkpointing import apply_checkpoint_policy  # noqa: E402
from dstoolkit.spec.checkpoint import CheckpointPolicy  # noqa: E402


class Counted(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return torch.tanh(self.lin(x))


class Blocks(nn.Module):
    """A user's module: `.blocks`, and a forward that knows nothing of `checkpointed`."""

    def __init__(self, n=4):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([Counted() for _ in range(n)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.sum()


def _run(model):
    for b in model.blocks:
        b.calls = 0
    x = torch.randn(2, 4)
    model(x).backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    model.zero_grad()
    return [b.calls for b in model.blocks], grads


def test_marked_blocks_recompute_in_backward():
    ref_calls, ref_grads = _run(Blocks())
    assert ref_calls == [1, 1, 1, 1]
    m = Blocks()
    assert apply_checkpoint_policy(m, CheckpointPolicy(kind="full")) == [True] * 4
    calls, grads = _run(m)
    assert calls == [2, 2, 2, 2]  # before: [1, 1, 1, 1] (flags set, nothing recomputed)
    assert torch.equal(grads, ref_grads)
    assert apply_checkpoint_policy(m, CheckpointPolicy(kind="every-k", every_k=3)) == [True, False, False, True]
    assert _run(m)[0] == [2, 1, 1, 2]
    apply_checkpoint_policy(m, CheckpointPolicy(kind="none"))
    assert _run(m)[0] == [1, 1, 1, 1] and all("forward" not in b.__dict__ for b in m.blocks)
    with torch.no_grad():  # no autograd, no checkpoint
        apply_checkpoint_policy(m, CheckpointPolicy(kind="full"))
        m(torch.randn(2, 4))
    assert [b.calls for b in m.blocks] == [2, 2, 2, 2]  # the counts of _run, plus one forward each


def test_the_bundled_model_keeps_its_own_recompute():
    from dstoolkit.models import get_preset
    from dstoolkit.runtime.model import build_model

    model = build_model(get_preset("tiny"))
    assert apply_checkpoint_policy(model, CheckpointPolicy(kind="full")) == model.checkpointed == [True] * 4
    assert all("forward" not in b.__dict__ for b in model.blocks)  # not wrapped twice


def test_transformers_model_is_pointed_at_gradient_checkpointing_enable():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=2, vocab_size=64)
    hf = transformers.LlamaForCausalLM(cfg)
    with pytest.raises(TypeError) as info:
        apply_checkpoint_policy(hf, CheckpointPolicy(kind="full"))
    assert str(info.value) == (
        "model LlamaForCausalLM has no `blocks` nn.ModuleList to apply 'full' to: for a transformers model use "
        "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False}) (HF Trainer: "
        "TrainingArguments(gradient_checkpointing=True)), which recomputes every decoder layer")


def test_module_without_blocks_is_told_what_works():
    with pytest.raises(TypeError) as info:
        apply_checkpoint_policy(nn.Sequential(nn.Linear(2, 2)), CheckpointPolicy(kind="full"))
    assert str(info.value) == (
        "model Sequential has no `blocks` nn.ModuleList to apply 'full' to: put the layers to recompute in "
        "`model.blocks` (an nn.ModuleList, each called as a module), or call torch.utils.checkpoint.checkpoint "
        "around them in your forward")


def test_selective_without_the_attention_switch_is_refused():
    with pytest.raises(TypeError) as info:  # before: returned [False] * 4, nothing recomputed
        apply_checkpoint_policy(Blocks(), CheckpointPolicy(kind="selective"))
    assert str(info.value) == (
        "model Blocks: 'selective' recomputes the attention core through each block's `self_attn.recompute_core` "
        "switch (dstoolkit.runtime.model's blocks), which 4 of its 4 blocks lack: use 'full', 'every-k' or 'ratio' "
        "(whole blocks recomputed)")


def test_bad_backend_is_refused_before_anything_changes():
    m = Blocks()
    with pytest.raises(ValueError, match="backend='jax': use 'torch' or 'deepspeed'"):
        apply_checkpoint_policy(m, CheckpointPolicy(kind="full"), backend="jax")
    assert _run(m)[0] == [1, 1, 1, 1]

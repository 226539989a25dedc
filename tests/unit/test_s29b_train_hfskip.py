"""A batch `DstoolkitCallback` skips adds zero gradients, NaN/Inf included, without a launch. Was: the skip multiplied
the loss by 0, and the backward through a forward that went NaN gave NaN gradients (0 x NaN). The real 2-rank HF
Trainer + DeepSpeed runs (ZeRO-0/2/3, bf16/fp32) are in tests/dist/test_s29b_train_hf_nan.py."""
import types

import pytest

torch = pytest.importorskip("torch")


class Net(torch.nn.Module):
    """A linear model whose forward goes NaN (in its activations, before the loss) when `nan=True`."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        torch.nn.init.constant_(self.lin.weight, 0.5)
        torch.nn.init.constant_(self.lin.bias, 0.1)

    def forward(self, input_ids=None, labels=None, nan=False, scale=1.0):
        h = self.lin(input_ids)
        if nan:
            h = h + float("nan")
        return {"loss": (h * scale).pow(2).mean()}


X = torch.arange(8, dtype=torch.float32).reshape(2, 4) / 8


def _grads(m):
    return [p.grad.clone() for p in m.parameters()]


def test_loss_times_zero_is_not_a_skip_when_the_forward_went_nan():
    # why the fix exists: 0 x NaN is NaN, the gradient of every weight is NaN
    m = Net()
    (m(X, nan=True)["loss"] * 0.0).backward()
    assert all(bool(torch.isnan(g).all()) for g in _grads(m))


def test_zero_batch_gives_zero_gradients_and_keeps_the_accumulated_ones():
    from dstoolkit.runtime.train.hfskip import ZeroBatch

    m = Net()
    m(X)["loss"].backward()  # an earlier micro-batch of the step
    before = _grads(m)
    z = ZeroBatch()
    loss = z.arm(m, m(X, nan=True)["loss"])
    assert z.armed and float(loss.detach()) == 0.0
    loss *= 2.0  # HF Trainer scales the loss in place (compute_loss): allowed
    loss.backward()
    assert all(torch.equal(a, b) for a, b in zip(_grads(m), before))  # the skipped batch added exactly zero
    z.disarm()
    assert not z.armed
    m(X)["loss"].backward()  # the next micro-batch trains again
    assert all(not torch.equal(a, b) for a, b in zip(_grads(m), before))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_zero_batch_loss_is_a_finite_zero_for_any_value(bad):
    from dstoolkit.runtime.train.hfskip import ZeroBatch

    w = torch.nn.Parameter(torch.ones(2))
    m = torch.nn.Module()
    m.w = w
    z = ZeroBatch()
    loss = z.arm(m, (w * bad).sum())
    assert float(loss.detach()) == 0.0 and loss.requires_grad and loss.grad_fn is not None
    loss.backward()
    assert w.grad.tolist() == [0.0, 0.0]
    z.disarm()


def test_callback_skip_of_a_nan_batch_adds_zero_gradients_and_then_trains_again(tmp_path):
    from dstoolkit.runtime.train.hf import DstoolkitCallback

    cb = DstoolkitCallback(metrics_path=str(tmp_path / "m.jsonl"), cross_rank_every=0)
    state = types.SimpleNamespace(global_step=0)
    args = types.SimpleNamespace(output_dir=str(tmp_path))
    m = Net()
    cb.on_train_begin(args, state, None, model=m)
    out = m(input_ids=X, nan=True)
    assert float(out["loss"].detach()) == 0.0
    out["loss"].backward()
    assert [g.abs().sum().item() for g in _grads(m)] == [0.0, 0.0]  # no NaN, no gradient at all
    spike = [e for e in cb.events if e["event"] == "spike"]
    assert [(e["step"], e["kind"], e["action"]) for e in spike] == [(1, "nonfinite_loss", "skip")]
    cb.on_substep_end(args, state, None)  # the Trainer's next micro-batch: trained on again
    m.zero_grad()
    out = m(input_ids=X)
    out["loss"].backward()
    assert all(float(g.abs().sum()) > 0 and bool(torch.isfinite(g).all()) for g in _grads(m))
    cb.on_train_end(args, state, None)


def test_callback_hooks_are_gone_at_the_next_forward_without_a_substep_callback(tmp_path):
    from dstoolkit.runtime.train.hf import DstoolkitCallback

    cb = DstoolkitCallback(metrics_path=str(tmp_path / "m.jsonl"), cross_rank_every=0)
    state = types.SimpleNamespace(global_step=0)
    m = Net()
    cb.on_train_begin(types.SimpleNamespace(output_dir=str(tmp_path)), state, None, model=m)
    m(input_ids=X, nan=True)["loss"].backward()
    assert cb._zero.armed
    m.zero_grad()
    m(input_ids=X)["loss"].backward()  # the next forward disarms before its own backward
    assert not cb._zero.armed and all(float(g.abs().sum()) > 0 for g in _grads(m))

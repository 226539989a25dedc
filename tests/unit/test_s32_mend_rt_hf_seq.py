"""DstoolkitCallback's sequence check (finding 11 of the s32 review): tokens only (input_ids, or the attention
mask's ones of a batch padded beyond seq_len), a mismatch only for a batch longer than the spec's seq_len (padding
to the batch's longest sequence makes shorter batches normal), and pixel_values / inputs_embeds are never tokens."""
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from dstoolkit.runtime.train import hf  # noqa: E402
from dstoolkit.runtime.train.hf_parts import batch_tokens, longest_sequence  # noqa: E402

from tests.unit.hf_callback_fakes import SPEC, Engine, tiny_params  # noqa: E402


class TextNet(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(n))

    def forward(self, input_ids=None, attention_mask=None, labels=None):
        return {"loss": self.w[:1].sum() + 1.0}


class VisionNet(TextNet):
    def forward(self, pixel_values=None, input_ids=None, inputs_embeds=None, attention_mask=None):
        return {"loss": self.w[:1].sum() + 1.0}


def _begin(monkeypatch, tmp_path, cls):
    monkeypatch.setattr(hf, "_find_engine", lambda model: Engine())
    cb = hf.DstoolkitCallback(spec=str(SPEC), cross_rank_every=0)
    m = cls(tiny_params())
    cb.on_train_begin(types.SimpleNamespace(output_dir=str(tmp_path)), types.SimpleNamespace(global_step=0), None,
                      model=m)
    if cb._estimate is None:
        pytest.skip("no estimate on this machine (no cached calibration)")
    return cb, m


def _mismatches(cb):
    return [e["line"] for e in cb.events if e["event"] == "spec_mismatch"]


def test_padded_shorter_batches_keep_the_estimate(monkeypatch, tmp_path):
    cb, m = _begin(monkeypatch, tmp_path, TextNet)
    m(input_ids=torch.zeros(2, 64, dtype=torch.long), attention_mask=torch.ones(2, 64, dtype=torch.long))
    # padded beyond seq_len, but no sequence holds more than 100 tokens
    mask = torch.zeros(2, 200, dtype=torch.long)
    mask[:, :100] = 1
    m(torch.zeros(2, 200, dtype=torch.long), mask)
    assert cb._estimate is not None and _mismatches(cb) == []
    assert cb._tokens == 2 * 64 + 2 * 200


def test_a_later_longer_batch_drops_it(monkeypatch, tmp_path):
    cb, m = _begin(monkeypatch, tmp_path, TextNet)
    m(input_ids=torch.zeros(2, 32, dtype=torch.long))
    m(torch.zeros(2, 300, dtype=torch.long))  # positional input_ids
    [line] = _mismatches(cb)
    assert "trains at seq_len 128, the Trainer's batches hold 300 tokens per sequence" in line
    assert cb._estimate is None


def test_pixel_values_and_inputs_embeds_are_not_tokens(monkeypatch, tmp_path):
    cb, m = _begin(monkeypatch, tmp_path, VisionNet)
    m(torch.zeros(2, 3, 224, 224))  # positional pixel_values: before, 224 'tokens per sequence' dropped the estimate
    assert cb._estimate is not None and _mismatches(cb) == [] and cb._tokens == 0
    m(inputs_embeds=torch.zeros(2, 64, 1024))
    assert cb._estimate is not None and cb._tokens == 2 * 64
    m(torch.zeros(2, 3, 224, 224), torch.zeros(2, 96, dtype=torch.long))  # image + text: the text's tokens
    assert cb._estimate is not None and _mismatches(cb) == [] and cb._tokens == 2 * 64 + 2 * 96


def test_helpers():
    net = VisionNet(1)
    ids, mask, n = batch_tokens(net, (torch.zeros(1, 3, 8, 8),), {"input_ids": torch.zeros(1, 5, dtype=torch.long)})
    assert ids.shape == (1, 5) and mask is None and n == 5
    assert batch_tokens(lambda *a: None, (torch.zeros(2, 7),), {}) == (None, None, 0)
    assert longest_sequence(torch.zeros(2, 10), None, 16) is None
    assert longest_sequence(torch.zeros(2, 20), None, 16) == 20
    assert longest_sequence(None, torch.tensor([[1] * 17 + [0] * 3, [1] * 5 + [0] * 15]), 16) == 17

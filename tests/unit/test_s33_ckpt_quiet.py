"""`ckpt reshard` / `ckpt export` print only their own lines, and `inspect` counts a hard-linked file once (s33
finding 10).

Before: reshard's quiet=True redirected ds_to_universal's stdout only, so its tqdm bars (`0%| ... 2/2`) still went
to stderr; export let zero_to_fp32 print "Processing zero checkpoint ..." on stdout before the tool's own lines; and
`inspect` of a universal checkpoint made from ZeRO-1/2 (whose model states `reshard` gives both names by a hard link)
counted that file's bytes twice in `total` and listed the link as a rank's file. DeepSpeed's converters are replaced
here by stand-ins that print and draw bars through the real module's globals, as the real ones do.
"""
from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest

from dstoolkit.ckpt.inspect import inspect_checkpoint
from dstoolkit.runtime.ckpt.quiet import quiet_tool

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
import tqdm  # noqa: E402  (a deepspeed dependency)


def _chatty(module):
    def run(*_a, **_k):
        print("Processing zero checkpoint 'x'")
        bars = module.tqdm.tqdm if isinstance(module.tqdm, (types.ModuleType, types.SimpleNamespace)) else module.tqdm
        for _ in bars(range(3), desc="Loading checkpoint shards"):
            pass
        print("a warning the user should see", file=sys.stderr)
        return {}
    return run


@pytest.mark.parametrize("kind", ["module", "class"])  # ds_to_universal: `import tqdm`; zero_to_fp32: the class
def test_quiet_tool_silences_prints_and_bars_and_restores(kind, capfd):
    mod = types.ModuleType("fake_tool")
    mod.tqdm = tqdm if kind == "module" else tqdm.tqdm
    with quiet_tool(mod):
        _chatty(mod)()
    out, err = capfd.readouterr()
    assert out == "" and "%|" not in err and "Loading checkpoint shards" not in err
    assert "a warning the user should see" in err
    assert mod.tqdm is (tqdm if kind == "module" else tqdm.tqdm)
    with pytest.raises(RuntimeError, match="boom"), quiet_tool(mod):
        raise RuntimeError("boom")
    assert mod.tqdm is (tqdm if kind == "module" else tqdm.tqdm)


def test_reshard_prints_no_bar(tmp_path, monkeypatch, capfd):
    from deepspeed.checkpoint import ds_to_universal

    from dstoolkit.runtime.ckpt import reshard
    from tests.unit.test_s31_ckpt_atomic import _fake_converter, _zero2

    ck = _zero2(tmp_path / "ck")
    chatty = _chatty(ds_to_universal)
    _fake_converter(monkeypatch, then=chatty)
    monkeypatch.setattr(reshard, "_optimizer_state_for_every_stage", lambda dest: None)
    reshard.to_universal(ck, tmp_path / "u")
    out, err = capfd.readouterr()
    assert "%|" not in err and "Processing zero checkpoint" not in out


def test_export_consolidation_prints_nothing(monkeypatch, capfd):
    from deepspeed.utils import zero_to_fp32

    from dstoolkit.runtime.ckpt.export import consolidated_state_dict

    monkeypatch.setattr(zero_to_fp32, "get_fp32_state_dict_from_zero_checkpoint", _chatty(zero_to_fp32))
    sd, source = consolidated_state_dict(types.SimpleNamespace(zero_stage=2, root=Path("."), tag="t"))
    out, err = capfd.readouterr()
    assert sd == {} and out == "" and "%|" not in err


def test_a_hard_link_is_counted_once_and_said(tmp_path):
    from tests.unit.test_ckpt_fuzz_inspect import TAG, _universal

    root = _universal(tmp_path / "u")
    tag = root / TAG
    before = inspect_checkpoint(root)
    os.link(tag / "mp_rank_00_model_states.pt", tag / "zero_pp_rank_0_mp_rank_00_model_states.pt")
    info = inspect_checkpoint(root)
    assert info.complete
    assert info.total_bytes == before.total_bytes
    assert info.model_state_bytes + info.optimizer_state_bytes + info.other_bytes == info.total_bytes
    assert sum(r.bytes for r in info.ranks) + info.shared_bytes == info.total_bytes
    assert any(n.startswith("mp_rank_00_model_states.pt is a hard link to zero_pp_rank_0_mp_rank_00_model_states.pt")
               for n in info.notes)

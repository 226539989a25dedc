"""DstoolkitCallback's pieces without a launch (skip by zeroing the loss, checkpoint choice for a rollback),
the shared Rollback policy, and the `-- <command>` plumbing of tune / bench train (placeholders, HF form,
argument split). The real 2-rank runs are in tests/dist/test_user_scripts.py."""
import json
import types

import pytest

from dstoolkit.runtime.train.spike import Rollback, SpikeGuard, SpikeGuardConfig


def test_hf_checkpoint_choice_for_rollback(tmp_path):
    from dstoolkit.runtime.train.hf import MARKER, _HfCheckpoints

    for step, healthy in ((4, True), (8, False), (12, True), (16, True)):
        d = tmp_path / f"checkpoint-{step}"
        d.mkdir()
        (d / "latest").write_text(f"global_step{step}")
        (d / MARKER).write_text(json.dumps({"step": step, "healthy": healthy, "guard": {}}))
    (tmp_path / "checkpoint-20").mkdir()  # saved without the callback: passed over
    ck = _HfCheckpoints(str(tmp_path))
    assert ck.latest_valid().step == 16 and "checkpoint-20" in ck.latest_valid().rejected[0]
    assert ck.latest_valid(max_step=11, require_healthy=True).step == 4  # 8 was cooling down
    assert ck.latest_valid(max_step=3).tag is None


def test_rollback_policy_shared_and_bounded():
    g = SpikeGuard(SpikeGuardConfig(rollback_margin_steps=2))
    g.consecutive_skips = 2
    seen = {}

    class Mgr:
        def latest_valid(self, *, max_step=None, require_healthy=False):
            seen.update(max_step=max_step, healthy=require_healthy)
            return types.SimpleNamespace(tag="step_8", step=8, rejected=[])

    loaded = []
    rb = Rollback(g, max_rollbacks=1)
    assert rb.perform(Mgr(), 12, "spike", loaded.append) == ("step_8", [])
    assert loaded == ["step_8"] and seen == {"max_step": 10, "healthy": True}
    assert g.consecutive_skips == 0 and g.lr_cooldown_left == g.config.lr_scale_steps
    with pytest.raises(RuntimeError, match=r"^step 12: 1 rollbacks did not clear the spike \(spike\)"):
        rb.perform(Mgr(), 12, "spike", loaded.append)  # the spike is back before the run got past step 12
    assert loaded == ["step_8"]
    assert rb.perform(Mgr(), 14, "spike", loaded.append)[0] == "step_8"  # past step 12: a new spike, a new count
    assert (rb.done, rb.streak) == (2, 1)


def test_callback_skips_a_spiking_batch_by_zeroing_its_loss(tmp_path):
    import torch

    from dstoolkit.runtime.train.hf import DstoolkitCallback

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, input_ids=None, labels=None, value=1.0):
            return {"loss": self.w.sum() * value}

    cb = DstoolkitCallback(config=SpikeGuardConfig(min_history=3, window=5), metrics_path=str(tmp_path / "m.jsonl"))
    state = types.SimpleNamespace(global_step=0)
    args = types.SimpleNamespace(output_dir=str(tmp_path))
    m = M()
    cb.on_train_begin(args, state, None, model=m)
    for step, v in enumerate([2.0, 1.9, 1.8, 1.7, 1.6], start=1):
        out = m(input_ids=torch.zeros(2, 8, dtype=torch.long), value=v)
        assert float(out["loss"]) == pytest.approx(v)
        state.global_step = step
        cb.on_step_end(args, state, None)
    out = m(input_ids=torch.zeros(2, 8, dtype=torch.long), value=50.0)
    assert float(out["loss"]) == 0.0 and out["loss"].requires_grad  # no gradient from this batch
    spike = [e for e in cb.events if e["event"] == "spike"][0]
    assert spike["action"] == "skip" and spike["kind"] == "loss_spike" and spike["step"] == 6
    cb.on_train_end(args, state, None)
    assert '"event": "spike"' in (tmp_path / "m.jsonl").read_text()


# --- `-- <command>` plumbing --------------------------------------------------------------------------------
def test_placeholders_filled_and_empty_flag_dropped(tmp_path):
    from dstoolkit.runtime.bench.harness import BenchInputError
    from dstoolkit.runtime.bench.usercmd import command_values, fill_command, hf_form, placeholders_used

    ds = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "torch_adam": True}}, "zero_optimization": {"stage": 2}}
    vals = command_values(ds, tmp_path, world_size=2, steps=5)
    cmd = ["torchrun", "train.py", "--deepspeed", "{hf_config}", "--per_device_train_batch_size", "{micro_batch}",
           "--gradient_accumulation_steps", "{grad_accum}", "{precision_flag}", "--max_steps", "{max_steps}",
           "--x", "{{literal}}"]
    out = fill_command(cmd, vals)
    assert out == ["torchrun", "train.py", "--deepspeed", vals["hf_config"], "--per_device_train_batch_size", "2",
                   "--gradient_accumulation_steps", "2", "--max_steps", "5", "--x", "{literal}"]  # fp32: no flag
    assert placeholders_used(cmd) == ["hf_config", "micro_batch", "grad_accum", "precision_flag", "max_steps"]
    hf = json.loads(open(vals["hf_config"]).read())
    assert hf["train_micro_batch_size_per_gpu"] == "auto" and hf["optimizer"]["params"]["lr"] == "auto"
    assert hf["zero_optimization"] == {"stage": 2} and hf["optimizer"]["params"]["torch_adam"] is True
    assert json.loads(open(vals["config"]).read()) == ds
    assert "deepspeed_config_file: " + vals["hf_config"] in open(vals["accelerate_config"]).read()
    assert hf_form({"bf16": {"enabled": True}})["bf16"]["enabled"] == "auto"
    with pytest.raises(BenchInputError, match="unknown placeholder {nope}"):
        fill_command(["{nope}"], vals)


def test_command_after_double_dash_is_kept_verbatim():
    from dstoolkit.cli import build_parser

    p = build_parser()
    a = p.parse_args(["tune", "s.yaml", "--budget", "4", "--out", "o", "--", "torchrun", "--nproc_per_node", "2",
                      "t.py", "--deepspeed", "{config}", "--", "x"])
    assert a.spec == "s.yaml" and a.budget == 4
    assert a.command == ["torchrun", "--nproc_per_node", "2", "t.py", "--deepspeed", "{config}", "--", "x"]
    b = p.parse_args(["bench", "train", "a.json", "b.json", "--steps", "3", "--", "python", "loop.py", "{config}"])
    assert b.targets == ["a.json", "b.json"] and b.steps == 3 and b.command == ["python", "loop.py", "{config}"]
    assert p.parse_args(["bench", "train", "a.json"]).command == []


def test_hook_rows_summary():
    from dstoolkit.runtime.bench.train_report import summarize_hook_rows

    rows = [{"step": i, "step_time_s": t, "tokens": 256, "samples": 8, "loss": 3.0 - i / 10, "peak_memory_bytes": 100 + i,
             "global_batch": 8, "micro_batch": 4, "grad_accum": 1} for i, t in enumerate([1.0, 0.5, 0.4, 0.6], 1)]
    m = summarize_hook_rows(rows + [{"event": "stop", "step": 4}], 1)
    assert m["timed_steps"] == 3 and m["step_time_s_median"] == 0.5 and m["tokens_per_s"] == 512
    assert m["peak_memory_bytes"] == 104 and m["loss_first"] == pytest.approx(2.9)


def test_resume_takes_the_newest_checkpoint_hf_finished(tmp_path):
    # A rank killed while saving leaves checkpoint-N without trainer_state.json (written last); resuming from it
    # fails in HF Trainer, so the newest complete one is taken.
    from dstoolkit.runtime.train.hf import last_complete_checkpoint

    assert last_complete_checkpoint(tmp_path) is None
    for n, complete in ((4, True), (8, True), (12, False)):
        d = tmp_path / f"checkpoint-{n}"
        d.mkdir()
        if complete:
            (d / "trainer_state.json").write_text("{}")
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-8")

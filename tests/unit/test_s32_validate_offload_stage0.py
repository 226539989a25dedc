"""offload_optimizer at ZeRO stage 0 (DS105). DeepSpeed 0.19.8's engine picks its CPU optimizers from the offload
device alone (engine.py zero_use_cpu_optimizer), whatever the stage, while stage 0 leaves the parameters on the
accelerator: DeepSpeedCPUAdam / CPULion / CPUAdagrad then assert at the first step on GPUs (ops/adam/cpu_adam.py
"CPUAdam param is on cuda:0 and must be 'cpu'"); CPU ranks train. So it is an error that says so (and agrees with
DS210, which checks the params against the same CPU class), and a warning only where the offload really does
nothing (an optimizer class the offload does not change, or a client optimizer allowed by
zero_force_ds_cpu_optimizer false)."""
from __future__ import annotations

import pytest

from dstoolkit.validate import validate_config

BASE = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}}
FIX = 'set "stage": 1 or higher to offload the optimizer, or remove the offload'
LEAD = "zero_optimization.offload_optimizer at stage 0: ZeRO is off, so the parameters stay on the accelerator"


def _cfg(optimizer=None, stage=0, offload=None, **top):
    z = {"stage": stage, "offload_optimizer": offload or {"device": "cpu"}}
    cfg = {**BASE, "zero_optimization": z, **top}
    if optimizer is not None:
        cfg["optimizer"] = optimizer
    return cfg


def _ds105(cfg):
    return [(f.severity, f.pointer, f.message, f.suggestion) for f in validate_config(cfg) if f.code == "DS105"]


def test_adamw_at_stage0_is_the_cpu_adam_assert():
    assert _ds105(_cfg({"type": "AdamW", "params": {"lr": 1e-4}})) == [
        ("error", "/zero_optimization/offload_optimizer",
         f"{LEAD}, yet the offload makes DeepSpeed build DeepSpeedCPUAdam for optimizer.type 'AdamW' (engine.py "
         "zero_use_cpu_optimizer ignores the stage): on GPUs its first step asserts ('CPUAdam param is on cuda:0 and "
         "must be 'cpu''); only CPU ranks (gloo) train", FIX)]


@pytest.mark.parametrize("opt_type, cls", [("Adam", "DeepSpeedCPUAdam"), ("Lion", "DeepSpeedCPULion"),
                                           ("Adagrad", "DeepSpeedCPUAdagrad")])
def test_every_cpu_optimizer_class_is_named(opt_type, cls):
    offload = {"device": "nvme", "nvme_path": "/local_nvme"}
    [(sev, _, msg, _)] = _ds105(_cfg({"type": opt_type, "params": {"lr": 1e-4}}, offload=offload))
    assert sev == "error" and f"build {cls} for optimizer.type {opt_type!r}" in msg
    assert f"('{cls[len('DeepSpeed'):]} param is on cuda:0 and must be 'cpu'')" in msg


def test_deprecated_cpu_offload_true_is_the_same():
    cfg = {**BASE, "zero_optimization": {"stage": 0, "cpu_offload": True}, "optimizer": {"type": "Adam"}}
    [(sev, ptr, msg, fix)] = _ds105(cfg)
    assert (sev, ptr, fix) == ("error", "/zero_optimization/cpu_offload", FIX)
    assert msg.startswith("zero_optimization.cpu_offload at stage 0: ZeRO is off") and "DeepSpeedCPUAdam" in msg


@pytest.mark.parametrize("optimizer, cls", [({"type": "SGD", "params": {"lr": 0.1}}, "torch.optim.SGD"),
                                            ({"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
                                             "torch.optim.AdamW"),
                                            ({"type": "Lamb", "params": {"lr": 1e-3}}, "FusedLamb")])
def test_classes_the_offload_does_not_change_make_it_a_no_op_warning(optimizer, cls):
    assert _ds105(_cfg(optimizer)) == [
        ("warning", "/zero_optimization/offload_optimizer", f"{LEAD} and {cls} runs there: the offload has no effect",
         FIX)]


def test_client_optimizer_needs_a_cpu_class_unless_forced_off():
    assert _ds105(_cfg()) == [
        ("error", "/zero_optimization/offload_optimizer",
         f"{LEAD}, yet DeepSpeed requires the optimizer from code to be DeepSpeedCPUAdam or DeepSpeedCPULion "
         "(ZeRORuntimeException at initialize otherwise, zero_force_ds_cpu_optimizer), and on GPUs their first step "
         "asserts (param is on cuda:0 and must be 'cpu'); only CPU ranks (gloo) train", FIX)]
    assert _ds105(_cfg(zero_force_ds_cpu_optimizer=False)) == [
        ("warning", "/zero_optimization/offload_optimizer",
         "zero_optimization.offload_optimizer has no effect at stage 0: optimizer offload needs ZeRO stage 1-3",
         "set a stage >= 1")]


def test_ds105_and_ds210_name_the_same_class_and_stage1_is_clean():
    cfg = _cfg({"type": "AdamW", "params": {"lr": 1e-4, "momentum": 0.9}})
    found = {f.code: f for f in validate_config(cfg)}
    assert found["DS105"].severity == found["DS210"].severity == "error"
    assert "DeepSpeedCPUAdam" in found["DS105"].message and "DeepSpeedCPUAdam" in found["DS210"].message
    assert "no effect" not in found["DS105"].message
    assert [f for f in validate_config(_cfg({"type": "AdamW", "params": {"lr": 1e-4}}, stage=1))] == []

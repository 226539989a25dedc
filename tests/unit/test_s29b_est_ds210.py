"""DS210 against what DeepSpeed 0.19.8's engine builds (runtime/engine.py _configure_basic_optimizer): the keys a
type accepts depend on the class it builds, which optimizer offload and torch_adam choose.

Before: one key list per type, the union of its classes, so offloaded Adagrad "accepted" torch's lr_decay /
initial_accumulator_value (DeepSpeedCPUAdagrad raises TypeError), offloaded Lion refused the fp32_optimizer_states
DeepSpeedCPULion takes, Muon "accepted" nesterov / ns_steps that the engine drops without a word, and MuAdam /
MuAdamW / MuSGD without lr passed (mup raises KeyError('lr')).
"""
from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path

import pytest

from dstoolkit.dsconfig.deepspeed import DeepSpeedConfig
from dstoolkit.validate import validate_config

BASE = {"train_micro_batch_size_per_gpu": 1}
OFFLOAD = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
TYPE_ERROR = "; the engine passes params as keyword arguments and fails with TypeError"


def ds210(type_, params=None, **top):
    cfg = {**BASE, "optimizer": {"type": type_} if params is None else {"type": type_, "params": params}, **top}
    return [(f.severity, f.pointer, f.message, f.suggestion) for f in validate_config(cfg) if f.code == "DS210"]


def test_offloaded_adagrad_refuses_torch_keywords():
    assert ds210("Adagrad", {"lr": 0.01, "lr_decay": 0.1, "initial_accumulator_value": 0.1}, **OFFLOAD) == [
        ("error", "/optimizer/params/lr_decay",
         "optimizer.params 'lr_decay', 'initial_accumulator_value' not accepted by DeepSpeedCPUAdagrad (what Adagrad "
         "builds with the optimizer offloaded to cpu / nvme)" + TYPE_ERROR,
         "remove 'lr_decay', 'initial_accumulator_value' (DeepSpeedCPUAdagrad takes amsgrad, eps, "
         "fp32_optimizer_states, lr, weight_decay), or turn optimizer offload off (offload_optimizer.device \"none\"): "
         "torch.optim.Adagrad takes them")]
    # on the device it is torch.optim.Adagrad: lr_decay is fine, DeepSpeedCPUAdagrad's amsgrad is not
    assert ds210("Adagrad", {"lr": 0.01, "lr_decay": 0.1, "initial_accumulator_value": 0.1}) == []
    [(sev, ptr, msg, _)] = ds210("Adagrad", {"lr": 0.01, "amsgrad": True})
    assert (sev, ptr, msg) == ("error", "/optimizer/params/amsgrad", "optimizer.params 'amsgrad' not accepted by "
                               "torch.optim.Adagrad (what Adagrad builds without optimizer offload)" + TYPE_ERROR)
    # the deprecated cpu_offload: true is offload_optimizer cpu (DeepSpeed's zero config maps it)
    assert ds210("Adagrad", {"lr_decay": 0.1}, zero_optimization={"stage": 2, "cpu_offload": True})[0][1] == \
        "/optimizer/params/lr_decay"
    # nvme offloads too; "none" does not
    nvme = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}}
    assert len(ds210("Adagrad", {"lr_decay": 0.1}, **nvme)) == 1
    off_none = {"stage": 2, "offload_optimizer": {"device": "none"}}
    assert ds210("Adagrad", {"lr_decay": 0.1}, zero_optimization=off_none) == []


def test_lion_takes_fp32_optimizer_states_only_when_offloaded():
    assert ds210("Lion", {"lr": 1e-4, "fp32_optimizer_states": False}, **OFFLOAD) == []
    assert ds210("Lion", {"lr": 1e-4, "fp32_optimizer_states": False}) == [
        ("error", "/optimizer/params/fp32_optimizer_states",
         "optimizer.params 'fp32_optimizer_states' not accepted by FusedLion (what Lion builds without optimizer "
         "offload)" + TYPE_ERROR,
         "remove 'fp32_optimizer_states' (FusedLion takes betas, lr, set_grad_none, weight_decay), or offload the "
         "optimizer (offload_optimizer.device \"cpu\"): DeepSpeedCPULion takes it")]
    [(_, ptr, msg, _)] = ds210("Lion", {"lr": 1e-4, "set_grad_none": True}, **OFFLOAD)
    assert (ptr, msg) == ("/optimizer/params/set_grad_none", "optimizer.params 'set_grad_none' not accepted by "
                          "DeepSpeedCPULion (what Lion builds with the optimizer offloaded to cpu / nvme)" + TYPE_ERROR)


def test_muon_drops_nesterov_and_ns_steps_with_a_warning():
    cfg = {**BASE, "optimizer": {"type": "Muon", "params": {"lr": 0.02, "nesterov": False, "ns_steps": 3}}}
    assert ds210("Muon", {"lr": 0.02, "nesterov": False, "ns_steps": 3}) == [
        ("warning", "/optimizer/params/nesterov",
         "optimizer.params 'nesterov', 'ns_steps': DeepSpeed's MuonWithAuxAdam never reads them: the engine reads only "
         "adam_lr, adam_w_mode, betas, eps, fp32_optimizer_states, lr, momentum, muon_lr, ns_method, torch_adam, "
         "weight_decay (runtime/engine.py _muon_param_groups) and drops the rest without a word; it always runs "
         "nesterov=true, ns_steps=5 (original_muon.py muon_update)", "remove 'nesterov', 'ns_steps'")]
    DeepSpeedConfig.model_validate(cfg)  # a warning: the model (which DeepSpeed's engine would build) accepts it
    [(sev, ptr, _, fix)] = ds210("muon", {"lr": 0.02, "momentun": 0.9})
    assert (sev, ptr, fix) == ("warning", "/optimizer/params/momentun", "did you mean 'momentum'?")
    assert ds210("Muon", {"lr": 0.02, "momentum": 0.95, "ns_method": "gram", "muon_lr": 0.02, "adam_lr": 3e-4,
                          "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "torch_adam": True,
                          "foreach": True}) == []
    assert ds210("Muon", {"lr": 0.02, "foreach": True})[0][:2] == ("warning", "/optimizer/params/foreach")


@pytest.mark.parametrize("type_, cls", [("MuAdam", "mup's MuAdam (torch.optim.Adam)"),
                                        ("MuAdamW", "mup's MuAdamW (torch.optim.AdamW)"),
                                        ("MuSGD", "mup's MuSGD (torch.optim.SGD)")])
def test_mup_optimizers_need_lr(type_, cls):
    why = (f"{cls} raises KeyError('lr') at engine start (mup/optim.py process_param_groups reads kwargs['lr'] for "
           "the model's parameters, which set none of their own)")
    fix = 'add "lr" to optimizer.params (e.g. 1e-3)'
    assert ds210(type_, {"weight_decay": 0.0}) == [
        ("error", "/optimizer/params", f"optimizer.type {type_!r} without optimizer.params.lr: {why}", fix)]
    assert ds210(type_) == [
        ("error", "/optimizer", f"optimizer.type {type_!r} without optimizer.params.lr: {why}", fix)]
    # every torch keyword of the class it builds passes through (foreach, maximize: refused before)
    assert ds210(type_, {"lr": 1e-3, "foreach": True, "maximize": False}) == []


def test_adam_keys_follow_the_class_built():
    [(_, ptr, msg, fix)] = ds210("AdamW", {"lr": 1e-3, "foreach": True})
    assert (ptr, msg) == ("/optimizer/params/foreach", "optimizer.params 'foreach' not accepted by FusedAdam (what "
                          "AdamW builds without optimizer offload or torch_adam)" + TYPE_ERROR)
    assert fix.endswith(', or "torch_adam": true: torch.optim.AdamW takes it')
    assert ds210("AdamW", {"lr": 1e-3, "foreach": True, "torch_adam": True}) == []
    [(_, ptr, _, fix)] = ds210("AdamW", {"lr": 1e-3, "bias_correction": True, "torch_adam": True})
    assert ptr == "/optimizer/params/bias_correction" and fix.endswith(', or drop "torch_adam": FusedAdam takes it')
    [(_, ptr, msg, _)] = ds210("Adam", {"set_grad_none": True}, **OFFLOAD)
    assert msg.startswith("optimizer.params 'set_grad_none' not accepted by DeepSpeedCPUAdam (what Adam builds with "
                          "the optimizer offloaded to cpu / nvme)")
    # torch.optim.Adam (type adam, adam_w_mode false) takes decoupled_weight_decay; AdamW does not
    assert ds210("Adam", {"torch_adam": True, "adam_w_mode": False, "decoupled_weight_decay": True}) == []
    assert len(ds210("AdamW", {"torch_adam": True, "adam_w_mode": False, "decoupled_weight_decay": True})) == 1


def _init_keywords(path: Path, cls: str) -> set[str]:
    """The keyword parameters of `cls.__init__` in a source file, read without importing it."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    init = next(f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    return {a.arg for a in init.args.args[2:] + init.args.kwonlyargs}


def test_builds_match_the_installed_signatures():
    from dstoolkit.dsconfig.facts import ADAM_ENGINE_KEYS, MUON_KEYS, OPTIMIZER_BUILDS, TORCH_OPTIMIZERS

    spec = importlib.util.find_spec("deepspeed")
    torch_optim = pytest.importorskip("torch.optim")
    if spec is None:
        pytest.skip("deepspeed not installed")
    ds = Path(spec.origin).parent
    engine_passes = {"DeepSpeedCPUAdam": {"adamw_mode", "fp32_optimizer_states"}, "FusedAdam": {"adam_w_mode"}}
    for file, cls, type_, path in (("ops/adam/fused_adam.py", "FusedAdam", "adamw", "device"),
                                   ("ops/adam/cpu_adam.py", "DeepSpeedCPUAdam", "adamw", "offload"),
                                   ("ops/lamb/fused_lamb.py", "FusedLamb", "lamb", "device"),
                                   ("ops/lion/fused_lion.py", "FusedLion", "lion", "device"),
                                   ("ops/lion/cpu_lion.py", "DeepSpeedCPULion", "lion", "offload"),
                                   ("ops/adagrad/cpu_adagrad.py", "DeepSpeedCPUAdagrad", "adagrad", "offload")):
        takes = _init_keywords(ds / file, cls) - engine_passes.get(cls, set())
        extra = ADAM_ENGINE_KEYS if type_ == "adamw" else set()
        assert OPTIMIZER_BUILDS[type_][path].keywords == takes | extra, cls

    def torch_kw(name):
        return set(list(inspect.signature(getattr(torch_optim, name).__init__).parameters)[2:])

    assert OPTIMIZER_BUILDS["adagrad"]["device"].keywords == torch_kw("Adagrad")
    assert OPTIMIZER_BUILDS["adamw"]["torch_adam"].keywords == torch_kw("AdamW") | ADAM_ENGINE_KEYS
    assert OPTIMIZER_BUILDS["adam"]["torch_adam_l2"].keywords == torch_kw("Adam") | ADAM_ENGINE_KEYS
    for type_, name in (("muadam", "Adam"), ("muadamw", "AdamW"), ("musgd", "SGD")):
        assert OPTIMIZER_BUILDS[type_]["device"].keywords == torch_kw(name), type_
    for name, keys in TORCH_OPTIMIZERS.items():
        assert keys == torch_kw(name), name
    # Muon: the two halves' keys of runtime/engine.py, and the overrides _muon_half_defaults reads
    tree = ast.parse((ds / "runtime/engine.py").read_text(encoding="utf-8"))
    halves = {t.id: {e.value for e in n.value.elts} for n in ast.walk(tree) if isinstance(n, ast.Assign)
              for t in n.targets if isinstance(t, ast.Name) and t.id in ("_MUON_HALF_KEYS", "_ADAM_HALF_KEYS")}
    assert MUON_KEYS == halves["_MUON_HALF_KEYS"] | halves["_ADAM_HALF_KEYS"] | {"muon_lr", "adam_lr"}

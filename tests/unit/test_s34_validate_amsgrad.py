"""s34 validate finding 1: "amsgrad": true for Adam / AdamW. FusedAdam raises RuntimeError in its constructor
(ops/adam/fused_adam.py) and DeepSpeedCPUAdam in add_param_group (ops/adam/cpu_adam.py); torch's AdamW
(torch_adam) runs AMSGrad. Measured on a 1-rank gloo engine (DeepSpeed 0.19.8): both fail before the first step."""
from dstoolkit.validate import validate_config

BASE = {"train_batch_size": 24, "train_micro_batch_size_per_gpu": 3}


def _cfg(params: dict, offload: bool = False) -> dict:
    cfg = {**BASE, "optimizer": {"type": "Adam", "params": {"lr": 3e-5, **params}}}
    if offload:
        cfg["zero_optimization"] = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
        cfg["bf16"] = {"enabled": True}
    return cfg


def _findings(cfg: dict) -> list:
    return [(f.severity, f.code, f.pointer, f.message, f.suggestion) for f in validate_config(cfg, world_size=8)]


def test_amsgrad_true_is_an_error_for_fused_adam():
    assert _findings(_cfg({"amsgrad": True})) == [(
        "error", "DS210", "/optimizer/params/amsgrad",
        "optimizer.params.amsgrad=true: FusedAdam (what Adam builds without optimizer offload or torch_adam) raises "
        "RuntimeError ('FusedAdam does not support the AMSGrad variant.', ops/adam/fused_adam.py) before the first "
        "step", 'remove "amsgrad", or set "torch_adam": true (torch.optim.AdamW / Adam run AMSGrad)')]


def test_amsgrad_true_is_an_error_for_cpu_adam_under_offload():
    [(severity, code, pointer, message, _)] = _findings(_cfg({"amsgrad": True}, offload=True))
    assert (severity, code, pointer) == ("error", "DS210", "/optimizer/params/amsgrad")
    assert message.startswith("optimizer.params.amsgrad=true: DeepSpeedCPUAdam (what Adam builds with the optimizer "
                              "offloaded to cpu / nvme) raises RuntimeError ('DeepSpeedCPUAdam does not support the "
                              "AMSGrad variant.', ops/adam/cpu_adam.py)")


def test_amsgrad_false_and_torch_adam_stay_clean():
    assert _findings(_cfg({"amsgrad": False})) == []
    assert _findings(_cfg({"amsgrad": True, "torch_adam": True})) == []
    assert _findings({**BASE, "optimizer": {"type": "AdamW", "params": {"amsgrad": True, "torch_adam": True}}}) == []

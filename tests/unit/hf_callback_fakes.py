"""What the DstoolkitCallback tests drive by hand instead of HF Trainer + DeepSpeed (shared by
test_s32_train_hf_callback.py and test_s32_mend_rt_hf_seq.py): the spec (the tiny preset, seq_len 128), its
parameter count, and the part of DeepSpeed's engine the callback reads for its estimate."""
import types
from pathlib import Path

SPEC = Path(__file__).resolve().parents[2] / "ds_configs" / "tiny_cpu.yaml"


class Engine:
    """What the callback reads of DeepSpeed's engine for the estimate."""

    def __init__(self):
        self._config = types.SimpleNamespace(_param_dict={
            "train_batch_size": 8, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": 1}, "bf16": {"enabled": True}})
        self.optimizer = types.SimpleNamespace(param_groups=[{"lr": 1e-3}])


def tiny_params() -> int:
    from dstoolkit.models import get_preset
    from dstoolkit.models.params import count_params

    return count_params(get_preset("tiny")).total

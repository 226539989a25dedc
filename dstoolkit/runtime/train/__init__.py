"""dstoolkit.runtime.train: batch ramp, checkpoint policy, spike guard, monitor, atomic checkpoints, example trainer.

Pure-Python pieces import without torch:
    from dstoolkit.runtime.train.ramp import BatchRamp
    from dstoolkit.runtime.train.spike import SpikeGuard, SpikeGuardConfig
    from dstoolkit.runtime.train.monitor import Monitor
    from dstoolkit.runtime.train.ckpt import CheckpointManager
Torch pieces: dstoolkit.runtime.train.checkpointing (apply_checkpoint_policy, measure_saved_activation_bytes) and
the trainer (`python -m dstoolkit.runtime.train.trainer`, launched by deepspeed / torchrun).
"""
from dstoolkit.runtime.train.ramp import BatchRamp, RampPoint
from dstoolkit.runtime.train.spike import Decision, SpikeGuard, SpikeGuardConfig

__all__ = ["BatchRamp", "RampPoint", "SpikeGuard", "SpikeGuardConfig", "Decision"]
